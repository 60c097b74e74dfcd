"""The traceback an error history entry keeps (SPEC §13): bounded, scrubbed, storable."""

from __future__ import annotations

from jaren_jobs.tracebacks import MAX_TRACEBACK_CHARS, format_traceback

TOKEN = "tok-SECRET-123"


def fail_loudly() -> None:
    # many distinct lines, so the text outgrows the bound (Python folds repeated frames)
    lines = "\n".join(f"line {n} of a long message" for n in range(2000))
    raise ValueError(f"bad \udc80 value near {TOKEN}\n{lines}\nthe end")


def test_a_long_traceback_keeps_its_tail_cut_at_a_line_with_a_marker() -> None:
    try:
        try:
            raise KeyError(f"the cause, with {TOKEN}")
        except KeyError:
            fail_loudly()
    except ValueError as exc:
        text = format_traceback(exc, TOKEN)
    assert text is not None
    head, rest = text.split("\n", 1)
    assert head.startswith("[... ")
    assert head.endswith(" earlier characters of the traceback cut ...]")
    assert len(rest) <= MAX_TRACEBACK_CHARS
    assert rest.startswith("line ")  # a whole line, not the middle of one
    assert rest.endswith("the end\n")
    assert TOKEN not in text


def test_a_short_traceback_is_whole_scrubbed_and_storable() -> None:
    try:
        raise ValueError(f"bad \udc80 value near {TOKEN}")
    except ValueError as exc:
        text = format_traceback(exc, TOKEN)
    assert text is not None
    assert text.startswith("Traceback (most recent call last):")
    assert "in test_a_short_traceback_is_whole_scrubbed_and_storable" in text
    assert TOKEN not in text
    assert "ValueError: bad \\udc80 value near <lease token>" in text
    text.encode("utf-8")  # no lone surrogate left


def test_no_traceback_without_a_raised_exception() -> None:
    assert format_traceback("a text") is None
    assert format_traceback(ValueError("made, never raised")) is None


def test_a_hostile_str_still_gives_the_frames() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    try:
        raise Hostile
    except Hostile as exc:
        text = format_traceback(exc)
    assert text is not None
    assert "in test_a_hostile_str_still_gives_the_frames" in text
