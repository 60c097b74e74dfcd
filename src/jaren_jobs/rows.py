"""Mapping stored rows to the public records (the column order is ``sql.JOB_COLUMNS``)."""

from __future__ import annotations

from typing import Any

from .codec import datetime_from_ms, decode_json
from .records import ClaimedJob, CorruptJson, Job, Lease

__all__ = ["claimed_from_row", "job_from_row", "lease_from_row"]


def job_from_row(row: tuple[Any, ...]) -> Job:
    return Job(**_job_fields(row))


def claimed_from_row(row: tuple[Any, ...]) -> ClaimedJob:
    fields_ = _job_fields(row)
    lease = Lease(
        job_id=row[0],
        token=row[15],
        generation=int(row[10]),
        attempt=int(row[5]),
        owner=row[9],
        expires_at=fields_["lease_until"],  # converted once, with the other times
    )
    return ClaimedJob(**fields_, lease=lease)


def lease_from_row(row: tuple[Any, ...]) -> Lease:
    return claimed_from_row(row).lease


def _decoded(text: Any) -> Any:
    """Stored JSON, or a :class:`CorruptJson` marker naming what is wrong with it."""
    if text is not None and not isinstance(text, str):
        return CorruptJson(repr(text), f"stored as {type(text).__name__}, not JSON text")
    try:
        return decode_json(text)
    except ValueError as exc:
        return CorruptJson(text or "", str(exc))


def _job_fields(row: tuple[Any, ...]) -> dict[str, Any]:
    job_id = row[0]
    payload = _decoded(row[2])
    result = _decoded(row[12])
    # run_at, created_at and updated_at are often the same instant: convert once
    times: dict[Any, Any] = {}
    for ms in (row[7], row[8], row[13], row[14]):
        if ms not in times:
            times[ms] = datetime_from_ms(ms)
    return {
        "id": job_id,
        "kind": row[1],
        "payload": payload,
        "state": row[3],
        "priority": int(row[4]),
        "attempts": int(row[5]),
        "max_attempts": int(row[6]),
        "run_at": times[row[7]],
        "lease_until": times[row[8]],
        "lease_owner": row[9],
        "lease_generation": int(row[10]),
        "last_error": row[11],
        "result": result,
        "created_at": times[row[13]],
        "updated_at": times[row[14]],
    }
