"""The checked arguments of every engine call: refusals happen here, before any I/O.

Each function takes what a caller handed over (``object``: anything may
arrive) and answers a checked value, or raises ``TypeError`` /
``ValueError`` / :class:`~jaren_jobs.LeaseRequired` naming what was wrong.
The sync and async shells, and every backend, share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from jaren_jobs.codec import check_identifier, check_text, encode_json, encode_result, ms_from_aware
from jaren_jobs.core.policy import lease_ms
from jaren_jobs.errors import LeaseRequired, describe_error
from jaren_jobs.records import SETTLED_STATES, STATES, Lease
from jaren_jobs.runtime import Defaults, check_positive_int, check_seconds

__all__ = [
    "PAGE_ORDERS",
    "ClaimRequest",
    "Failure",
    "PageFilters",
    "PreparedJob",
    "check_id",
    "check_kinds",
    "check_lease_seconds",
    "check_page",
    "check_queue",
    "check_queues",
    "claim_request",
    "prepare_complete",
    "prepare_fail",
    "prepare_job",
    "require_lease",
]

_INT64 = (-(2**63), 2**63 - 1)


def check_id(value: object, what: str) -> str:
    """A kind, id or owner: a non-empty str, storable, without NUL."""
    if type(value) is str and value and value.isascii() and "\x00" not in value:
        return value  # the common case (plain ASCII): valid as it stands, checked cheaply
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if value == "":
        raise ValueError(f"{what} must be a non-empty string")
    return check_identifier(value, what)


def check_kinds(kinds: object, what: str) -> tuple[str, ...]:
    """A non-empty list, tuple or set of kinds, answered sorted and unique."""
    if type(kinds) is list and len(kinds) == 1:
        return (check_id(kinds[0], f"{what}: each kind"),)  # the common case: one kind
    if isinstance(kinds, (str, bytes)):
        raise TypeError(f"{what}: kinds is a list of kinds, not a bare string (write [{kinds!r}])")
    if not isinstance(kinds, (list, tuple, set, frozenset)):
        raise TypeError(
            f"{what}: kinds must be a list, tuple or set of str, got {type(kinds).__name__}"
        )
    if not kinds:
        raise ValueError(f"{what}: kinds must name at least one kind")
    for kind in kinds:
        check_id(kind, f"{what}: each kind")
    # a stable order gives a stable statement text (one prepared statement)
    return tuple(sorted(set(kinds)))


def check_queue(value: object, what: str) -> str:
    """A queue name: a non-empty str without NUL (checked like a kind)."""
    return check_id(value, what)


def check_queues(queues: object, what: str) -> tuple[str, ...] | None:
    """``None`` (every queue), or an iterable of queue names, answered sorted and unique.

    A bare string is refused: ``queues="emails"`` would otherwise read as the
    queues ``e``, ``m``, ``a`` ...
    """
    if queues is None:
        return None
    if isinstance(queues, (str, bytes)):
        raise TypeError(
            f"{what}: queues is an iterable of queue names, not a bare string (write [{queues!r}])"
        )
    try:
        names = list(queues)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"{what}: queues must be an iterable of str or None, got {type(queues).__name__}"
        ) from None
    if not names:
        raise ValueError(f"{what}: queues must name at least one queue (or be None for all)")
    for name in names:
        check_queue(name, f"{what}: each queue")
    return tuple(sorted(set(names)))


def check_lease_seconds(defaults: Defaults, value: object, what: str) -> float:
    """``lease_seconds`` given, or the store's default."""
    if value is None:
        return defaults.lease_seconds
    return check_seconds(value, f"{what}: lease_seconds")


class PreparedJob(NamedTuple):
    """One new job, checked and ready to bind (an ``id`` of None is minted at insert)."""

    id: str | None
    kind: str
    payload: str
    run_at_ms: int | None
    delay_ms: int | None
    max_attempts: int
    priority: int
    queue: str
    unique_key: str | None
    # a periodic tick keeps its run_at even when enqueued after it (SPEC §12)
    exact_run_at: bool
    # the enqueuing span's W3C traceparent (SPEC §17), set only while traced
    trace_context: str | None = None

    def run_at(self, now: int) -> int:
        """When the job may first run, for an insert at ``now`` (epoch ms)."""
        if self.run_at_ms is not None:
            if self.exact_run_at:
                return self.run_at_ms
            return max(self.run_at_ms, now)  # a past run_at runs now, in FIFO order
        if self.delay_ms is not None:
            return now + self.delay_ms
        return now


# NamedTuple's own __new__ is Python code; tuple's is the same, faster
_new_prepared = tuple.__new__


