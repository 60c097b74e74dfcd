"""The PostgreSQL peers: procrastinate, pgqueuer, chancy and oban, each through its own API.

Each adapter enqueues, drains and listens through the peer's documented API
(all four are asyncio-first: the adapter runs the peer's own event loop in a
thread of its own), in a fresh schema (the URL's ``search_path``), at the run's
durability: every connection the peer opens carries ``synchronous_commit`` of
the run (``on`` for ``full``) in its URL, and the server's ``fsync`` is on.
Where a peer cannot be set to match, or records less than jaren_jobs does,
:attr:`PgPeer.notes` says so and the report prints it.

oban (oban-py) needs Python 3.12: on an older interpreter the bench runs it in
a 3.12 one given by ``--oban-python`` (:class:`Remote`, :func:`resolve`), or
reports it skipped with the reason.

Install them with the optional extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from bench import Channels, Timer, drain_in_processes, remote_latency

__all__ = ["PG_PEERS", "PgPeer", "Remote", "resolve", "with_durability"]

QUEUE = "bench"
TASK = "noop"
WAIT = 600.0
# the fallback poll of every peer's idle consumer, as jaren_jobs' PG_POLL in bench.pg:
# a start much sooner than this is the peer's LISTEN/NOTIFY wake-up, not its poll
POLL = 1.0

# where a Python >= 3.12 interpreter with oban installed is found when the bench runs on
# an older one (``--oban-python`` says it too)
OBAN_PYTHON_ENV = "JAREN_JOBS_BENCH_OBAN_PYTHON"
# the bench package's own folder's parent: what a remote interpreter needs on its path
ROOT = Path(__file__).resolve().parent.parent
# a remote workload's longest run: a full drain or latency run, with the child's start-up
REMOTE_TIMEOUT = 1800.0

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


class PgPeer:
    """One PostgreSQL peer's adapter. Subclasses fill in the async primitives."""

    name = ""
    package = ""
    notes: tuple[str, ...] = ()

    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def available(self) -> bool:
        try:
            self.version()
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

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
        spec = {"peer": self.name, "url": url, "concurrency": 1}
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
                latency_consumer, {"peer": self.name, "url": url}, enqueue, samples=samples
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


def _payload(n: int, t: float | None) -> dict[str, Any]:
    return {"n": n} if t is None else {"n": n, "t": t}


# ---------------------------------------------------------------- procrastinate

_PROCRASTINATE_APPS: dict[str, Any] = {}


async def _procrastinate_job(n: int, t: float | None = None) -> None:
    _RUN[0](_payload(n, t))


class Procrastinate(PgPeer):
    """procrastinate: ``defer_async`` inserts a job row; its worker fetches, runs, finishes it."""

    name = "procrastinate"
    package = "procrastinate"
    notes = (
        "procrastinate's task is an async function (its documented fast path: a sync task "
        "runs in a thread); the worker's concurrency is its own, LISTEN/NOTIFY on, "
        f"a {POLL:g} s fallback poll.",
        "it records an outcome per job (status succeeded/failed) and retries by its "
        "own policy, but has no fence: a stalled worker's job is retried only by a "
        "retry_stalled_jobs call the application makes.",
    )

    def app(self, url: str) -> Any:
        """One App per URL and process, with the no-op task registered."""
        import procrastinate

        app = _PROCRASTINATE_APPS.get(url)
        if app is None:
            app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
            app.task(name=TASK, queue=QUEUE)(_procrastinate_job)
            _PROCRASTINATE_APPS[url] = app
        return app

    async def install(self, url: str) -> None:
        app = self.app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def open(self, url: str) -> Any:
        app = self.app(url)
        await app.open_async()
        return app

    async def close(self, handle: Any) -> None:
        await handle.close_async()

    async def put(self, handle: Any, payload: dict[str, Any]) -> None:
        await handle.tasks[TASK].defer_async(**payload)

    async def put_many(self, handle: Any, payloads: list[dict[str, Any]]) -> None:
        await handle.tasks[TASK].batch_defer_async(*payloads)

    async def work(self, url: str, concurrency: int, stopped: asyncio.Event) -> None:
        app = self.app(url)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[QUEUE],
                    concurrency=concurrency,
                    wait=True,
                    install_signal_handlers=False,
                    fetch_job_polling_interval=POLL,
                    listen_notify=True,
                )
            )
            waiter = asyncio.create_task(stopped.wait())
            await asyncio.wait((worker, waiter), return_when=asyncio.FIRST_COMPLETED)
            worker.cancel()  # procrastinate's documented graceful stop of run_worker_async
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            waiter.cancel()


