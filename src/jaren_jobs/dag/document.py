"""DAG documents: tasks, checking a document against them, and the compiled graph."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaren_jobs.codec import MAX_DEPTH, check_text
from jaren_jobs.errors import DocumentError
from jaren_jobs.records import ClaimedJob
from jaren_jobs.signals import SignalLike

# The checkpoint row holding a run's identity. The leading unit separator
# keeps it out of every node-id namespace a document can declare.
RUN_IDENTITY_NODE = "\x1fidentity"
# joins a job id to an attempt's token in a run key; no valid id holds one
RUN_KEY_SEPARATOR = "\x1f"
_RESERVED = "input"
_NODE_KEYS = frozenset({"task", "needs", "description"})
_DOCUMENT_KEYS = frozenset({"nodes", "output", "description"})


@dataclass(frozen=True)
class Task:
    """A task implementation with a declared version (a plain callable's is ``None``).

    Bump ``version`` when the implementation changes what it computes: a run
    checkpointed under another version refuses to resume (:class:`RunMismatch`).
    """

    fn: Callable[[dict[str, Any], TaskContext], Any]
    version: int | str | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Task(fn) must be callable, got {type(self.fn).__name__}")
        if self.version is not None and (
            isinstance(self.version, bool) or not isinstance(self.version, (int, str))
        ):
            raise TypeError(f"Task version must be an int, a str or None, got {self.version!r}")


@dataclass(frozen=True)
class TaskContext:
    """What a task sees besides its inputs.

    ``job`` is the claimed job, ``node_id`` the node being computed, and
    ``signal`` the attempt's signal (aborted when the worker stops, the job is
    cancelled, or the lease is lost: a long task should watch it). ``run_key``
    names this attempt's run (:meth:`DagJobs.run_key`); it stops resolving
    (:class:`RunMismatch`) once the attempt's handler has returned. It holds
    the claim's token, so it is left out of the repr: a context written to a
    log must not hand out the capability to settle the job.
    """

    job: ClaimedJob
    node_id: str
    signal: SignalLike
    run_key: str = field(default="", repr=False)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the form every hash here reads."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def fingerprint(value: Any) -> str:
    """The SHA-256 (lowercase hex) of a JSON value's canonical form."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def document_revision(document: Any) -> str:
    """The SHA-256 (lowercase hex) of a document's canonical JSON: its revision."""
    return fingerprint(document)


def _key_path(base: str, key: str) -> str:
    if key.isidentifier():
        return f"{base}.{key}"
    return f"{base}[{json.dumps(key, ensure_ascii=False)}]"


