"""jaren_jobs: an embeddable, fenced job queue in your application's SQLite database.

Execution is at-least-once; settlement is exactly-once against the store; a
worker that no longer holds its job is refused by name every time it tries to
speak for it. See ``docs/`` for the concepts and the full API.
"""

from __future__ import annotations

from jaren_jobs.aio.runner import AsyncCheckpointStore
from jaren_jobs.aio.store import (
    AsyncCursor,
    AsyncJobs,
    AsyncStore,
    AsyncTransaction,
    open_async_store,
)
from jaren_jobs.aio.worker import AsyncJobContext, AsyncWorker
from jaren_jobs.core.policy import backoff_seconds
from jaren_jobs.cursor import Barrier, Cursor, drain_page
from jaren_jobs.dag import CompiledDag, Task, TaskContext, compile_document, create_dag_job_runner
from jaren_jobs.engine.checkpoints import CheckpointStore
from jaren_jobs.errors import (
    CancelRequested,
    CursorAborted,
    DeadlinePassed,
    DocumentError,
    DuplicateJob,
    GateRefused,
    ItemTooLarge,
    JobsError,
    JobSettled,
    LeaseExpired,
    LeaseLost,
    LeaseRequired,
    LeaseSuperseded,
    OperationCancelled,
    RunMismatch,
    SchemaError,
    StorageError,
    StoreClosed,
    TransactionAborted,
    TransactionEnded,
    UnknownJob,
)
from jaren_jobs.jobs import Jobs
from jaren_jobs.periodic import Periodic
from jaren_jobs.records import (
    ClaimedJob,
    CorruptJson,
    Counts,
    DueCounts,
    Job,
    JobError,
    JobState,
    JsonValue,
    Lease,
    NewJob,
    Outcome,
    Page,
    SettledBuckets,
    StopOutcome,
    WorkerStats,
)
from jaren_jobs.runtime import Defaults, Runtime
from jaren_jobs.signals import CancelScope, Signal, any_signal
from jaren_jobs.snooze import Snooze
from jaren_jobs.store import Rows, Store, Transaction, open_store
from jaren_jobs.worker import JobContext, Worker, WorkerStopped

__version__ = "0.1.0"

__all__ = [
    "AsyncCheckpointStore",
    "AsyncCursor",
    "AsyncJobContext",
    "AsyncJobs",
    "AsyncStore",
    "AsyncTransaction",
    "AsyncWorker",
    "Barrier",
    "CancelRequested",
    "CancelScope",
    "CheckpointStore",
    "ClaimedJob",
    "CompiledDag",
    "CorruptJson",
    "Counts",
    "Cursor",
    "CursorAborted",
    "DeadlinePassed",
    "Defaults",
    "DocumentError",
    "DueCounts",
    "DuplicateJob",
    "GateRefused",
    "ItemTooLarge",
    "Job",
    "JobContext",
    "JobError",
    "JobSettled",
    "JobState",
    "Jobs",
    "JobsError",
    "JsonValue",
    "Lease",
    "LeaseExpired",
    "LeaseLost",
    "LeaseRequired",
    "LeaseSuperseded",
    "NewJob",
    "OperationCancelled",
    "Outcome",
    "Page",
    "Periodic",
    "Rows",
    "RunMismatch",
    "Runtime",
    "SchemaError",
    "SettledBuckets",
    "Signal",
    "Snooze",
    "StopOutcome",
    "StorageError",
    "Store",
    "StoreClosed",
    "Task",
    "TaskContext",
    "Transaction",
    "TransactionAborted",
    "TransactionEnded",
    "UnknownJob",
    "Worker",
    "WorkerStats",
    "WorkerStopped",
    "__version__",
    "any_signal",
    "backoff_seconds",
    "compile_document",
    "create_dag_job_runner",
    "drain_page",
    "open_async_store",
    "open_store",
]


def __getattr__(name: str) -> object:
    # the engine left the public names (``store.jobs`` is a Jobs, which has one); the
    # old name still imports, for code written against an earlier release
    if name == "JobEngine":
        from jaren_jobs.engine.engine import JobEngine  # noqa: PLC0415 - lazy on purpose

        return JobEngine
    raise AttributeError(f"module 'jaren_jobs' has no attribute {name!r}")