# ---------------------------------------------------------------- pgqueuer


class PgQueuer(PgPeer):
    """pgqueuer: ``Queries.enqueue`` inserts a row; a ``PgQueuer`` dequeues in batches."""

    name = "pgqueuer"
    package = "pgqueuer"
    notes = (
        "pgqueuer deletes a job's row when it finishes and writes the outcome to its log "
        "table in batches (after up to 10 finished jobs or 0.1 s): a drain is timed to the "
        "last job's execution, as for every subject, and its log write may follow.",
        "pgqueuer has no per-worker concurrency below twice its dequeue batch: its "
        "entrypoint's concurrency_limit counts picked jobs across every worker and frees a "
        "slot only when the log batch is written (3 jobs in 5 s at a limit of 1 here), so "
        "every workload runs it at its defaults (batches of 10, no limit, async handlers on "
        "one event loop): its 'concurrency 1' and '4' are the same configuration, its best.",
        "a job whose worker dies is re-picked after its heartbeat times out (30 s); "
        "there is no fence, so a stalled-but-alive worker and its successor can both "
        "finish it.",
        "its handler is an async function run on its event loop, its durability "
        "setting is 'durable' (all tables logged), through asyncpg, its primary driver: "
        "its psycopg driver waits for notifications on the connection its queries use, "
        "so a dequeue can wait up to a second behind the listener (measured here: ~1 s "
        "enqueue-to-start, 180 jobs/s).",
    )

    def available(self) -> bool:
        try:
            importlib.metadata.version("asyncpg")
        except importlib.metadata.PackageNotFoundError:
            return False
        return super().available()

    async def connect(self, url: str) -> Any:
        import asyncpg

        dsn, settings = asyncpg_connect_args(url)
        return await asyncpg.connect(dsn, server_settings=settings)

    async def install(self, url: str) -> None:
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        conn = await self.connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def open(self, url: str) -> Any:
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        conn = await self.connect(url)
        return conn, Queries(AsyncpgDriver(conn))

    async def close(self, handle: Any) -> None:
        await handle[0].close()

    async def put(self, handle: Any, payload: dict[str, Any]) -> None:
        await handle[1].enqueue(TASK, json.dumps(payload).encode(), 0)

    async def put_many(self, handle: Any, payloads: list[dict[str, Any]]) -> None:
        await handle[1].enqueue(
            [TASK] * len(payloads),
            [json.dumps(p).encode() for p in payloads],
            [0] * len(payloads),
        )

    async def work(self, url: str, concurrency: int, stopped: asyncio.Event) -> None:
        from datetime import timedelta

        from pgqueuer import PgQueuer as App
        from pgqueuer.db import AsyncpgDriver

        conn = await self.connect(url)
        pgq = App(AsyncpgDriver(conn))

        # concurrency is pgqueuer's own (see notes): no entrypoint limit, its default batch
        @pgq.entrypoint(TASK)
        async def noop(job: Any) -> None:
            _RUN[0](json.loads(job.payload))

        runner = asyncio.create_task(pgq.run(dequeue_timeout=timedelta(seconds=POLL)))
        waiter = asyncio.create_task(stopped.wait())
        await asyncio.wait((runner, waiter), return_when=asyncio.FIRST_COMPLETED)
        pgq.shutdown.set()
        await runner
        waiter.cancel()
        await conn.close()


