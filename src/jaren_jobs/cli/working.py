"""``jaren-jobs worker``: run the user's handlers until a signal (or, with ``--burst``, until
nothing is due), and report.

Exit status: 0 when it stopped and every attempt finished within the grace
period (with ``--burst``: and it ran out of due work); 1 when it stopped
without draining (an attempt was still running at the end of the grace
period, its lease left to expire; or a ``--burst`` run was stopped by a
signal before it ran dry); 130 when a second SIGINT/SIGTERM stopped it at
once, mid-drain (the attempts under way are abandoned: their leases expire
and the jobs are re-claimed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal as os_signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from jaren_jobs.cli.arguments import EXIT_OK, EXIT_REFUSED, CliError, shown_text
from jaren_jobs.store import Store

#: a second signal during the drain: stop at once
EXIT_ABANDONED = 130
_log = logging.getLogger("jaren_jobs.cli")


def _load_handlers(spec: str) -> Mapping[str, Callable[..., Any]]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected MODULE:ATTR (e.g. myapp.jobs:HANDLERS), got {spec!r}")
    # like `python -m`, look in the working directory first
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CliError(f"module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if callable(target) and not isinstance(target, Mapping):
        try:
            target = target()
        except Exception as exc:
            raise CliError(f"{spec}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(target, Mapping) or not target:
        raise CliError(f"{spec} must be a non-empty dict of kind -> handler")
    return target


def _configure_logging(level: str | None) -> None:
    """``--log-level``: the ``jaren_jobs`` logger tree to stderr at that level.

    Without it nothing is configured, as in a library: Python's last-resort
    handler prints the WARNING-or-worse lines alone.
    """
    if level is None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    tree = logging.getLogger("jaren_jobs")
    tree.addHandler(handler)
    tree.setLevel(level)
    tree.propagate = False  # the application's root handlers (none here) stay out of it


def _options(args: argparse.Namespace, handlers: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"concurrency": args.concurrency}
    if args.queues is not None:
        queues = [q.strip() for q in args.queues.split(",") if q.strip()]
        if not queues:
            raise CliError(f"--queues names no queue: {args.queues!r}")
        options["queues"] = queues
    if args.poll is not None:
        options["poll_seconds"] = args.poll
    if args.lease is not None:
        options["lease_seconds"] = args.lease
    return options


def _kinds(args: argparse.Namespace, handlers: dict[str, Any]) -> dict[str, Any]:
    if not args.kinds:
        return handlers
    wanted = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not wanted:
        raise CliError(f"--kinds names no kind: {args.kinds!r}")
    unknown = sorted(set(wanted) - set(handlers))
    if unknown:
        raise CliError(f"--kinds names kinds with no handler: {', '.join(unknown)}")
    return {k: handlers[k] for k in wanted}


def _emit(out: TextIO, args: argparse.Namespace, text: str, data: dict[str, Any]) -> None:
    out.write((json.dumps(data, ensure_ascii=False) if args.json else text) + "\n")
    out.flush()


def cmd_worker(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    handlers = _kinds(args, dict(_load_handlers(args.handlers)))
    options = _options(args, handlers)
    _configure_logging(args.log_level)
    try:
        worker = store.jobs.create_worker(handlers, **options)
    except (TypeError, ValueError) as exc:
        # the handlers came from the user's module: a bad entry is their input
        raise CliError(f"{args.handlers}: {exc}") from None
    metrics = _serve_metrics(store, args, out) if args.metrics_port is not None else None
    try:
        return _work(store, worker, handlers, args, out, queues=options.get("queues"))
    finally:
        if metrics is not None:
            metrics()


def _serve_metrics(store: Store, args: argparse.Namespace, out: TextIO) -> Callable[[], None]:
    """``--metrics-port``: the store's metrics (SPEC §17) at /metrics; what stops serving."""
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        from jaren_jobs.observability.metrics import (  # noqa: PLC0415 - the optional extra
            register_metrics,
            serve_metrics,
            unregister_metrics,
        )
    except ImportError:
        raise CliError(
            "--metrics-port needs prometheus_client: pip install 'jaren_jobs[prometheus]'"
        ) from None
    registry = CollectorRegistry()
    register_metrics(store, registry=registry)
    try:
        server = serve_metrics(registry, port=args.metrics_port)
    except OSError as exc:
        unregister_metrics(registry)
        raise CliError(f"--metrics-port {args.metrics_port}: {exc.strerror or exc}") from None
    _emit(out, args, f"metrics at {server.url}", {"event": "metrics", "url": server.url})

    def close() -> None:
        server.close()
        unregister_metrics(registry)

    return close


