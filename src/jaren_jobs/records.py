"""The public records: jobs, leases, counts, pages, worker outcomes.

All are frozen dataclasses. A :class:`Job` never carries the lease token: a
record anyone can read must not carry the capability to settle the job.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeAlias, TypeVar

__all__ = [
    "SETTLED_STATES",
    "STATES",
    "ClaimedJob",
    "CorruptJson",
    "Counts",
    "DueCounts",
    "Job",
    "JobError",
    "JobState",
    "JsonValue",
    "Lease",
    "NewJob",
    "Outcome",
    "Page",
    "SettledBuckets",
    "StopOutcome",
    "WorkerStats",
]

T = TypeVar("T")
R = TypeVar("R")

_new = object.__new__
_set = object.__setattr__


def assemble(cls: type[R], fields: dict[str, Any]) -> R:
    """A record built from a dict holding every one of its fields, already checked.

    For the row mappers, which build thousands of records a second: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``
    and costs more than the whole row's decoding. The result is equal, field
    for field, to the record ``cls(**fields)`` builds (no record here has a
    ``__post_init__`` or ``__slots__``; a test holds them to it).
    """
    record = _new(cls)
    _set(record, "__dict__", fields)
    return record


class JobState(str, enum.Enum):
    """The closed set of job states (see docs/concepts.md for the diagram)."""

    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        # a Job's repr and the refusals that quote a state read as they did when
        # states were plain strings: 'done', not <JobState.DONE: 'done'>
        return repr(self.value)


STATES: tuple[str, ...] = tuple(s.value for s in JobState)
#: a stored state's member, for the row mappers (one dict lookup a row)
STATE_OF: dict[str, JobState] = {s.value: s for s in JobState}

#: Any JSON value: what payloads and results are (SPEC §1). Recursive; a
#: JSON object's keys are strings.
JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

SETTLED_STATES: frozenset[str] = frozenset({"done", "dead", "cancelled"})


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class CorruptJson:
    """A stored payload or result that does not parse as JSON.

    Only a row written outside jaren_jobs can hold one. Reads still work and
    say which row is bad: the job's ``payload`` (or ``result``) is this marker
    instead of a value, and a worker that claims such a job fails the attempt
    with a clear error instead of calling the handler.
    """

    text: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"corrupt_json": self.text, "error": self.error}


def _json_value(value: Any) -> Any:
    return value.to_dict() if isinstance(value, CorruptJson) else value


@dataclass(frozen=True)
class Job:
    """One job as the store holds it (times are aware UTC datetimes)."""

    id: str
    kind: str
    #: the job's JSON payload, or a :class:`CorruptJson` marker for a row
    #: written outside jaren_jobs that does not parse
    payload: JsonValue | CorruptJson
    #: a :class:`JobState` member, equal to its plain string (``"done"``)
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    lease_until: datetime | None
    lease_owner: str | None
    lease_generation: int
    last_error: str | None
    #: the JSON result a completion stored (``None`` until then), or a
    #: :class:`CorruptJson` marker
    result: JsonValue | CorruptJson
    created_at: datetime
    updated_at: datetime
    #: the named queue the job belongs to (SPEC §12)
    queue: str
    #: while the job is pending, failed or leased, no other job holds this key
    unique_key: str | None
    #: ``cancel(id, force=True)`` asked the attempt running it to stop (SPEC
    #: §13); the job ends cancelled unless that attempt completes first
    cancel_requested: bool = field(default=False, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: times as ISO 8601 UTC strings with milliseconds; no lease token."""
        return {
            "id": self.id,
            "kind": self.kind,
            "payload": _json_value(self.payload),
            "state": str(self.state),  # the plain string (a row edited by hand: its text)
            "priority": self.priority,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "run_at": _iso(self.run_at),
            "lease_until": _iso(self.lease_until),
            "lease_owner": self.lease_owner,
            "lease_generation": self.lease_generation,
            "last_error": self.last_error,
            "result": _json_value(self.result),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "queue": self.queue,
            "unique_key": self.unique_key,
            "cancel_requested": self.cancel_requested,
        }