# ---------------------------------------------------------------- chancy


async def chancy_job(n: int, t: float | None = None) -> None:
    """The no-op job chancy's worker imports by name (``bench.pg_peers.chancy_job``)."""
    _RUN[0](_payload(n, t))


class Chancy(PgPeer):
    """chancy: ``push`` inserts a job row; its worker fetches, runs and updates it."""

    name = "chancy"
    package = "chancy"
    notes = (
        "chancy's queue uses its asyncio executor (an async job function) at the workload's "
        "concurrency, eager polling on, LISTEN/NOTIFY on, a 1 s fallback poll (its poll "
        "interval is whole seconds); its default plugins (leadership, pruner, recovery, "
        "metrics, workflows) run as they would for a user.",
        "its worker writes job outcomes in batches every send_outgoing_interval (set to "
        "10 ms here, 1 s by default): a drain is timed to the last job's execution, and "
        "the outcome rows follow.",
        "a job whose worker dies is recovered by its Recovery plugin after the worker's "
        "heartbeat times out; there is no fence against a stalled worker finishing it late.",
    )

    def chancy(self, url: str) -> Any:
        import logging

        from chancy import Chancy as App

        # chancy's default logger prints every job it pulls at INFO through rich (~10 ms
        # a job here): a production worker logs warnings, so this one does
        log = logging.getLogger("bench.chancy")
        log.setLevel(logging.WARNING)
        return App(url, log=log)

    async def install(self, url: str) -> None:
        from chancy import Queue

        async with self.chancy(url) as chancy:
            await chancy.migrate()
            await chancy.declare(Queue(QUEUE, concurrency=1))
            # every chancy worker serves the queue 'default' (it declares it if missing)
            # with a process pool: declared first here with the asyncio executor, it
            # costs no pool (and a daemonic bench child could not start one)
            await chancy.declare(Queue("default", executor=chancy.Executor.Async))

    async def open(self, url: str) -> Any:
        chancy = self.chancy(url)
        await chancy.__aenter__()
        return chancy

    async def close(self, handle: Any) -> None:
        await handle.__aexit__(None, None, None)

    def _job(self, payload: dict[str, Any]) -> Any:
        from chancy import Job

        return Job.from_func(chancy_job, kwargs=payload, queue=QUEUE)

    async def put(self, handle: Any, payload: dict[str, Any]) -> None:
        await handle.push(self._job(payload))

    async def put_many(self, handle: Any, payloads: list[dict[str, Any]]) -> None:
        async for _ in handle.push_many([self._job(p) for p in payloads]):
            pass

    async def work(self, url: str, concurrency: int, stopped: asyncio.Event) -> None:
        from chancy import Queue, Worker

        async with self.chancy(url) as chancy:
            await chancy.declare(
                Queue(
                    QUEUE,
                    concurrency=concurrency,
                    executor=chancy.Executor.Async,
                    polling_interval=int(POLL),
                    eager_polling=True,
                ),
                upsert=True,
            )
            worker = Worker(chancy, register_signal_handlers=False)
            worker.send_outgoing_interval = 0.01
            await worker.start()
            await stopped.wait()
            await worker.stop()


# ---------------------------------------------------------------- oban


def schema_of(url: str) -> str:
    """The schema a bench URL's ``search_path`` names (:func:`bench.pg.fresh_schema`)."""
    for key, value in parse_qsl(urlsplit(url).query):
        if key == "options":
            for option in value.split():
                name, _, setting = option.removeprefix("-c").partition("=")
                if name == "search_path":
                    return setting.strip('"')
    return "public"


_OBAN_WORKER: list[Any] = []