def _work(
    store: Store,
    worker: Any,
    handlers: dict[str, Any],
    args: argparse.Namespace,
    out: TextIO,
    *,
    queues: list[str] | None,
) -> int:
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        if stop.is_set():
            # a second signal: stop at once, attempts abandoned to their leases
            _emit(
                out,
                args,
                f"stopped at once by a second {os_signal.Signals(signum).name}: attempts under "
                "way are abandoned, their leases expire and the jobs are re-claimed",
                {"event": "abandoned", "signal": os_signal.Signals(signum).name},
            )
            sys.stderr.flush()
            os._exit(EXIT_ABANDONED)
        stop.set()

    previous = {
        sig: os_signal.signal(sig, request_stop) for sig in (os_signal.SIGINT, os_signal.SIGTERM)
    }
    ran_dry = False
    # a path is bytes: one that is not UTF-8 is shown escaped, never a traceback
    ready_text = (
        f"worker {', '.join(sorted(handlers))} x{args.concurrency}"
        f"{'' if queues is None else ' (queues ' + ', '.join(queues) + ')'}"
        f"{' burst' if args.burst else ''} on {shown_text(store.path or '')}; "
        "SIGINT or SIGTERM stops it"
    )
    ready_data = {
        "event": "ready",
        "kinds": sorted(handlers),
        "concurrency": args.concurrency,
        "queues": queues,
        "burst": args.burst,
    }

    def ready() -> None:
        _emit(out, args, ready_text, ready_data)

    try:
        if args.burst:
            ran_dry = _burst(worker, args.concurrency, stop, ready)
        else:
            worker.start()
            ready()
            while not stop.wait(0.5):
                pass
        grace = worker.stop_grace_seconds if args.grace is None else args.grace
        _emit(
            out,
            args,
            f"stopping: draining for up to {grace:g}s; a second SIGINT or SIGTERM stops at once",
            {"event": "stopping", "grace_seconds": grace},
        )
        outcome = worker.stop(args.grace)
    finally:
        for sig, handler in previous.items():
            os_signal.signal(sig, handler)
    stats = worker.stats()
    drained = outcome.drained and (ran_dry or not args.burst)
    how = "drained" if outcome.drained else f"{outcome.in_flight} not drained"
    if args.burst and not ran_dry:
        how += ", interrupted before it ran dry"
    _emit(
        out,
        args,
        f"stopped: {stats.completions} completed, {stats.failures} failed, "
        f"{stats.cancellations} cancelled, {stats.lost_settlements} lost; {how}",
        {
            "event": "stopped",
            "completed": stats.completions,
            "failed": stats.failures,
            "cancelled": stats.cancellations,
            "lost": stats.lost_settlements,
            "snoozed": stats.snoozes,
            "drained": outcome.drained,
            "in_flight": outcome.in_flight,
            "burst": args.burst,
            "ran_dry": ran_dry if args.burst else None,
        },
    )
    return EXIT_OK if drained else EXIT_REFUSED


def _burst(worker: Any, concurrency: int, stop: threading.Event, ready: Callable[[], None]) -> bool:
    """Run what is due now in ``concurrency`` threads, each claiming until nothing is
    claimable (``run_once()`` answers False); True when they all ran dry before a signal.

    A retry whose backoff has not passed, or a delayed job, is not due: it is
    left for a later run.
    """
    dry = [False] * concurrency

    def drive(index: int) -> None:
        while not stop.is_set():
            if not worker.run_once():
                dry[index] = True
                return

    threads = [
        threading.Thread(target=drive, args=(i,), name=f"jaren-jobs-burst-{i}", daemon=True)
        for i in range(concurrency)
    ]
    ready()
    # run_once() drives the worker without start(), whose "started" line this stands for
    _log.info(
        "jaren_jobs: worker %r: burst in %d thread(s): running what is due, then stopping",
        worker.owner,
        concurrency,
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        # joined in slices, so this (the main) thread takes the signals meanwhile;
        # on a signal the caller's stop() aborts the handlers' signals and drains
        while thread.is_alive():
            if stop.is_set():
                return False
            thread.join(0.2)
    return all(dry) and not stop.is_set()
