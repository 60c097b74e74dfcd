"""The SQLite half of the runner: every workload beside raw ``sqlite3``, and the peers.

Each measurement gets a fresh file in the run's scratch directory. The runner
(:mod:`bench.run`) makes one :class:`Runner` per round; :mod:`bench.pg_run`
is the PostgreSQL half.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import (
    POLL_SECONDS,
    Sizes,
    drain_in_processes,
    in_subprocess,
    median,
    raw,
    remote_latency,
    workloads,
)
from bench.peers import Peer
from bench.report import (
    JAREN,
    WORKLOADS,
    Figure,
    latency_figures,
    log,
    memory_figures,
    scale_figure,
)

__all__ = ["Runner"]


class Runner:
    def __init__(self, sizes: Sizes, durability: str, scratch: Path, peers: Sequence[Peer]) -> None:
        self.sizes = sizes
        self.durability = durability
        self.scratch = scratch
        self.peers = list(peers)
        self._files = 0

    def fresh(self, name: str) -> Path:
        """A new path in the scratch directory (never reused, so no run sees another's file).

        Flushes the page cache first: under ``synchronous=FULL`` an fsync also
        waits for whatever else is dirty on the filesystem (ext4 commits its
        journal as a whole), so the previous measurement's writes must not be
        billed to the next one.
        """
        os.sync()
        self._files += 1
        return self.scratch / f"{self._files:03d}-{name}"

    def rounds(self, fn: Callable[[Path], float], name: str) -> float:
        return median([fn(self.fresh(name)) for _ in range(self.sizes.rounds)])

    # ------------------------------------------------------------ the workloads

    def w1(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        figure = Figure(1, "1", WORKLOADS[1], "jobs/s", "higher", None)
        raws, ours = [], []
        for _ in range(s.rounds):  # interleaved, so drift hits both alike
            raws.append(raw.enqueue_one(self.fresh("raw.db"), d, s.enqueue))
            ours.append(workloads.enqueue_one(self.fresh("jj.db"), d, s.enqueue))
        figure.raw, figure.values[JAREN] = median(raws), median(ours)
        for peer in self.peers:
            figure.values[peer.name] = self.rounds(
                functools.partial(peer.enqueue_one, durability=d, jobs=s.enqueue), peer.name
            )
        return [figure]

    def w2(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        figure = Figure(2, "2", f"{WORKLOADS[2]} of {s.batch}", "jobs/s", "higher", None)
        raws, ours = [], []
        for _ in range(s.rounds):
            raws.append(raw.enqueue_batches(self.fresh("raw.db"), d, s.enqueue_many, s.batch))
            ours.append(workloads.enqueue_batches(self.fresh("jj.db"), d, s.enqueue_many, s.batch))
        figure.raw, figure.values[JAREN] = median(raws), median(ours)
        one = Figure(
            2,
            "2.one",
            f"enqueue_many of {s.enqueue_many_one:,} jobs in one call",
            "jobs/s",
            "higher",
            None,
            extra={"raw_is": f"executemany of the same {s.enqueue_many_one:,} rows"},
        )
        raws, ours = [], []
        for _ in range(s.rounds):
            raws.append(raw.enqueue_many_one(self.fresh("raw.db"), d, s.enqueue_many_one))
            ours.append(workloads.enqueue_many_one(self.fresh("jj.db"), d, s.enqueue_many_one))
        one.raw, one.values[JAREN] = median(raws), median(ours)
        return [figure, one]

    def w3(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        figure = Figure(3, "3", WORKLOADS[3], "jobs/s", "higher", None)
        raws, ours = [], []
        for _ in range(s.rounds):
            raws.append(raw.claim_complete_one(self.fresh("raw.db"), d, s.claim_complete))
            ours.append(workloads.claim_complete_one(self.fresh("jj.db"), d, s.claim_complete))
        figure.raw, figure.values[JAREN] = median(raws), median(ours)
        for peer in self.peers:
            figure.values[peer.name] = self.rounds(
                functools.partial(peer.claim_complete_one, durability=d, jobs=s.claim_complete),
                peer.name,
            )
        return [figure]

    def w4(self, one_at_a_time: float | None) -> list[Figure]:
        s, d = self.sizes, self.durability
        if one_at_a_time is None:  # workload 3 was not run: measure its raw rate here
            one_at_a_time = raw.claim_complete_one(self.fresh("raw.db"), d, s.claim_complete)
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
            figure.values[JAREN] = self.rounds(
                functools.partial(
                    workloads.drain, durability=d, jobs=s.drain, concurrency=concurrency
                ),
                "jj.db",
            )
            for peer in self.peers:
                peer.take_errors()
                figure.values[peer.name] = peer.drain(
                    self.fresh(peer.name), d, s.drain, concurrency
                )
                errors = peer.take_errors()
                if errors:
                    figure.extra.setdefault("errors", {})[peer.name] = errors
            figures.append(figure)
        figures.append(self.w4_async(one_at_a_time))
        ceiling = Figure(
            4,
            "4.batched",
            "raw claim + complete, 100 jobs per transaction (the ceiling)",
            "jobs/s",
            "higher",
            raw.drain_batched(self.fresh("raw.db"), d, s.raw_batch_drain),
            extra={"raw_is": "claim 100 in one transaction, complete 100 in one"},
        )
        c4 = next((f for f in figures if f.extra["concurrency"] == 4), None)
        if c4 is not None:
            ceiling.values[JAREN + " c=4"] = c4.values[JAREN]
        figures.append(ceiling)
        return figures

    def w4_async(self, one_at_a_time: float) -> Figure:
        """The AsyncWorker at concurrency 4, interleaved with the thread worker's rounds."""
        s, d = self.sizes, self.durability
        figure = Figure(
            4,
            "4.async",
            "an AsyncWorker draining no-op async jobs, concurrency 4",
            "jobs/s",
            "higher",
            one_at_a_time,
            extra={"concurrency": 4, "raw_is": "claim + complete one at a time"},
        )
        figure.values[JAREN] = self.rounds(
            functools.partial(workloads.drain_async, durability=d, jobs=s.drain, concurrency=4),
            "jj.db",
        )
        return figure

    def w5(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        figure = Figure(
            5,
            "5",
            f"{s.processes} worker processes on one file",
            "jobs/s",
            "higher",
            None,
            extra={"duplicates": {}},
        )
        spec = raw.processes_setup(self.fresh("raw.db"), d, s.process_jobs)
        figure.raw, dup, _ = drain_in_processes(
            raw.process_drainer, spec, jobs=s.process_jobs, processes=s.processes
        )
        figure.extra["duplicates"]["raw"] = dup
        spec = workloads.processes_setup(self.fresh("jj.db"), d, s.process_jobs, 1)
        figure.values[JAREN], dup, _ = drain_in_processes(
            workloads.process_drainer, spec, jobs=s.process_jobs, processes=s.processes
        )
        figure.extra["duplicates"][JAREN] = dup
        for peer in self.peers:
            from bench import peers as peer_module

            path = self.fresh(peer.name)
            peer.setup_file(path, d, s.process_jobs)
            spec = {"peer": peer.name, "path": str(path), "durability": d, "concurrency": 1}
            figure.values[peer.name], dup, errors = drain_in_processes(
                peer_module.process_drainer, spec, jobs=s.process_jobs, processes=s.processes
            )
            figure.extra["duplicates"][peer.name] = dup
            if errors:
                figure.extra.setdefault("errors", {})[peer.name] = errors
        return [figure]

    def w10(self) -> list[Figure]:
        """Scale-out: 1, 2, 4, 8 worker processes (concurrency 1 each) on one file."""
        from bench import peers as peer_module

        s, d = self.sizes, self.durability
        figures = []
        for processes in s.scale_processes:
            log(f"  {processes} processes")
            figure = scale_figure(
                processes, "file", "claim 100 + complete 100 per transaction in each process"
            )
            spec = raw.processes_setup(self.fresh("raw.db"), d, s.scale_jobs)
            figure.raw, dup, _ = drain_in_processes(
                raw.batched_process_drainer, spec, jobs=s.scale_jobs, processes=processes
            )
            figure.extra["duplicates"]["raw"] = dup
            spec = workloads.processes_setup(self.fresh("jj.db"), d, s.scale_jobs, 1)
            figure.values[JAREN], dup, _ = drain_in_processes(
                workloads.process_drainer, spec, jobs=s.scale_jobs, processes=processes
            )
            figure.extra["duplicates"][JAREN] = dup
            for peer in self.peers if s.scale_peers else []:
                path = self.fresh(peer.name)
                peer.setup_file(path, d, s.scale_jobs)
                spec = {"peer": peer.name, "path": str(path), "durability": d, "concurrency": 1}
                figure.values[peer.name], dup, errors = drain_in_processes(
                    peer_module.process_drainer, spec, jobs=s.scale_jobs, processes=processes
                )
                figure.extra["duplicates"][peer.name] = dup
                if errors:
                    figure.extra.setdefault("errors", {})[peer.name] = errors
            figures.append(figure)
        return figures

    def w6(self) -> list[Figure]:
        from bench import peers as peer_module

        s, d = self.sizes, self.durability
        local: dict[str, list[float]] = {}
        remote: dict[str, list[float]] = {}
        local["raw"] = raw.latency_local(self.fresh("raw.db"), d, s.latency_local)
        local[JAREN] = workloads.latency_local(self.fresh("jj.db"), d, s.latency_local)
        for peer in self.peers:
            local[peer.name] = peer.latency_local(self.fresh(peer.name), d, s.latency_local)

        spec, enqueue = raw.latency_remote_setup(self.fresh("raw.db"), d)
        remote["raw"] = remote_latency(
            raw.latency_consumer, spec, enqueue, samples=s.latency_remote
        )
        spec, enqueue, close = workloads.latency_remote_setup(self.fresh("jj.db"), d)
        try:
            remote[JAREN] = remote_latency(
                workloads.latency_consumer, spec, enqueue, samples=s.latency_remote
            )
        finally:
            close()
        for peer in self.peers:
            path = self.fresh(peer.name)
            handle = peer.open(path, d)
            try:
                remote[peer.name] = remote_latency(
                    peer_module.latency_consumer,
                    {"peer": peer.name, "path": str(path), "durability": d},
                    functools.partial(_put_timed, peer, handle),
                    samples=s.latency_remote,
                )
            finally:
                peer.close(handle)

        return latency_figures(local, remote, "50 ms poll")

    def w7(self) -> list[Figure]:
        s = self.sizes
        figures = []
        for pending in sorted({p for _, p in s.table_sizes}):
            path = self.fresh(f"table-{pending}.db")
            raw.prepare(path)
            raw.add_pending(path, pending)
            settled_so_far = 0
            for settled in sorted(st for st, p in s.table_sizes if p == pending):
                log(f"  {settled:,} settled + {pending:,} pending")
                raw.add_settled(path, settled - settled_so_far, start=settled_so_far)
                settled_so_far = settled
                ours, raws = self._claim_costs(path)
                figures.append(
                    Figure(
                        7,
                        f"7.{settled}+{pending}",
                        f"claim at {settled:,} settled + {pending:,} pending rows",
                        "ms",
                        "lower",
                        median(raws) * 1000,
                        {JAREN: median(ours) * 1000},
                        extra={"settled": settled, "pending": pending},
                    )
                )
            path.unlink(missing_ok=True)
        return figures

    def _claim_costs(self, path: Path) -> tuple[list[float], list[float]]:
        ours: list[float] = []
        raws: list[float] = []
        conn = raw.connect(path, self.durability)
        os.sync()  # the rows just built must not be flushed by the first timed fsync
        with workloads.open_(path, self.durability) as store:
            for _ in range(3):  # warm both connections' page caches alike
                workloads.claim_cost(store)
                raw.claim_cost(conn)
            for _ in range(self.sizes.table_claims):  # interleaved
                ours.append(workloads.claim_cost(store))
                raws.append(raw.claim_cost(conn))
        conn.close()
        return ours, raws

    def w8(self) -> list[Figure]:
        s, d = self.sizes, self.durability
        path = self.fresh("raw.db")
        raw.prepare(path)
        raw_share = in_subprocess(raw.idle_cpu, str(path), d, s.idle_seconds)
        path = self.fresh("jj.db")
        raw.prepare(path)
        ours = in_subprocess(workloads.idle_cpu, str(path), d, s.idle_seconds, POLL_SECONDS)
        return [
            Figure(
                8,
                "8",
                "CPU of an idle worker, 50 ms poll (raw: a claim transaction every 50 ms)",
                "% of a core",
                "lower",
                raw_share * 100,
                {JAREN: ours * 100},
                extra={"seconds": s.idle_seconds},
            )
        ]

    def w9(self) -> list[Figure]:
        s, d = self.sizes, self.durability

        def drain(module: Any, name: str, jobs: int, heap: bool) -> list[tuple[int, int]]:
            path = self.fresh(name)
            raw.prepare(path)
            samples: list[tuple[int, int]] = in_subprocess(module.memory, str(path), d, jobs, heap)
            return samples

        raw_rss = drain(raw, "raw.db", s.memory_jobs, False)
        our_rss = drain(workloads, "jj.db", s.memory_jobs, False)
        raw_heap = drain(raw, "raw.db", s.heap_jobs, True)
        our_heap = drain(workloads, "jj.db", s.heap_jobs, True)
        return memory_figures(
            {"raw heap": raw_heap, "our heap": our_heap, "raw rss": raw_rss, "our rss": our_rss},
            s.heap_jobs,
            s.memory_jobs,
            "claim 100 and complete 100 per transaction; ours: a worker, c=4",
        )


def _put_timed(peer: Peer, handle: Any, n: int, t: float) -> None:
    peer.put(handle, {"n": n, "t": t})