@dataclass(frozen=True)
class JobError:
    """One failed attempt of a job, as ``store.jobs.errors(id)`` lists them (SPEC §13).

    ``error`` is the ``last_error`` text that attempt left; ``traceback`` the
    formatted traceback of the exception that failed it (bounded, the lease
    token scrubbed), or ``None`` when the failure carried no exception with
    a traceback (``fail(lease, "text")``). ``at`` is an aware UTC datetime.
    """

    attempt: int
    at: datetime
    error: str
    traceback: str | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``at`` as an ISO 8601 UTC string with milliseconds."""
        return {
            "attempt": self.attempt,
            "at": _iso(self.at),
            "error": self.error,
            "traceback": self.traceback,
        }


@dataclass(frozen=True)
class Lease:
    """The capability one claim mints: the right to settle THIS attempt while it is valid.

    ``renew()`` answers a new lease (new token, later expiry, same generation
    and attempt); the old one then fails every settling call.

    ``claim_key`` names the claim that began the attempt, the same across
    its renewals: what lets a repeated settlement from the attempt that
    settled the job be told from any other (a generation repeats once a
    swept id is enqueued again). A digest of the claim's token, it settles
    nothing. Leases are compared by their other fields (the token already
    tells leases apart).
    """

    job_id: str
    token: str = field(repr=False)
    generation: int
    attempt: int
    owner: str
    expires_at: datetime
    claim_key: bytes = field(default=b"", repr=False, compare=False)

    def __repr__(self) -> str:
        # the token is a capability: keep it out of logs and tracebacks
        return (
            f"Lease(job_id={self.job_id!r}, generation={self.generation}, "
            f"attempt={self.attempt}, owner={self.owner!r}, "
            f"expires_at={self.expires_at.isoformat(timespec='milliseconds')})"
        )


@dataclass(frozen=True)
class ClaimedJob(Job):
    """A job a claim returned, with the lease that settles it.

    ``trace_context`` is the W3C ``traceparent`` of the span that enqueued it,
    when it was enqueued while traced (SPEC §17), else ``None``; it is stored
    as written (a foreign writer's text is not checked here).
    """

    lease: Lease = field(repr=False)
    trace_context: str | None = field(default=None, repr=False, compare=False, kw_only=True)


@dataclass(frozen=True)
class NewJob:
    """One job for :meth:`JobEngine.enqueue_many`; the fields mirror ``enqueue``."""

    kind: str
    payload: Any = None
    _: KW_ONLY
    id: str | None = None
    run_at: datetime | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    priority: int = 0
    queue: str = "default"
    unique_key: str | None = None


@dataclass(frozen=True)
class Counts:
    """Jobs per state, and ``pending_kinds``: pending + failed jobs per kind."""

    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    pending_kinds: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "leased": self.leased,
            "done": self.done,
            "failed": self.failed,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "pending_kinds": dict(self.pending_kinds),
        }


@dataclass(frozen=True)
class DueCounts:
    """The queued jobs split by the runtime clock's now, for an operator (``due_counts()``).

    ``*_ready``: ``run_at`` has passed, so a worker may claim it now;
    ``*_scheduled``: due later (a delayed job, or a retry waiting out its
    backoff). ``leased_expired``: leased jobs whose lease has run out (their
    holder is gone or late; the next claim rescues them).
    ``oldest_ready_at``: the earliest ``run_at`` of the ready jobs (pending or
    failed), so ``now - oldest_ready_at`` is how long the longest-waiting one has
    waited; ``None`` when none is ready.
    """

    pending_ready: int = 0
    pending_scheduled: int = 0
    failed_ready: int = 0
    failed_scheduled: int = 0
    leased_expired: int = 0
    oldest_ready_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``oldest_ready_at`` as an ISO 8601 UTC string with milliseconds."""
        return {
            "pending_ready": self.pending_ready,
            "pending_scheduled": self.pending_scheduled,
            "failed_ready": self.failed_ready,
            "failed_scheduled": self.failed_scheduled,
            "leased_expired": self.leased_expired,
            "oldest_ready_at": _iso(self.oldest_ready_at),
        }


@dataclass(frozen=True)
class SettledBuckets:
    """The jobs that settled per bucket of a window, by state (``settled_buckets()``).

    ``done``, ``dead`` and ``cancelled`` hold one count per bucket, oldest
    first, of the jobs whose last change (their settlement) falls in it.
    At most ``limit`` jobs are read per state, the most recent first: a state
    in ``truncated`` reached that bound, so its older buckets may fall short.
    """

    since: datetime
    bucket_seconds: float
    done: tuple[int, ...]
    dead: tuple[int, ...]
    cancelled: tuple[int, ...]
    truncated: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "bucket_seconds": self.bucket_seconds,
            "done": list(self.done),
            "dead": list(self.dead),
            "cancelled": list(self.cancelled),
            "truncated": sorted(self.truncated),
        }


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page drained from a cursor."""

    items: Sequence[T]
    continuation: str | None
    has_more: bool


OutcomeName = Literal["completed", "failed", "cancelled", "lost", "snoozed"]


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt: exactly one per attempt."""

    outcome: OutcomeName
    job_id: str
    kind: str
    attempt: int
    generation: int
    phase: Literal["completion", "failure", "snooze"] | None = None
    code: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class WorkerStats:
    """A worker's counters at one instant."""

    claims: int = 0
    completions: int = 0
    failures: int = 0
    polls: int = 0
    wakes: int = 0
    claim_errors: int = 0
    cancellations: int = 0
    renewals: int = 0
    lost_settlements: int = 0
    in_flight: int = 0
    # attempts handed back without spending them: a handler's Snooze, or
    # the worker's stop hand-back (SPEC §12)
    snoozes: int = 0


@dataclass(frozen=True)
class StopOutcome:
    """What ``stop()`` achieved: whether every handler drained, and how many did not."""

    drained: bool
    in_flight: int
