"""The traceback an error history entry keeps (SPEC §13): formatted, bounded, storable.

Not in ``core/``: formatting a traceback reads the source lines of its frames
(``linecache``), which is I/O.
"""

from __future__ import annotations

import traceback as _traceback

from jaren_jobs.errors import storable_text

__all__ = ["MAX_TRACEBACK_CHARS", "format_traceback"]

#: the most of a traceback kept: its last 16 KiB of text (the raising frames
#: are at the end, so the head is what is cut)
MAX_TRACEBACK_CHARS = 16 * 1024
_CUT = "[... {} earlier characters of the traceback cut ...]\n"
_SCRUBBED = "<lease token>"


def format_traceback(error: object, token: str | None = None) -> str | None:
    """``error``'s formatted traceback, or ``None`` when it is no raised exception.

    Bounded to :data:`MAX_TRACEBACK_CHARS` (the tail kept, cut at a line
    boundary, a marker saying how much went), lone surrogates escaped as
    :func:`~jaren_jobs.errors.describe_error` does, and ``token`` (the lease
    token) replaced wherever it appears: the history is readable by anyone
    who can read the job. Never raises: a failure must settle whatever the
    exception does in its ``__str__``.
    """
    if not isinstance(error, BaseException) or error.__traceback__ is None:
        return None
    try:
        text = "".join(_traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:  # a hostile __str__ in the chain: keep the frames at least
        try:
            text = "".join(_traceback.format_tb(error.__traceback__))
            text = (
                f"Traceback (most recent call last):\n{text}<unprintable {type(error).__name__}>\n"
            )
        except Exception:
            return None
    if token:
        text = text.replace(token, _SCRUBBED)
    text = storable_text(text)
    if len(text) > MAX_TRACEBACK_CHARS:
        tail = text[len(text) - MAX_TRACEBACK_CHARS :]
        newline = tail.find("\n")
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1 :]  # start at a whole line
        text = _CUT.format(len(text) - len(tail)) + tail
    return text