def prepare_job(
    defaults: Defaults,
    kind: object,
    payload: Any,
    *,
    job_id: object,
    run_at: object,
    delay_seconds: object,
    max_attempts: object,
    priority: object,
    queue: object = "default",
    unique_key: object = None,
    what: str,
) -> PreparedJob:
    """Check one new job's arguments; raises before anything is written."""
    # the common case (a non-empty ASCII str without NUL) is valid as it
    # stands; everything else takes the full checks, which name what is wrong
    if type(kind) is not str or not kind or not kind.isascii() or "\x00" in kind:
        if not isinstance(kind, str):
            raise TypeError(f"{what}: kind must be a non-empty str, got {type(kind).__name__}")
        kind = check_id(kind, f"{what}: kind")
    if job_id is not None and (
        type(job_id) is not str or not job_id or not job_id.isascii() or "\x00" in job_id
    ):
        job_id = check_id(job_id, f"{what}: id")
    text = "null" if payload is None else encode_json(payload, what, "payload")
    run_at_ms = delay_ms = None
    if run_at is not None or delay_seconds is not None:
        if run_at is not None and delay_seconds is not None:
            raise ValueError(f"{what}: give run_at or delay_seconds, not both")
        if run_at is not None:
            run_at_ms = ms_from_aware(run_at, f"{what}: run_at")
        else:
            delay = check_seconds(delay_seconds, f"{what}: delay_seconds", allow_zero=True)
            delay_ms = math.floor(delay * 1000)
    if max_attempts is None:
        attempts = defaults.max_attempts
    else:
        attempts = check_positive_int(max_attempts, f"{what}: max_attempts")
    if type(priority) is not int and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise TypeError(f"{what}: priority must be an int, got {type(priority).__name__}")
    if not _INT64[0] <= priority <= _INT64[1]:
        raise ValueError(f"{what}: priority must fit in 64 bits, got {priority}")
    if queue != "default" or type(queue) is not str:
        queue = check_queue(queue, f"{what}: queue")
    if unique_key is not None:
        unique_key = check_queue(unique_key, f"{what}: unique_key")
    return _new_prepared(
        PreparedJob,
        (
            job_id,
            kind,
            text,
            run_at_ms,
            delay_ms,
            attempts,
            priority,
            queue,
            unique_key,
            False,
            None,
        ),
    )


@dataclass(frozen=True)
class ClaimRequest:
    """Checked claim arguments: the kinds (sorted, unique), the owner, the lease in ms,
    and the queues (sorted, unique; ``None``: every queue)."""

    kinds: tuple[str, ...]
    owner: str
    lease_ms: int
    queues: tuple[str, ...] | None = None

    @property
    def idle_key(self) -> tuple[str, ...]:
        """What an empty claim is remembered under: the kinds, and the queues after a NUL
        (no kind or queue holds one, so two requests never share a key)."""
        if self.queues is None:
            return self.kinds
        return (*self.kinds, "\x00", *self.queues)


def claim_request(
    defaults: Defaults,
    kinds: object,
    owner: object,
    lease_seconds: object,
    what: str,
    *,
    queues: object = None,
) -> ClaimRequest:
    """Check a claim's kinds, owner, lease length and queues."""
    checked = check_kinds(kinds, what)
    names = check_queues(queues, what)
    if not isinstance(owner, str):
        raise TypeError(f"{what}: owner must be a non-empty str, got {type(owner).__name__}")
    check_id(owner, f"{what}: owner")
    seconds = check_lease_seconds(defaults, lease_seconds, what)
    return ClaimRequest(checked, owner, lease_ms(seconds), names)


def require_lease(lease: object, what: str) -> Lease:
    """The lease a settling call was handed, or :class:`LeaseRequired`."""
    if isinstance(lease, Lease):
        return lease
    # the value itself is not echoed: what was handed over by mistake may
    # be a token (or hold one), and this message ends up in logs
    raise LeaseRequired(
        f"{what} takes the lease a claim returned (claimed.lease), not a "
        f"{type(lease).__name__}: an owner is reused by every attempt "
        "a worker makes, so only the lease can say WHICH attempt is speaking",
        given=type(lease).__name__,
    )


def prepare_complete(lease: object, result: Any, what: str) -> tuple[Lease, str]:
    """A completion's checks, before any write: the lease, and the result as JSON."""
    return require_lease(lease, what), encode_result(result, what)


@dataclass(frozen=True)
class Failure:
    """A checked ``fail()``: the lease, the described error, and how to retry."""

    lease: Lease
    message: str
    retry: bool
    base: float
    cap: float
    #: the formatted traceback of the exception that failed the attempt, if any
    traceback: str | None = None


