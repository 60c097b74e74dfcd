"""Checkpointed DAG jobs (SPEC §8) on a real SQLite file.

Most tests drive ``run_once()`` on the fake clock with renewal off, so every
step is deterministic; the tests about threads (``max_parallel``, ``stop()``)
use real threads and wait on events and barriers with timeouts.

The workhorse document is a five-node DAG over the input ``{"x": 3}``::

    n1 = x = 3;  n2 = 2*n1 = 6;  n3 = n1+n2 = 9;  n4 = 2*n3 = 18;  n5 = n2+n4 = 24
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from jaren_jobs import (
    CancelScope,
    Job,
    JobsError,
    Lease,
    LeaseRequired,
    OperationCancelled,
    Outcome,
    RunMismatch,
    Runtime,
    Store,
    Task,
    TaskContext,
    Worker,
    create_dag_job_runner,
)
from jaren_jobs.dag import RUN_IDENTITY_NODE, DagJobs, document_revision
from jaren_jobs.errors import describe_error
from tests.conftest import FakeClock, Sequence
from tests.harness import Harness

WAIT = 10.0
KIND = "chain"
LEASE = 30.0
INPUT = {"x": 3}
RESULT = 24

DOCUMENT: dict[str, Any] = {
    "description": "five nodes, two of them fan-ins",
    "nodes": {
        "n1": {"task": "seed"},
        "n2": {"task": "double", "needs": ["n1"]},
        "n3": {"task": "add", "needs": ["n1", "n2"]},
        "n4": {"task": "double", "needs": ["n3"]},
        "n5": {"task": "add", "needs": ["n2", "n4"]},
    },
    "output": "n5",
}
VALUES = {"n1": 3, "n2": 6, "n3": 9, "n4": 18, "n5": 24}
VERSIONS: dict[str, Any] = {"seed": None, "double": 1, "add": 1}
# what the run identity records of the graph: each node's task and needs
SHAPES: dict[str, Any] = {
    node: {"task": spec["task"], "needs": spec.get("needs", [])}
    for node, spec in DOCUMENT["nodes"].items()
}

Hook = Callable[[dict[str, Any], Any], None]


def sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def needs_of(inputs: dict[str, Any]) -> list[Any]:
    return [value for key, value in inputs.items() if key != "input"]


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "seed": lambda inputs: inputs["input"]["x"],
    "double": lambda inputs: 2 * sum(needs_of(inputs)),
    "add": lambda inputs: sum(needs_of(inputs)),
}


class Calls:
    """Which nodes' tasks ran, in order, with what inputs (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nodes: list[str] = []
        self.inputs: dict[str, list[dict[str, Any]]] = {}
        self.threads: dict[str, str] = {}

    def add(self, node: str, inputs: dict[str, Any]) -> None:
        with self._lock:
            self.nodes.append(node)
            self.inputs.setdefault(node, []).append(copy.deepcopy(inputs))
            self.threads[node] = threading.current_thread().name

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.nodes)


def make_tasks(
    calls: Calls,
    hooks: dict[str, Hook] | None = None,
    versions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The three tasks; ``hooks[node_id]`` runs inside the task, before its value."""
    hooks = hooks or {}
    declared = {**VERSIONS, **(versions or {})}

    def wrap(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], Any], Any]:
        def task(inputs: dict[str, Any], ctx: Any) -> Any:
            calls.add(ctx.node_id, inputs)
            hook = hooks.get(ctx.node_id)
            if hook is not None:
                hook(inputs, ctx)
            return fn(inputs)

        return task

    tasks: dict[str, Any] = {}
    for name, fn in IMPLEMENTATIONS.items():
        version = declared[name]
        # a version of None is declared the plain way: a bare callable
        tasks[name] = wrap(fn) if version is None else Task(wrap(fn), version=version)
    return tasks


def fail_first(node: str) -> Hook:
    """A hook raising on its first call only."""
    fired = []

    def hook(inputs: dict[str, Any], ctx: Any) -> None:
        if not fired:
            fired.append(True)
            raise RuntimeError(f"{node} broke on its first run")

    return hook


@dataclass
class Runner:
    """A DAG worker plus what it reported: outcomes, and what its handlers raised."""

    dag: DagJobs
    worker: Worker
    outcomes: list[Outcome] = field(default_factory=list)
    raised: list[BaseException] = field(default_factory=list)

    def run_once(self) -> bool:
        return self.worker.run_once()


def runner(
    store: Store,
    calls: Calls,
    *,
    hooks: dict[str, Hook] | None = None,
    versions: dict[str, Any] | None = None,
    document: dict[str, Any] | None = None,
    max_parallel: int = 1,
    **options: Any,
) -> Runner:
    dag = DagJobs(
        {KIND: document or DOCUMENT},
        make_tasks(calls, hooks, versions),
        max_parallel=max_parallel,
    )
    outcomes: list[Outcome] = []
    raised: list[BaseException] = []

    def keep(handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def handle(payload: Any, ctx: Any) -> Any:
            try:
                return handler(payload, ctx)
            except BaseException as exc:
                raised.append(exc)
                raise

        return handle

    options.setdefault("renew", False)
    options.setdefault("lease_seconds", LEASE)
    worker = store.jobs.create_worker(
        {kind: keep(h) for kind, h in dag.handlers().items()},
        on_outcome=outcomes.append,
        **options,
    )
    return Runner(dag, worker, outcomes, raised)


def rows(backend: Harness, job_id: str) -> list[tuple[str, Any, int]]:
    """The job's checkpoint rows, straight from the table: (node_id, value, generation)."""
    return [
        (node, json.loads(value), generation)
        for run, node, value, generation in backend.checkpoint_rows()
        if run == job_id
    ]


def raw(backend: Harness, statement: str, params: tuple[Any, ...]) -> None:
    backend.execute(statement, params)


def nodes_of(found: list[tuple[str, Any, int]]) -> list[str]:
    return [node for node, _, _ in found]


def enqueue(store: Store, run_input: Any = INPUT, **options: Any) -> Job:
    return store.jobs.enqueue(KIND, {"input": run_input}, **options)


def get(store: Store, job_id: str) -> Job:
    job = store.jobs.get(job_id)
    assert job is not None
    return job


def fail_at_n3(store: Store, backend: Harness, calls: Calls) -> Job:
    """Attempt 1 records n1 and n2, then n3 raises: the job waits for a retry."""
    job = enqueue(store)
    first = runner(store, calls, hooks={"n3": fail_first("n3")})
    assert first.run_once() is True
    assert [o.outcome for o in first.outcomes] == ["failed"]
    assert get(store, job.id).state == "failed"
    assert calls.snapshot() == ["n1", "n2", "n3"]
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "n1", "n2"]
    return job


