"""Server settings a DBA may choose, set where a DBA sets them: on the role.

Each test makes a login role of its own (dropped afterwards) with the
setting, and opens the store as that role on a fresh schema:

* ``default_transaction_isolation = 'serializable'``: the library's own
  transactions still run at READ COMMITTED, and the workers' ordinary waits
  never turn into dead letters (issue 26 item 4);
* ``idle_session_timeout``: a pooled connection the server closed while idle
  is replaced before use, so no call fails for it, sync or async (item 5).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import jaren_jobs
from jaren_jobs import NewJob, Outcome, StorageError
from tests.harness import PostgresUrl, with_search_path

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

WAIT = 30.0


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.02)


def as_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.fixture
def role(pg: PostgresUrl) -> Iterator[Callable[[str], str]]:
    """``role(setting)``: the URL of a fresh login role with ``ALTER ROLE ... SET setting``,
    whose search_path is the test's schema."""
    made: list[str] = []

    def make(setting: str) -> str:
        name = f"jr_{secrets.token_hex(5)}"
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{name}" LOGIN SUPERUSER')
            admin.execute(f'ALTER ROLE "{name}" SET {setting}')
        made.append(name)
        return with_search_path(as_user(pg.server_url, name), pg.schema)

    yield make
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        for name in made:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(f'DROP OWNED BY "{name}" CASCADE')  # its tables in the test's schema
            admin.execute(f'DROP ROLE IF EXISTS "{name}"')


def _sessions_of(pg: PostgresUrl, user: str) -> set[int]:
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE usename = %s", (user,)
        ).fetchall()
    return {int(pid) for (pid,) in rows}


# ------------------------------------------------------------ isolation


def test_the_librarys_transactions_run_at_read_committed_whatever_the_roles_default(
    pg: PostgresUrl, role: Callable[[str], str]
) -> None:
    url = role("default_transaction_isolation = 'serializable'")
    with psycopg.connect(url, autocommit=True) as probe:
        assert probe.execute("SHOW transaction_isolation").fetchone()[0] == "serializable"
    with jaren_jobs.open_store(url) as store:
        with store.transaction() as tx:
            (level,) = tx.execute("SHOW transaction_isolation").fetchone()
            assert level == "read committed"
            tx.jobs.enqueue("k", id="one")
        assert store.jobs.get("one") is not None


def test_a_serializable_default_dead_letters_no_successful_handler(
    pg: PostgresUrl, role: Callable[[str], str]
) -> None:
    url = role("default_transaction_isolation = 'serializable'")
    total = 600
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def observe(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)

    with jaren_jobs.open_store(url) as store:
        store.jobs.enqueue_many(NewJob("ok", {"n": n}, max_attempts=1) for n in range(total))
        worker = store.jobs.create_worker(
            {"ok": lambda payload, ctx: payload["n"]},
            concurrency=6,
            poll_seconds=0.05,
            on_outcome=observe,
        )
        with worker:
            _wait_until(lambda: len(outcomes) >= total, "every job's outcome")
        counts = store.jobs.counts()
    assert (counts.done, counts.dead, counts.failed) == (total, 0, 0)
    assert {o.outcome for o in outcomes} == {"completed"}


def test_an_async_worker_under_a_serializable_default_completes_every_job(
    pg: PostgresUrl, role: Callable[[str], str]
) -> None:
    url = role("default_transaction_isolation = 'serializable'")
    total = 300

    async def main() -> tuple[int, int, int]:
        done = asyncio.Event()
        seen: list[str] = []

        def observe(outcome: Outcome) -> None:
            seen.append(outcome.outcome)
            if len(seen) >= total:
                done.set()

        async def handler(payload: Any, ctx: Any) -> int:
            return int(payload["n"])

        async with jaren_jobs.open_async_store(url) as store:
            await store.jobs.enqueue_many(
                NewJob("ok", {"n": n}, max_attempts=1) for n in range(total)
            )
            async with store.jobs.create_worker(
                {"ok": handler}, concurrency=6, poll_seconds=0.05, on_outcome=observe
            ):
                await asyncio.wait_for(done.wait(), WAIT)
            assert set(seen) == {"completed"}
            counts = await store.jobs.counts()
            return counts.done, counts.dead, counts.failed

    assert asyncio.run(main()) == (total, 0, 0)


def test_the_connection_lost_hint_is_given_for_connection_errors_only() -> None:
    from jaren_jobs.backends.postgres.errors import storage_error

    lost = "the connection to PostgreSQL failed or was lost"
    for conflict in (
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
    ):
        error = storage_error(conflict, "claim()")
        assert isinstance(error, StorageError)
        assert lost not in error.message
        assert "retries" in error.message
    assert lost in storage_error(psycopg.OperationalError("server closed"), "claim()").message
    assert lost in storage_error(psycopg.errors.AdminShutdown("bye"), "claim()").message


# ------------------------------------------------------------ idle_session_timeout


def test_a_connection_the_server_closed_while_idle_is_replaced_before_use(
    pg: PostgresUrl, role: Callable[[str], str]
) -> None:
    url = role("idle_session_timeout = '300ms'")
    user = urlsplit(url).username
    assert user is not None
    with jaren_jobs.open_store(url, pool_size=4) as store:
        for quiet in range(3):
            store.jobs.enqueue("k", id=f"warm-{quiet}")
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id=f"tx-{quiet}")
            # the quiet spell: the server ends every idle session of the pool
            _wait_until(lambda: not _sessions_of(pg, user), "the server to close them")
            for n in range(10):
                store.jobs.enqueue("k", id=f"after-{quiet}-{n}")
                assert store.jobs.get(f"after-{quiet}-{n}") is not None
            assert store.jobs.counts().pending == 12 * (quiet + 1)


def test_an_async_store_replaces_what_the_server_closed_while_idle(
    pg: PostgresUrl, role: Callable[[str], str]
) -> None:
    url = role("idle_session_timeout = '300ms'")
    user = urlsplit(url).username
    assert user is not None

    async def main() -> int:
        async with jaren_jobs.open_async_store(url) as store:
            await asyncio.gather(*(store.jobs.enqueue("k", id=f"w{n}") for n in range(4)))
            await asyncio.to_thread(
                _wait_until, lambda: not _sessions_of(pg, user), "the server to close them"
            )
            for n in range(10):
                await store.jobs.enqueue("k", id=f"after-{n}")
            async with store.transaction() as tx:
                await tx.jobs.enqueue("k", id="in-tx")
            return (await store.jobs.counts()).pending

    assert asyncio.run(main()) == 15
