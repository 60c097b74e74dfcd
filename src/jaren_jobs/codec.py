"""JSON in and out of the store, and time conversions.

Payloads and results are JSON values, never pickle. What JSON cannot carry is
refused *before* anything is written: ``TypeError`` for a type JSON lacks
(sets, bytes, objects, non-``str`` keys), ``ValueError`` for a value it cannot
hold (NaN, infinity, nesting deeper than :data:`MAX_DEPTH`; for a result,
which the contract calls a value JSON cannot express, these are
``TypeError`` too). Text that cannot be encoded (a lone surrogate, such as
``os.fsdecode`` leaves for a file name that is not UTF-8) is ``ValueError``
for payloads and results alike: it is an encoding problem, not a type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from json.encoder import encode_basestring
from json.scanner import make_scanner
from typing import Any

__all__ = [
    "EPOCH",
    "MAX_DEPTH",
    "TOO_DEEP",
    "check_identifier",
    "check_text",
    "datetime_from_ms",
    "decode_json",
    "encode_json",
    "encode_result",
    "ms_from_aware",
    "ms_from_datetime",
]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_EPOCH_PLUS = EPOCH.__add__

# deep enough for any honest document, shallow enough that neither the
# encoder nor the decoder can hit Python's recursion limit
MAX_DEPTH = 256
# what a stored document written outside the library, deeper than Python's
# decoder can recurse, is said to be
TOO_DEEP = "nested too deeply to decode (past Python's recursion limit)"
# the instants a datetime can hold, as epoch ms: every stored time must read back
_MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

_SCALARS = (str, int, float, bool, type(None))
_isfinite = math.isfinite

# json.dumps with these options would build this encoder on every call
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# The C encoder JSONEncoder.encode builds afresh per call, built once for
# flat values (no container inside, so no circular-reference check needed).
_c_make_encoder: Any = vars(json.encoder).get("c_make_encoder")  # None without the C module
_C_ENCODER: Callable[[Any, int], Any] | None = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
)
# the scanner alone: what json.loads runs once it has skipped whitespace
_scan_once: Callable[[str, int], tuple[Any, int]] = make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed types the C scanner's context oddly
)


def encode_json(
    value: Any, what: str, part: str | None = None, *, unfit: type[Exception] = ValueError
) -> str:
    """Serialise a JSON value compactly, refusing what JSON cannot carry.

    Refusals name ``what`` (and ``part`` of it, when given: ``"enqueue():
    payload"``); the label is built only when one is raised. ``unfit`` is
    raised for a value JSON cannot hold (NaN, infinity, too deep); a type it
    lacks is always ``TypeError``, text that cannot be encoded ``ValueError``.
    """
    if value is None:
        return "null"
    if not _flat(value):
        _check_json(value, what if part is None else f"{what}: {part}", unfit)
        return _ENCODER.encode(value)
    if _C_ENCODER is None:  # pragma: no cover - CPython always has the C encoder
        text = _ENCODER.encode(value)
    else:
        text = "".join(_C_ENCODER(value, 0))
    if not text.isascii():
        # one UTF-8 check of the whole text stands for one per string; on a
        # lone surrogate the full walk names where it is
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            _check_json(value, what if part is None else f"{what}: {part}", unfit)
            raise  # pragma: no cover - the walk always finds it first
    return text


def encode_result(value: Any, what: str) -> str:
    """A job's result as JSON text: ``TypeError`` for what JSON cannot express (SPEC §3),
    ``ValueError`` for text that cannot be encoded (a lone surrogate)."""
    return "null" if value is None else encode_json(value, what, "result", unfit=TypeError)


def _flat(value: Any) -> bool:
    """A scalar, or a dict/list of scalars with str keys: the common payload, checked fast.

    Exact types only: a subclass (of str, int, dict …) takes the full walk,
    which accepts it just the same.
    """
    cls = type(value)
    if cls is dict:
        for key in value:
            if type(key) is not str:
                return False
        children: Any = value.values()
    elif cls is list:
        children = value
    else:
        return cls is str or cls is int or cls is bool or (cls is float and _isfinite(value))
    for child in children:
        kind = type(child)
        if kind is str or kind is int or kind is bool or child is None:
            continue
        if kind is float and _isfinite(child):
            continue
        return False
    return True


def _check_json(value: Any, what: str, unfit: type[Exception]) -> None:
    # iterative walk: a 100,000-deep payload must be refused, not crash
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise unfit(f"{what} is nested more than {MAX_DEPTH} levels deep (at {path})")
        if isinstance(item, str):
            check_text(item, f"{what} at {path}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise unfit(f"{what} holds {item!r} at {path}; JSON has no NaN or infinity")
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


def check_identifier(text: str, what: str) -> str:
    """A kind, id or owner: storable text without NUL (which C strings and PostgreSQL end at)."""
    if "\x00" in text:
        raise ValueError(f"{what} must not contain a NUL character ('\\x00'), got {text!r}")
    return check_text(text, what)


def decode_json(text: str | None) -> Any:
    """Parse stored JSON (``None`` stays ``None``); raises ``ValueError`` when corrupt.

    Exactly ``json.loads``: text the scanner takes whole in one pass (what
    :func:`encode_json` writes) is answered at once; anything else (leading
    or trailing whitespace, extra data, a fault) goes through ``json.loads``,
    which answers or raises as it always does — except that a document
    nested past the decoder's recursion limit is ``ValueError`` too.
    """
    if text is None:
        return None
    try:
        value, end = _scan_once(text, 0)
        if end == len(text):
            return value
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    except Exception:
        pass  # json.loads says what is wrong
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None


def ms_from_datetime(value: datetime) -> int:
    """An aware datetime as integer epoch milliseconds, rounded down."""
    return (value - EPOCH) // _MS


def ms_from_aware(value: object, what: str) -> int:
    """A checked aware datetime as epoch ms, refused unless it reads back as a UTC datetime.

    (``datetime.max`` five hours west of UTC is an aware datetime, and later
    than any UTC datetime can be.)
    """
    ms = ms_from_datetime(check_aware(value, what))
    if not _MIN_MS <= ms <= _MAX_MS:
        raise ValueError(
            f"{what} {value!r} is out of range: in UTC it falls outside the years 1 to 9999"
        )
    return ms


def datetime_from_ms(value: int | None) -> datetime | None:
    """Integer epoch milliseconds as an aware UTC datetime."""
    if value is None:
        return None
    return _EPOCH_PLUS(timedelta(0, 0, 0, int(value)))  # (days, seconds, µs, ms): exact ints


def check_aware(value: object, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be an aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return value