# ----------------------------------------------------------------- running


def test_a_run_completes_with_its_result_and_prunes_its_checkpoints(
    store: Store, backend: Harness
) -> None:
    calls = Calls()
    outcomes: list[Outcome] = []
    worker = create_dag_job_runner(
        store,
        documents={KIND: DOCUMENT},
        tasks=make_tasks(calls),
        renew=False,
        owner="dag-worker",
        on_outcome=outcomes.append,
    )
    assert isinstance(worker, Worker)
    assert worker.kinds == [KIND]
    assert worker.owner == "dag-worker"
    job = enqueue(store)
    other = enqueue(store, {"x": 5})
    assert worker.run_once() is True
    assert worker.run_once() is True
    assert worker.run_once() is False
    assert get(store, job.id).state == "done"
    assert get(store, job.id).result == RESULT
    assert get(store, other.id).result == 40
    assert calls.snapshot() == ["n1", "n2", "n3", "n4", "n5"] * 2
    assert [(o.outcome, o.job_id) for o in outcomes] == [
        ("completed", job.id),
        ("completed", other.id),
    ]
    assert rows(backend, job.id) == []
    assert rows(backend, other.id) == []


def test_tasks_get_the_input_exactly_their_needs_and_a_task_context(store: Store) -> None:
    calls = Calls()
    contexts: list[TaskContext] = []
    hooks: dict[str, Hook] = {node: lambda i, ctx: contexts.append(ctx) for node in VALUES}
    job = enqueue(store)
    assert runner(store, calls, hooks=hooks).run_once() is True
    assert calls.inputs == {
        "n1": [{"input": INPUT}],
        "n2": [{"input": INPUT, "n1": 3}],
        "n3": [{"input": INPUT, "n1": 3, "n2": 6}],
        "n4": [{"input": INPUT, "n3": 9}],
        "n5": [{"input": INPUT, "n2": 6, "n4": 18}],
    }
    assert [ctx.node_id for ctx in contexts] == list(VALUES)
    for ctx in contexts:
        assert isinstance(ctx, TaskContext)
        assert ctx.job.id == job.id
        assert ctx.job.lease.attempt == 1
        assert ctx.signal.aborted is False
        assert ctx.run_key == DagJobs.run_key(job.id, ctx.job.lease.token)


@pytest.mark.parametrize("payload", [{}, None, 7])
def test_a_payload_without_an_input_runs_with_none(store: Store, payload: Any) -> None:
    document = {"nodes": {"echo": {"task": "echo"}}, "output": "echo"}
    worker = create_dag_job_runner(
        store,
        documents={"echo": document},
        tasks={"echo": lambda inputs, ctx: {"got": inputs}},
        renew=False,
    )
    job = store.jobs.enqueue("echo", payload)
    assert worker.run_once() is True
    assert get(store, job.id).result == {"got": {"input": None}}


def test_ready_nodes_run_in_id_order(store: Store) -> None:
    order: list[str] = []
    document = {
        "nodes": {
            "zeta": {"task": "t"},
            "alpha": {"task": "t", "needs": ["zeta"]},
            "mid": {"task": "t"},
            "beta": {"task": "t", "needs": ["alpha", "mid"]},
        },
        "output": "beta",
    }
    worker = create_dag_job_runner(
        store,
        documents={"k": document},
        tasks={"t": lambda inputs, ctx: order.append(ctx.node_id)},
        renew=False,
    )
    store.jobs.enqueue("k", {"input": None})
    assert worker.run_once() is True
    assert order == ["mid", "zeta", "alpha", "beta"]


def test_a_value_json_cannot_carry_fails_the_attempt_and_writes_nothing(
    store: Store, backend: Harness
) -> None:
    calls = Calls()

    def hook(inputs: dict[str, Any], ctx: Any) -> None:
        raise AssertionError("never reached")

    document = {"nodes": {"a": {"task": "bad"}, "b": {"task": "t", "needs": ["a"]}}, "output": "b"}
    worker = create_dag_job_runner(
        store,
        documents={"k": document},
        tasks={"bad": lambda inputs, ctx: {1, 2}, "t": hook},
        renew=False,
    )
    job = store.jobs.enqueue("k", {"input": None})
    assert worker.run_once() is True
    failed = get(store, job.id)
    assert failed.state == "failed"
    assert "TypeError" in (failed.last_error or "")
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE]
    assert calls.snapshot() == []


# ----------------------------------------------------------------- resume


def test_a_retry_resumes_from_the_checkpoints_of_the_failed_attempt(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)

    # attempt 1 recorded its identity and the values of n1 and n2, stamped generation 1
    found = {node: (value, generation) for node, value, generation in rows(backend, job.id)}
    assert found["n1"] == (3, 1)
    assert found["n2"] == (6, 1)
    identity, generation = found[RUN_IDENTITY_NODE]
    assert generation == 1
    assert identity == {
        "revision": document_revision(DOCUMENT),
        "input_hash": sha256(INPUT),
        "task_versions": {"add": 1, "double": 1, "seed": None},
        "task_versions_hash": sha256({"add": 1, "double": 1, "seed": None}),
        "nodes": SHAPES,
    }
    assert identity["revision"] == sha256(DOCUMENT)

    second = runner(store, calls)
    assert second.run_once() is False  # the retry waits for its backoff
    clock.advance(5)
    assert second.run_once() is True
    assert [o.outcome for o in second.outcomes] == ["completed"]
    done = get(store, job.id)
    assert (done.state, done.result, done.attempts) == ("done", RESULT, 2)
    # n1 and n2 ran once, in attempt 1; n3 ran in both attempts
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4", "n5"]
    assert calls.inputs["n3"][1] == {"input": INPUT, "n1": 3, "n2": 6}
    assert rows(backend, job.id) == []


# ----------------------------------------------------------------- identity


