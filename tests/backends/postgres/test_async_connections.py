"""The async store on PostgreSQL runs on psycopg's AsyncConnection: seen from the server
and from the threads of the process.

What the async API promises (same answers as the sync one) is the conformance
suite's, which runs whole on the ``postgres-async`` harness; this file checks
how: no thread per call, the async pool's rules, LISTEN on the loop, and a
server restart under async load.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import AsyncJobContext, AsyncStore, GateRefused, NewJob, Outcome, StorageError
from tests.harness import PostgresUrl
from tests.processes.pg_support import PrivateServer, private_pg, schema_on

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

__all__ = ["private_pg"]

WAIT = 10.0


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), WAIT * 6))


def _pool(store: AsyncStore) -> Any:
    return store._native.db  # the async pool (AsyncPgDatabase)


def _live(pg: PostgresUrl, pids: set[int]) -> set[int]:
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
        ).fetchall()
    return {int(pid) for (pid,) in rows}


async def _pids(store: AsyncStore, n: int) -> tuple[set[int], Callable[[], Awaitable[None]]]:
    """``n`` tasks' transactions open at once: their connections' server pids, and what
    ends them."""
    inside = [asyncio.Event() for _ in range(n)]
    leave = asyncio.Event()
    pids: set[int] = set()

    async def hold(index: int) -> None:
        async with store.transaction() as tx:
            rows = await tx.execute("SELECT pg_backend_pid()")
            pids.add(int(rows.fetchone()[0]))
            inside[index].set()
            await leave.wait()

    tasks = [asyncio.create_task(hold(i)) for i in range(n)]
    for event in inside:
        await asyncio.wait_for(event.wait(), WAIT)

    async def end() -> None:
        leave.set()
        await asyncio.gather(*tasks)

    return pids, end


def test_calls_run_on_async_connections_without_a_thread_each(pg: PostgresUrl) -> None:
    async def main() -> None:
        async with jaren_jobs.open_async_store(pg.url, pool_size=4) as store:
            await store.jobs.enqueue("k", id="warm")  # the first connection opens
            threads = threading.active_count()
            names = {t.name for t in threading.enumerate()}

            async def one(n: int) -> None:
                job = await store.jobs.enqueue("k", {"n": n}, id=f"j{n:03}")
                assert (await store.jobs.get(job.id)) == job

            await asyncio.gather(*(one(n) for n in range(200)))
            async with store.transaction() as tx:
                await tx.jobs.enqueue("k", id="in-tx")
                await tx.execute("SELECT 1")
            assert threading.active_count() == threads
            assert {t.name for t in threading.enumerate()} == names
            pool = _pool(store)
            assert 1 <= pool.size <= 4
            assert all(isinstance(c, psycopg.AsyncConnection) for c in pool._open)
            # the sync pool underneath kept the one connection it opened with: no call
            # of the async API went through it
            assert store.store._backend.db.size == 1  # type: ignore[attr-defined]

    run(main)
    assert len(pg.job_ids()) == 202


def test_the_async_pool_opens_lazily_up_to_its_size_and_closes_every_one(
    pg: PostgresUrl,
) -> None:
    async def main() -> set[int]:
        store = await jaren_jobs.open_async_store(pg.url, pool_size=3)
        try:
            assert _pool(store).size == 0  # nothing opened before a call needs it
            await store.jobs.counts()
            assert _pool(store).size == 1
            pids, end = await _pids(store, 3)
            assert len(pids) == 3
            assert _pool(store).size == 3
            assert _live(pg, pids) == pids
            await end()
            await store.jobs.counts()  # LIFO: a quiet store reuses the last one given back
            assert _pool(store).size == 3
        finally:
            await store.close()
        return pids

    pids = run(main)
    assert _live(pg, pids) == set()


def test_a_full_pool_queues_fairly_and_times_out_as_gate_refused(pg: PostgresUrl) -> None:
    async def main() -> None:
        async with jaren_jobs.open_async_store(
            pg.url, pool_size=2, gate_timeout_seconds=0.3
        ) as store:
            _, end = await _pids(store, 2)
            began = time.monotonic()
            with pytest.raises(GateRefused) as info:
                await store.jobs.enqueue("k", id="late")
            assert info.value.details["reason"] == "timeout"
            assert time.monotonic() - began >= 0.25
            await end()
        assert pg.job_ids() == []

        async with jaren_jobs.open_async_store(
            pg.url, pool_size=1, gate_timeout_seconds=WAIT
        ) as store:
            _, end = await _pids(store, 1)
            order: list[str] = []

            async def queued(name: str) -> None:
                await store.jobs.enqueue("k", id=name)
                order.append(name)

            gate = _pool(store).gate
            first = asyncio.create_task(queued("first"))
            while gate.waiting() < 1:
                await asyncio.sleep(0)
            second = asyncio.create_task(queued("second"))
            while gate.waiting() < 2:
                await asyncio.sleep(0)
            await end()
            await asyncio.gather(first, second)
            assert order == ["first", "second"]  # served in arrival order

    run(main)


def test_connections_the_server_closed_while_idle_are_replaced_before_use(
    pg: PostgresUrl,
) -> None:
    # SPEC §10: no call fails for a connection it did not use
    async def main() -> None:
        async with jaren_jobs.open_async_store(pg.url, pool_size=3) as store:
            pids, end = await _pids(store, 3)
            await end()
            with psycopg.connect(pg.server_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                    (list(pids),),
                )
            deadline = time.monotonic() + WAIT
            while _live(pg, pids):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await store.jobs.enqueue("k", id="first")
            for n in range(3):
                await store.jobs.enqueue("k", id=f"after-{n}")
            again, end = await _pids(store, 3)
            await end()
            assert not again & pids

    run(main)
    assert pg.job_ids() == ["after-0", "after-1", "after-2", "first"]


def test_wait_is_woken_by_a_notify_from_another_store_listening_on_the_loop(
    pg: PostgresUrl,
) -> None:
    other = pg.open()  # another store, as another process's: its own hub, so only NOTIFY
    other.jobs.enqueue("k", id="w")
    claimed = other.jobs.claim(["k"], owner="elsewhere")
    assert claimed is not None

    async def main() -> float:
        async with jaren_jobs.open_async_store(pg.url) as store:
            waiting = asyncio.create_task(store.jobs.wait("w", timeout_seconds=WAIT))
            listener = _pool(store).listener
            await asyncio.wait_for(listener.connected.wait(), WAIT)
            # LISTEN runs on the loop: no listener thread, its connection an async one
            assert "jaren_jobs-listen" not in {t.name for t in threading.enumerate()}
            assert isinstance(listener.connection, psycopg.AsyncConnection)
            await asyncio.sleep(0.05)  # the wait has read the row once and sleeps now
            began = time.monotonic()
            await asyncio.to_thread(other.jobs.complete, claimed.lease, "ok")
            job = await waiting
            assert job.state == "done"
            return time.monotonic() - began

    woke = run(main)
    # well inside the 1 s poll a listened wait keeps as a fallback: the NOTIFY woke it
    assert woke < 0.5, woke


def test_a_waiting_async_store_hears_settlements_and_not_enqueues(pg: PostgresUrl) -> None:
    # its listener serves wait(), which wakes on settlements; an AsyncWorker hears
    # enqueues through the sync store's listener: enqueues here would wake the loop
    # for nothing, once per enqueue in any process
    other = pg.open()
    other.jobs.enqueue("k", id="w")
    claimed = other.jobs.claim(["k"], owner="elsewhere")
    assert claimed is not None

    async def main() -> tuple[dict[str, int], str]:
        async with jaren_jobs.open_async_store(pg.url) as store:
            waiting = asyncio.create_task(store.jobs.wait("w", timeout_seconds=WAIT))
            listener = _pool(store).listener
            await asyncio.wait_for(listener.connected.wait(), WAIT)
            await asyncio.to_thread(lambda: [other.jobs.enqueue("k") for _ in range(5)])
            # committed after the enqueues: their notifications, if any came, came first
            await asyncio.to_thread(other.jobs.complete, claimed.lease, "ok")
            job = await waiting
            assert job.state == "done"
            # read in commit order: once the settlement's is in, any enqueue's was too
            await asyncio.wait_for(listener.heard_settled.wait(), WAIT)
            return dict(listener.heard), listener.settled_name

    try:
        heard, settled = run(main)
    finally:
        other.close()
    assert heard == {settled: 1}, heard


def test_an_enqueue_waker_added_to_a_waiting_listener_hears_enqueues(pg: PostgresUrl) -> None:
    # the seam's wake_on_commits, on a listener already running for wait(): it
    # listens again, on the enqueue channel too
    other = pg.open()

    async def main() -> None:
        async with jaren_jobs.open_async_store(pg.url) as store:
            await store.jobs.enqueue("k", id="w")
            waiting = asyncio.create_task(store.jobs.wait("w", timeout_seconds=WAIT))
            listener = _pool(store).listener
            await asyncio.wait_for(listener.connected.wait(), WAIT)
            woken = asyncio.Event()
            store._native.wake_on_commits(woken.set)
            assert not listener.connected.is_set()  # until it listens on enqueues too
            await asyncio.wait_for(listener.connected.wait(), WAIT)
            await asyncio.to_thread(other.jobs.enqueue, "k")
            await asyncio.wait_for(woken.wait(), WAIT)
            waiting.cancel()

    try:
        run(main)
    finally:
        other.close()


def test_every_wake_up_the_async_backend_offers_is_one_its_listener_carries(
    pg: PostgresUrl,
) -> None:
    # the backend's wake_on_* methods are generated from the sync store's; each
    # must be one the loop's listener can give (none may end in AttributeError)
    async def main() -> list[str]:
        async with jaren_jobs.open_async_store(pg.url) as store:
            backend = store._native
            offered = sorted(name for name in dir(backend) if name.startswith("wake_on_"))
            for name in offered:
                getattr(backend, name)(lambda *_: None)
            await asyncio.wait_for(_pool(store).listener.connected.wait(), WAIT)
            return offered

    assert run(main) == ["wake_on_commits", "wake_on_settlements"]


def test_a_server_restart_under_async_load_is_storage_errors_then_recovery(
    private_pg: PrivateServer,
) -> None:
    with schema_on(private_pg.url()) as schema:
        url = schema.url
        jaren_jobs.open_store(url).close()  # the tables

        async def main() -> tuple[int, int, list[Exception]]:
            async with jaren_jobs.open_async_store(url, pool_size=3) as store:
                acked = 0
                refused: list[Exception] = []

                async def load(worker: int, count: int) -> None:
                    nonlocal acked
                    for n in range(count):
                        try:
                            await store.jobs.enqueue("k", id=f"w{worker}-{n}-{time.monotonic()}")
                            acked += 1
                        except (StorageError, GateRefused) as exc:
                            refused.append(exc)
                            await asyncio.sleep(0.01)

                await asyncio.gather(*(load(w, 20) for w in range(3)))
                before = acked
                await asyncio.to_thread(private_pg.stop, "immediate")
                await asyncio.gather(*(load(w, 5) for w in range(3)))
                away = acked - before
                await asyncio.to_thread(private_pg.start)
                deadline = time.monotonic() + WAIT * 3
                recovered = acked
                while acked - recovered < 30:
                    assert time.monotonic() < deadline, "the store did not recover"
                    await asyncio.gather(*(load(w, 10) for w in range(3)))
                return before, away, refused

        before, away, refused = run(main)
    assert before == 60
    assert away == 0  # nothing succeeds while the server is away
    # the library's errors, never a raw psycopg one (which would have ended the run);
    # the driver's failure is a StorageError's cause
    assert any(isinstance(exc, StorageError) for exc in refused)
    for exc in refused:
        assert isinstance(exc, GateRefused) or isinstance(exc.__cause__, psycopg.Error), exc


def test_an_async_worker_rides_out_a_server_restart(private_pg: PrivateServer) -> None:
    """Renewals (a task on the loop, on the async pool), claims and settlements meet a
    server that went away: storage errors are retried or end the attempt, a lease that ran
    out is re-claimed, and every job ends done, completed at most once."""
    outcomes: list[Outcome] = []
    with schema_on(private_pg.url()) as schema:
        url = schema.url
        jaren_jobs.open_store(url).close()  # the tables
        ids = [f"long-{n}" for n in range(2)] + [f"q-{n:03}" for n in range(100)]

        async def main() -> tuple[int, list[Any]]:
            loop = asyncio.get_running_loop()
            some_done, back, renewed = asyncio.Event(), asyncio.Event(), asyncio.Event()
            async with jaren_jobs.open_async_store(url) as store:

                def observe(outcome: Outcome) -> None:
                    outcomes.append(outcome)
                    if sum(o.outcome == "completed" for o in outcomes) == 20:
                        loop.call_soon_threadsafe(some_done.set)

                async def quick(payload: Any, ctx: AsyncJobContext) -> Any:
                    await asyncio.sleep(0)
                    return payload

                async def long(payload: Any, ctx: AsyncJobContext) -> Any:
                    await back.wait()  # held across the outage: its renewals meet it
                    return payload

                async def settled(job_id: str) -> Any:
                    # the first calls after the restart may meet a connection the server
                    # dropped (a StorageError; the pool reconnects): the caller retries
                    while True:
                        try:
                            job = await store.jobs.wait(job_id, timeout_seconds=WAIT * 3)
                        except (StorageError, GateRefused):
                            continue
                        return job

                await store.jobs.enqueue_many(
                    [NewJob("long", n, id=f"long-{n}") for n in range(2)]
                    + [NewJob("quick", n, id=f"q-{n:03}") for n in range(100)]
                )
                worker = store.jobs.create_worker(
                    {"quick": quick, "long": long},
                    concurrency=4,
                    lease_seconds=1.5,
                    poll_seconds=0.1,
                    on_outcome=observe,
                    on_renewal=lambda _: loop.call_soon_threadsafe(renewed.set),
                )
                async with worker:
                    await asyncio.wait_for(some_done.wait(), WAIT)
                    await asyncio.wait_for(renewed.wait(), WAIT)  # renewed before the outage
                    await asyncio.to_thread(private_pg.stop, "immediate")
                    await asyncio.to_thread(private_pg.start)
                    back.set()
                    jobs = [await settled(job_id) for job_id in ids]
                return worker.stats().renewals, jobs

        renewals, jobs = run(main)
    assert [(job.id, job.state) for job in jobs] == [(job_id, "done") for job_id in ids]
    completed = [o.job_id for o in outcomes if o.outcome == "completed"]
    assert len(completed) == len(set(completed))  # never completed twice
    # an attempt whose settlement could not be written while the server was away ends
    # failed (the job is retried) or lost (its lease ran out): never a second completion
    assert {o.outcome for o in outcomes} <= {"completed", "failed", "lost"}
    assert renewals >= 1


def test_a_settlement_waits_off_the_loop_for_the_renewal_in_flight(pg: PostgresUrl) -> None:
    """The renewal task holds the attempt's lease across its awaited write. A handler that
    returns meanwhile settles with the fresh lease once the renewal lands, and the loop
    never blocks waiting for it (the renewal it would wait for runs on this very loop)."""
    outcomes: list[Outcome] = []

    async def blocked_renewals() -> int:
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s",
                ["%lease_token = %"],
            ).fetchone()
        return int(row[0])

    async def main() -> tuple[Any, int]:
        loop = asyncio.get_running_loop()
        started, go, returning, ended = (asyncio.Event() for _ in range(4))
        async with jaren_jobs.open_async_store(pg.url) as store:

            async def held(payload: Any, ctx: AsyncJobContext) -> Any:
                started.set()
                await go.wait()
                returning.set()
                return "fresh"

            def observe(outcome: Outcome) -> None:
                outcomes.append(outcome)
                loop.call_soon_threadsafe(ended.set)

            await store.jobs.enqueue("k", id="r")
            worker = store.jobs.create_worker(
                {"k": held}, lease_seconds=1.5, poll_seconds=0.05, on_outcome=observe
            )
            async with worker:
                await asyncio.wait_for(started.wait(), WAIT)
                with psycopg.connect(pg.url) as blocker:
                    # the job's row locked: the next renewal waits on the server
                    blocker.execute('SELECT 1 FROM "_jaren_jobs" WHERE id = %s FOR UPDATE', ["r"])
                    deadline = time.monotonic() + WAIT
                    while await blocked_renewals() == 0:
                        assert time.monotonic() < deadline, "no renewal came"
                        await asyncio.sleep(0.02)  # the server's state, polled
                    go.set()  # the handler returns while its renewal is in flight
                    await asyncio.wait_for(returning.wait(), WAIT)
                    for _ in range(10):  # the run posts the result (this loop still turns)
                        await asyncio.sleep(0)
                    assert not ended.is_set()  # the settlement waits for the renewal
                # the lock is gone: the renewal lands, then the settlement with its lease
                await asyncio.wait_for(ended.wait(), WAIT)
            return await store.jobs.get("r"), worker.stats().renewals

    answer: list[Any] = []

    def loop_thread() -> None:
        try:
            answer.append(run(main))
        except BaseException as exc:  # re-raised below, in the test's thread
            answer.append(exc)

    # the loop on a thread of its own: a loop blocked on the lease fails the test, not hangs it
    thread = threading.Thread(target=loop_thread, daemon=True)
    thread.start()
    thread.join(WAIT * 3)
    assert not thread.is_alive(), "the event loop blocked waiting for its own renewal"
    if isinstance(answer[0], BaseException):
        raise answer[0]
    job, renewals = answer[0]
    assert [(o.outcome, o.attempt) for o in outcomes] == [("completed", 1)]
    assert job is not None
    assert (job.state, job.result, job.attempts) == ("done", "fresh", 1)
    assert renewals >= 1
