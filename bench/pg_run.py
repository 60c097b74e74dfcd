"""The PostgreSQL half of the runner: ``python -m bench --pg-url URL`` (or ``--backend postgres``).

Every workload of :mod:`bench.run`, each beside a raw psycopg baseline
(:mod:`bench.pg`) measured in the same run on the same server, and
beside the PostgreSQL peers (:mod:`bench.pg_peers`: procrastinate, pgqueuer,
chancy, oban) where the issue compares with them: workloads 1, 4 (concurrency 1 and
4), 5, 6 (across processes) and 10. Every measurement runs in a fresh schema.
The targets of issue 28 are reported (:mod:`bench.targets`), never asserted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from bench import (
    POLL_SECONDS,
    Sizes,
    drain_in_processes,
    in_subprocess,
    median,
    remote_latency,
    workloads,
)
from bench import pg as b
from bench import pg_peers as pp
from bench.report import (
    JAREN,
    WORKLOADS,
    Figure,
    Report,
    latency_figures,
    log,
    memory_figures,
    scale_figure,
)

PG_WORKLOADS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)


class PgRunner:
    def __init__(
        self, sizes: Sizes, durability: str, url: str, peers: Sequence[pp.PgPeer] = ()
    ) -> None:
        self.sizes = sizes
        self.durability = durability
        self.url = url
        self.peers = list(peers)

    def peer_url(self, url: str) -> str:
        """The schema's URL with the run's ``synchronous_commit`` for every peer connection."""
        return pp.with_durability(url, self.durability)

    def peer_rate(self, peer: pp.PgPeer, fn: Any, *args: Any) -> float:
        rates = []
        for _ in range(self.sizes.rounds):
            with b.fresh_schema(self.url, peer.name.replace("-", "")) as url:
                rates.append(fn(self.peer_url(url), *args))
        return median(rates)

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
        for peer in self.peers:
            log(f"  {peer.name}")
            figure.values[peer.name] = self.peer_rate(peer, peer.enqueue_one, self.sizes.enqueue)
        return [figure]

    def w2(self) -> list[Figure]:
        s = self.sizes
        figure = Figure(2, "2", f"{WORKLOADS[2]} of {s.batch}", "jobs/s", "higher", None)
        figure.raw, figure.values[JAREN] = self.pair(
            "2", b.raw_enqueue_batches, b.enqueue_batches, s.enqueue_many, s.batch
        )
        one = Figure(
            2,
            "2.one",
            f"enqueue_many of {s.enqueue_many_one:,} jobs in one call",
            "jobs/s",
            "higher",
            None,
            extra={"raw_is": f"executemany of the same {s.enqueue_many_one:,} rows"},
        )
        one.raw, one.values[JAREN] = self.pair(
            "2one", b.raw_enqueue_many_one, b.enqueue_many_one, s.enqueue_many_one
        )
        return [figure, one]

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
            if concurrency in s.peer_concurrencies:
                for peer in self.peers:
                    log(f"    {peer.name}")
                    figure.values[peer.name] = self.peer_rate(
                        peer, peer.drain, s.drain, concurrency
                    )
            figures.append(figure)
        asynchronous = Figure(
            4,
            "4.async",
            "an AsyncWorker draining no-op async jobs, concurrency 4",
            "jobs/s",
            "higher",
            one_at_a_time,
            extra={"concurrency": 4, "raw_is": "claim + complete one at a time"},
        )
        rates = []
        for _ in range(s.rounds):
            with b.fresh_schema(self.url, "jj4a") as url:
                rates.append(workloads.drain_async(url, d, s.drain, 4, from_first=True))
        asynchronous.values[JAREN] = median(rates)
        figures.append(asynchronous)
        ceiling = Figure(
            4,
            "4.batched",
            "raw claim + complete, 100 jobs per statement, 4 connections (the ceiling)",
            "jobs/s",
            "higher",
            None,
            extra={"raw_is": "claim 100 in one UPDATE, complete 100 in one, 4 threads"},
        )
        rates = []
        for _ in range(s.rounds):
            with b.fresh_schema(self.url, "raw4b") as url:
                rates.append(b.raw_drain_batched(url, d, s.raw_batch_drain, 4))
        ceiling.raw = median(rates)
        c4 = next((f for f in figures if f.extra["concurrency"] == 4), None)
        if c4 is not None:
            ceiling.values[JAREN + " c=4"] = c4.values[JAREN]
        figures.append(ceiling)
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
        for peer in self.peers:
            log(f"  {peer.name}")
            figure.values[peer.name], figure.extra["duplicates"][peer.name] = self.peer_processes(
                peer, s.process_jobs, s.processes
            )
        return [figure]

    def peer_processes(self, peer: pp.PgPeer, jobs: int, processes: int) -> tuple[float, int]:
        with b.fresh_schema(self.url, peer.name) as schema:
            return peer.processes(self.peer_url(schema), jobs, processes)

    def w10(self) -> list[Figure]:
        """Scale-out: 1, 2, 4, 8 worker processes (concurrency 1 each) on one database."""
        s, d = self.sizes, self.durability
        figures = []
        for processes in s.scale_processes:
            log(f"  {processes} processes")
            figure = scale_figure(
                processes, "database", "claim 100 + complete 100 per statement in each process"
            )
            with b.fresh_schema(self.url, "raw10") as url:
                spec = b.raw_processes_setup(url, d, s.scale_jobs)
                figure.raw, dup, _ = drain_in_processes(
                    b.raw_batched_process_drainer, spec, jobs=s.scale_jobs, processes=processes
                )
            figure.extra["duplicates"]["raw"] = dup
            with b.fresh_schema(self.url, "jj10") as url:
                spec = b.processes_setup(url, d, s.scale_jobs, 1)
                figure.values[JAREN], dup, _ = drain_in_processes(
                    b.process_drainer, spec, jobs=s.scale_jobs, processes=processes
                )
            figure.extra["duplicates"][JAREN] = dup
            for peer in self.peers if s.scale_peers else []:
                log(f"    {peer.name}")
                rate, dup = self.peer_processes(peer, s.scale_jobs, processes)
                figure.values[peer.name] = rate
                figure.extra["duplicates"][peer.name] = dup
            figures.append(figure)
        return figures

    def w7(self) -> list[Figure]:
        """A claim's cost as the table grows: jaren_jobs' claim beside a raw claim statement."""
        s, d = self.sizes, self.durability
        figures = []
        for pending in sorted({p for _, p in s.table_sizes}):
            with b.fresh_schema(self.url, f"table{pending}") as url:
                b.open_(url, d).close()  # the library's tables and indexes
                b.add_library_rows(url, pending, settled=False)
                settled_so_far = 0
                for settled in sorted(st for st, p in s.table_sizes if p == pending):
                    log(f"  {settled:,} settled + {pending:,} pending")
                    b.add_library_rows(
                        url, settled - settled_so_far, settled=True, start=settled_so_far
                    )
                    settled_so_far = settled
                    ours: list[float] = []
                    raws: list[float] = []
                    with b.open_(url, d) as store, b.raw_connect(url, d) as conn:
                        for _ in range(3):  # warm both connections alike
                            workloads.claim_cost(store)
                            b.library_claim_cost(conn)
                        for _ in range(s.table_claims):  # interleaved
                            ours.append(workloads.claim_cost(store))
                            raws.append(b.library_claim_cost(conn))
                    figures.append(
                        Figure(
                            7,
                            f"7.{settled}+{pending}",
                            f"claim at {settled:,} settled + {pending:,} pending rows",
                            "ms",
                            "lower",
                            median(raws) * 1000,
                            {JAREN: median(ours) * 1000},
                            extra={
                                "settled": settled,
                                "pending": pending,
                                "raw_is": "one UPDATE ... SKIP LOCKED on the library's table",
                            },
                        )
                    )
        return figures

    def w8(self) -> list[Figure]:
        """An idle worker's CPU as workload 6 runs it (1 s poll, LISTEN on) beside raw's
        consumer there; and with a 50 ms poll beside a raw claim every 50 ms."""
        s, d = self.sizes, self.durability
        figures = []
        for key, poll, raw_idle, text in (
            (
                "8",
                b.PG_POLL,
                b.raw_idle_listen_cpu,
                f"CPU of an idle worker, {b.PG_POLL:g} s poll and LISTEN/NOTIFY, as in "
                "workload 6 (raw: its consumer there, idle)",
            ),
            (
                "8.fast",
                POLL_SECONDS,
                b.raw_idle_cpu,
                f"CPU of an idle worker, {POLL_SECONDS * 1000:g} ms poll "
                f"(raw: a claim statement every {POLL_SECONDS * 1000:g} ms)",
            ),
        ):
            with b.fresh_schema(self.url, "raw8") as url:
                b.raw_prepare(url)
                raw_share = in_subprocess(raw_idle, url, d, s.idle_seconds)
            with b.fresh_schema(self.url, "jj8") as url:
                b.open_(url, d).close()  # the schema first, as SQLite's file is
                ours = in_subprocess(workloads.idle_cpu, url, d, s.idle_seconds, poll)
            figures.append(
                Figure(
                    8,
                    key,
                    text,
                    "% of a core",
                    "lower",
                    raw_share * 100,
                    {JAREN: ours * 100},
                    extra={"seconds": s.idle_seconds, "poll_seconds": poll},
                )
            )
        return figures

    def w9(self) -> list[Figure]:
        """Memory while draining: the Python heap's and RSS's slope, and the peak."""
        s, d = self.sizes, self.durability

        def drain(fn: Any, name: str, jobs: int, heap: bool) -> list[tuple[int, int]]:
            with b.fresh_schema(self.url, name) as url:
                if fn is workloads.memory:
                    b.open_(url, d).close()
                else:
                    b.raw_prepare(url)
                samples: list[tuple[int, int]] = in_subprocess(fn, url, d, jobs, heap)
            return samples

        raw_rss = drain(b.raw_memory, "raw9", s.memory_jobs, False)
        our_rss = drain(workloads.memory, "jj9", s.memory_jobs, False)
        raw_heap = drain(b.raw_memory, "raw9h", s.heap_jobs, True)
        our_heap = drain(workloads.memory, "jj9h", s.heap_jobs, True)
        return memory_figures(
            {"raw heap": raw_heap, "our heap": our_heap, "raw rss": raw_rss, "our rss": our_rss},
            s.heap_jobs,
            s.memory_jobs,
            "claim 100 and complete 100 per statement; ours: a worker, c=4",
        )

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
        for peer in self.peers:
            log(f"  {peer.name}")
            with b.fresh_schema(self.url, peer.name) as schema:
                remote[peer.name] = peer.latency(self.peer_url(schema), s.latency_remote)
        return latency_figures(local, remote, f"{b.PG_POLL:g} s poll, LISTEN/NOTIFY")


def run(  # noqa: PLR0917 - the runner's one call site passes them in order
    report: Report,
    sizes: Sizes,
    durability: str,
    url: str,
    only: set[int],
    peers: Sequence[pp.PgPeer] = (),
) -> None:
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
    runner = PgRunner(sizes, durability, url, peers)
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