def changed_document() -> dict[str, Any]:
    """n2 (recorded by ``fail_at_n3``) reads nothing now: its recorded value is stale."""
    document = copy.deepcopy(DOCUMENT)
    document["nodes"]["n2"]["needs"] = []
    return document


def redescribed_document() -> dict[str, Any]:
    """Another revision, but no node runs or reads anything else."""
    document = copy.deepcopy(DOCUMENT)
    document["description"] = "the same graph, described differently"
    document["nodes"]["n2"]["description"] = "twice n1"
    return document


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("document", "the document (checkpointed under revision"),
        ("input", "the input (checkpointed under"),
        ("version", "the task versions ('double' moved from version 1 to 2)"),
    ],
)
def test_a_resume_that_is_not_the_same_run_dead_letters_at_once(
    store: Store, backend: Harness, clock: FakeClock, change: str, expected: str
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    before = rows(backend, job.id)

    options: dict[str, Any] = {}
    if change == "document":
        options["document"] = changed_document()
    elif change == "version":
        options["versions"] = {"double": 2}
    else:
        raw(
            backend,
            'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?',
            (json.dumps({"input": {"x": 4}}), job.id),
        )
    second = runner(store, calls, **options)
    clock.advance(5)
    assert second.run_once() is True

    [error] = second.raised
    assert isinstance(error, RunMismatch)
    assert error.code == "JD2069"
    assert error.retryable is False
    assert expected in error.message
    assert len(error.details["moved"]) == 1
    assert error.details["job_id"] == job.id
    if change == "document":
        assert document_revision(DOCUMENT) in error.message
        assert document_revision(changed_document()) in error.message
    if change == "input":
        assert sha256(INPUT) in error.message
        assert sha256({"x": 4}) in error.message

    [outcome] = second.outcomes
    assert (outcome.outcome, outcome.code) == ("failed", "JD2069")
    dead = get(store, job.id)
    assert dead.state == "dead"
    assert dead.attempts == 2 < dead.max_attempts
    assert (dead.last_error or "").startswith("JD2069: ")
    assert expected in (dead.last_error or "")
    # the refused attempt ran nothing and recorded nothing
    assert calls.snapshot() == ["n1", "n2", "n3"]
    assert rows(backend, job.id) == before


def test_a_mismatch_names_everything_that_moved(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    raw(
        backend,
        'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?',
        (json.dumps({"input": {"x": 3, "y": 0}}), job.id),
    )
    second = runner(store, calls, document=changed_document(), versions={"seed": 1, "double": "1"})
    clock.advance(5)
    assert second.run_once() is True
    [error] = second.raised
    assert isinstance(error, RunMismatch)
    moved = error.details["moved"]
    assert [m.split(" (")[0] for m in moved] == ["the document", "the input", "the task versions"]
    # 1 and "1" are different versions, and the message keeps them apart
    assert (
        "the task versions ('double' moved from version 1 to '1', "
        "'seed' moved from version None to 1)"
    ) in error.message
    assert " and the input " in error.message
    assert get(store, job.id).state == "dead"


def test_a_task_the_document_adds_or_drops_is_named(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    document = copy.deepcopy(DOCUMENT)
    document["nodes"]["n1"]["task"] = "origin"  # "seed" is gone, "origin" is new
    dag = DagJobs(
        {KIND: document},
        {**make_tasks(calls), "origin": Task(lambda inputs, ctx: 3, version=7)},
    )
    raised: list[BaseException] = []

    def handle(payload: Any, ctx: Any) -> Any:
        try:
            return dag.handlers()[KIND](payload, ctx)
        except RunMismatch as exc:
            raised.append(exc)
            raise

    worker = store.jobs.create_worker({KIND: handle}, renew=False)
    clock.advance(5)
    assert worker.run_once() is True
    [error] = raised
    assert "'origin' is new at version 7, 'seed' is gone (was version None)" in str(error)
    assert get(store, job.id).state == "dead"


def test_requeued_once_the_deployment_is_fixed_the_run_resumes(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    clock.advance(5)
    # n2 was recorded by 'double' version 1: a deployment of version 2 cannot reuse it
    assert runner(store, calls, versions={"double": 2}).run_once() is True
    assert get(store, job.id).state == "dead"

    assert store.jobs.requeue(job.id) is True
    fixed = runner(store, calls)  # the deployment the checkpoints were written by
    assert fixed.run_once() is True
    assert [o.outcome for o in fixed.outcomes] == ["completed"]
    assert get(store, job.id).result == RESULT
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4", "n5"]
    assert rows(backend, job.id) == []


def test_a_run_that_failed_on_a_bug_resumes_once_the_fix_ships_with_a_bumped_version(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)  # 'add' broke in n3; n1 and n2 are recorded
    seen: list[dict[str, Any]] = []

    def look(inputs: dict[str, Any], ctx: Any) -> None:
        seen.append({node: (v, g) for node, v, g in rows(backend, job.id)})

    # the fix ships as 'add' version 2: nothing recorded was computed by 'add'
    fixed = runner(store, calls, versions={"add": 2}, hooks={"n4": look})
    clock.advance(5)
    assert fixed.run_once() is True
    assert [o.outcome for o in fixed.outcomes] == ["completed"]
    assert fixed.raised == []
    done = get(store, job.id)
    assert (done.state, done.result, done.attempts) == ("done", RESULT, 2)
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4", "n5"]  # n1, n2 reused
    # before any node ran, the resume re-recorded the identity as this deployment's
    [during] = seen
    assert during[RUN_IDENTITY_NODE] == (
        {**pre_shape_identity(versions={**VERSIONS, "add": 2}), "nodes": SHAPES},
        2,
    )
    assert (during["n1"], during["n2"], during["n3"]) == ((3, 1), (6, 1), (9, 2))
    assert rows(backend, job.id) == []


def test_a_value_recorded_under_the_new_deployment_is_not_reused_by_the_old_one(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    clock.advance(5)
    forward = runner(store, calls, versions={"add": 2}, hooks={"n4": fail_first("n4")})
    assert forward.run_once() is True  # n3 is recorded by 'add' version 2; n4 breaks
    assert [o.outcome for o in forward.outcomes] == ["failed"]
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "n1", "n2", "n3"]
    before = rows(backend, job.id)

    clock.advance(60)
    back = runner(store, calls)  # rolled back to 'add' version 1
    assert back.run_once() is True
    [error] = back.raised
    assert isinstance(error, RunMismatch)
    assert error.details["moved"] == ["the task versions ('add' moved from version 2 to 1)"]
    assert get(store, job.id).state == "dead"
    assert rows(backend, job.id) == before
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4"]


def _document_where(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    document = copy.deepcopy(DOCUMENT)
    change(document)
    return document


def _swap_n1_task(document: dict[str, Any]) -> None:
    document["nodes"]["n1"]["task"] = "double"


def _output_n4(document: dict[str, Any]) -> None:
    document["output"] = "n4"


def _n4_reads_n1_too(document: dict[str, Any]) -> None:
    document["nodes"]["n4"]["needs"] = ["n3", "n1"]


def _add_n6(document: dict[str, Any]) -> None:
    document["nodes"]["n6"] = {"task": "add", "needs": ["n5", "n1"]}
    document["output"] = "n6"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # nothing the recorded n1 and n2 depend on moved: the run resumes
        pytest.param({"document": redescribed_document()}, RESULT, id="descriptions"),
        pytest.param({"versions": {"add": 2}}, RESULT, id="a task only later nodes run"),
        pytest.param({"document": _document_where(_output_n4)}, 18, id="the output"),
        pytest.param({"document": _document_where(_n4_reads_n1_too)}, 30, id="a later needs"),
        pytest.param({"document": _document_where(_add_n6)}, 27, id="a node added downstream"),
        # something a recorded value depends on moved: refused
        pytest.param(
            {"versions": {"seed": 1}},
            ["the task versions ('seed' moved from version None to 1)"],
            id="the task of a recorded node",
        ),
        pytest.param(
            {"document": changed_document()},
            [f"compiles revision {sha256(changed_document())}: node 'n2' needs [], not ['n1'])"],
            id="what a recorded node reads",
        ),
        pytest.param(
            {"document": _document_where(_swap_n1_task)},
            [
                "node 'n1' runs task 'double', not 'seed')",
                "the task versions ('seed' is gone (was version None))",
            ],
            id="the task of a node upstream of a recorded one",
        ),
        pytest.param({"input": {"x": 4}}, ["the input (checkpointed under"], id="the input"),
    ],
)
def test_a_resume_compares_only_what_the_recorded_values_depend_on(
    store: Store, backend: Harness, clock: FakeClock, options: dict[str, Any], expected: Any
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)  # n1 and n2 are recorded
    before = rows(backend, job.id)
    options = dict(options)  # the parameter's own dict is shared by every backend's run
    run_input = options.pop("input", None)
    if run_input is not None:
        raw(
            backend,
            'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?',
            (json.dumps({"input": run_input}), job.id),
        )
    second = runner(store, calls, **options)
    clock.advance(5)
    assert second.run_once() is True
    if isinstance(expected, int):
        assert second.raised == []
        assert get(store, job.id).result == expected
        # n1 and n2 were not run again
        assert calls.snapshot()[:3] == ["n1", "n2", "n3"]
        assert not {"n1", "n2"} & set(calls.snapshot()[3:])
        assert rows(backend, job.id) == []
        return
    [error] = second.raised
    assert isinstance(error, RunMismatch)
    moved = error.details["moved"]
    assert len(moved) == len(expected)
    for needle, item in zip(expected, moved, strict=True):
        assert needle in item
    assert get(store, job.id).state == "dead"
    assert rows(backend, job.id) == before
    assert calls.snapshot() == ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"document": changed_document()}, id="the document"),
        pytest.param({"versions": {"seed": 2, "double": 2, "add": 2}}, id="every task version"),
        pytest.param({"input": {"x": 5}}, id="the input"),
    ],
)
def test_a_run_that_recorded_no_value_resumes_whatever_moved(
    store: Store, backend: Harness, clock: FakeClock, options: dict[str, Any]
) -> None:
    calls = Calls()
    job = enqueue(store)
    first = runner(store, calls, hooks={"n1": fail_first("n1")})
    assert first.run_once() is True
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE]  # no node value
    run_input = options.pop("input", INPUT)
    raw(
        backend,
        'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?',
        (json.dumps({"input": run_input}), job.id),
    )
    second = runner(store, calls, **options)
    clock.advance(5)
    assert second.run_once() is True
    assert second.raised == []
    document = options.get("document", DOCUMENT)
    expected = second.dag.compiled[KIND].evaluate(
        run_input, lambda node, inputs: IMPLEMENTATIONS[document["nodes"][node]["task"]](inputs)
    )
    done = get(store, job.id)
    assert (done.state, done.result) == ("done", expected)
    assert calls.snapshot() == ["n1", "n1", "n2", "n3", "n4", "n5"]


