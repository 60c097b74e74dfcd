"""Checkpointed DAG jobs (SPEC §8): documents, their compiler, and the runner.

A document names nodes, each running a task over the values of the nodes it
``needs``; each node's value is checkpointed as it completes, so an attempt
that re-claims a crashed job resumes instead of restarting. A resume must be
the *same run*: the document's revision, the input's hash and the declared
task versions are recorded with the checkpoints, and a resume that disagrees
is :class:`RunMismatch`, naming what moved. No retry cures a mismatch, so the
attempt dead-letters the job at once (``RunMismatch.retryable`` is False).

Runs are keyed per *attempt* (job id + the claim's token), never per job: a
stale attempt cannot write through the store of the attempt that replaced it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from .codec import encode_json
from .errors import DocumentError, OperationCancelled, RunMismatch
from .records import ClaimedJob
from .runtime import check_positive_int
from .signals import SignalLike

__all__ = [
    "RUN_IDENTITY_NODE",
    "CompiledDag",
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
    """What a task sees besides its inputs."""

    job: ClaimedJob
    node_id: str
    signal: SignalLike


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
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def document_revision(document: Any) -> str:
    """The SHA-256 of a document's canonical JSON."""
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

    try:
        encode_json(document, "the document")
    except (TypeError, ValueError) as exc:
        raise fault("$", f"it is not JSON ({exc})") from None
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
        if not isinstance(node_needs, list):
            raise fault(f"{path}.needs", "needs is a list of node ids")
        for index, need in enumerate(node_needs):
            need_path = f"{path}.needs[{index}]"
            if not isinstance(need, str) or need not in nodes:
                raise fault(need_path, f"unknown node {need!r}")
            if need in node_needs[:index]:
                raise fault(need_path, f"node {need!r} is needed twice")
        needs[node_id] = tuple(node_needs)
        node_tasks[node_id] = task
    output = document.get("output")
    if not isinstance(output, str) or output not in nodes:
        raise fault("$.output", f"output must name a node, got {output!r}")
    order = _topological_order(needs, fault)
    used = {name: bound[name] for name in set(node_tasks.values())}
    return CompiledDag(
        document=document,
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
    """The handlers a DAG runner's worker runs; one per document kind."""

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
        return {kind: self._handler(kind) for kind in self.compiled}

    def _handler(self, kind: str) -> Callable[[Any, Any], Any]:
        def handle(payload: Any, ctx: Any) -> Any:
            return self.run(kind, payload, ctx)

        handle.__name__ = f"dag:{kind}"
        return handle

    # ----------------------------------------------------------- run keys

    @staticmethod
    def run_key(job_id: str, token: str) -> str:
        return f"{job_id}{RUN_KEY_SEPARATOR}{token}"

    def _bound(self, run_key: str) -> _Run:
        with self._lock:
            run = self._active.get(run_key)
        if run is None:
            job_id = run_key.split(RUN_KEY_SEPARATOR, 1)[0]
            raise RunMismatch(
                f"no attempt holds run {job_id!r}: its lease was lost, or the run outlived "
                "the handler that started it",
                job_id=job_id,
            )
        return run

    # ----------------------------------------------------------- identity

    def _require_same_run(
        self, run_key: str, compiled: CompiledDag, run_input: Any
    ) -> dict[str, Any]:
        run = self._bound(run_key)
        job_id = run.job.id
        loaded = run.checkpoints.load(job_id) or {}
        versions = compiled.task_versions
        identity = {
            "revision": compiled.revision,
            "input_hash": fingerprint(run_input),
            "task_versions_hash": fingerprint(versions),
            "task_versions": versions,
        }
        stored = loaded.get(RUN_IDENTITY_NODE)
        recorded = {k: v for k, v in loaded.items() if k != RUN_IDENTITY_NODE}
        if stored is None:
            if recorded:
                raise RunMismatch(
                    f"run {job_id!r} cannot resume: it holds {len(recorded)} node value(s) but "
                    "no run identity, so what produced them cannot be confirmed",
                    job_id=job_id,
                )
            self._bound(run_key).checkpoints.save(job_id, RUN_IDENTITY_NODE, identity)
            return recorded
        if not isinstance(stored, dict):
            stored = {}
        moved: list[str] = []
        if stored.get("revision") != identity["revision"]:
            moved.append(
                f"the document (checkpointed under revision {stored.get('revision')}, this "
                f"runner compiles revision {identity['revision']})"
            )
        if stored.get("input_hash") != identity["input_hash"]:
            moved.append(
                f"the input (checkpointed under {stored.get('input_hash')}, this attempt was "
                f"given {identity['input_hash']})"
            )
        if "task_versions_hash" not in stored:
            # written before task identity was recorded: upgrade only while
            # nothing could be replayed from an implementation nobody can name
            if recorded:
                moved.append(
                    f"the task versions (this run recorded {len(recorded)} node value(s) before "
                    "task versions were recorded, so their implementation cannot be confirmed)"
                )
            elif not moved:
                self._bound(run_key).checkpoints.save(job_id, RUN_IDENTITY_NODE, identity)
        elif stored.get("task_versions_hash") != identity["task_versions_hash"]:
            drift = _version_drift(stored.get("task_versions") or {}, versions)
            moved.append("the task versions (" + ", ".join(drift) + ")")
        if moved:
            raise RunMismatch(
                f"run {job_id!r} cannot resume: {' and '.join(moved)} changed since its "
                "checkpoints were written. No retry can cure this: requeue the job once the "
                "deployment is fixed, or enqueue the work under a new id",
                job_id=job_id,
                moved=moved,
            )
        return recorded

    # ----------------------------------------------------------- running

    def run(self, kind: str, payload: Any, ctx: Any) -> Any:
        compiled = self.compiled[kind]
        run_input = payload.get("input") if isinstance(payload, dict) else None
        job: ClaimedJob = ctx.job
        run_key = self.run_key(job.id, job.lease.token)
        with self._lock:
            self._active[run_key] = _Run(job, ctx.checkpoints, ctx.signal)
        try:
            values = self._require_same_run(run_key, compiled, run_input)
            values = {k: v for k, v in values.items() if k in compiled.needs}
            self._run_nodes(run_key, compiled, run_input, values)
            result = values[compiled.output]
            self._bound(run_key).checkpoints.complete(job.id, result)
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

    def _call(self, run_key: str, compiled: CompiledDag, node: str, inputs: dict[str, Any]) -> Any:
        run = self._check_live(run_key)
        task = compiled.tasks[compiled.node_tasks[node]]
        return task.fn(inputs, TaskContext(job=run.job, node_id=node, signal=run.signal))

    def _record(self, run_key: str, node: str, value: Any, values: dict[str, Any]) -> None:
        run = self._bound(run_key)
        run.checkpoints.save(run.job.id, node, value)
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
        pending: dict[Future[Any], str] = {}
        with ThreadPoolExecutor(self.max_parallel, thread_name_prefix="jaren-dag") as pool:
            try:
                while todo or pending:
                    ready = [n for n in todo if all(need in values for need in compiled.needs[n])]
                    for node in ready[: self.max_parallel - len(pending)]:
                        todo.remove(node)
                        inputs = compiled.inputs_of(node, run_input, values)
                        pending[pool.submit(self._call, run_key, compiled, node, inputs)] = node
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    # record in a stable order so checkpoint writes are deterministic
                    for future in sorted(done, key=lambda f: pending[f]):
                        node = pending.pop(future)
                        self._record(run_key, node, future.result(), values)
            finally:
                for future in pending:
                    future.cancel()


def _version_drift(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    moved = []
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name, _MISSING), after.get(name, _MISSING)
        if was == now:
            continue
        if was is _MISSING:
            moved.append(f"{name!r} is new at version {now}")
        elif now is _MISSING:
            moved.append(f"{name!r} is gone (was version {was})")
        else:
            moved.append(f"{name!r} moved from version {was} to {now}")
    return moved


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
