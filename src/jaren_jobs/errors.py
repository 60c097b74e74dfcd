"""The one exception family of jaren_jobs.

Every error the library raises on purpose is a :class:`JobsError` with a
stable ``code`` and structured ``details``; argument mistakes stay
``TypeError`` / ``ValueError``. A driver's errors are translated at one
boundary in its backend (``backends/sqlite/errors.py``) and never escape raw.

::

    JobsError
    ├── SchemaError          JD0002  tables could not be created or upgraded
    ├── DocumentError        JD0003  a DAG document is invalid (carries .path)
    ├── GateRefused          JD2064  a call queued on the store's gate was abandoned
    ├── LeaseLost                    the fence refused a settling call
    │   ├── JobSettled       JD2065  unknown, or no longer leased
    │   ├── LeaseSuperseded  JD2066  another attempt (or a renewal) holds it now
    │   └── LeaseExpired     JD2067  the token matches but the lease ran out
    ├── LeaseRequired        JD2068  a lease was needed and not given
    ├── RunMismatch          JD2069  a DAG run cannot resume
    ├── CursorAborted        JD2072  a cursor's signal fired
    ├── ItemTooLarge         JD2074  one item alone exceeds a page's max_bytes
    ├── DeadlinePassed       JD2075  a cursor's or call's deadline passed
    ├── OperationCancelled   JD2081  handed an aborted signal or a passed deadline
    │   └── CancelRequested  JD2081  a running job's signal: cancel(id, force=True) asked it to stop
    ├── DuplicateJob         JD2090  enqueue with an id that exists
    ├── StoreClosed          JD2091  the store was closed
    ├── UnknownJob           JD2092  an unknown id where a job must exist (a LookupError)
    ├── TransactionAborted   JD2093  SQLite rolled back the store.transaction() in use
    └── StorageError         JD2099  any other driver failure (``__cause__`` is the driver's error)
        └── TransactionEnded JD2094  a transaction used after its block ended (nothing written)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "CancelRequested",
    "CursorAborted",
    "DeadlinePassed",
    "DocumentError",
    "DuplicateJob",
    "GateRefused",
    "ItemTooLarge",
    "JobSettled",
    "JobsError",
    "LeaseExpired",
    "LeaseLost",
    "LeaseRequired",
    "LeaseSuperseded",
    "OperationCancelled",
    "RunMismatch",
    "SchemaError",
    "StorageError",
    "StoreClosed",
    "TransactionAborted",
    "TransactionEnded",
    "UnknownJob",
    "describe_error",
    "storable_text",
]


class JobsError(Exception):
    """Root of every error jaren_jobs raises on purpose.

    ``code`` is stable across releases; ``details`` is a read-only mapping of
    structured facts (a job id, a generation) that a program can act on
    without parsing the message.
    """

    code: ClassVar[str] = "JD0000"
    # whether a worker should retry an attempt that raised this; False means
    # no retry can cure it, so the worker dead-letters the job at once.
    # Application exceptions may set ``retryable = False`` too.
    retryable: ClassVar[bool] = True

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: Mapping[str, Any] = dict(details)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword details survive pickling across multiprocessing queues
        return (_rebuild, (type(self), self.message, dict(self.details)))


def _rebuild(cls: type[JobsError], message: str, details: dict[str, Any]) -> JobsError:
    return cls(message, **details)


class SchemaError(JobsError):
    """The tables could not be created or upgraded, or are missing on a read-only store."""

    code = "JD0002"


class DocumentError(JobsError):
    """A DAG document is invalid; ``path`` is the JSON path of the fault."""

    code = "JD0003"
    retryable = False

    @property
    def path(self) -> str:
        return str(self.details.get("path", "$"))


class GateRefused(JobsError):
    """A call waiting on the store's gate timed out, was abandoned, or would deadlock."""

    code = "JD2064"


class LeaseLost(JobsError):
    """Base of the three fence refusals: this lease no longer speaks for its job."""


class JobSettled(LeaseLost):
    """The job is unknown, or not leased any more: someone else settled it."""

    code = "JD2065"