def test_requeue_with_drop_checkpoints_starts_a_mismatched_run_over(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    clock.advance(5)
    new_deployment = runner(store, calls, versions={"double": 2})
    assert new_deployment.run_once() is True  # n2 was computed by 'double' version 1
    assert isinstance(new_deployment.raised[0], RunMismatch)
    assert get(store, job.id).state == "dead"

    assert store.jobs.requeue(job.id, drop_checkpoints=True) is True
    assert rows(backend, job.id) == []
    requeued = get(store, job.id)
    assert (requeued.state, requeued.attempts) == ("pending", 2)  # history kept
    assert runner(store, calls, versions={"double": 2}).run_once() is True
    done = get(store, job.id)
    assert (done.state, done.result, done.attempts) == ("done", RESULT, 3)
    # the run started over: every node ran again under the new deployment
    assert calls.snapshot() == ["n1", "n2", "n3", "n1", "n2", "n3", "n4", "n5"]


def test_requeue_drops_checkpoints_only_when_asked_and_never_under_a_live_lease(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = fail_at_n3(store, backend, calls)
    kept = rows(backend, job.id)
    assert store.jobs.requeue(job.id) is True  # the default keeps them: a resume
    assert rows(backend, job.id) == kept
    # already pending: nothing moves, but no attempt holds the run, so they go
    assert store.jobs.requeue(job.id, drop_checkpoints=True) is False
    assert rows(backend, job.id) == []

    claimed = store.jobs.claim([KIND], owner="holder")
    assert claimed is not None
    assert claimed.id == job.id
    store.jobs.checkpoints_for(claimed).save(job.id, "n1", 3)
    held = rows(backend, job.id)
    assert held == [("n1", 3, 2)]
    with pytest.raises(LeaseRequired):
        store.jobs.requeue(job.id, drop_checkpoints=True)
    assert rows(backend, job.id) == held
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="drop_checkpoints"):
            store.jobs.requeue(job.id, drop_checkpoints=bad)  # type: ignore[arg-type]
    assert rows(backend, job.id) == held
    assert get(store, job.id).state == "leased"


# ----------------------------------------------------------------- legacy identity rows


def seed_rows(backend: Harness, job_id: str, values: dict[str, Any]) -> None:
    """Checkpoint rows as an older release left them: generation 0 (pre-fence default)."""
    for node, value in values.items():
        raw(
            backend,
            'INSERT INTO "_jaren_job_checkpoints" (run_id, node_id, value, generation) '
            "VALUES (?, ?, ?, 0)",
            (job_id, node, json.dumps(value)),
        )


def legacy_identity(document: dict[str, Any] = DOCUMENT) -> dict[str, Any]:
    return {"revision": sha256(document), "input_hash": sha256(INPUT)}


def pre_shape_identity(
    document: dict[str, Any] = DOCUMENT,
    run_input: Any = INPUT,
    versions: dict[str, Any] = VERSIONS,
) -> dict[str, Any]:
    """An identity row as the release before graph shapes were recorded wrote it."""
    return {
        "revision": sha256(document),
        "input_hash": sha256(run_input),
        "task_versions": versions,
        "task_versions_hash": sha256(versions),
    }


@pytest.mark.parametrize(
    "seeded",
    [
        pytest.param(legacy_identity(), id="legacy identity"),
        # no node value depends on anything, so nothing that moved can be stale
        pytest.param(legacy_identity(changed_document()), id="legacy identity of another document"),
        pytest.param(
            pre_shape_identity(changed_document(), {"x": 4}, {**VERSIONS, "seed": 9}),
            id="identity of another document, input and versions",
        ),
    ],
)
def test_a_legacy_identity_without_node_values_is_upgraded(
    store: Store, backend: Harness, clock: FakeClock, seeded: dict[str, Any]
) -> None:
    calls = Calls()
    job = enqueue(store)
    seed_rows(backend, job.id, {RUN_IDENTITY_NODE: seeded})
    first = runner(store, calls, hooks={"n3": fail_first("n3")})
    assert first.run_once() is True
    assert [o.outcome for o in first.outcomes] == ["failed"]
    assert first.raised[0].args == ("n3 broke on its first run",)
    found = {node: (value, generation) for node, value, generation in rows(backend, job.id)}
    # the identity row now names this deployment, written by attempt 1
    assert found[RUN_IDENTITY_NODE] == (
        {
            **legacy_identity(),
            "task_versions": VERSIONS,
            "task_versions_hash": sha256(VERSIONS),
            "nodes": SHAPES,
        },
        1,
    )
    clock.advance(5)
    assert runner(store, calls).run_once() is True
    assert get(store, job.id).result == RESULT
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4", "n5"]


@pytest.mark.parametrize(
    ("seeded", "expected"),
    [
        pytest.param(
            {RUN_IDENTITY_NODE: legacy_identity(), "n1": 3},
            "this run recorded 1 node value(s) before task versions were recorded",
            id="legacy identity with a node value",
        ),
        pytest.param(
            {RUN_IDENTITY_NODE: legacy_identity(redescribed_document()), "n1": 3},
            "the document (checkpointed under revision",
            id="legacy identity of another document with a node value",
        ),
        pytest.param(
            # which nodes another revision had is not recorded: nothing can be reused
            {RUN_IDENTITY_NODE: pre_shape_identity(redescribed_document()), "n1": 3},
            "the document (checkpointed under revision",
            id="identity of another document without its shape, with a node value",
        ),
        pytest.param(
            {"n1": 3, "n2": 6},
            "it holds 2 node value(s) but no run identity",
            id="node values without an identity",
        ),
    ],
)
def test_a_run_whose_checkpoints_cannot_be_confirmed_is_refused(
    store: Store, backend: Harness, seeded: dict[str, Any], expected: str
) -> None:
    calls = Calls()
    job = enqueue(store)
    seed_rows(backend, job.id, seeded)
    before = rows(backend, job.id)
    first = runner(store, calls)
    assert first.run_once() is True
    [error] = first.raised
    assert isinstance(error, RunMismatch)
    assert expected in error.message
    dead = get(store, job.id)
    assert (dead.state, dead.attempts) == ("dead", 1)
    assert calls.snapshot() == []
    assert rows(backend, job.id) == before


# ----------------------------------------------------------------- stale attempts and run keys


@pytest.mark.parametrize("superseded_in", ["n2", "n5"])
def test_a_superseded_attempt_writes_nothing_more_and_the_newer_one_finishes(
    store: Store, backend: Harness, clock: FakeClock, superseded_in: str
) -> None:
    calls = Calls()
    job = enqueue(store)
    newer: dict[str, Any] = {}
    box: list[Runner] = []

    def supersede(inputs: dict[str, Any], ctx: Any) -> None:
        if newer:
            return
        clock.advance(LEASE + 1)  # the stale attempt's lease ran out mid-node...
        claimed = store.jobs.claim([KIND], owner="newer")  # ...and another attempt holds it
        assert claimed is not None
        assert claimed.lease.generation == 2
        newer["claim"] = claimed
        # the newer attempt's run key is held by no running attempt of this runner
        with pytest.raises(RunMismatch):
            box[0].dag.load(DagJobs.run_key(job.id, claimed.lease.token))

    stale_runner = runner(store, calls, owner="stale", hooks={superseded_in: supersede})
    box.append(stale_runner)
    assert stale_runner.run_once() is True

    done_before = list(VALUES)[: list(VALUES).index(superseded_in)]
    [outcome] = stale_runner.outcomes
    assert (outcome.outcome, outcome.code, outcome.phase) == ("lost", "JD2066", "failure")
    assert outcome.generation == 1
    assert stale_runner.worker.stats().lost_settlements == 1
    # no checkpoint of the superseded node or after it; the job is not completed
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, *done_before]
    assert {generation for _, _, generation in rows(backend, job.id)} == {1}
    held = get(store, job.id)
    assert (held.state, held.lease_owner, held.lease_generation) == ("leased", "newer", 2)
    assert held.result is None
    assert calls.snapshot() == [*done_before, superseded_in]

    # the newer attempt runs the same handlers with its own claim and finishes
    claimed = newer["claim"]
    ctx = SimpleNamespace(
        job=claimed,
        checkpoints=store.jobs.checkpoints_for(claimed),
        signal=CancelScope().signal,
    )
    assert stale_runner.dag.handlers()[KIND](claimed.payload, ctx) == RESULT
    done = get(store, job.id)
    assert (done.state, done.result, done.lease_generation) == ("done", RESULT, 2)
    assert rows(backend, job.id) == []
    assert calls.snapshot() == [*done_before, superseded_in, *list(VALUES)[len(done_before) :]]


