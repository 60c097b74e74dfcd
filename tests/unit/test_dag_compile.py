"""The DAG document compiler (SPEC §8): what it accepts, and every refusal by JSON path."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import (
    CompiledDag,
    DocumentError,
    JobsError,
    Task,
    compile_document,
    create_dag_job_runner,
)
from jaren_jobs.dag import RUN_IDENTITY_NODE, DagJobs, document_revision


def noop(inputs: dict[str, Any], ctx: Any) -> Any:
    return None


TASKS: dict[str, Any] = {
    "fetch": noop,
    "parse": Task(noop, version=2),
    "count": Task(noop, version="2024-06"),
    "unused": Task(noop, version=9),
}

GOOD = {
    "description": "fetch, parse, count",
    "nodes": {
        "count": {"task": "count", "needs": ["parse"]},
        "parse": {"task": "parse", "needs": ["fetch"], "description": "strip tags"},
        "fetch": {"task": "fetch"},
    },
    "output": "count",
}


def refusal(document: Any, tasks: dict[str, Any] | None = None) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        compile_document(document, TASKS if tasks is None else tasks)
    error = caught.value
    assert error.code == "JD0003"
    assert str(error).startswith("JD0003: ")
    assert error.details["path"] == error.path
    return error


def doc(nodes: Any, output: Any = "a", **extra: Any) -> dict[str, Any]:
    return {"nodes": nodes, "output": output, **extra}


# ----------------------------------------------------------------- accepted


def test_a_good_document_compiles_in_dependency_order() -> None:
    compiled = compile_document(GOOD, TASKS)
    assert isinstance(compiled, CompiledDag)
    assert compiled.order == ("fetch", "parse", "count")
    assert compiled.needs == {"fetch": (), "parse": ("fetch",), "count": ("parse",)}
    assert compiled.node_tasks == {"fetch": "fetch", "parse": "parse", "count": "count"}
    assert compiled.output == "count"


def test_ready_nodes_are_ordered_by_id_whatever_the_declaration_order() -> None:
    document = doc(
        {
            "z": {"task": "fetch"},
            "m": {"task": "fetch", "needs": ["z"]},
            "b": {"task": "fetch", "needs": ["z"]},
            "a": {"task": "fetch", "needs": ["m", "b"]},
            "y": {"task": "fetch"},
        }
    )
    # y and z are ready first (y < z); then b and m; then a
    assert compile_document(document, TASKS).order == ("y", "z", "b", "m", "a")


def test_declared_task_versions_cover_only_the_tasks_the_document_uses() -> None:
    compiled = compile_document(GOOD, TASKS)
    # "unused" is in the runner's tasks but not in the document: it is no part of the run
    assert compiled.task_versions == {"count": "2024-06", "fetch": None, "parse": 2}
    assert set(compiled.tasks) == {"count", "fetch", "parse"}
    # a plain callable is wrapped as a Task of version None
    assert compiled.tasks["fetch"] == Task(noop, version=None)


def test_task_validates_its_function_and_version() -> None:
    assert Task(noop).version is None
    assert Task(noop, version=0).version == 0
    assert Task(noop, version="v1").version == "v1"
    with pytest.raises(TypeError, match="callable"):
        Task("noop")  # type: ignore[arg-type]
    for bad in (True, 1.5, ["1"]):
        with pytest.raises(TypeError, match="version"):
            Task(noop, version=bad)  # type: ignore[arg-type]


def test_tasks_must_be_callables_or_tasks() -> None:
    with pytest.raises(TypeError, match="tasks\\['fetch'\\]"):
        compile_document(GOOD, {**TASKS, "fetch": "not callable"})
    with pytest.raises(TypeError, match="tasks must map"):
        compile_document(GOOD, [noop])  # type: ignore[arg-type]


def test_needs_may_be_a_tuple_and_descriptions_are_free_text() -> None:
    document = doc({"a": {"task": "fetch", "description": "x"}, "b": {"task": "fetch"}}, "a")
    document["nodes"]["a"]["needs"] = ("b",)
    assert compile_document(document, TASKS).needs["a"] == ("b",)


def test_the_compiled_document_is_a_copy_the_caller_cannot_change() -> None:
    document = copy.deepcopy(GOOD)
    compiled = compile_document(document, TASKS)
    document["nodes"]["fetch"]["task"] = "parse"
    document["output"] = "fetch"
    assert compiled.document == GOOD
    assert compiled.revision == document_revision(GOOD)


def test_evaluate_runs_without_checkpoints() -> None:
    compiled = compile_document(GOOD, TASKS)
    seen: list[tuple[str, dict[str, Any]]] = []

    def call(node: str, inputs: dict[str, Any]) -> Any:
        seen.append((node, inputs))
        return len(seen)

    assert compiled.evaluate("in", call) == 3
    assert seen == [
        ("fetch", {"input": "in"}),
        ("parse", {"input": "in", "fetch": 1}),
        ("count", {"input": "in", "parse": 2}),
    ]


# ----------------------------------------------------------------- revision


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_the_revision_is_the_sha256_of_the_canonical_json() -> None:
    document = {
        "output": "a",
        "nodes": {"a": {"task": "fetch"}},
        "description": "café ☕",
    }
    literal = '{"description":"café ☕","nodes":{"a":{"task":"fetch"}},"output":"a"}'
    expected = hashlib.sha256(literal.encode("utf-8")).hexdigest()
    assert canonical(document) == literal.encode("utf-8")
    assert compile_document(document, TASKS).revision == expected
    assert document_revision(document) == expected
    assert jaren_jobs.dag.document_revision(GOOD) == hashlib.sha256(canonical(GOOD)).hexdigest()


def test_key_order_does_not_change_the_revision_and_content_does() -> None:
    reordered = {
        "output": GOOD["output"],
        "nodes": dict(reversed(list(copy.deepcopy(GOOD["nodes"]).items()))),
        "description": GOOD["description"],
    }
    for node in reordered["nodes"].values():
        items = list(node.items())
        node.clear()
        node.update(reversed(items))
    assert json.dumps(reordered) != json.dumps(GOOD)  # really a different order
    assert compile_document(reordered, TASKS).revision == compile_document(GOOD, TASKS).revision

    edited = copy.deepcopy(GOOD)
    edited["description"] = "fetch, parse, count!"
    assert compile_document(edited, TASKS).revision != compile_document(GOOD, TASKS).revision


# ----------------------------------------------------------------- refusals

F = {"task": "fetch"}

REFUSALS: list[tuple[str, Any, str, str]] = [
    # (name, document, exact path, a fragment of the message)
    ("unknown task", doc({"a": {"task": "nope"}}), "$.nodes.a.task", "unknown task 'nope'"),
    ("missing task", doc({"a": {"needs": []}}), "$.nodes.a.task", "task is the name"),
    ("task not a string", doc({"a": {"task": 3}}), "$.nodes.a.task", "task is the name"),
    ("empty task", doc({"a": {"task": ""}}), "$.nodes.a.task", "task is the name"),
    (
        "unknown need",
        doc({"a": F, "b": {"task": "fetch", "needs": ["a", "zz"]}}),
        "$.nodes.b.needs[1]",
        "unknown node 'zz'",
    ),
    (
        "unknown need under a quoted id",
        doc({"a": F, "b-1": {"task": "fetch", "needs": ["x"]}}),
        '$.nodes["b-1"].needs[0]',
        "unknown node 'x'",
    ),
    (
        "needs naming the reserved input",
        doc({"a": {"task": "fetch", "needs": ["input"]}}),
        "$.nodes.a.needs[0]",
        "unknown node 'input'",
    ),
    (
        "a need that is not a string",
        doc({"a": F, "b": {"task": "fetch", "needs": [1]}}),
        "$.nodes.b.needs[0]",
        "unknown node 1",
    ),
    (
        "repeated need",
        doc({"a": F, "b": {"task": "fetch", "needs": ["a", "a"]}}),
        "$.nodes.b.needs[1]",
        "needed twice",
    ),
    (
        "needs not a list",
        doc({"a": F, "b": {"task": "fetch", "needs": "a"}}),
        "$.nodes.b.needs",
        "list of node ids",
    ),
    (
        "self cycle",
        doc({"a": {"task": "fetch", "needs": ["a"]}}),
        "$.nodes.a.needs[0]",
        "cyclic needs: a -> a",
    ),
    (
        "three-node cycle",
        doc(
            {
                "a": {"task": "fetch", "needs": ["c"]},
                "b": {"task": "fetch", "needs": ["a"]},
                "c": {"task": "fetch", "needs": ["d", "b"]},
                "d": F,
            }
        ),
        "$.nodes.a.needs[0]",
        "cyclic needs: a -> c -> b -> a",
    ),
    (
        # x is stuck behind the cycle but is not in it: the path points INTO the cycle
        "cycle downstream of a stuck node",
        doc(
            {
                "x": {"task": "fetch", "needs": ["y"]},
                "y": {"task": "fetch", "needs": ["z"]},
                "z": {"task": "fetch", "needs": ["y"]},
            },
            "x",
        ),
        "$.nodes.y.needs[0]",
        "cyclic needs: y -> z -> y",
    ),
    ("unknown output", doc({"a": F}, "zz"), "$.output", "output must name a node, got 'zz'"),
    ("missing output", {"nodes": {"a": F}}, "$.output", "got None"),
    ("output not a string", doc({"a": F}, ["a"]), "$.output", "output must name a node"),
    ("reserved id input", doc({"input": F}, "input"), "$.nodes.input", "reserved"),
    (
        "reserved identity id",
        doc({RUN_IDENTITY_NODE: F}, RUN_IDENTITY_NODE),
        '$.nodes["\\u001fidentity"]',
        "reserved",
    ),
    ("reserved separator id", doc({"\x1f": F}, "\x1f"), '$.nodes["\\u001f"]', "reserved"),
    ("empty id", doc({"": F}, ""), '$.nodes[""]', "reserved (or empty)"),
    ("unknown document field", doc({"a": F}, outputs="a"), "$.outputs", "unknown field"),
    ("unknown quoted field", doc({"a": F}, **{"x y": 1}), '$["x y"]', "unknown field"),
    (
        "unknown node field",
        doc({"a": F, "b": {"task": "fetch", "need": ["a"]}}),
        "$.nodes.b.need",
        "unknown field",
    ),
    ("node not an object", doc({"a": "fetch"}), "$.nodes.a", "a node is an object"),
    ("nodes missing", {"output": "a"}, "$.nodes", "non-empty object"),
    ("nodes empty", doc({}), "$.nodes", "non-empty object"),
    ("nodes a list", doc([F]), "$.nodes", "non-empty object"),
    # not JSON: the path of the first value JSON cannot carry
    ("a set document", {"a", "b"}, "$", "not JSON (a set)"),
    ("NaN at the top", doc({"a": F}, description=math.nan), "$.description", "NaN"),
    (
        "infinity in a node",
        doc({"a": {"task": "fetch", "description": -math.inf}}),
        "$.nodes.a.description",
        "JSON has no NaN or infinity",
    ),
    (
        "a set of needs",
        doc({"a": F, "b": {"task": "fetch", "needs": {"a"}}}),
        "$.nodes.b.needs",
        "not JSON (a set)",
    ),
    ("bytes", doc({"a": {"task": b"fetch"}}), "$.nodes.a.task", "not JSON (a bytes)"),
    (
        "NaN inside a list",
        doc({"a": F}, description=["ok", [1, math.nan]]),
        "$.description[1][1]",
        "NaN",
    ),
    ("a non-string key", doc({1: F}), "$.nodes", "int key 1"),
    ("a lone surrogate id", doc({"\ud800": F}), "$.nodes", "not valid Unicode"),
    ("a lone surrogate value", doc({"a": {"task": "\udfff"}}), "$.nodes.a.task", "Unicode"),
    # not an object
    ("a list document", [{"nodes": {}}], "$", "a document is a JSON object, got list"),
    ("a string document", "nodes", "$", "got str"),
    ("a null document", None, "$", "got NoneType"),
]


@pytest.mark.parametrize(
    ("document", "path", "fragment"),
    [pytest.param(d, p, m, id=name) for name, d, p, m in REFUSALS],
)
def test_each_refusal_names_the_json_path_of_the_fault(
    document: Any, path: str, fragment: str
) -> None:
    error = refusal(document)
    assert error.path == path
    assert fragment in error.message
    assert f"at {path}" in error.message


def test_of_several_faults_the_documented_check_order_picks_one() -> None:
    document = doc(
        {
            "a": {"task": "fetch", "needs": ["b"]},
            "b": {"task": "fetch", "needs": ["a"]},
            "c": {"task": "nope"},
            "d": {"task": "fetch", "needs": ["zz"]},
        },
        "zz",
        description=[math.nan],
        extra=1,
    )
    # not JSON (anywhere), unknown document fields, nodes in order, output, cycles
    expected = [
        "$.description[0]",
        "$.extra",
        "$.nodes.c.task",
        "$.nodes.d.needs[0]",
        "$.output",
        "$.nodes.a.needs[0]",
    ]
    for path in expected:
        assert refusal(document).path == path
        if path == "$.description[0]":
            del document["description"]
        elif path == "$.extra":
            del document["extra"]
        elif path == "$.nodes.c.task":
            document["nodes"]["c"]["task"] = "fetch"
        elif path == "$.nodes.d.needs[0]":
            del document["nodes"]["d"]["needs"]
        elif path == "$.output":
            document["output"] = "c"
    document["nodes"]["b"]["needs"] = []
    assert compile_document(document, TASKS).order == ("b", "a", "c", "d")


def test_a_document_too_deep_for_json_is_refused_not_a_recursion_error() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    error = refusal(doc({"a": F}, description=deep))
    assert error.path.startswith("$.description[0][0]")
    assert "nested more than" in error.message


def test_document_error_is_a_jobs_error_that_no_retry_cures() -> None:
    error = refusal(doc({"a": F}, "b"))
    assert isinstance(error, JobsError)
    assert error.retryable is False


# ----------------------------------------------------------------- the runner's compile


def test_the_runner_compiles_every_document_and_names_the_kind_at_fault() -> None:
    with pytest.raises(DocumentError) as caught:
        DagJobs({"good": GOOD, "bad": doc({"a": {"task": "nope"}})}, TASKS)
    assert caught.value.path == "$.nodes.a.task"
    assert caught.value.details["kind"] == "bad"
    assert caught.value.message.startswith("documents['bad']: ")


def test_the_runner_validates_its_arguments() -> None:
    with pytest.raises(TypeError, match="documents"):
        DagJobs({}, TASKS)
    with pytest.raises(TypeError, match="documents"):
        DagJobs([GOOD], TASKS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="job kinds"):
        DagJobs({"": GOOD}, TASKS)
    with pytest.raises(TypeError, match="max_parallel"):
        DagJobs({"k": GOOD}, TASKS, max_parallel=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_parallel"):
        DagJobs({"k": GOOD}, TASKS, max_parallel=0)
    with pytest.raises(TypeError, match="open Store"):
        create_dag_job_runner(object(), documents={"k": GOOD}, tasks=TASKS)


def test_a_run_key_joins_the_job_id_and_token_with_a_separator_no_id_holds() -> None:
    key = DagJobs.run_key("job-1", "token-1")
    assert key == "job-1\x1ftoken-1"
    assert key.split("\x1f") == ["job-1", "token-1"]
    handlers = DagJobs({"k": GOOD, "other": GOOD}, TASKS).handlers()
    assert sorted(handlers) == ["k", "other"]
    assert all(callable(h) for h in handlers.values())
