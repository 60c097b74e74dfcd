"""JSON in and out of the store, and time conversions.

Payloads and results are JSON values, never pickle. What JSON cannot carry is
refused *before* anything is written: ``TypeError`` for a type JSON lacks
(sets, bytes, objects, non-``str`` keys), ``ValueError`` for a value it cannot
hold (NaN, infinity, a lone surrogate, nesting deeper than
:data:`MAX_DEPTH`).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = [
    "EPOCH",
    "MAX_DEPTH",
    "check_text",
    "datetime_from_ms",
    "decode_json",
    "encode_json",
    "ms_from_datetime",
]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)

# deep enough for any honest document, shallow enough that neither the
# encoder nor the decoder can hit Python's recursion limit
MAX_DEPTH = 256

_SCALARS = (str, int, float, bool, type(None))

# json.dumps with these options would build this encoder on every call
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_json(value: Any, what: str) -> str:
    """Serialise a JSON value compactly, refusing what JSON cannot carry."""
    flat = _flat(value)
    if not flat:
        _check_json(value, what)
    text = _ENCODER.encode(value)
    if flat:
        # one UTF-8 check of the whole text stands for one per string; on a
        # lone surrogate the full walk names where it is
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            _check_json(value, what)
            raise  # pragma: no cover - the walk always finds it first
    return text


def _scalar(item: Any) -> bool:
    if isinstance(item, float):
        return math.isfinite(item)
    return isinstance(item, _SCALARS)


def _flat(value: Any) -> bool:
    """A scalar, or a dict/list of scalars with str keys: the common payload, checked fast."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str) or not _scalar(child):
                return False
        return True
    if isinstance(value, list):
        return all(_scalar(child) for child in value)
    return _scalar(value)


def _check_json(value: Any, what: str) -> None:
    # iterative walk: a 100,000-deep payload must be refused, not crash
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{what} is nested more than {MAX_DEPTH} levels deep (at {path})")
        if isinstance(item, str):
            check_text(item, f"{what} at {path}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{what} holds {item!r} at {path}; JSON has no NaN or infinity")
        elif isinstance(item, _SCALARS):
            continue
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"{what} has a {type(key).__name__} key {key!r} at {path}; "
                        "JSON object keys are strings"
                    )
                check_text(key, f"{what} key at {path}")
                stack.append((child, depth + 1, f"{path}.{key}"))
        elif isinstance(item, (list, tuple)):
            for index, child in enumerate(item):
                stack.append((child, depth + 1, f"{path}[{index}]"))
        else:
            raise TypeError(
                f"{what} holds a {type(item).__name__} at {path}, which JSON cannot carry "
                "(use dicts, lists, strings, numbers, booleans and None)"
            )


def check_text(text: str, what: str) -> str:
    """Refuse text SQLite cannot store as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text ({exc.reason})") from None
    return text


def decode_json(text: str | None) -> Any:
    """Parse stored JSON (``None`` stays ``None``); raises ``ValueError`` when corrupt."""
    if text is None:
        return None
    return json.loads(text)


def ms_from_datetime(value: datetime) -> int:
    """An aware datetime as integer epoch milliseconds, rounded down."""
    return (value - EPOCH) // _MS


def datetime_from_ms(value: int | None) -> datetime | None:
    """Integer epoch milliseconds as an aware UTC datetime."""
    if value is None:
        return None
    return EPOCH + timedelta(0, 0, 0, int(value))  # (days, seconds, µs, ms): exact ints


def check_aware(value: object, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be an aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return value