def test_a_stale_attempt_cannot_write_after_a_newer_worker_completed_the_job(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = enqueue(store)
    newer_box: list[Runner] = []

    def overtaken(inputs: dict[str, Any], ctx: Any) -> None:
        if ctx.job.lease.generation != 1:
            return
        clock.advance(LEASE + 1)
        # another worker re-claims and runs the whole rest of the job while
        # this attempt is still inside n3
        assert newer_box[0].run_once() is True
        assert get(store, job.id).state == "done"

    stale = runner(store, calls, owner="stale", hooks={"n3": overtaken})
    newer_box.append(runner(store, calls, owner="newer", hooks={"n3": overtaken}))
    assert stale.run_once() is True

    [newer_outcome] = newer_box[0].outcomes
    assert (newer_outcome.outcome, newer_outcome.generation) == ("completed", 2)
    [stale_outcome] = stale.outcomes
    assert (stale_outcome.outcome, stale_outcome.code) == ("lost", "JD2065")
    done = get(store, job.id)
    assert (done.state, done.result, done.lease_generation) == ("done", RESULT, 2)
    # the newer attempt pruned everything of generation <= 2; a stale write
    # of n3 after that would have left a row behind
    assert rows(backend, job.id) == []
    # n1 and n2 ran once; n3 in both attempts; n4 and n5 only in the newer one
    assert calls.snapshot() == ["n1", "n2", "n3", "n3", "n4", "n5"]


def test_a_run_key_no_attempt_holds_is_a_run_mismatch(store: Store, backend: Harness) -> None:
    calls = Calls()
    job = enqueue(store)
    seen: dict[str, Any] = {}
    box: list[Runner] = []

    def look(inputs: dict[str, Any], ctx: Any) -> None:
        dag = box[0].dag
        seen["key"] = ctx.run_key
        seen["loaded"] = dag.load(ctx.run_key)
        # the same job under another token is another attempt's run: not held
        with pytest.raises(RunMismatch) as forged:
            dag.save(DagJobs.run_key(ctx.job.id, "forged-token"), "n1", 0)
        seen["forged"] = forged.value

    box.append(runner(store, calls, hooks={"n2": look}))
    assert box[0].run_once() is True
    dag = box[0].dag

    assert seen["key"].startswith(job.id + "\x1f")
    assert set(seen["loaded"]) == {RUN_IDENTITY_NODE, "n1"}
    assert seen["forged"].code == "JD2069"
    assert seen["forged"].details["job_id"] == job.id
    assert f"no attempt holds run {job.id!r}" in seen["forged"].message

    # once the handler returned, the attempt's own key no longer resolves
    for call in (
        lambda: dag.load(seen["key"]),
        lambda: dag.save(seen["key"], "n1", 0),
        lambda: dag.complete(seen["key"], 0),
    ):
        with pytest.raises(RunMismatch, match="no attempt holds run"):
            call()
    done = get(store, job.id)
    assert (done.state, done.result) == ("done", RESULT)
    assert rows(backend, job.id) == []


# ----------------------------------------------------------------- parallel nodes

FAN: dict[str, Any] = {
    "nodes": {
        "root": {"task": "seed"},
        "left": {"task": "double", "needs": ["root"]},
        "right": {"task": "add", "needs": ["root"]},
        "join": {"task": "add", "needs": ["left", "right"]},
    },
    "output": "join",
}


def meet(barrier: threading.Barrier) -> Hook:
    def hook(inputs: dict[str, Any], ctx: Any) -> None:
        barrier.wait()  # the barrier's own timeout bounds a failure

    return hook


def test_independent_nodes_overlap_with_max_parallel(store: Store, backend: Harness) -> None:
    barrier = threading.Barrier(2, timeout=WAIT)
    parallel_calls = Calls()
    parallel = runner(
        store,
        parallel_calls,
        document=FAN,
        max_parallel=2,
        hooks={"left": meet(barrier), "right": meet(barrier)},
    )
    job = enqueue(store)
    assert parallel.run_once() is True
    assert parallel.raised == []
    assert get(store, job.id).result == 9  # root 3, left 6, right 3
    # both met at the barrier: they ran at the same time, on the pool's threads
    assert barrier.broken is False
    assert parallel_calls.threads["left"] != parallel_calls.threads["right"]
    assert parallel_calls.threads["left"].startswith("jaren-dag")
    assert parallel_calls.threads["right"].startswith("jaren-dag")
    assert rows(backend, job.id) == []

    sequential_calls = Calls()
    sequential = runner(store, sequential_calls, document=FAN, max_parallel=1)
    again = enqueue(store)
    assert sequential.run_once() is True
    assert get(store, again.id).result == get(store, job.id).result
    assert sequential_calls.inputs == parallel_calls.inputs
    assert sequential_calls.snapshot() == ["root", "left", "right", "join"]


def test_without_max_parallel_the_barrier_is_never_met(store: Store) -> None:
    # the control for the test above: run one at a time, the barrier breaks
    barrier = threading.Barrier(2, timeout=0.2)
    calls = Calls()
    sequential = runner(
        store, calls, document=FAN, hooks={"left": meet(barrier), "right": meet(barrier)}
    )
    job = enqueue(store)
    assert sequential.run_once() is True
    assert isinstance(sequential.raised[0], threading.BrokenBarrierError)
    assert get(store, job.id).state == "failed"
    assert calls.snapshot() == ["root", "left"]


@pytest.mark.parametrize("max_parallel", [2, 3, 4])
def test_wide_documents_give_the_same_result_at_any_parallelism(
    store: Store, max_parallel: int
) -> None:
    nodes: dict[str, Any] = {"root": {"task": "seed"}}
    for i in range(6):
        nodes[f"w{i}"] = {"task": "double" if i % 2 else "add", "needs": ["root"]}
    nodes["sum"] = {"task": "add", "needs": [f"w{i}" for i in range(6)]}
    nodes["tail"] = {"task": "double", "needs": ["sum", "w0"]}
    document = {"nodes": nodes, "output": "tail"}
    results = []
    for parallelism in (1, max_parallel):
        calls = Calls()
        job = enqueue(store)
        assert runner(store, calls, document=document, max_parallel=parallelism).run_once()
        results.append((get(store, job.id).result, calls.inputs))
        assert sorted(calls.snapshot()) == sorted(nodes)
    assert results[0] == results[1]
    assert results[0][0] == 2 * ((3 + 6) * 3 + 3)


def test_a_failing_parallel_node_winds_up_its_siblings_and_keeps_their_values(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    barrier = threading.Barrier(2, timeout=WAIT)
    calls = Calls()
    first_left = fail_first("left")
    told: list[Any] = []

    def left(inputs: dict[str, Any], ctx: Any) -> None:
        barrier.wait()
        first_left(inputs, ctx)

    def right(inputs: dict[str, Any], ctx: Any) -> None:
        if ctx.job.lease.attempt > 1:
            return
        barrier.wait()
        # still running when left fails: the run tells it to wind up
        assert ctx.signal.wait(WAIT)
        told.append(ctx.signal.reason)

    job = enqueue(store)
    first = runner(store, calls, document=FAN, max_parallel=2, hooks={"left": left, "right": right})
    assert first.run_once() is True
    assert [o.outcome for o in first.outcomes] == ["failed"]
    assert isinstance(first.raised[0], RuntimeError)
    [reason] = told
    assert isinstance(reason, OperationCancelled)
    assert reason.details["node_id"] == "left"
    # right returned after left failed: its value is kept for the retry
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "right", "root"]

    clock.advance(5)
    assert runner(store, calls, document=FAN, max_parallel=2).run_once() is True
    assert get(store, job.id).result == 9
    assert sorted(calls.snapshot()) == ["join", "left", "left", "right", "root"]


# ----------------------------------------------------------------- signal: cancel and stop


def hand_built_attempt(store: Store) -> tuple[Any, CancelScope]:
    claimed = store.jobs.claim([KIND], owner="by-hand", lease_seconds=LEASE)
    assert claimed is not None
    scope = CancelScope()
    ctx = SimpleNamespace(
        job=claimed, checkpoints=store.jobs.checkpoints_for(claimed), signal=scope.signal
    )
    return ctx, scope


@pytest.mark.parametrize("reason", ["enough for today", ValueError("told to stop")])
def test_an_aborted_signal_stops_the_run_before_the_next_node(
    store: Store, backend: Harness, reason: Any
) -> None:
    calls = Calls()
    job = enqueue(store)
    ctx, scope = hand_built_attempt(store)

    def abort(inputs: dict[str, Any], task_ctx: Any) -> None:
        assert task_ctx.signal is ctx.signal
        scope.abort(reason)

    dag = DagJobs({KIND: DOCUMENT}, make_tasks(calls, {"n2": abort}))
    expected = OperationCancelled if isinstance(reason, str) else ValueError
    with pytest.raises(expected) as caught:
        dag.handlers()[KIND](ctx.job.payload, ctx)
    if isinstance(reason, str):
        assert "stopped between nodes" in caught.value.args[0]
        assert "enough for today" in caught.value.args[0]
    else:
        assert caught.value is reason
    # n2 finished and was recorded; n3 never started
    assert calls.snapshot() == ["n1", "n2"]
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "n1", "n2"]
    assert get(store, job.id).state == "leased"


