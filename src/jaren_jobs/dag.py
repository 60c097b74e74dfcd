"""Checkpointed DAG jobs (SPEC §8): documents, their compiler, and the runner.

A document names nodes, each running a task over the values of the nodes it
``needs``; each node's value is checkpointed as it completes, so an attempt
that re-claims a crashed job resumes instead of restarting. A resume reuses
only values nothing has moved under: the document's revision and shape, the
input's hash and the declared task versions are recorded with the
checkpoints, and a resume whose recorded values depend on something that
moved (their node's task or its version, an upstream node's, what they read,
the input) is :class:`RunMismatch`, naming what moved. No retry cures a
mismatch, so the attempt dead-letters the job at once
(``RunMismatch.retryable`` is False); ``requeue(id, drop_checkpoints=True)``
starts such a run over.

Runs are keyed per *attempt* (job id + the claim's token), never per job: a
stale attempt cannot write through the store of the attempt that replaced it.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from .codec import MAX_DEPTH, check_text
from .errors import DocumentError, OperationCancelled, RunMismatch
from .records import ClaimedJob
from .runtime import check_positive_int
from .signals import CancelScope, SignalLike, any_signal

__all__ = [
    "RUN_IDENTITY_NODE",
    "CompiledDag",
    "DagJobs",
    "Task",
    "TaskContext",
    "compile_document",
    "create_dag_job_runner",
    "document_revision",
]

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


class _Checkpoints(Protocol):
    def load(self, run_id: str) -> dict[str, Any] | None: ...

    def save(self, run_id: str, node_id: str, value: Any) -> None: ...

    def complete(self, run_id: str, result: Any = None) -> bool: ...


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


class _Run:
    """One attempt's run: the context it holds, keyed by its run key."""

    __slots__ = ("checkpoints", "job", "signal")

    def __init__(self, job: ClaimedJob, checkpoints: _Checkpoints, signal: SignalLike) -> None:
        self.job = job
        self.checkpoints = checkpoints
        self.signal = signal


