"""Random DAG documents run to what a direct topological evaluation says (SPEC §8).

Hypothesis draws node ids in a random order (a permutation that is also a
topological order: every ``needs`` entry points to an earlier node), a few
tasks with random declared versions, a random output node and a random
``max_parallel``, and declares the nodes to the document in yet another
order. The runner's result must equal the test's own evaluation, every task
must see exactly the input and the values of its needs, and each node's task
must run exactly once — or, when one node fails on the first attempt, exactly
once except that node, which runs twice (the retry resumes from the
checkpoints, never recomputing a recorded node).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jaren_jobs import Runtime, Task, compile_document, create_dag_job_runner, open_store
from tests.conftest import FakeClock, Sequence

MAX_EXAMPLES = 100 if os.environ.get("CI") else 50
KIND = "random-dag"

node_ids = st.text(
    # any non-empty string except the reserved ones (\x1f-prefixed, "input")
    alphabet=st.characters(codec="utf-8", exclude_characters="\x1f"),
    min_size=1,
    max_size=5,
).filter(lambda s: s != "input")
versions = st.one_of(st.none(), st.integers(-3, 3), st.text(alphabet="v.0123", max_size=3))
inputs = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-100, 100), st.text(max_size=4)),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 12))
    # the draw order is a random permutation; needs only point backwards in it
    order = draw(st.lists(node_ids, min_size=count, max_size=count, unique=True))
    task_names = [f"task-{i}" for i in range(draw(st.integers(1, 4)))]
    declared = {name: draw(versions) for name in task_names}
    nodes: dict[str, dict[str, Any]] = {}
    for index, node in enumerate(order):
        spec: dict[str, Any] = {"task": draw(st.sampled_from(task_names))}
        if index:
            needs = draw(st.lists(st.sampled_from(order[:index]), unique=True, max_size=4))
            if needs or draw(st.booleans()):
                spec["needs"] = needs
        nodes[node] = spec
    declaration = draw(st.permutations(order))
    document = {
        "nodes": {node: nodes[node] for node in declaration},
        "output": draw(st.sampled_from(order)),
    }
    return {
        "document": document,
        "order": order,
        "versions": declared,
        "input": draw(inputs),
        "max_parallel": draw(st.integers(1, 4)),
        "fail_at": draw(st.none() | st.sampled_from(order)),
    }


def value_of(task: str, node: str, run_input: Any, needs: dict[str, Any]) -> str:
    """What every task computes: a digest of its name, its node, the input and its needs."""
    text = json.dumps([task, node, run_input, sorted(needs.items())], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def evaluate(document: dict[str, Any], order: list[str], run_input: Any) -> Any:
    """The test's own evaluation: walk the permutation, which is topological by construction."""
    values: dict[str, Any] = {}
    for node in order:
        spec = document["nodes"][node]
        needs = {need: values[need] for need in spec.get("needs", [])}
        values[node] = value_of(spec["task"], node, run_input, needs)
    return values[document["output"]]


def smallest_ready_first(document: dict[str, Any]) -> list[str]:
    """The order the runner promises: dependency order, the smallest ready id first."""
    needs = {node: set(spec.get("needs", [])) for node, spec in document["nodes"].items()}
    order: list[str] = []
    while len(order) < len(needs):
        ready = [node for node, deps in needs.items() if node not in order and deps <= set(order)]
        order.append(min(ready))
    return order


class Recorder:
    def __init__(self, fail_at: str | None) -> None:
        self.calls: Counter[str] = Counter()
        self.sequence: list[str] = []
        self.bad_inputs: list[tuple[str, list[str]]] = []
        self.fail_at = fail_at
        self._lock = threading.Lock()

    def task(self, name: str, document: dict[str, Any]) -> Any:
        def run(inputs: dict[str, Any], ctx: Any) -> str:
            node = ctx.node_id
            with self._lock:
                self.calls[node] += 1
                self.sequence.append(node)
                first = self.calls[node] == 1
            expected = sorted(["input", *document["nodes"][node].get("needs", [])])
            if sorted(inputs) != expected:
                with self._lock:
                    self.bad_inputs.append((node, sorted(inputs)))
            if node == self.fail_at and first:
                raise RuntimeError(f"{node!r} fails its first run")
            needs = {key: value for key, value in inputs.items() if key != "input"}
            return value_of(name, node, inputs["input"], needs)

        return run


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(case=dags())
def test_random_documents_run_to_the_direct_evaluation(case: dict[str, Any]) -> None:
    document = case["document"]
    recorder = Recorder(case["fail_at"])
    tasks: dict[str, Any] = {}
    for index, (name, version) in enumerate(case["versions"].items()):
        fn = recorder.task(name, document)
        # version None both ways: a bare callable, and an explicit Task(fn, version=None)
        tasks[name] = fn if version is None and index % 2 else Task(fn, version=version)

    used = {spec["task"] for spec in document["nodes"].values()}
    compiled = compile_document(document, tasks)
    assert compiled.task_versions == {name: case["versions"][name] for name in sorted(used)}
    assert list(compiled.order) == smallest_ready_first(document)

    clock = FakeClock()
    ids = Sequence()
    with tempfile.TemporaryDirectory() as directory:
        runtime = Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)
        with open_store(Path(directory) / "dag.db", runtime=runtime) as store:
            job = store.jobs.enqueue(KIND, {"input": case["input"]})
            worker = create_dag_job_runner(
                store,
                documents={KIND: document},
                tasks=tasks,
                max_parallel=case["max_parallel"],
                renew=False,
            )
            assert worker.run_once() is True
            if case["fail_at"] is not None:
                assert store.jobs.get(job.id).state == "failed"  # type: ignore[union-attr]
                clock.advance(60)  # past the first retry's backoff
                assert worker.run_once() is True
            assert worker.run_once() is False
            done = store.jobs.get(job.id)
            assert done is not None
            assert done.state == "done", done.last_error
            assert done.result == evaluate(document, case["order"], case["input"])
            leftover = store.jobs.counts()
            assert (leftover.pending, leftover.failed, leftover.leased) == (0, 0, 0)

    assert recorder.bad_inputs == []
    expected = Counter(case["order"])
    if case["fail_at"] is not None:
        expected[case["fail_at"]] += 1
    assert recorder.calls == expected
    if case["max_parallel"] == 1 and case["fail_at"] is None:
        assert recorder.sequence == list(compiled.order)
