"""oban (oban-py), the one PostgreSQL peer that needs Python 3.12, and how a 3.11 bench runs it.

:class:`Oban` is the adapter, through oban's public API. Where the bench runs
on an older Python, :class:`Remote` runs each of its workloads in a child of a
3.12 interpreter (``--oban-python``; :mod:`bench.pg_remote` is the child).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.pg_peer import _RUN, POLL, QUEUE, PgPeer, asyncpg_connect_args

__all__ = ["OBAN_PYTHON_ENV", "Oban", "Remote"]

# where a Python >= 3.12 interpreter with oban installed is found when the bench runs on
# an older one (``--oban-python`` says it too)
OBAN_PYTHON_ENV = "JAREN_JOBS_BENCH_OBAN_PYTHON"
# the bench package's own folder's parent: what a remote interpreter needs on its path
ROOT = Path(__file__).resolve().parent.parent
# a remote workload's longest run: a full drain or latency run, with the child's start-up
REMOTE_TIMEOUT = 1800.0


def schema_of(url: str) -> str:
    """The schema a bench URL's ``search_path`` names (:func:`bench.pg.fresh_schema`)."""
    return asyncpg_connect_args(url)[1].get("search_path", "public").strip('"')


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