def oban_worker() -> Any:
    """The no-op worker class, made (and registered with oban) once per process.

    Made here rather than at import so that this module still imports where
    oban cannot be installed (Python 3.11); its name is fixed, so every
    process resolves the jobs' ``worker`` column to it.
    """
    if not _OBAN_WORKER:
        from oban import worker

        class ObanNoop:
            async def process(self, job: Any) -> None:
                _RUN[0](job.args)

        ObanNoop.__module__, ObanNoop.__qualname__ = __name__, "ObanNoop"
        _OBAN_WORKER.append(worker(queue=QUEUE)(ObanNoop))
    return _OBAN_WORKER[0]


class Oban(PgPeer):
    """oban (oban-py): ``Oban.enqueue`` inserts a job row; a queue's producer fetches and acks.

    oban requires Python 3.12 or later: where the bench runs on an older
    interpreter, :class:`Remote` runs this adapter in a 3.12 one
    (``--oban-python``).
    """

    name = "oban"
    package = "oban"
    notes = (
        "oban runs in a Python 3.12 interpreter of its own (its requirement; every other "
        "subject runs in the bench's): Oban(pool=..., queues={queue: concurrency}, "
        "prefix=schema) and an async @worker, at the workload's concurrency (its queue "
        "limit); its insert trigger's NOTIFY wakes the producer, its stager's 1 s loop is "
        "the fallback poll; leadership, pruner, lifeline and refresher run as for a user.",
        "it keeps a finished job's row, as jaren_jobs does, and acknowledges finished "
        "jobs (one UPDATE each, in one transaction) before its producer's next fetch: a "
        "drain is timed to the last job's execution, and its acknowledgement follows.",
        "its acknowledgement matches the attempt's attempted_at, so a rescued job's late "
        "ack is refused; a job whose worker dies is rescued by the leader's lifeline "
        "after 300 s by default.",
    )

    def available(self) -> bool:
        return sys.version_info >= (3, 12) and super().available()

    async def pool(self, url: str) -> Any:
        from oban import Oban as App

        return await App.create_pool(url)

    async def install(self, url: str) -> None:
        from oban.schema import install

        pool = await self.pool(url)
        try:
            await install(pool, prefix=schema_of(url))
        finally:
            await pool.close()

    async def open(self, url: str) -> Any:
        from oban import Oban as App

        pool = await self.pool(url)
        app = App(pool=pool, name=f"bench-producer-{id(pool)}", prefix=schema_of(url))
        await app.start()
        return app, pool

    async def close(self, handle: Any) -> None:
        await handle[0].stop()
        await handle[1].close()

    async def put(self, handle: Any, payload: dict[str, Any]) -> None:
        await handle[0].enqueue(oban_worker().new(payload))

    async def put_many(self, handle: Any, payloads: list[dict[str, Any]]) -> None:
        noop = oban_worker()
        await handle[0].enqueue_many([noop.new(p) for p in payloads])

    async def work(self, url: str, concurrency: int, stopped: asyncio.Event) -> None:
        from oban import Oban as App

        oban_worker()
        pool = await self.pool(url)
        app = App(
            pool=pool,
            name=f"bench-worker-{id(pool)}",
            prefix=schema_of(url),
            queues={QUEUE: concurrency},
            stager={"interval": POLL},
        )
        try:
            async with app:
                await stopped.wait()
        finally:
            await pool.close()


PG_PEERS: dict[str, PgPeer] = {p.name: p for p in (Procrastinate(), PgQueuer(), Chancy(), Oban())}


# ---------------------------------------------------------------- another interpreter


