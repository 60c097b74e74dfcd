"""A DAG job whose worker process dies mid-run resumes in another worker (SPEC §8).

A spawned child claims a five-node DAG job and runs it; the task of one node
calls ``os._exit(1)`` on its first run: no cleanup, no settlement, the lease
left dangling. The child lives at a fixed instant, so its lease expires at a
known time; the worker in this process runs on the fake clock and moves past
it. Every task appends its node id to a side file as it starts, which is how
the test counts executions across both processes.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import AsyncStore, Outcome, Store, create_dag_job_runner
from jaren_jobs.dag import RUN_IDENTITY_NODE
from tests.conftest import START, FakeClock
from tests.processes.dag_targets import (
    DOCUMENT,
    KIND,
    LEASE_SECONDS,
    ORDER,
    crash_in_a_node,
    make_tasks,
)
from tests.processes.dag_targets import START as CHILD_START

CHILD_TIMEOUT = 60.0
VALUES = {"n1": 3, "n2": 6, "n3": 9, "n4": 18, "n5": 24}


def checkpoint_rows(db_path: Path, job_id: str) -> list[tuple[str, object, int]]:
    connection = sqlite3.connect(db_path)
    try:
        found = connection.execute(
            'SELECT node_id, value, generation FROM "_jaren_job_checkpoints" '
            "WHERE run_id = ? ORDER BY node_id",
            (job_id,),
        ).fetchall()
    finally:
        connection.close()
    return [(node, json.loads(value), generation) for node, value, generation in found]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.requires("file")  # the child opens the same file by its path
@pytest.mark.parametrize(
    ("crash_in", "api"), [("n3", "sync"), ("n1", "sync"), ("n5", "sync"), ("n3", "async")]
)
def test_a_crashed_run_resumes_in_another_worker_without_rerunning_recorded_nodes(  # noqa: PLR0917
    store: Store, db_path: Path, clock: FakeClock, tmp_path: Path, crash_in: str, api: str
) -> None:
    assert CHILD_START == START  # the child and this store's fake clock share an epoch
    side_file = tmp_path / "executions.txt"
    marker = tmp_path / "crashed-once"
    job = store.jobs.enqueue(KIND, {"input": {"x": 3}})

    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(
        target=crash_in_a_node,
        args=(
            {
                "db_path": str(db_path),
                "side_file": str(side_file),
                "marker": str(marker),
                "crash_in": crash_in,
            },
        ),
    )
    child.start()
    child.join(CHILD_TIMEOUT)
    if child.is_alive():  # pragma: no cover - only on a hung child
        child.kill()
        child.join()
        pytest.fail("the child never reached its crash")
    assert child.exitcode == 1
    assert marker.exists()

    # the child ran every node up to and including the one that killed it
    before = list(ORDER[: ORDER.index(crash_in)])
    assert lines(side_file) == [*before, crash_in]
    # ...and recorded the ones before it, under its generation, beside its identity
    found = checkpoint_rows(db_path, job.id)
    assert [node for node, _, _ in found] == sorted([RUN_IDENTITY_NODE, *before])
    assert {node: value for node, value, _ in found if node != RUN_IDENTITY_NODE} == {
        node: VALUES[node] for node in before
    }
    assert {generation for _, _, generation in found} == {1}
    orphan = store.jobs.get(job.id)
    assert orphan is not None
    assert (orphan.state, orphan.attempts, orphan.lease_owner) == ("leased", 1, "doomed-child")

    outcomes: list[Outcome] = []
    options: dict[str, Any] = {
        "documents": {KIND: DOCUMENT},
        "tasks": make_tasks(side_file, marker, crash_in),
        "lease_seconds": LEASE_SECONDS,
        "renew": False,
        "owner": "rescuer",
        "on_outcome": outcomes.append,
    }
    if api == "sync":
        worker = create_dag_job_runner(store, **options)
        assert worker.run_once() is False  # the dead child's lease is still in force
        clock.advance(LEASE_SECONDS)
        assert worker.run_once() is True  # expired: re-claimed and resumed
    else:
        # the same rescue by an AsyncWorker (the DAG's tasks run on its threads)

        async def rescue() -> None:
            aworker: Any = create_dag_job_runner(AsyncStore(store), **options)
            assert await aworker.run_once() is False
            clock.advance(LEASE_SECONDS)
            assert await aworker.run_once() is True

        asyncio.run(rescue())

    assert [(o.outcome, o.attempt) for o in outcomes] == [("completed", 2)]
    done = store.jobs.get(job.id)
    assert done is not None
    # completed by the rescuer's attempt (generation 2), not by the dead child's
    assert (done.state, done.result, done.attempts) == ("done", 24, 2)
    assert (done.lease_owner, done.lease_generation) == ("rescuer", 2)
    # nodes before the crash ran once; the crashing node twice; the rest once
    after = list(ORDER[ORDER.index(crash_in) + 1 :])
    assert lines(side_file) == [*before, crash_in, crash_in, *after]
    # the completion pruned every checkpoint row of the run
    assert checkpoint_rows(db_path, job.id) == []
