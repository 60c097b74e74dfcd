"""PostgreSQL under real processes and real faults, through the public API only.

Every test works in a schema of its own (``pg_schema``) or on a server of its
own (``private_pg``) and checks the same ledger: the jobs as the store reports
them, the executions each handler recorded in a table of ours, and the
outcomes each worker process appended to a file as they happened. A job is
*done exactly once* when its row is done and settled by the generation whose
execution is recorded, at most one completion was reported for it, and every
other execution belongs to an attempt that died with its process or was told
its lease was lost.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Job, NewJob, Store, open_store
from tests.processes.pg_support import (
    PrivateServer,
    Schema,
    base_url,
    connect,
    netns_unavailable,
    schema_on,
    simulated_hosts,
    with_search_path,
)
from tests.processes.pg_targets import CREATE_EXECUTIONS, EXECUTIONS, KIND, pg_enqueuer, pg_worker

REPO = Path(__file__).resolve().parents[2]
SPAWN = multiprocessing.get_context("spawn")
pytestmark = pytest.mark.slow


# ------------------------------------------------------------------ the ledger


def all_jobs(store: Store) -> dict[str, Job]:
    jobs: dict[str, Job] = {}
    after = None
    while True:
        with store.jobs.page(after=after, limit=1000) as cursor:
            batch = list(cursor)
        if not batch:
            return jobs
        jobs.update((job.id, job) for job in batch)
        after = batch[-1].id


def read_lines(folder: Path, pattern: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob(pattern)):
        lines = path.read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "", f"{path.name} ends in a torn line: {lines[-1]!r}"
        records.extend(json.loads(line) for line in lines[:-1])
    return records


def check_ledger(
    jobs: dict[str, Job],
    executions: list[tuple[str, int, int, str]],
    outcomes: list[dict[str, Any]],
    *,
    expected: set[str],
    killed: set[str] = frozenset(),  # type: ignore[assignment]
) -> dict[str, int]:
    """Every expected job done exactly once (see the module docstring); returns tallies."""
    assert set(jobs) >= expected, f"{len(expected - set(jobs))} jobs lost"
    for job in jobs.values():
        assert (job.state, job.lease_until) == ("done", None), job
    runs: dict[str, dict[int, str]] = defaultdict(dict)
    for job_id, attempt, generation, incarnation in executions:
        assert attempt <= generation
        assert generation not in runs[job_id], f"{job_id} ran twice in generation {generation}"
        runs[job_id][generation] = incarnation
    # an attempt told its lease was lost, or whose failure was recorded (the server went
    # away under it), may be followed by another execution; nothing else may
    excused = {
        (o["incarnation"], o["job_id"], o["generation"])
        for o in outcomes
        if o["outcome"] in ("lost", "failed")
    }
    completions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for outcome in outcomes:
        if outcome["outcome"] == "completed":
            completions[outcome["job_id"]].append(outcome)
    tally = Counter[str]()
    for job_id, job in jobs.items():
        generation = job.lease_generation
        result = job.result
        assert isinstance(result, dict), job
        assert result["generation"] == generation, job
        assert runs[job_id].get(generation) == result["by"], (job_id, runs[job_id], result)
        assert max(runs[job_id]) == generation, (
            f"{job_id} executed after it settled: {runs[job_id]}"
        )
        reported = completions.get(job_id, [])
        assert len(reported) <= 1, f"{job_id} settled twice: {reported}"
        if reported:
            assert (reported[0]["generation"], reported[0]["incarnation"]) == (
                generation,
                result["by"],
            )
        else:
            assert result["by"] in killed, f"{job_id}: completed by {result['by']}, never reported"
            tally["unreported"] += 1
        for earlier, incarnation in runs[job_id].items():
            if earlier != generation:
                tally["reexecuted"] += 1
                assert incarnation in killed or (incarnation, job_id, earlier) in excused, (
                    f"{job_id}: generation {earlier} ran on {incarnation}, which was neither "
                    f"killed nor told its attempt failed or lost its lease; runs {runs[job_id]}"
                )
        if generation > 1:
            tally["rescued"] += 1
    return dict(tally)


def executions_of(schema_url: str) -> list[tuple[str, int, int, str]]:
    with connect(schema_url) as conn:
        return [
            (row[0], row[1], row[2], row[3])
            for row in conn.execute(
                f"SELECT job_id, attempt, generation, incarnation FROM {EXECUTIONS}"
            ).fetchall()
        ]


def prepare(url: str) -> None:
    with open_store(url) as store, store.transaction() as tx:
        tx.execute(CREATE_EXECUTIONS)


def check_reports(folder: Path, names: list[str]) -> list[dict[str, Any]]:
    reports = []
    for name in names:
        report = json.loads((folder / f"report-{name}.json").read_text())
        assert report["error"] is None, f"{name}:\n{report['error']}"
        assert report["stop"] == {"drained": True, "in_flight": 0}, name
        reports.append(report)
    return reports


class Workers:
    """Worker processes started with ``spawn``, each with its own ready and stop events."""

    def __init__(self, folder: Path, url: str, **settings: Any) -> None:
        self.folder = folder
        self.url = url
        self.settings = settings
        self.live: dict[str, tuple[Any, Any, Any]] = {}
        self.started: list[str] = []
        self.killed: set[str] = set()
        self.queue: Any = None  # the ``started`` queue the workers put into, if any

    def spawn(self, started: Any = None) -> str:
        if started is not None:
            self.queue = started
        name = f"w{len(self.started) + 1:03d}"
        ready, stop = SPAWN.Event(), SPAWN.Event()
        settings = {"folder": str(self.folder), "url": self.url, "incarnation": name}
        settings.update(self.settings)
        process = SPAWN.Process(target=pg_worker, args=(settings, ready, stop, started), name=name)
        process.start()
        self.started.append(name)
        self.live[name] = (process, ready, stop)
        return name

    def wait_ready(self, timeout: float = 60) -> None:
        for name, (process, ready, _) in self.live.items():
            assert ready.wait(timeout), f"{name} never became ready (exit {process.exitcode})"

    def kill(self, name: str) -> None:
        process, _, _ = self.live.pop(name)
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        assert process.exitcode == -signal.SIGKILL, (name, process.exitcode)
        self.killed.add(name)

    def stop_all(self) -> dict[str, int | None]:
        for _, _, stop in self.live.values():
            stop.set()
        codes: dict[str, int | None] = {}
        for name, (process, _, _) in self.live.items():
            end = time.monotonic() + 60
            # a process does not exit before its queue's buffer is flushed: keep reading it
            while self.queue is not None and process.is_alive() and time.monotonic() < end:
                with contextlib.suppress(queue.Empty):
                    self.queue.get(timeout=0.1)
            process.join(max(0.0, end - time.monotonic()))
            if process.is_alive():  # pragma: no cover - only on a hung child
                process.kill()
                process.join(10)
            codes[name] = process.exitcode
        return codes


def wait_until_done(store: Store, total: int, deadline_seconds: float, what: str) -> None:
    pause = threading.Event()  # never set: the pacing of the check
    end = time.monotonic() + deadline_seconds
    while True:
        counts = store.jobs.counts()
        if counts.done >= total and counts.leased == 0 and counts.pending == 0:
            return
        assert time.monotonic() < end, f"{what}: not drained in {deadline_seconds:.0f}s: {counts}"
        pause.wait(0.2)


# ------------------------------------------------------------------ 1. many processes


def test_eight_processes_of_four_loops_drain_20000_jobs_each_exactly_once(
    tmp_path: Path, pg_schema: Schema
) -> None:
    prepare(pg_schema.url)
    with open_store(pg_schema.url) as store:
        expected: set[str] = set()
        for start in range(0, 20_000, 1_000):
            created = store.jobs.enqueue_many(
                NewJob(KIND, {"n": n}) for n in range(start, start + 1000)
            )
            expected.update(job.id for job in created)
        # no server crash here: "normal" (synchronous_commit off) keeps the side records'
        # commits from waiting on the shared server's disk, and proves the same thing
        workers = Workers(
            tmp_path,
            pg_schema.url,
            concurrency=4,
            lease_seconds=30.0,
            poll_seconds=0.2,
            durability="normal",
        )
        for _ in range(8):
            workers.spawn()
        try:
            workers.wait_ready()
            wait_until_done(store, 20_000, 180, "8 x 4 workers")
        finally:
            codes = workers.stop_all()
        assert codes == dict.fromkeys(workers.started, 0)
        jobs = all_jobs(store)
        counts = store.jobs.counts()
    assert (counts.done, counts.leased, counts.pending, counts.failed) == (20_000, 0, 0, 0)
    outcomes = read_lines(tmp_path, "outcomes-*.jsonl")
    executions = executions_of(pg_schema.url)
    tally = check_ledger(jobs, executions, outcomes, expected=expected)
    # nobody was killed and the leases were long: one execution and one attempt per job
    # (a worker may hand back unstarted jobs stuck behind a slow batch: such a job is
    # claimed again, a generation later, but the released claim spent no attempt)
    assert len(executions) == 20_000, tally
    assert all(job.attempts == 1 for job in jobs.values())
    reports = check_reports(tmp_path, workers.started)
    assert sum(r["stats"]["completions"] for r in reports) == 20_000
    assert sum(r["stats"]["lost_settlements"] for r in reports) == 0
    assert all(r["stats"]["claim_errors"] == 0 for r in reports), [r["problems"] for r in reports]
    busy = [r["incarnation"] for r in reports if r["stats"]["completions"] > 0]
    assert len(busy) >= 4, "the processes did not share the work"


# ------------------------------------------------------------------ 2. chaos


def test_sigkilled_workers_lose_nothing_and_settle_nothing_twice(
    tmp_path: Path, pg_schema: Schema
) -> None:
    prepare(pg_schema.url)
    rng = random.Random(14)
    with open_store(pg_schema.url) as store:
        created = store.jobs.enqueue_many(
            NewJob(KIND, {"work_ms": rng.choice((0, 5, 20, 50))}, max_attempts=1000)
            for _ in range(3000)
        )
        expected = {job.id for job in created}
        workers = Workers(
            tmp_path,
            pg_schema.url,
            concurrency=2,
            lease_seconds=1.0,
            poll_seconds=0.05,
            durability="normal",
        )
        for _ in range(4):
            workers.spawn()
        pause = threading.Event()  # never set: the pacing between kills
        kills = 0
        began = time.monotonic()
        try:
            workers.wait_ready()
            while store.jobs.counts().done < 3000:
                assert time.monotonic() - began < 180, f"not drained: {store.jobs.counts()}"
                pause.wait(rng.uniform(0.15, 0.45))
                working = sorted(n for n, (_, ready, _) in workers.live.items() if ready.is_set())
                if len(working) >= 2:  # leave one working, so the drain always progresses
                    workers.kill(rng.choice(working))
                    kills += 1
                    workers.spawn()
            wait_until_done(store, 3000, 30, "after the chaos")
        finally:
            codes = workers.stop_all()
        jobs = all_jobs(store)
    assert codes == dict.fromkeys(codes, 0)
    assert kills >= 5, f"only {kills} kills: the chaos never happened"
    outcomes = read_lines(tmp_path, "outcomes-*.jsonl")
    assert {o["outcome"] for o in outcomes} <= {"completed", "lost"}
    tally = check_ledger(
        jobs, executions_of(pg_schema.url), outcomes, expected=expected, killed=workers.killed
    )
    assert tally.get("rescued", 0) > 0, "no kill ever hit a claimed job: the chaos proved nothing"
    check_reports(tmp_path, sorted(codes))
    print(f"\n{kills} kills, {len(workers.started)} processes; {tally}")


# ------------------------------------------------------------------ 3. the server crashes


def test_server_stopped_immediately_and_restarted_under_load(
    tmp_path: Path, private_pg: PrivateServer
) -> None:
    with schema_on(private_pg.url()) as schema:
        url = schema.url
        prepare(url)
        started = SPAWN.Queue()
        # a long poll: after the restart only a re-established listener explains a prompt start
        workers = Workers(tmp_path, url, concurrency=2, lease_seconds=2.0, poll_seconds=10.0)
        for _ in range(2):
            workers.spawn(started)
        ready, stop = SPAWN.Event(), SPAWN.Event()
        enqueuer = SPAWN.Process(
            target=pg_enqueuer, args=({"folder": str(tmp_path), "url": url}, ready, stop)
        )
        enqueuer.start()
        pause = threading.Event()  # never set: the pacing of the checks
        try:
            workers.wait_ready()
            assert ready.wait(60)

            def acked() -> int:
                path = tmp_path / "acked.jsonl"
                return path.read_bytes().count(b"\n") if path.exists() else 0

            end = time.monotonic() + 60
            while acked() < 200:
                assert time.monotonic() < end, "the enqueuer never got going"
                pause.wait(0.05)
            private_pg.stop("immediate")
            pause.wait(1.0)  # the server stays away long enough for every call to notice
            private_pg.start()
            before = acked()
            end = time.monotonic() + 60
            while acked() < before + 200:
                assert time.monotonic() < end, "the enqueuer did not resume after the restart"
                pause.wait(0.05)
            stop.set()
            enqueuer.join(60)
            assert enqueuer.exitcode == 0
            with open_store(url) as store:
                total = len(all_jobs(store))
                # done promptly: notifications (not the 10 s poll) wake the workers again
                wait_until_done(store, total, 40, "after the restart")
                while not started.empty():
                    started.get()
                # the listeners are back: an idle worker starts a fresh job at once
                probe_at = time.monotonic()
                store.jobs.enqueue(KIND, {}, id="probe")
                while True:
                    job_id, _, at = started.get(timeout=30)
                    if job_id == "probe":
                        break
                wake = at - probe_at
                assert wake < 2.0, f"the probe started after {wake:.2f}s: no listener came back"
                wait_until_done(store, total + 1, 20, "the probe")
                jobs = all_jobs(store)
        finally:
            stop.set()
            codes = workers.stop_all()
            if enqueuer.is_alive():  # pragma: no cover
                enqueuer.kill()
        assert codes == dict.fromkeys(codes, 0)
        enqueued = {r["id"] for r in read_lines(tmp_path, "acked.jsonl")}
        refused = read_lines(tmp_path, "refused.jsonl")
        report = json.loads((tmp_path / "report-enqueuer.json").read_text())
        assert report == {"error": None, "raw": []}, report
        assert refused, "no enqueue failed: the server never went away"
        # the library's own errors only (a pool may answer GateRefused while it reconnects)
        assert {r["error"] for r in refused} <= {"StorageError", "GateRefused"}, refused[:5]
        outcomes = read_lines(tmp_path, "outcomes-*.jsonl")
        tally = check_ledger(
            jobs, executions_of(url), outcomes, expected=enqueued | {"probe"}, killed=set()
        )
        reports = check_reports(tmp_path, sorted(codes))
        print(
            f"\n{len(enqueued)} acknowledged, {len(refused)} refused while away, "
            f"probe {wake:.3f}s, "
            f"{tally}, claim_errors {[r['stats']['claim_errors'] for r in reports]}"
        )


# ------------------------------------------------------------------ 4. a connection terminated


def test_connection_terminated_mid_settlement_settles_or_is_rescued_never_both(
    tmp_path: Path, pg_schema: Schema
) -> None:
    """The completing statement is held on a row lock of ours, its backend terminated.

    ``pg_blocking_pids`` names exactly the backends our lock blocks, so
    nothing another test (or another engineer) runs on the server is touched.
    """
    prepare(pg_schema.url)
    release = tmp_path / "release"
    started = SPAWN.Queue()
    workers = Workers(
        tmp_path,
        pg_schema.url,
        concurrency=1,
        lease_seconds=3.0,
        poll_seconds=0.1,
        release=str(release),
    )
    rounds = 4
    with open_store(pg_schema.url) as store:
        workers.spawn(started)
        terminated = 0
        try:
            workers.wait_ready()
            for n in range(rounds):
                release.unlink(missing_ok=True)
                job_id = f"held-{n}"
                store.jobs.enqueue(KIND, {"hold": True}, id=job_id, max_attempts=10)
                while True:  # skip the starts of earlier rounds' retries
                    got, generation, _ = started.get(timeout=30)
                    if got == job_id:
                        break
                assert generation == 1
                with connect(pg_schema.url) as locker, connect(pg_schema.url) as watcher:
                    locker.autocommit = False
                    locker.execute(
                        'SELECT 1 FROM "_jaren_jobs" WHERE id = %s FOR UPDATE', (job_id,)
                    )
                    release.write_text("1")  # the handler returns; its settlement meets our lock
                    # watched from another session: pg_stat_activity is snapshotted once
                    # per transaction, so the locker itself would never see a newcomer
                    end = time.monotonic() + 20
                    blocked: list[int] = []
                    while not blocked:
                        assert time.monotonic() < end, "the settlement never reached the row"
                        blocked = [
                            row[0]
                            for row in watcher.execute(
                                "SELECT pid FROM pg_stat_activity "
                                "WHERE %s = ANY(pg_blocking_pids(pid))",
                                (locker.info.backend_pid,),
                            ).fetchall()
                        ]
                    for pid in blocked:
                        watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        terminated += 1
                    locker.rollback()
                # either it settled, or the lease expires and the job runs again
                wait_until_done(store, n + 1, 30, job_id)
        finally:
            codes = workers.stop_all()
        jobs = all_jobs(store)
    assert codes == dict.fromkeys(codes, 0)
    assert terminated >= rounds
    outcomes = read_lines(tmp_path, "outcomes-*.jsonl")
    executions = executions_of(pg_schema.url)
    # an attempt whose completion was refused is told so (lost), never reported complete
    by_attempt = {(o["job_id"], o["generation"]): o["outcome"] for o in outcomes}
    for job in jobs.values():
        first = by_attempt.get((job.id, 1))
        if job.lease_generation == 1:  # it settled despite the kill (a retry on a new connection)
            assert first == "completed", (job, first)
        else:  # recovered by lease expiry: the first attempt did not also settle
            assert first != "completed", (job, first)
            assert by_attempt.get((job.id, job.lease_generation)) == "completed"
    check_ledger(jobs, executions, outcomes, expected={f"held-{n}" for n in range(rounds)})
    check_reports(tmp_path, sorted(codes))


# ------------------------------------------------------------------ 5. other hosts


def test_workers_on_other_hosts_drain_one_queue_over_tcp(tmp_path: Path) -> None:
    base_url()  # the shared server must exist (fails in CI without one)
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    with simulated_hosts(2) as hosts:
        server = PrivateServer(listen=",".join(["127.0.0.1", *(h.gateway for h in hosts)]))
        try:
            server.start()
            with schema_on(server.url()) as schema:
                prepare(schema.url)
                with open_store(schema.url) as store:
                    created = store.jobs.enqueue_many(
                        NewJob(KIND, {"work_ms": 1}) for _ in range(2000)
                    )
                    expected = {job.id for job in created}
                    processes = []
                    names = []
                    for n, host in enumerate(hosts):
                        name = f"host{n}"
                        names.append(name)
                        settings = {
                            "folder": str(tmp_path),
                            # the worker reaches the server over its veth, as another host would
                            "url": with_search_path(server.url(host.gateway), schema.name),
                            "incarnation": name,
                            "concurrency": 4,
                            "lease_seconds": 30.0,
                            "poll_seconds": 0.2,
                            "ready": str(tmp_path / f"ready-{name}"),
                            "stop": str(tmp_path / f"stop-{name}"),
                        }
                        argv = [sys.executable, "-m", "tests.processes.pg_targets", "worker"]
                        processes.append(
                            subprocess.Popen(host.command([*argv, json.dumps(settings)]), cwd=REPO)
                        )
                    try:
                        wait_until_done(store, 2000, 120, "two hosts")
                        # the workers' sessions came from the other hosts' addresses
                        clients = {
                            row[0]
                            for row in schema.query(
                                "SELECT DISTINCT host(client_addr) FROM pg_stat_activity "
                                "WHERE client_addr IS NOT NULL"
                            )
                        }
                    finally:
                        for name in names:
                            (tmp_path / f"stop-{name}").write_text("1")
                        codes = [p.wait(60) for p in processes]
                    jobs = all_jobs(store)
                    executions = executions_of(schema.url)
        finally:
            server.destroy()
    assert codes == [0, 0]
    assert clients >= {h.address for h in hosts}, clients
    outcomes = read_lines(tmp_path, "outcomes-*.jsonl")
    check_ledger(jobs, executions, outcomes, expected=expected)
    reports = check_reports(tmp_path, names)
    assert all(r["stats"]["completions"] > 0 for r in reports), "one host did all the work"


def test_an_enqueue_wakes_an_idle_worker_in_another_process_whatever_the_schema_name(
    tmp_path: Path, pg_schema_any_length: Schema
) -> None:
    # a 30 s poll: only a notification explains a start within a few seconds; the worker
    # is a spawned process, whose hash() is salted differently from this one's
    url = pg_schema_any_length.url
    prepare(url)
    started = SPAWN.Queue()
    workers = Workers(tmp_path, url, concurrency=1, lease_seconds=30.0, poll_seconds=30.0)
    workers.spawn(started)
    try:
        workers.wait_ready()
        with open_store(url) as store:
            store.jobs.enqueue(KIND, {}, id="warm-up")  # proves the worker idle and listening
            assert started.get(timeout=40)[0] == "warm-up"
            wait_until_done(store, 1, 20, "the warm-up")
            enqueued = time.monotonic()
            store.jobs.enqueue(KIND, {}, id="woken")
            job_id, _, at = started.get(timeout=40)
            assert job_id == "woken"
            assert at - enqueued < 5.0, f"started {at - enqueued:.2f}s after: no notification"
    finally:
        codes = workers.stop_all()
    assert codes == dict.fromkeys(codes, 0)


# ------------------------------------------------------------------ 6. the outbox


def test_outbox_on_the_applications_connection_wakes_a_worker_in_another_process(
    tmp_path: Path, pg_schema: Schema
) -> None:
    import psycopg

    prepare(pg_schema.url)
    pg_schema.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)")
    started = SPAWN.Queue()
    # a 30 s poll: only a notification explains a start within a second or two
    workers = Workers(tmp_path, pg_schema.url, concurrency=1, lease_seconds=30.0, poll_seconds=30.0)
    workers.spawn(started)
    app = psycopg.connect(pg_schema.url)
    try:
        workers.wait_ready()
        store = open_store(connection=app)
        assert store.backend == "postgres"
        # warm up: the first job proves the worker is idle and listening
        store.jobs.enqueue(KIND, {}, id="warm-up")
        assert started.get(timeout=40)[0] == "warm-up"

        def failed_order() -> None:
            with store.transaction() as tx:
                tx.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", ("order-1", 42))
                tx.jobs.enqueue(KIND, {"order": "order-1"}, id="ship-order-1")
                raise RuntimeError("the order failed")

        with pytest.raises(RuntimeError, match="the order failed"):
            failed_order()
        assert store.jobs.get("ship-order-1") is None
        assert pg_schema.query("SELECT count(*) FROM orders") == [(0,)]

        with store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", ("order-2", 42))
            tx.jobs.enqueue(KIND, {"order": "order-2"}, id="ship-order-2")
            # inside the transaction nobody else sees it yet
            assert pg_schema.query("SELECT count(*) FROM orders") == [(0,)]
        committed = time.monotonic()
        job_id, _, at = started.get(timeout=40)
        assert job_id == "ship-order-2"
        wake = at - committed
        assert wake < 2.0, f"the job started {wake:.2f}s after the commit: no notification"
        wait_until_done(store, 2, 20, "the outbox")
        assert pg_schema.query("SELECT id FROM orders") == [("order-2",)]
        executed = {row[0] for row in executions_of(pg_schema.url)}
        assert executed == {"warm-up", "ship-order-2"}
        store.close()
        assert not app.closed, "a store given a connection never closes it"
    finally:
        codes = workers.stop_all()
        app.close()
    assert codes == dict.fromkeys(codes, 0)
    print(f"\noutbox commit to start in another process: {wake * 1000:.1f} ms")
