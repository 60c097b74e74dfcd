"""jaren_jobs: an embeddable, fenced job queue in your application's SQLite database.

Execution is at-least-once; settlement is exactly-once against the store; a
worker that no longer holds its job is refused by name every time it tries to
speak for it. See ``docs/`` for the concepts and the full API.
"""

from __future__ import annotations

from .arunner import AsyncCheckpointStore
from .astore import (
    AsyncCursor,
    AsyncJobs,
    AsyncStore,
    AsyncTransaction,
    open_async_store,
)
from .aworker import AsyncJobContext, AsyncWorker
from .checkpoints import CheckpointStore
from .core.policy import backoff_seconds
from .cursor import Barrier, Cursor, drain_page
from .dag import CompiledDag, Task, TaskContext, compile_document, create_dag_job_runner
from .engine import JobEngine
from .errors import (
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
from .periodic import Periodic
from .records import (
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
from .runtime import Defaults, Runtime
from .signals import CancelScope, Signal, any_signal
from .snooze import Snooze
from .store import Rows, Store, Transaction, open_store
from .worker import JobContext, Worker, WorkerStopped

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
    "JobEngine",
    "JobError",
    "JobSettled",
    "JobState",
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
