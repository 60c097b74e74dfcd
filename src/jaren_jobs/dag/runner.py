"""The runner: the handlers that run (or resume) a document's nodes, checkpointed per attempt."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from jaren_jobs.dag.document import (
    RUN_IDENTITY_NODE,
    RUN_KEY_SEPARATOR,
    CompiledDag,
    TaskContext,
    compile_document,
)
from jaren_jobs.dag.identity import run_identity, stale
from jaren_jobs.errors import DocumentError, OperationCancelled, RunMismatch
from jaren_jobs.records import ClaimedJob
from jaren_jobs.runtime import check_positive_int
from jaren_jobs.signals import CancelScope, SignalLike, any_signal


class _Checkpoints(Protocol):
    def load(self, run_id: str) -> dict[str, Any] | None: ...

    def save(self, run_id: str, node_id: str, value: Any) -> None: ...

    def complete(self, run_id: str, result: Any = None) -> bool: ...


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
        moved = stale(stored, identity, compiled, sorted(recorded)) if recorded else []
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
