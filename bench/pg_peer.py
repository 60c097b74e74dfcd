"""What every PostgreSQL peer's adapter shares: the base class, its workloads, its children.

The adapters themselves are in :mod:`bench.pg_peers` (procrastinate, pgqueuer,
chancy) and :mod:`bench.pg_oban` (oban, and running it in another interpreter).
A workload child gets its adapter pickled in its spec (its class, by import
path), so this module needs no registry of them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from bench import Channels, Package, Timer, drain_in_processes, remote_latency

__all__ = [
    "POLL",
    "QUEUE",
    "TASK",
    "PgPeer",
    "asyncpg_connect_args",
    "latency_consumer",
    "process_drainer",
    "with_durability",
]

QUEUE = "bench"
TASK = "noop"
WAIT = 600.0
# the fallback poll of every peer's idle consumer, as jaren_jobs' PG_POLL in bench.pg:
# a start much sooner than this is the peer's LISTEN/NOTIFY wake-up, not its poll
POLL = 1.0

Run = Callable[[dict[str, Any]], None]

# the run callable of this process's consumer: the peers call a module-level function
# by its import path (chancy) or by a name registered once, so it is looked up here
_RUN: list[Run] = [lambda payload: None]


def with_durability(url: str, durability: str) -> str:
    """``url`` with ``synchronous_commit`` of the run added to its ``options``.

    The peers open connections of their own (pools, listeners); putting the
    setting in the URL reaches every one of them, which a ``SET`` would not.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    options = " ".join(v for k, v in query if k == "options")
    setting = f"-csynchronous_commit={'on' if durability == 'full' else 'off'}"
    query = [(k, v) for k, v in query if k != "options"]
    query.append(("options", f"{options} {setting}".strip()))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def asyncpg_connect_args(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its ``options``, and those ``-cname=value`` as asyncpg's server_settings.

    asyncpg does not read libpq's ``options`` parameter, so the schema and the
    durability travel as settings of the connection's startup packet instead.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    settings: dict[str, str] = {}
    for key, value in query:
        if key == "options":
            for option in value.split():
                name, _, setting = option.removeprefix("-c").partition("=")
                settings[name] = setting
    rest = [(k, v) for k, v in query if k != "options"]
    return urlunsplit(parts._replace(query=urlencode(rest))), settings


class Counter:
    """Counts executions from any thread; sets ``done`` at ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.at = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.target:
                self.at = time.perf_counter()
                self.done.set()


class Loop:
    """An event loop run by the calling thread, one ``run_until_complete`` per call.

    The producer side of a peer (enqueue) runs here, so a put costs no hop
    between threads: the same calling thread as jaren_jobs' ``enqueue``.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class PgPeer(Package):
    """One PostgreSQL peer's adapter. Subclasses fill in the async primitives."""

    # primitives -------------------------------------------------------------
    async def install(self, url: str) -> None:
        """Create the peer's tables in the URL's schema (untimed)."""
        raise NotImplementedError

    async def open(self, url: str) -> Any:
        raise NotImplementedError

    async def close(self, handle: Any) -> None:
        raise NotImplementedError

    async def put(self, handle: Any, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    async def put_many(self, handle: Any, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            await self.put(handle, payload)

    async def work(self, url: str, concurrency: int, stopped: asyncio.Event) -> None:
        """Run the peer's own worker at ``concurrency`` until ``stopped`` is set."""
        raise NotImplementedError

    # sync faces -------------------------------------------------------------
    def setup(self, url: str, jobs: int = 0) -> None:
        """Install, and enqueue ``jobs`` jobs in batches of 1,000 (untimed)."""

        async def main() -> None:
            await self.install(url)
            if jobs:
                handle = await self.open(url)
                try:
                    for start in range(0, jobs, 1_000):
                        await self.put_many(
                            handle, [{"n": i} for i in range(start, min(start + 1_000, jobs))]
                        )
                finally:
                    await self.close(handle)

        asyncio.run(main())

    def enqueue_one(self, url: str, jobs: int) -> float:
        """Workload 1: one enqueue call per job, awaited before the next. Jobs per second."""
        self.setup(url)

        async def main() -> float:
            handle = await self.open(url)
            try:
                with Timer() as timer:
                    for i in range(jobs):
                        await self.put(handle, {"n": i})
            finally:
                await self.close(handle)
            return jobs / timer.seconds

        rate: float = asyncio.run(main())
        return rate

    def consume(self, url: str, concurrency: int, run: Run, stop: threading.Event) -> Any:
        """Start the peer's worker in a thread of this process; returns a joiner."""
        _RUN[0] = run
        started = threading.Event()
        holder: dict[str, Any] = {}

        async def main() -> None:
            stopped = asyncio.Event()
            holder["loop"], holder["stopped"] = asyncio.get_running_loop(), stopped
            started.set()
            await self.work(url, concurrency, stopped)

        def target() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # reported by the joiner
                holder["error"] = exc
                started.set()

        thread = threading.Thread(target=target, daemon=True, name=f"{self.name}-worker")
        thread.start()
        started.wait(60)

        def join() -> None:
            stop.set()
            loop = holder.get("loop")
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(holder["stopped"].set)
            thread.join(30)
            if "error" in holder:
                raise RuntimeError(f"bench: the {self.name} worker failed") from holder["error"]

        def failed() -> BaseException | None:
            error: BaseException | None = holder.get("error")
            return error

        join.failed = failed  # type: ignore[attr-defined]
        return join

    def drain(self, url: str, jobs: int, concurrency: int) -> float:
        """Workload 4: the peer's worker drains ``jobs`` no-op jobs. Jobs per second.

        Timed from the first job's start (so neither the peer's start-up — its
        pools, LISTEN, schema checks, plugins — nor its first claim is in it, as
        for jaren_jobs in :func:`bench.pg.drain`) to the last job's execution: a
        peer that writes completions in batches after the handler returns is
        not charged for that tail (:attr:`notes` says which do), where
        jaren_jobs' clock stops at its last settlement.
        """
        self.setup(url, jobs)
        counter = Counter(jobs)
        first: list[float] = []

        def run(payload: dict[str, Any]) -> None:
            if not first:
                first.append(time.perf_counter())
            counter.hit(payload)

        stop = threading.Event()
        join = self.consume(url, concurrency, run, stop)
        try:
            end = time.monotonic() + WAIT
            while not counter.done.wait(0.05):
                if join.failed() is not None or time.monotonic() > end:
                    raise TimeoutError(f"bench: {self.name} drained {counter.count} of {jobs}")
        finally:
            join()
        return jobs / (counter.at - first[0])

    def processes(self, url: str, jobs: int, processes: int) -> tuple[float, int]:
        """Workloads 5 and 10: ``processes`` worker processes (concurrency 1 each) drain ``jobs``.

        Returns (jobs per second, duplicate executions).
        """
        self.setup(url, jobs)
        spec = {"peer": self, "url": url, "concurrency": 1}  # pickled: its class
        rate, duplicates, _ = drain_in_processes(
            process_drainer, spec, jobs=jobs, processes=processes
        )
        return rate, duplicates

    def latency(self, url: str, samples: int) -> list[float]:
        """Workload 6: enqueue-to-start, in seconds, into an idle worker in another process."""
        self.setup(url)
        enqueue, close = self.producer(url)
        try:
            return remote_latency(
                latency_consumer, {"peer": self, "url": url}, enqueue, samples=samples
            )
        finally:
            close()

    def producer(self, url: str) -> tuple[Callable[[int, float], None], Callable[[], None]]:
        """``(enqueue(n, t), close)`` in the calling thread, for the latency workload."""
        loop = Loop()
        handle = loop.run(self.open(url))

        def enqueue(n: int, t: float) -> None:
            loop.run(self.put(handle, {"n": n, "t": t}))

        def close() -> None:
            loop.run(self.close(handle))
            loop.close()

        return enqueue, close


# ---------------------------------------------------------------- child processes


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 and scale-out child: one worker of the peer in this process.

    The worker starts before the shared clock and says it is ready from its
    first job, which it holds until ``go``, so its start-up is not timed (as
    jaren_jobs' children in :func:`bench.pg.process_drainer`).
    """
    peer: PgPeer = spec["peer"]
    halt = threading.Event()
    reached = threading.Event()

    def run(payload: dict[str, Any]) -> None:
        if not reached.is_set():
            reached.set()
            channels.ready.set()
            channels.go.wait()
        channels.executed(payload["n"])

    join = peer.consume(spec["url"], spec["concurrency"], run, halt)
    channels.stop.wait()
    join()


def latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    """Workload 6 child: one idle worker of the peer, reporting each start."""
    peer: PgPeer = spec["peer"]
    halt = threading.Event()

    def run(payload: dict[str, Any]) -> None:
        reports.put((payload["n"], time.monotonic() - payload["t"]))

    join = peer.consume(spec["url"], 1, run, halt)
    # consume() returns once the peer's loop runs, before its LISTEN may be in place:
    # a second's grace keeps the first sample from meeting the fallback poll instead
    stop.wait(1.0)
    ready.set()
    stop.wait()
    join()
