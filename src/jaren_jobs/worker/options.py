"""create_worker's options and their checks."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jaren_jobs.codec import check_text
from jaren_jobs.core.commands import check_queues
from jaren_jobs.engine.engine import EngineHub, JobEngine
from jaren_jobs.periodic import Periodic, check_schedules
from jaren_jobs.records import (
    Lease,
    Outcome,
)
from jaren_jobs.runtime import check_positive_int, check_seconds
from jaren_jobs.worker.attempt import Handler
from jaren_jobs.worker.threaded import Worker, WorkerHost


def _check_handlers(handlers: object) -> dict[str, Handler]:
    if not isinstance(handlers, Mapping):
        raise TypeError(
            "create_worker(): handlers must be a mapping of job kind to handler(payload, ctx), "
            f"got {type(handlers).__name__}"
        )
    if not handlers:
        raise ValueError("create_worker(): handlers must name at least one job kind")
    checked: dict[str, Handler] = {}
    for kind, handler in handlers.items():
        if not isinstance(kind, str):
            raise TypeError(
                f"create_worker(): each handlers key is a job kind (str), got "
                f"{type(kind).__name__} {kind!r}"
            )
        if kind == "":
            raise ValueError("create_worker(): a job kind must be a non-empty string")
        check_text(kind, "create_worker(): job kind")
        if not callable(handler):
            raise TypeError(
                f"create_worker(): the handler for kind {kind!r} must be callable as "
                f"handler(payload, ctx), got {type(handler).__name__}"
            )
        _check_handler_shape(kind, handler)
        checked[kind] = handler
    return checked


def _check_handler_shape(kind: str, handler: Callable[..., Any]) -> None:
    """Refuse a handler that can only fail at run time: ``async def``, or the wrong arity."""
    if is_async(handler):
        raise TypeError(
            f"create_worker(): the handler for kind {kind!r} is an async def function; this "
            "worker calls handlers on threads as plain functions, handler(payload, ctx). "
            "An AsyncStore's worker awaits async def handlers on the event loop: "
            "store = await jaren_jobs.open_async_store(...); store.jobs.create_worker(...)"
        )
    try:
        signature = inspect.signature(handler)
    except Exception:  # some builtins cannot be inspected: take them on trust
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise TypeError(
            f"create_worker(): the handler for kind {kind!r} cannot be called as "
            f"handler(payload, ctx): its signature is {signature} ({exc})"
        ) from None


def is_async(handler: object) -> bool:
    """Whether calling ``handler`` gives a coroutine or async generator, not a result."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
        return True
    if inspect.isroutine(handler) or inspect.isclass(handler):
        return False
    call = type(handler).__call__  # a callable object
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def _check_callable(value: object, what: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(
            f"create_worker(): {what} must be callable or None, got {type(value).__name__}"
        )
    return value


def create_worker(
    engine: JobEngine,
    hub: EngineHub,
    handlers: Mapping[str, Handler],
    *,
    concurrency: int = 1,
    poll_seconds: float | None = None,
    lease_seconds: float | None = None,
    owner: str | None = None,
    renew: bool = True,
    on_outcome: Callable[[Outcome], Any] | None = None,
    backoff_base_seconds: float | None = None,
    backoff_cap_seconds: float | None = None,
    stop_grace_seconds: float | None = None,
    on_renewal: Callable[[Lease], Any] | None = None,
    on_idle: Callable[[], Any] | None = None,
    periodic: Sequence[Periodic] | None = None,
    queues: Iterable[str] | None = None,
    host: WorkerHost | None = None,
) -> Worker:
    """Build a :class:`Worker` (``store.jobs.create_worker`` calls this). Not started.

    ``poll_seconds``, ``lease_seconds``, the backoff and ``stop_grace_seconds``
    default to the store's :class:`~jaren_jobs.Defaults`; ``owner`` to a fresh
    id from the runtime. ``on_outcome(Outcome)`` sees every attempt's one
    outcome; ``on_renewal(Lease)`` every successful renewal; ``on_idle()``
    every time a loop finds nothing to claim and goes idle. ``periodic``:
    :class:`~jaren_jobs.Periodic` schedules whose ticks this worker enqueues
    (distinct names; their kinds need no handler here). ``queues`` (an
    iterable of queue names; ``None``: every queue) limits what it claims.
    Observers that
    raise are logged (logger ``jaren_jobs``) and otherwise ignored.
    Mistakes are ``TypeError``/``ValueError``. ``host``: the AsyncWorker a worker is
    built for (its queue runs, renewals and grace end; see :class:`WorkerHost`).
    """
    checked = _check_handlers(handlers)
    schedules = check_schedules(periodic, "create_worker()")
    names = check_queues(queues, "create_worker()")
    loops = check_positive_int(concurrency, "create_worker(): concurrency")
    defaults = hub.defaults
    poll = (
        defaults.poll_seconds
        if poll_seconds is None
        else check_seconds(poll_seconds, "create_worker(): poll_seconds")
    )
    lease = (
        defaults.lease_seconds
        if lease_seconds is None
        else check_seconds(lease_seconds, "create_worker(): lease_seconds")
    )
    base = (
        None
        if backoff_base_seconds is None
        else check_seconds(backoff_base_seconds, "create_worker(): backoff_base_seconds")
    )
    cap = (
        None
        if backoff_cap_seconds is None
        else check_seconds(backoff_cap_seconds, "create_worker(): backoff_cap_seconds")
    )
    grace = (
        defaults.stop_grace_seconds
        if stop_grace_seconds is None
        else check_seconds(
            stop_grace_seconds, "create_worker(): stop_grace_seconds", allow_zero=True
        )
    )
    if owner is None:
        owner = hub.runtime.uuid()
    elif not isinstance(owner, str):
        raise TypeError(f"create_worker(): owner must be a str, got {type(owner).__name__}")
    elif owner == "":
        raise ValueError("create_worker(): owner must be a non-empty string")
    check_text(owner, "create_worker(): owner")
    if not isinstance(renew, bool):
        raise TypeError(f"create_worker(): renew must be a bool, got {type(renew).__name__}")
    return Worker(
        engine,
        hub,
        checked,
        concurrency=loops,
        poll_seconds=poll,
        lease_seconds=lease,
        owner=owner,
        renew=renew,
        on_outcome=_check_callable(on_outcome, "on_outcome"),
        on_renewal=_check_callable(on_renewal, "on_renewal"),
        on_idle=_check_callable(on_idle, "on_idle"),
        backoff_base_seconds=base,
        backoff_cap_seconds=cap,
        stop_grace_seconds=grace,
        periodic=schedules,
        queues=names,
        host=host,
    )