def test_a_cancel_between_nodes_ends_the_run_as_cancelled(store: Store, backend: Harness) -> None:
    calls = Calls()
    job = enqueue(store)

    def cancel(inputs: dict[str, Any], ctx: Any) -> None:
        assert store.jobs.cancel(ctx.job.id, lease=ctx.job.lease) is True
        assert ctx.signal.aborted

    cancelling = runner(store, calls, hooks={"n2": cancel})
    assert cancelling.run_once() is True
    [outcome] = cancelling.outcomes
    assert outcome.outcome == "cancelled"
    assert get(store, job.id).state == "cancelled"
    assert calls.snapshot() == ["n1", "n2"]
    # the cancel settled the job: n2's value had nowhere to go
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "n1"]


def test_stop_between_nodes_leaves_a_run_the_next_worker_resumes(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    calls = Calls()
    job = enqueue(store)
    entered = threading.Event()
    saw_abort: list[bool] = []

    def wait_for_stop(inputs: dict[str, Any], ctx: Any) -> None:
        entered.set()
        saw_abort.append(ctx.signal.wait(WAIT))

    stopping = runner(store, calls, hooks={"n2": wait_for_stop}, poll_seconds=0.05)
    stopping.worker.start()
    assert entered.wait(WAIT)
    stopped = stopping.worker.stop(grace_seconds=WAIT)
    assert stopped.drained is True
    assert saw_abort == [True]
    [outcome] = stopping.outcomes
    # handed back (SPEC §12): the stop cost the run no attempt
    assert (outcome.outcome, outcome.code) == ("snoozed", "JD2091")
    waiting = get(store, job.id)
    assert (waiting.state, waiting.attempts) == ("pending", 0)
    assert calls.snapshot() == ["n1", "n2"]
    assert nodes_of(rows(backend, job.id)) == [RUN_IDENTITY_NODE, "n1", "n2"]

    clock.advance(5)
    assert runner(store, calls).run_once() is True
    assert get(store, job.id).result == RESULT
    assert calls.snapshot() == ["n1", "n2", "n3", "n4", "n5"]


# ----------------------------------------------------------------- lease tokens


def test_no_lease_token_appears_in_any_repr_str_detail_or_log_line(
    backend: Harness, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A token is the capability to settle a job: nothing anyone can print may carry it.

    Every public object a real run hands out (claimed jobs, leases, the
    worker's and the DAG's contexts, outcomes, stats, the fence's errors,
    the DAG's run objects) and every log record of a run that fails, retries
    and loses its lease is rendered, and no live token may appear in any of
    it. Ids and owners are given, so every uuid the runtime mints is a token.
    """
    caplog.set_level(logging.DEBUG)
    tokens_runtime = Runtime(now=clock.now, random=lambda: 0.5, uuid=Sequence("live-token").uuid)
    shown: list[tuple[str, object]] = []  # (where, object) pairs to render
    tokens: set[str] = set()
    raised: list[BaseException] = []
    task_contexts: list[TaskContext] = []
    job_contexts: list[Any] = []
    app_log = logging.getLogger("tests.app")

    def note_lease(lease: Lease) -> None:
        tokens.add(lease.token)
        shown.append(("lease", lease))

    def careless(inputs: dict[str, Any], ctx: TaskContext) -> Any:
        # what an application writes without thinking about capabilities
        task_contexts.append(ctx)
        app_log.warning("running %r (%s)", ctx, ctx)
        if ctx.job.id == "flaky" and ctx.job.lease.attempt == 1:
            raise RuntimeError(f"the first attempt breaks in {ctx!r}")
        if ctx.job.id == "stolen" and not thief:
            clock.advance(LEASE + 1)  # this attempt's lease runs out mid-node...
            claimed = store.jobs.claim([KIND], owner="thief")  # ...and another claims it
            assert claimed is not None
            thief.append(claimed)
        return 1

    thief: list[Any] = []
    document = {"nodes": {"a": {"task": "t"}, "b": {"task": "t", "needs": ["a"]}}, "output": "b"}
    with backend.open(runtime=tokens_runtime) as store:
        dag = DagJobs({KIND: document}, {"t": Task(careless, version=1)})

        def handle(payload: Any, ctx: Any) -> Any:
            job_contexts.append(ctx)
            note_lease(ctx.lease)
            try:
                return dag.handlers()[KIND](payload, ctx)
            except BaseException as exc:
                raised.append(exc)
                raise

        outcomes: list[Outcome] = []
        worker = store.jobs.create_worker(
            {KIND: handle}, owner="leaky", renew=False, lease_seconds=LEASE,
            on_outcome=outcomes.append,
        )  # fmt: skip
        store.jobs.enqueue(KIND, {"input": 1}, id="flaky")
        assert worker.run_once() is True  # attempt 1 fails
        clock.advance(5)
        assert worker.run_once() is True  # attempt 2 resumes and completes
        store.jobs.enqueue(KIND, {"input": 2}, id="stolen")
        assert worker.run_once() is True  # the attempt is superseded: lost
        assert [o.outcome for o in outcomes] == ["failed", "completed", "lost"]
        [stolen] = thief
        note_lease(stolen.lease)
        renewed = store.jobs.renew(stolen.lease)
        note_lease(renewed)
        stats = worker.stats()
        stopped = worker.stop()

        # the fence's refusals, and the mistakes that hand it the wrong thing
        first, _, third = (ctx.lease for ctx in job_contexts)
        refusals: list[Callable[[], Any]] = [
            lambda: store.jobs.complete(first, "late"),  # JobSettled: settled since
            lambda: store.jobs.complete(third, "late"),  # LeaseSuperseded: another attempt
            lambda: store.jobs.complete(stolen.lease, "late"),  # superseded by the renewal
            lambda: job_contexts[2].checkpoints.save("stolen", "a", 2),
            lambda: store.jobs.complete(renewed.token),  # LeaseRequired: a token is no lease
            lambda: store.jobs.renew({"job_id": "stolen", "token": renewed.token}),
            lambda: store.jobs.cancel("stolen", lease=renewed.token),
            lambda: dag.save(task_contexts[0].run_key, "a", 2),  # RunMismatch: not held
            lambda: dag.load(DagJobs.run_key("stolen", renewed.token)),
        ]
        clock.advance(LEASE + 1)
        refusals.append(lambda: store.jobs.complete(renewed, "late"))  # LeaseExpired
        for refuse in refusals:
            with pytest.raises(JobsError) as refused:
                refuse()
            shown.append(("error", refused.value))
        assert {type(r).__name__ for _, r in shown if isinstance(r, BaseException)} >= {
            "JobSettled", "LeaseSuperseded", "LeaseExpired", "LeaseRequired", "RunMismatch",
        }  # fmt: skip

        shown.extend(("raised", exc) for exc in raised)
        shown.extend(("job context", ctx) for ctx in job_contexts)
        shown.extend(("checkpoints", ctx.checkpoints) for ctx in job_contexts)
        shown.extend(("task context", ctx) for ctx in task_contexts)
        shown.extend(("claimed job", ctx.job) for ctx in [*job_contexts, *task_contexts])
        shown.extend(("outcome", outcome) for outcome in outcomes)
        shown.extend([("stats", stats), ("stop", stopped), ("worker", worker)])
        shown.extend([("dag", dag), ("compiled", dag.compiled[KIND]), ("store", store)])
        shown.append(("thief's claim", stolen))
        shown.extend(("job", store.jobs.get(job_id)) for job_id in ("flaky", "stolen"))
        shown.extend(("leases", lease) for lease in worker.leases())
        texts: list[tuple[str, str]] = []
        for where, item in shown:
            texts += [(f"repr({where})", repr(item)), (f"str({where})", str(item))]
            if isinstance(item, BaseException):
                texts += [
                    (f"{where}.args", repr(item.args)),
                    (f"{where}.desc", describe_error(item)),
                ]
            if isinstance(item, JobsError):
                texts += [(f"{where}.details", repr(dict(item.details)))]
            if isinstance(item, Job):
                texts += [(f"{where}.to_dict()", json.dumps(item.to_dict()))]
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts += [(f"log {r.name}", formatter.format(r)) for r in caplog.records]
    # every record at every level, the library's included (it logs under "jaren_jobs")
    assert "tests.app" in {r.name for r in caplog.records}
    assert len(tokens) == 5
    leaked = sorted({where for where, text in texts if any(t in text for t in tokens)})
    assert leaked == []