def prepare_fail(
    defaults: Defaults,
    lease: object,
    error: object,
    *,
    retry: object,
    backoff_base_seconds: object,
    backoff_cap_seconds: object,
    what: str,
) -> Failure:
    """A failure's checks, before any write; the error is described here, once."""
    current = require_lease(lease, what)
    if not isinstance(retry, bool):
        raise TypeError(f"{what}: retry must be a bool, got {type(retry).__name__}")
    base = (
        defaults.backoff_base_seconds
        if backoff_base_seconds is None
        else check_seconds(backoff_base_seconds, f"{what}: backoff_base_seconds")
    )
    cap = (
        defaults.backoff_cap_seconds
        if backoff_cap_seconds is None
        else check_seconds(backoff_cap_seconds, f"{what}: backoff_cap_seconds")
    )
    return Failure(current, describe_error(error), retry, base, cap)


# ---------------------------------------------------------------- page filters (SPEC §5)


class PageFilterTypeError(TypeError, ValueError):
    """A page filter of the wrong type: an argument mistake (TypeError) and a bad filter
    (ValueError, as the contract names every bad filter)."""


def check_page_filters(
    state: object, kind: object, after: object, limit: object, what: str
) -> tuple[str | None, str | None, str, int]:
    if state is not None:
        if not isinstance(state, str):
            raise PageFilterTypeError(
                f"{what}: state must be one of {list(STATES)} or None, got {type(state).__name__}"
            )
        if state not in STATES:
            raise ValueError(f"{what}: state must be one of {list(STATES)}, got {state!r}")
        state = STATES[STATES.index(state)]  # the plain str, even for a JobState
    if kind is not None:
        if not isinstance(kind, str):
            raise PageFilterTypeError(
                f"{what}: kind must be a non-empty str or None, got {type(kind).__name__}"
            )
        if kind == "":
            raise ValueError(f"{what}: kind must be a non-empty string (or None for every kind)")
        check_text(kind, f"{what}: kind")
    if after is None:
        after = ""  # ids are non-empty, so every id sorts after ""
    elif not isinstance(after, str):
        raise PageFilterTypeError(
            f"{what}: after must be the str id to continue past, or None; "
            f"got {type(after).__name__}"
        )
    else:
        check_text(after, f"{what}: after")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise PageFilterTypeError(
            f"{what}: limit must be a positive int, got {type(limit).__name__}"
        )
    if limit < 1:
        raise ValueError(f"{what}: limit must be >= 1, got {limit}")
    return state, kind, after, limit


def check_page_queue(queue: object, what: str) -> str | None:
    """``page()``'s queue filter: ``None`` (every queue) or a non-empty str."""
    if queue is None:
        return None
    if not isinstance(queue, str):
        raise PageFilterTypeError(
            f"{what}: queue must be a non-empty str or None, got {type(queue).__name__}"
        )
    if queue == "":
        raise ValueError(f"{what}: queue must be a non-empty string (or None for every queue)")
    return check_text(queue, f"{what}: queue")


def check_sweep_states(states: object, what: str) -> tuple[str, ...]:
    """``sweep(states=...)``: ``()`` for every settled state, else the chosen ones, sorted."""
    if states is None:
        return ()
    if isinstance(states, str) or not isinstance(states, Iterable):
        raise TypeError(
            f"{what}: states must be an iterable of settled states (e.g. ['done']) or None, "
            f"got {type(states).__name__}"
        )
    chosen: set[str] = set()
    for state in states:
        if not isinstance(state, str):
            raise TypeError(f"{what}: states holds a {type(state).__name__}, not a state name")
        if state not in SETTLED_STATES:
            raise ValueError(
                f"{what}: states must name settled states ({', '.join(sorted(SETTLED_STATES))}), "
                f"got {state!r}"
            )
        chosen.add(STATES[STATES.index(state)])  # the plain str, even for a JobState
    if not chosen:
        raise ValueError(f"{what}: states names no state; pass None to sweep every settled state")
    return tuple(sorted(chosen))


#: the orders ``page()`` walks in: by id, or newest first by ``updated_at`` (ties by id, descending)
PAGE_ORDERS = ("id", "newest")


@dataclass(frozen=True, slots=True)
class PageFilters:
    """``page()``'s checked filters, passed as one value from the engine to the backend's
    keyset cursor: ``after`` is ``""`` for "from the start" (every id sorts after it)."""

    state: str | None
    kind: str | None
    queue: str | None
    after: str
    limit: int
    order: str = "id"


def check_page(
    *,
    state: object,
    kind: object,
    after: object,
    limit: object,
    queue: object,
    order: object,
    what: str,
) -> PageFilters:
    """Every ``page()`` filter checked at once, before any I/O."""
    state_, kind_, after_, limit_ = check_page_filters(state, kind, after, limit, what)
    queue_ = check_page_queue(queue, what)
    if not isinstance(order, str):
        raise PageFilterTypeError(
            f"{what}: order must be one of {list(PAGE_ORDERS)}, got {type(order).__name__}"
        )
    if order not in PAGE_ORDERS:
        raise ValueError(f"{what}: order must be one of {list(PAGE_ORDERS)}, got {order!r}")
    return PageFilters(state_, kind_, queue_, after_, limit_, order)