@dataclass(frozen=True)
class CompiledDag:
    """A validated document bound to its task implementations."""

    document: Mapping[str, Any]
    revision: str
    order: tuple[str, ...]  # a deterministic topological order
    needs: Mapping[str, tuple[str, ...]]
    node_tasks: Mapping[str, str]
    tasks: Mapping[str, Task]
    output: str

    @property
    def task_versions(self) -> dict[str, int | str | None]:
        """The declared version of every task this document uses (and only those)."""
        return {name: self.tasks[name].version for name in sorted(set(self.node_tasks.values()))}

    def evaluate(self, run_input: Any, call: Callable[[str, dict[str, Any]], Any]) -> Any:
        """Evaluate without checkpoints (for tests and dry runs)."""
        values: dict[str, Any] = {}
        for node in self.order:
            values[node] = call(node, self.inputs_of(node, run_input, values))
        return values[self.output]

    def inputs_of(self, node: str, run_input: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        inputs: dict[str, Any] = {_RESERVED: run_input}
        for need in self.needs[node]:
            inputs[need] = values[need]
        return inputs


def _json_fault(document: Any) -> tuple[str, str] | None:
    """The JSON path of the first value JSON cannot carry (in reading order), and why."""
    # iterative, so a pathologically deep document is refused, not a RecursionError
    stack: list[tuple[Any, int, str]] = [(document, 0, "$")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return path, f"it is nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, str):
            if not _is_text(item):
                return path, "it is not JSON (a string that is not valid Unicode)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"it is not JSON ({item!r}: JSON has no NaN or infinity)"
        elif item is None or isinstance(item, (bool, int)):
            continue
        elif isinstance(item, dict):
            children: list[tuple[Any, int, str]] = []
            for key, child in item.items():
                if not isinstance(key, str):
                    return path, f"it is not JSON (a {type(key).__name__} key {key!r})"
                if not _is_text(key):
                    return path, "it is not JSON (a key that is not valid Unicode)"
                children.append((child, depth + 1, _key_path(path, key)))
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(
                (child, depth + 1, f"{path}[{index}]")
                for index, child in reversed(list(enumerate(item)))
            )
        else:
            return path, f"it is not JSON (a {type(item).__name__})"
    return None


def _is_text(text: str) -> bool:
    try:
        check_text(text, "")
    except ValueError:
        return False
    return True


def _as_task(name: str, value: object) -> Task:
    if isinstance(value, Task):
        return value
    if callable(value):
        return Task(value)
    raise TypeError(f"tasks[{name!r}] must be callable or a jaren_jobs.Task, got {value!r}")


def compile_document(document: Any, tasks: Mapping[str, Any]) -> CompiledDag:
    """Validate a document against the tasks; :class:`DocumentError` names the JSON path."""
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must map task names to callables, got {type(tasks).__name__}")
    bound = {name: _as_task(str(name), fn) for name, fn in tasks.items()}

    def fault(path: str, message: str) -> DocumentError:
        return DocumentError(f"invalid DAG document at {path}: {message}", path=path)

    problem = _json_fault(document)
    if problem is not None:
        raise fault(*problem)
    if not isinstance(document, dict):
        raise fault("$", f"a document is a JSON object, got {type(document).__name__}")
    for key in document:
        if key not in _DOCUMENT_KEYS:
            raise fault(_key_path("$", key), f"unknown field (known: {sorted(_DOCUMENT_KEYS)})")
    nodes = document.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise fault("$.nodes", "nodes is a non-empty object of node id -> node")
    needs: dict[str, tuple[str, ...]] = {}
    node_tasks: dict[str, str] = {}
    for node_id, node in nodes.items():
        path = _key_path("$.nodes", node_id)
        if node_id in ("", _RESERVED) or node_id.startswith(RUN_KEY_SEPARATOR):
            raise fault(path, f"node id {node_id!r} is reserved (or empty)")
        if not isinstance(node, dict):
            raise fault(path, "a node is an object with a 'task' (and optional 'needs')")
        for key in node:
            if key not in _NODE_KEYS:
                raise fault(_key_path(path, key), f"unknown field (known: {sorted(_NODE_KEYS)})")
        task = node.get("task")
        if not isinstance(task, str) or task == "":
            raise fault(f"{path}.task", "task is the name of a task (a non-empty string)")
        if task not in bound:
            raise fault(f"{path}.task", f"unknown task {task!r} (known: {sorted(bound)})")
        node_needs = node.get("needs", [])
        if not isinstance(node_needs, (list, tuple)):
            raise fault(f"{path}.needs", "needs is a list of node ids")
        for index, need in enumerate(node_needs):
            need_path = f"{path}.needs[{index}]"
            if not isinstance(need, str) or need not in nodes:
                raise fault(need_path, f"unknown node {need!r}")
            if need in node_needs[:index]:  # a repeat would say nothing, or a typo
                raise fault(need_path, f"node {need!r} is needed twice")
        needs[node_id] = tuple(node_needs)
        node_tasks[node_id] = task
    output = document.get("output")
    if not isinstance(output, str) or output not in nodes:
        raise fault("$.output", f"output must name a node, got {output!r}")
    order = _topological_order(needs, fault)
    used = {name: bound[name] for name in set(node_tasks.values())}
    return CompiledDag(
        document=json.loads(canonical_json(document)),
        revision=document_revision(document),
        order=order,
        needs=needs,
        node_tasks=node_tasks,
        tasks=used,
        output=output,
    )


def _topological_order(
    needs: Mapping[str, tuple[str, ...]], fault: Callable[[str, str], DocumentError]
) -> tuple[str, ...]:
    # Kahn's algorithm, ready nodes taken in sorted order: deterministic
    waiting = {node: set(deps) for node, deps in needs.items()}
    order: list[str] = []
    ready = sorted(node for node, deps in waiting.items() if not deps)
    while ready:
        node = ready.pop(0)
        order.append(node)
        for other, deps in waiting.items():
            if node in deps:
                deps.discard(node)
                if not deps and other not in order and other not in ready:
                    ready.append(other)
        ready.sort()
    if len(order) < len(needs):
        stuck = sorted(node for node in needs if node not in order)
        cycle = _find_cycle(needs, stuck)
        first = cycle[0]
        index = needs[first].index(cycle[1])
        raise fault(
            f"{_key_path('$.nodes', first)}.needs[{index}]",
            "cyclic needs: " + " -> ".join([*cycle]),
        )
    return tuple(order)


def _find_cycle(needs: Mapping[str, tuple[str, ...]], stuck: list[str]) -> list[str]:
    # walk needs from a stuck node until a node repeats: that is a cycle
    path: list[str] = []
    node = stuck[0]
    members = set(stuck)
    while node not in path:
        path.append(node)
        node = next(n for n in needs[node] if n in members)
    start = path.index(node)
    return [*path[start:], node]