class LeaseSuperseded(LeaseLost):
    """The lease's token is not the job's: another attempt, or a renewal, holds it."""

    code = "JD2066"


class LeaseExpired(LeaseLost):
    """The token matches but the lease ran out before the call."""

    code = "JD2067"


class LeaseRequired(JobsError):
    """A lease was needed and not given (or requeue met a live lease)."""

    code = "JD2068"


class RunMismatch(JobsError):
    """A DAG run cannot resume: its identity changed, or no attempt holds it."""

    code = "JD2069"
    retryable = False


class CursorAborted(JobsError):
    """A cursor's signal fired; its statement was released."""

    code = "JD2072"


class ItemTooLarge(JobsError):
    """One item alone exceeds a page's ``max_bytes``."""

    code = "JD2074"


class DeadlinePassed(JobsError):
    """A cursor's or call's deadline passed."""

    code = "JD2075"


class OperationCancelled(JobsError):
    """The call was handed an already-aborted signal or a passed deadline."""

    code = "JD2081"


class CancelRequested(OperationCancelled):
    """``ctx.signal.reason`` when ``cancel(id, force=True)`` asked the running attempt to stop.

    The job is not settled yet: the attempt winds up, and its worker settles
    it ``cancelled`` through its own lease — unless the handler completes
    first, which stands (``done``).
    """


class DuplicateJob(JobsError):
    """A job with this id already exists."""

    code = "JD2090"


class StoreClosed(JobsError):
    """The store was closed; open a new one."""

    code = "JD2091"


class UnknownJob(JobsError, LookupError):
    """A call that needs an existing job was given an id no job has (never enqueued, or swept).

    Also a :class:`LookupError`, so ``except LookupError`` catches it as it
    would a missing key. ``details["job_id"]`` names the id.
    """

    code = "JD2092"


class TransactionAborted(JobsError):
    """SQLite rolled back the ``store.transaction()`` this call ran in.

    Some failures end the whole transaction, not just their statement
    (``INSERT OR ROLLBACK``, ``ON CONFLICT ROLLBACK``, ``RAISE(ROLLBACK)``, a
    full disk). Nothing of it was committed, and every later call through it
    is refused: it would otherwise run on its own, outside any transaction.
    """

    code = "JD2093"


class StorageError(JobsError):
    """Any other driver failure; ``__cause__`` is the driver's error."""

    code = "JD2099"


class TransactionEnded(StorageError):
    """A ``store.transaction()`` (or its ``tx.jobs``) was used after its block ended.

    Nothing the call tried was written: it never ran. Typically a task made
    inside an ``async with store.transaction()`` block and awaited after it;
    await such tasks inside the block. A ``StorageError`` too, as earlier
    releases raised.
    """

    code = "JD2094"


def describe_error(error: object) -> str:
    """A readable one-line description of whatever a handler raised; never raises.

    The text is always storable: lone surrogates (what ``os.fsdecode`` makes
    of a file name that is not UTF-8) are kept as backslash escapes.
    """
    try:
        if isinstance(error, JobsError):
            text = str(error)
        elif isinstance(error, BaseException):
            message = str(error)
            text = f"{type(error).__name__}: {message}" if message else type(error).__name__
        elif isinstance(error, str):
            text = error
        else:
            text = repr(error)
        return storable_text(text)
    except Exception:  # a hostile __str__/__repr__ must not break settlement
        try:
            return storable_text(f"<unprintable {type(error).__name__}>")
        except Exception:
            return "<unprintable error>"


def storable_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: each lone surrogate becomes its escape (``\\udc80``)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def key_held(job_id: str, holder: str, what: str) -> DuplicateJob:
    """A requeue refused because a newer job now holds the requeued job's unique key."""
    return DuplicateJob(
        f"{what} refused: job {job_id!r} has a unique_key that job {holder!r} now holds "
        "(pending, failed or leased); requeue it once that job has settled, or cancel that one",
        job_id=job_id,
        held_by=holder,
    )