class DagJobs:
    """The handlers a DAG runner's worker runs; one per document kind.

    :func:`create_dag_job_runner` builds one and hands :meth:`handlers` to
    ``store.jobs.create_worker``. Every checkpoint call of a run goes through
    :meth:`load`, :meth:`save` and :meth:`complete`, keyed by the attempt's
    *run key*: a key no running attempt holds is :class:`RunMismatch`.
    """

    def __init__(
        self,
        documents: Mapping[str, Any],
        tasks: Mapping[str, Any],
        *,
        max_parallel: int = 1,
    ) -> None:
        if not isinstance(documents, Mapping) or not documents:
            raise TypeError("documents must map job kinds to DAG documents (a non-empty dict)")
        self.max_parallel = check_positive_int(max_parallel, "max_parallel")
        self.compiled: dict[str, CompiledDag] = {}
        for kind, document in documents.items():
            if not isinstance(kind, str) or kind == "":
                raise TypeError(f"documents keys are job kinds (non-empty str), got {kind!r}")
            try:
                self.compiled[kind] = compile_document(document, tasks)
            except DocumentError as exc:
                raise DocumentError(
                    f"documents[{kind!r}]: {exc.message}", path=exc.path, kind=kind
                ) from None
        self._active: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def handlers(self) -> dict[str, Callable[[Any, Any], Any]]:
        """One worker handler per document kind: ``handler(payload, ctx)``."""
        return {kind: self._handler(kind) for kind in self.compiled}

    def _handler(self, kind: str) -> Callable[[Any, Any], Any]:
        def handle(payload: Any, ctx: Any) -> Any:
            return self.run(kind, payload, ctx)

        handle.__name__ = f"dag:{kind}"
        return handle

    # ----------------------------------------------------------- run keys

    @staticmethod
    def run_key(job_id: str, token: str) -> str:
        """The key of one attempt's run: the job id and the claim's token."""
        return f"{job_id}{RUN_KEY_SEPARATOR}{token}"

    def _bound(self, run_key: str) -> _Run:
        with self._lock:
            run = self._active.get(run_key)
        if run is None:
            job_id = str(run_key).split(RUN_KEY_SEPARATOR, 1)[0]
            raise RunMismatch(
                f"no attempt holds run {job_id!r}: its lease was lost, or the run outlived "
                "the handler that started it",
                job_id=job_id,
            )
        return run

    def load(self, run_key: str) -> dict[str, Any] | None:
        """The run's recorded values (its identity row included), through its attempt."""
        run = self._bound(run_key)
        return run.checkpoints.load(run.job.id)

    def save(self, run_key: str, node_id: str, value: Any) -> None:
        """Record one node's value through the attempt holding ``run_key`` (fenced)."""
        run = self._bound(run_key)
        run.checkpoints.save(run.job.id, node_id, value)

    def complete(self, run_key: str, result: Any) -> bool:
        """Complete the job and prune its checkpoints, in one transaction (fenced)."""
        run = self._bound(run_key)
        return run.checkpoints.complete(run.job.id, result)

    # ----------------------------------------------------------- identity

    def _require_same_run(
        self, run_key: str, compiled: CompiledDag, run_input: Any
    ) -> dict[str, Any]:
        """The recorded values this attempt resumes from, or :class:`RunMismatch`.

        Identity is compared only over what the recorded values depend on
        (docs/dag.md, "Run identity"): a value is stale when the input moved,
        or when its node or any node upstream of it now runs another task,
        another version of its task, or reads other nodes. A run holding no
        stale value resumes, and its identity row is rewritten to this
        deployment's before any node runs, so every value recorded from here
        on is attributed to what produced it.
        """
        job_id = self._bound(run_key).job.id
        loaded = self.load(run_key) or {}
        identity = run_identity(compiled, run_input)
        stored = loaded.get(RUN_IDENTITY_NODE)
        # a value of a node this document no longer has is never read
        recorded = {
            node: value
            for node, value in loaded.items()
            if node != RUN_IDENTITY_NODE and node in compiled.needs
        }
        if stored is None and recorded:
            raise RunMismatch(
                f"run {job_id!r} cannot resume: it holds {len(recorded)} node value(s) but "
                "no run identity, so what produced them cannot be confirmed. No retry can "
                "cure this: requeue it with drop_checkpoints=True to start it over, or "
                "enqueue the work under a new id",
                job_id=job_id,
                moved=["the run identity (none was recorded)"],
            )
        moved = _stale(stored, identity, compiled, sorted(recorded)) if recorded else []
        if moved:
            raise RunMismatch(
                f"run {job_id!r} cannot resume: {' and '.join(moved)} changed since its "
                "checkpoints were written, and its recorded values depend on it. No retry "
                "can cure this: requeue the job once the deployment that wrote them is back, "
                "requeue it with drop_checkpoints=True to start it over, or enqueue the work "
                "under a new id",
                job_id=job_id,
                moved=moved,
            )
        if stored != identity:
            self.save(run_key, RUN_IDENTITY_NODE, identity)
        return recorded

    # ----------------------------------------------------------- running

    def run(self, kind: str, payload: Any, ctx: Any) -> Any:
        """Run (or resume) one attempt of a ``kind`` job: the handler's body."""
        compiled = self.compiled[kind]
        run_input = payload.get("input") if isinstance(payload, dict) else None
        job: ClaimedJob = ctx.job
        run_key = self.run_key(job.id, job.lease.token)
        with self._lock:
            self._active[run_key] = _Run(job, ctx.checkpoints, ctx.signal)
        try:
            values = self._require_same_run(run_key, compiled, run_input)
            self._run_nodes(run_key, compiled, run_input, values)
            result = values[compiled.output]
            self.complete(run_key, result)
            return result
        finally:
            with self._lock:
                self._active.pop(run_key, None)

    def _check_live(self, run_key: str) -> _Run:
        run = self._bound(run_key)
        if run.signal.aborted:
            reason = run.signal.reason
            if isinstance(reason, BaseException):
                raise reason
            raise OperationCancelled(
                f"run {run.job.id!r} stopped between nodes: {reason!r}", job_id=run.job.id
            )
        return run

    def _call(
        self,
        run_key: str,
        compiled: CompiledDag,
        node: str,
        inputs: dict[str, Any],
        signal: SignalLike | None = None,
    ) -> Any:
        run = self._check_live(run_key)
        task = compiled.tasks[compiled.node_tasks[node]]
        context = TaskContext(
            job=run.job, node_id=node, signal=signal or run.signal, run_key=run_key
        )
        return task.fn(inputs, context)

    def _record(self, run_key: str, node: str, value: Any, values: dict[str, Any]) -> None:
        self.save(run_key, node, value)
        values[node] = value

    def _run_nodes(
        self, run_key: str, compiled: CompiledDag, run_input: Any, values: dict[str, Any]
    ) -> None:
        todo = [node for node in compiled.order if node not in values]
        if self.max_parallel == 1 or len(todo) <= 1:
            for node in todo:
                value = self._call(
                    run_key, compiled, node, compiled.inputs_of(node, run_input, values)
                )
                self._record(run_key, node, value, values)
            return
        job_id = self._bound(run_key).job.id
        # the tasks' signal: the attempt's, and aborted too when the run ends
        # early, so running siblings wind up instead of delaying the retry
        siblings = CancelScope()
        signal = any_signal(self._bound(run_key).signal, siblings.signal)
        pending: dict[Future[Any], str] = {}
        with ThreadPoolExecutor(self.max_parallel, thread_name_prefix="jaren-dag") as pool:
            try:
                while todo or pending:
                    ready = [n for n in todo if all(need in values for need in compiled.needs[n])]
                    for node in ready[: self.max_parallel - len(pending)]:
                        todo.remove(node)
                        inputs = compiled.inputs_of(node, run_input, values)
                        future = pool.submit(self._call, run_key, compiled, node, inputs, signal)
                        pending[future] = node
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    failed = self._record_finished(run_key, done, pending, values)
                    if failed is not None:
                        node, failure = failed
                        siblings.abort(
                            OperationCancelled(
                                f"node {node!r} of run {job_id!r} failed; the attempt is "
                                "winding up",
                                job_id=job_id,
                                node_id=node,
                            )
                        )
                        # start nothing new; what is already running finishes,
                        # and its values are kept for the retry to resume from
                        for future in pending:
                            future.cancel()
                        finished, _ = wait(pending)
                        self._record_finished(run_key, finished, pending, values)
                        raise failure
            finally:
                if pending:  # ended early some other way (a refused save): wind up
                    siblings.abort(
                        OperationCancelled(
                            f"run {job_id!r} ended early; the attempt is winding up",
                            job_id=job_id,
                        )
                    )
                for future in pending:
                    future.cancel()

    def _record_finished(
        self,
        run_key: str,
        finished: set[Future[Any]],
        pending: dict[Future[Any], str],
        values: dict[str, Any],
    ) -> tuple[str, BaseException] | None:
        # record in node-id order so checkpoint writes are deterministic; the
        # first task failure is returned, not raised, so its siblings' values
        # are saved first
        failure: tuple[str, BaseException] | None = None
        for future in sorted(finished, key=lambda f: pending[f]):
            node = pending.pop(future)
            if future.cancelled():
                continue
            error = future.exception()
            if error is not None:
                failure = failure or (node, error)
                continue
            self._record(run_key, node, future.result(), values)
        return failure


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


def _stale(
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


def create_dag_job_runner(
    store: Any,
    *,
    documents: Mapping[str, Any],
    tasks: Mapping[str, Any],
    max_parallel: int = 1,
    **worker_options: Any,
) -> Any:
    """A worker that runs checkpointed DAG documents as jobs.

    ``documents`` maps a job kind to a document; a job's payload is
    ``{"input": …}``. ``max_parallel`` runs independent ready nodes on a thread
    pool. Every other keyword is a worker option (SPEC §7).
    """
    jobs = getattr(store, "jobs", None)
    if jobs is None or not hasattr(jobs, "create_worker"):
        raise TypeError(f"create_dag_job_runner takes an open Store, got {type(store).__name__}")
    dag = DagJobs(documents, tasks, max_parallel=max_parallel)
    return jobs.create_worker(dag.handlers(), **worker_options)