class Remote(PgPeer):
    """A peer whose every workload runs in a child of another Python interpreter.

    oban needs Python 3.12; the bench may run on 3.11. The child
    (``python -m bench.pg_remote``) runs the peer's own adapter on the same
    schema URL and sizes and prints the result as JSON, so the figures are
    timed exactly as in-process ones are (inside the child, from the same
    marks), with the interpreter's start-up outside them.
    """

    def __init__(self, peer: PgPeer, python: str) -> None:
        self.name, self.package, self.notes = peer.name, peer.package, peer.notes
        self.python = python
        self._version: str | None = None

    def call(self, method: str, *args: Any, capture: bool = False) -> Any:
        """Run ``method(*args)`` of the peer in the other interpreter; its result."""
        request = json.dumps({"peer": self.name, "method": method, "args": list(args)})
        path = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        completed = subprocess.run(
            [self.python, "-m", "bench.pg_remote", request],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)},
            stdout=subprocess.PIPE,
            # the child's progress lines go where the bench's own go, unless asked for
            stderr=subprocess.PIPE if capture else None,
            text=True,
            timeout=REMOTE_TIMEOUT,
            check=False,
        )
        lines = completed.stdout.strip().splitlines()
        if completed.returncode != 0 or not lines:
            detail = (completed.stderr or "").strip().splitlines()[-1:] or ["see above"]
            raise RuntimeError(
                f"bench: {self.name}'s {method} in {self.python} exited with "
                f"{completed.returncode}: {detail[0]}"
            )
        return json.loads(lines[-1])["result"]

    def version(self) -> str:
        if self._version is None:
            self._version = str(self.call("version", capture=True))
        return self._version

    def unavailable(self) -> str | None:
        """None if the interpreter runs the peer; else why not."""
        try:
            self.version()
        except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            return f"{self.python} cannot run {self.name}: {exc}"
        return None

    def available(self) -> bool:
        return self.unavailable() is None

    def setup(self, url: str, jobs: int = 0) -> None:
        self.call("setup", url, jobs)

    def enqueue_one(self, url: str, jobs: int) -> float:
        return float(self.call("enqueue_one", url, jobs))

    def drain(self, url: str, jobs: int, concurrency: int) -> float:
        return float(self.call("drain", url, jobs, concurrency))

    def processes(self, url: str, jobs: int, processes: int) -> tuple[float, int]:
        rate, duplicates = self.call("processes", url, jobs, processes)
        return float(rate), int(duplicates)

    def latency(self, url: str, samples: int) -> list[float]:
        return [float(v) for v in self.call("latency", url, samples)]


def resolve(name: str, oban_python: str | None = None) -> PgPeer | str:
    """The adapter that runs peer ``name`` here, or why none can.

    oban runs in this interpreter when it can (Python 3.12 and oban
    installed), else in ``oban_python`` (default: ``$JAREN_JOBS_BENCH_OBAN_PYTHON``).
    """
    peer = PG_PEERS[name]
    if peer.available():
        return peer
    if name != "oban":
        return f"peer {name} is not installed (pip install -e '.[bench]')"
    python = oban_python or os.environ.get(OBAN_PYTHON_ENV)
    if python:
        remote = Remote(peer, python)
        return remote.unavailable() or remote
    if sys.version_info < (3, 12):
        return (
            "peer oban needs Python >= 3.12 and this bench runs on "
            f"{sys.version_info.major}.{sys.version_info.minor}: give --oban-python "
            f"(or ${OBAN_PYTHON_ENV}) a 3.12 interpreter with oban installed, e.g. "
            "python3.12 -m venv .venv-oban && .venv-oban/bin/pip install oban"
        )
    return "peer oban is not installed (pip install -e '.[bench]')"


# ---------------------------------------------------------------- child processes


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 and scale-out child: one worker of the named peer in this process.

    The worker starts before the shared clock and says it is ready from its
    first job, which it holds until ``go``, so its start-up is not timed (as
    jaren_jobs' children in :func:`bench.pg.process_drainer`).
    """
    peer = PG_PEERS[spec["peer"]]
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
    """Workload 6 child: one idle worker of the named peer, reporting each start."""
    peer = PG_PEERS[spec["peer"]]
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
