"""A run's identity, and what moved under a run's recorded values since they were written."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jaren_jobs.dag.document import CompiledDag, fingerprint


def run_identity(compiled: CompiledDag, run_input: Any) -> dict[str, Any]:
    """What a run records beside its checkpoints, to tell a resume from another run."""
    versions = compiled.task_versions
    return {
        "revision": compiled.revision,
        "input_hash": fingerprint(run_input),
        "task_versions_hash": fingerprint(versions),
        "task_versions": versions,
        # the graph's shape: what each node runs and reads, so that a later
        # deployment can tell which recorded values its changes reach
        "nodes": {
            node: {"task": compiled.node_tasks[node], "needs": list(compiled.needs[node])}
            for node in compiled.order
        },
    }


def _upstream(needs: Callable[[str], Any], nodes: list[str]) -> list[str]:
    """The nodes given and every node they read, directly or not (sorted)."""
    seen: set[str] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        found = needs(node)
        if isinstance(found, (list, tuple)):
            stack.extend(n for n in found if isinstance(n, str))
    return sorted(seen)


def stale(
    stored: Any, identity: Mapping[str, Any], compiled: CompiledDag, recorded: list[str]
) -> list[str]:
    """What moved that the recorded nodes' values depend on (empty: they can be reused)."""
    if not isinstance(stored, dict):
        stored = {}
    moved: list[str] = []
    shapes = stored.get("nodes")
    if not isinstance(shapes, dict):
        # written before shapes were recorded: the same revision is the same
        # shape; another revision's shape is unknown, so nothing can be reused
        shapes = identity["nodes"] if stored.get("revision") == compiled.revision else None
    current = _upstream(lambda n: compiled.needs[n], recorded)
    if shapes is None:
        moved.append(
            f"the document (checkpointed under revision {stored.get('revision')}, this "
            f"runner compiles revision {compiled.revision})"
        )
    else:
        changes = []
        for node in current:
            now = identity["nodes"][node]
            was = shapes.get(node)
            if not isinstance(was, dict):
                changes.append(f"node {node!r} is new")
            elif was.get("task") != now["task"]:
                changes.append(f"node {node!r} runs task {now['task']!r}, not {was.get('task')!r}")
            elif was.get("needs") != now["needs"]:
                changes.append(f"node {node!r} needs {now['needs']}, not {was.get('needs')}")
        if changes:
            moved.append(
                f"the document (checkpointed under revision {stored.get('revision')}, this "
                f"runner compiles revision {compiled.revision}: {', '.join(changes)})"
            )
    if stored.get("input_hash") != identity["input_hash"]:
        moved.append(
            f"the input (checkpointed under {stored.get('input_hash')}, this attempt was "
            f"given {identity['input_hash']})"
        )
    before = stored.get("task_versions")
    if "task_versions_hash" not in stored or not isinstance(before, dict):
        moved.append(
            f"the task versions (this run recorded {len(recorded)} node value(s) before "
            "task versions were recorded, so their implementation cannot be confirmed)"
        )
        return moved
    after: Mapping[str, Any] = compiled.task_versions
    if shapes is not None:
        # only the tasks the recorded values were computed by, and would be now
        known = shapes

        def was_needs(node: str) -> Any:
            shape = known.get(node)
            return shape.get("needs") if isinstance(shape, dict) else None

        used_then = {
            shape.get("task")
            for node in _upstream(was_needs, recorded)
            if isinstance(shape := known.get(node), dict)
        }
        used_now = {compiled.node_tasks[node] for node in current}
        before = {name: version for name, version in before.items() if name in used_then}
        after = {name: after[name] for name in used_now}
    drift = _version_drift(before, after)
    if drift:
        moved.append("the task versions (" + ", ".join(drift) + ")")
    return moved


def _version_drift(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    moved = []
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name, _MISSING), after.get(name, _MISSING)
        if was == now:
            continue
        if was is _MISSING:
            moved.append(f"{name!r} is new at version {_show(now)}")
        elif now is _MISSING:
            moved.append(f"{name!r} is gone (was version {_show(was)})")
        else:
            moved.append(f"{name!r} moved from version {_show(was)} to {_show(now)}")
    return moved


def _show(version: Any) -> str:
    # ints print bare ("version 2"); strings keep their quotes, so 1 and "1" differ
    return repr(version) if isinstance(version, str) else str(version)


_MISSING: Any = object()
