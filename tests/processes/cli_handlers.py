"""Handlers for the ``jaren-jobs worker`` subprocess tests (imported by the CLI by name)."""

from __future__ import annotations

import threading
from typing import Any

from jaren_jobs import JobContext

# how long a handler that waits for the stop signal waits at most; far longer
# than any test should take, so only the signal ends it in a passing run
SIGNAL_WAIT_SECONDS = 60.0

stubborn_release = threading.Event()  # never set: a stubborn handler ignores stop


def double(payload: Any, ctx: JobContext) -> Any:
    return {"n": payload["n"], "doubled": payload["n"] * 2}


def explode(payload: Any, ctx: JobContext) -> Any:
    raise RuntimeError(f"exploded on purpose: {payload!r}")


def hold(payload: Any, ctx: JobContext) -> Any:
    """Runs until the worker stops (its signal aborts), then completes normally."""
    released = ctx.signal.wait(SIGNAL_WAIT_SECONDS)
    return {"released_by_stop": released}


def stubborn(payload: Any, ctx: JobContext) -> Any:
    """Ignores the stop signal: the worker's grace period must bound the stop."""
    stubborn_release.wait(payload.get("seconds", SIGNAL_WAIT_SECONDS))
    return "finished late"


HANDLERS = {"double": double, "explode": explode, "hold": hold, "stubborn": stubborn}


def make_handlers() -> dict[str, Any]:
    """A factory: ``worker tests.processes.cli_handlers:make_handlers`` calls it."""
    return {"double": double}
