"""The PostgreSQL peers: procrastinate, pgqueuer, chancy and oban, each through its own API.

Each adapter enqueues, drains and listens through the peer's documented API
(all four are asyncio-first: the adapter runs the peer's own event loop in a
thread of its own), in a fresh schema (the URL's ``search_path``), at the run's
durability: every connection the peer opens carries ``synchronous_commit`` of
the run (``on`` for ``full``) in its URL, and the server's ``fsync`` is on.
Where a peer cannot be set to match, or records less than jaren_jobs does,
:attr:`PgPeer.notes` says so and the report prints it.

oban (oban-py) needs Python 3.12: on an older interpreter the bench runs it in
a 3.12 one given by ``--oban-python`` (:class:`bench.pg_oban.Remote`, :func:`resolve`), or
reports it skipped with the reason.

What every adapter shares is in :mod:`bench.pg_peer`; oban's adapter is in
:mod:`bench.pg_oban`. Install them with the optional extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import sys
from typing import Any

from bench.pg_oban import OBAN_PYTHON_ENV, Oban, Remote
from bench.pg_peer import _RUN, POLL, QUEUE, TASK, PgPeer, asyncpg_connect_args, with_durability

__all__ = ["OBAN_PYTHON_ENV", "PG_PEERS", "PgPeer", "resolve", "with_durability"]


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


PG_PEERS: dict[str, PgPeer] = {p.name: p for p in (Procrastinate(), PgQueuer(), Chancy(), Oban())}


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
