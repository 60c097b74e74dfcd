"""The PostgreSQL half of the runner: ``python -m bench --backend postgres --pg-url URL``.

Workloads 1 to 6 of :mod:`bench.run`, each beside a raw psycopg baseline
(:mod:`bench.pg`) measured in the same run on the same server; every
measurement in a fresh schema. The targets of the later performance issue
(the worker >= 5x raw one-at-a-time claim + complete, cross-process
enqueue-to-start p50 < 5 ms with an idle worker) are reported, never asserted.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import Sizes, drain_in_processes, median, percentile, remote_latency
from bench import pg as b
from bench.report import JAREN, WORKLOADS, Figure, Report, Target, log

PG_WORKLOADS = (1, 2, 3, 4, 5, 6)


class PgRunner:
    def __init__(self, sizes: Sizes, durability: str, url: str) -> None:
        self.sizes = sizes
        self.durability = durability
        self.url = url

    def pair(self, name: str, raw_fn: Any, ours_fn: Any, *args: Any) -> tuple[float, float]:
        """Raw and jaren_jobs, interleaved round by round so drift hits both alike."""
        raws, ours = [], []
        for _ in range(self.sizes.rounds):
            with b.fresh_schema(self.url, f"raw{name}") as url:
                raws.append(raw_fn(url, self.durability, *args))
            with b.fresh_schema(self.url, f"jj{name}") as url:
                ours.append(ours_fn(url, self.durability, *args))
        return median(raws), median(ours)

    def w1(self) -> list[Figure]:
        figure = Figure(1, "1", WORKLOADS[1], "jobs/s", "higher", None)
        figure.raw, figure.values[JAREN] = self.pair(
            "1", b.raw_enqueue_one, b.enqueue_one, self.sizes.enqueue
        )
        return [figure]

    def w2(self) -> list[Figure]:
        s = self.sizes
        figure = Figure(2, "2", f"{WORKLOADS[2]} of {s.batch}", "jobs/s", "higher", None)
        figure.raw, figure.values[JAREN] = self.pair(
            "2", b.raw_enqueue_batches, b.enqueue_batches, s.enqueue_many, s.batch
        )
        return [figure]

    def w3(self) -> list[Figure]:
        figure = Figure(3, "3", WORKLOADS[3], "jobs/s", "higher", None)
        figure.raw, figure.values[JAREN] = self.pair(
            "3", b.raw_claim_complete_one, b.claim_complete_one, self.sizes.claim_complete
        )
        return [figure]

    def w4(self, one_at_a_time: float | None) -> list[Figure]:
        s, d = self.sizes, self.durability
        if one_at_a_time is None:
            with b.fresh_schema(self.url, "raw4") as url:
                one_at_a_time = b.raw_claim_complete_one(url, d, s.claim_complete)
        figures = []
        for concurrency in s.concurrencies:
            log(f"  concurrency {concurrency}")
            figure = Figure(
                4,
                f"4.c{concurrency}",
                f"{WORKLOADS[4]}, concurrency {concurrency}",
                "jobs/s",
                "higher",
                one_at_a_time,
                extra={"concurrency": concurrency, "raw_is": "claim + complete one at a time"},
            )
            rates = []
            for _ in range(s.rounds):
                with b.fresh_schema(self.url, "jj4") as url:
                    rates.append(b.drain(url, d, s.drain, concurrency))
            figure.values[JAREN] = median(rates)
            figures.append(figure)
        return figures

    def w5(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        figure = Figure(
            5,
            "5",
            f"{s.processes} worker processes on one database",
            "jobs/s",
            "higher",
            None,
            extra={"duplicates": {}, "raw_is": "claim + complete one at a time per process"},
        )
        with b.fresh_schema(self.url, "raw5") as url:
            spec = b.raw_processes_setup(url, d, s.process_jobs)
            figure.raw, dup, _ = drain_in_processes(
                b.raw_process_drainer, spec, jobs=s.process_jobs, processes=s.processes
            )
        figure.extra["duplicates"]["raw"] = dup
        with b.fresh_schema(self.url, "jj5") as url:
            spec = b.processes_setup(url, d, s.process_jobs, 1)
            figure.values[JAREN], dup, _ = drain_in_processes(
                b.process_drainer, spec, jobs=s.process_jobs, processes=s.processes
            )
        figure.extra["duplicates"][JAREN] = dup
        return [figure]

    def w6(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        local: dict[str, list[float]] = {}
        remote: dict[str, list[float]] = {}
        with b.fresh_schema(self.url, "raw6") as url:
            local["raw"] = b.raw_latency_local(url, d, s.latency_local)
        with b.fresh_schema(self.url, "jj6") as url:
            local[JAREN] = b.latency_local(url, d, s.latency_local)
        with b.fresh_schema(self.url, "raw6r") as url:
            spec, enqueue, close = b.raw_latency_remote_setup(url, d)
            try:
                remote["raw"] = remote_latency(
                    b.raw_latency_consumer, spec, enqueue, samples=s.latency_remote
                )
            finally:
                close()
        with b.fresh_schema(self.url, "jj6r") as url:
            spec, enqueue, close = b.latency_remote_setup(url, d)
            try:
                remote[JAREN] = remote_latency(
                    b.latency_consumer, spec, enqueue, samples=s.latency_remote
                )
            finally:
                close()
        figures = []
        for where, samples in (("local", local), ("remote", remote)):
            place = "in-process" if where == "local" else "from another process"
            for name, fraction in (("p50", 0.5), ("p99", 0.99)):
                figure = Figure(
                    6,
                    f"6.{where}.{name}",
                    f"enqueue-to-start {name}, {place} ({b.PG_POLL:g} s poll, LISTEN/NOTIFY)",
                    "ms",
                    "lower",
                    percentile(samples["raw"], fraction) * 1000,
                    extra={"samples": len(samples["raw"])},
                )
                figure.values[JAREN] = percentile(samples[JAREN], fraction) * 1000
                figures.append(figure)
        return figures


def targets(report: Report) -> list[Target]:
    found: list[Target] = []
    for concurrency in (1, 4, 16):
        figure = report.figure(f"4.c{concurrency}")
        ratio = None if figure is None else figure.ratio(JAREN)
        if ratio is not None:
            found.append(
                Target(
                    f"worker at concurrency {concurrency} ≥ 5× raw one-at-a-time "
                    "claim + complete (PostgreSQL)",
                    f"{ratio:.1f}×",
                    ratio >= 5,
                )
            )
    figure = report.figure("6.remote.p50")
    if figure is not None and JAREN in figure.values:
        p50 = figure.values[JAREN]
        found.append(
            Target(
                "cross-process enqueue-to-start p50 < 5 ms, idle worker (PostgreSQL)",
                f"{p50:.2f} ms",
                p50 < 5,
            )
        )
    return found


def run(report: Report, sizes: Sizes, durability: str, url: str, only: set[int]) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()
    report.meta["postgres"] = {
        "server_version": None if version is None else version[0],
        "fsync": None if fsync is None else fsync[0],
        "psycopg": psycopg.__version__,
    }
    report.meta["baseline"] = "raw psycopg"
    runner = PgRunner(sizes, durability, url)
    for number in sorted(only & set(PG_WORKLOADS)):
        log(f"bench: postgres workload {number}: {WORKLOADS[number]}")
        started = time.monotonic()
        if number == 4:
            three = report.figure("3")
            report.figures.extend(runner.w4(None if three is None else three.raw))
        else:
            report.figures.extend(getattr(runner, f"w{number}")())
        report.meta.setdefault("workload_seconds", {})[number] = round(
            time.monotonic() - started, 2
        )
    report.meta["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
