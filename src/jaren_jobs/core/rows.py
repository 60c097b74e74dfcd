"""Mapping stored rows to the public records (the column order is ``sql.JOB_COLUMNS``).

This is the claim path's Python cost per job, so it is built for speed: the
records are assembled from their field dicts (:func:`records.assemble`), JSON
``null`` is not parsed, and times come from a small cache (a claim batch
shares its lease expiry and update time, an enqueue batch its creation time).

Payload, result and last_error arrive as the bytes of their text, decoded
here with the database's codec (``Database.text_codec``): a row that
another program left with bytes that are not text, or with JSON nested past
what Python's decoder can recurse into, maps to a :class:`CorruptJson`
marker (an unreadable ``last_error`` to its text with the bad bytes
escaped), so one poison row never fails a read or a claim of many.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jaren_jobs.codec import TOO_DEEP, datetime_from_ms, decode_json
from jaren_jobs.core.commands import PreparedJob
from jaren_jobs.records import STATE_OF, ClaimedJob, CorruptJson, Job, JobState, Lease, assemble

__all__ = [
    "claim_key",
    "claimed_from_row",
    "inserted_job",
    "job_from_row",
    "lease_from_row",
    "stored_text",
]

# epoch ms -> aware datetime; bounded, so memory never grows with jobs seen
_TIMES: dict[Any, datetime | None] = {None: None}
_TIMES_MAX = 1024


def _instant(ms: Any) -> datetime | None:
    try:
        return _TIMES[ms]
    except KeyError:
        pass
    moment = datetime_from_ms(ms)
    if len(_TIMES) >= _TIMES_MAX:
        _TIMES.clear()  # dropping everything is cheaper than tracking use
        _TIMES[None] = None
    _TIMES[ms] = moment
    return moment


# json.loads's own scanner, without its per-call checks (a third of the
# cost): stored text is compact JSON; anything else takes json.loads.
# (typeshed does not declare scan_once)
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decoded(stored: Any, codec: str) -> Any:
    """Stored JSON (not ``None``), or a :class:`CorruptJson` marker naming what is wrong."""
    if type(stored) is bytes:
        if stored == b"null":
            return None
        try:
            text = stored.decode(codec)
        except UnicodeDecodeError as exc:
            return CorruptJson(stored.decode(codec, "backslashreplace"), _not_text(exc))
    elif isinstance(stored, str):
        text = stored
    else:
        return CorruptJson(repr(stored), f"stored as {type(stored).__name__}, not JSON text")
    if text == "null":
        return None
    try:
        value, end = _scan(text, 0)
        if end == len(text):
            return value
    except RecursionError:
        return CorruptJson(text, TOO_DEEP)
    except (StopIteration, ValueError):
        pass
    try:  # whitespace around the value, or corrupt: json.loads decides and says why
        return json.loads(text)
    except RecursionError:
        return CorruptJson(text, TOO_DEEP)
    except ValueError as exc:
        return CorruptJson(text, str(exc))


def _text(stored: Any, codec: str) -> str:
    """Stored free text (``last_error``, not ``None``); bytes that are not text shown escaped."""
    if type(stored) is bytes:
        try:
            return stored.decode(codec)
        except UnicodeDecodeError:
            return stored.decode(codec, "backslashreplace")
    return str(stored)


def stored_text(stored: Any, codec: str = "utf-8") -> str | None:
    """Stored free text as a record shows it (``None`` stays ``None``)."""
    return None if stored is None else _text(stored, codec)


def _not_text(exc: UnicodeDecodeError) -> str:
    return (
        f"stored text is not valid {exc.encoding.upper()} ({exc.reason} at byte {exc.start}); "
        "the bad bytes are shown escaped"
    )


_state_of = STATE_OF.get


def _job_fields(row: tuple[Any, ...], codec: str) -> dict[str, Any]:
    # NULL is the common result and last_error: no call for it
    payload, error, result = row[2], row[11], row[12]
    if payload is not None:
        payload = _decoded(payload, codec)
    if error is not None:
        error = _text(error, codec)
    if result is not None:
        result = _decoded(result, codec)
    # the dict is the record's __dict__: every field, in declaration order
    return {
        "id": row[0],
        "kind": row[1],
        "payload": payload,
        # a state no release writes (a row edited by hand) reads as its text
        "state": _state_of(row[3], row[3]),
        "priority": int(row[4]),
        "attempts": int(row[5]),
        "max_attempts": int(row[6]),
        "run_at": _instant(row[7]),
        "lease_until": _instant(row[8]),
        "lease_owner": row[9],
        "lease_generation": int(row[10]),
        "last_error": error,
        "result": result,
        "created_at": _instant(row[13]),
        "updated_at": _instant(row[14]),
        "queue": row[16],
        "unique_key": row[17],
        "cancel_requested": row[18] is not None,
    }


def job_from_row(row: tuple[Any, ...], codec: str = "utf-8") -> Job:
    return assemble(Job, _job_fields(row, codec))


_blake2b = hashlib.blake2b


def claim_key(token: str) -> bytes:
    """The claim key of a claim's token: its 16-byte BLAKE2b digest.

    Unique per claim as the token is, and the token cannot be recovered
    from it: a row may keep it after settlement where it keeps no token.
    (BLAKE2b, not SHA-256: the same strength at two thirds of the cost, once
    per claimed job.)
    """
    return _blake2b(token.encode(), digest_size=16).digest()


def lease_from_row(row: tuple[Any, ...], key: bytes | None = None) -> Lease:
    """The lease in ``row``; ``key`` is its attempt's claim key (default: a claim's row)."""
    token = row[15]
    return assemble(
        Lease,
        {
            "job_id": row[0],
            "token": token,
            "generation": int(row[10]),
            "attempt": int(row[5]),
            "owner": row[9],
            "expires_at": _instant(row[8]),
            "claim_key": claim_key(token) if key is None else key,
        },
    )


def claimed_from_row(
    row: tuple[Any, ...], key: bytes | None = None, codec: str = "utf-8"
) -> ClaimedJob:
    """The claimed job in a claim's ``row``; ``key`` is its token's claim key, if known."""
    fields = _job_fields(row, codec)
    fields["lease"] = assemble(
        Lease,
        {
            "job_id": row[0],
            "token": row[15],
            "generation": fields["lease_generation"],
            "attempt": fields["attempts"],
            "owner": row[9],
            "expires_at": fields["lease_until"],
            "claim_key": claim_key(row[15]) if key is None else key,
        },
    )
    # a claim's row ends with the trace context (CLAIM_COLUMNS; a plain job row has none)
    fields["trace_context"] = row[19] if len(row) > 19 else None
    return assemble(ClaimedJob, fields)


def inserted_job(job_id: str, prepared: PreparedJob, run_at: int, now: int) -> Job:
    """The record of a row just inserted at ``now``: exactly what was bound, never read back."""
    created = _instant(now)
    return assemble(
        Job,
        {
            "id": job_id,
            "kind": prepared.kind,
            "payload": decode_json(prepared.payload),
            "state": JobState.PENDING,
            "priority": prepared.priority,
            "attempts": 0,
            "max_attempts": prepared.max_attempts,
            "run_at": created if run_at == now else _instant(run_at),
            "lease_until": None,
            "lease_owner": None,
            "lease_generation": 0,
            "last_error": None,
            "result": None,
            "created_at": created,
            "updated_at": created,
            "queue": prepared.queue,
            "unique_key": prepared.unique_key,
            "cancel_requested": False,
        },
    )
