"""The commands: each takes the opened store, the parsed arguments and the output stream."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal as os_signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from jaren_jobs.codec import datetime_from_ms
from jaren_jobs.records import STATES, Job
from jaren_jobs.store import Store

from .arguments import EXIT_OK, EXIT_REFUSED, INT64_MAX, CliError, clip, shown_text
from .opening import opened


def _when(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def _one_line(text: str | None, width: int) -> str:
    if not text:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def cmd_counts(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    counts = store.jobs.counts(queue=args.queue)
    if args.json:
        out.write(json.dumps(counts.to_dict(), ensure_ascii=False) + "\n")
        return EXIT_OK
    if args.queue is not None:
        out.write(f"queue {shown_text(args.queue)}:\n")
    rows = [["state", "jobs"]] + [[s, str(getattr(counts, s))] for s in STATES]
    _table(rows, out)
    if counts.pending_kinds:
        out.write("\nqueued (pending + failed) by kind:\n")
        _table(
            [["kind", "jobs"]] + [[k, str(v)] for k, v in sorted(counts.pending_kinds.items())],
            out,
        )
    return EXIT_OK


def cmd_ls(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    jobs: list[Job] = []
    # one more than asked, to say whether there is more (and still 64 bits)
    limit = min(args.limit, INT64_MAX - 1) + 1
    with store.jobs.page(
        state=args.state, kind=args.kind, after=args.after, limit=limit, queue=args.queue
    ) as cursor:
        for job in cursor:
            jobs.append(job)
    more = len(jobs) > args.limit
    jobs = jobs[: args.limit]
    if args.json:
        for job in jobs:
            out.write(json.dumps(job.to_dict(), ensure_ascii=False) + "\n")
        return EXIT_OK
    if not jobs:
        out.write("no jobs\n")
        return EXIT_OK
    rows = [["id", "kind", "state", "attempts", "run_at", "last_error"]]
    for job in jobs:
        rows.append(
            [
                job.id,
                job.kind,
                job.state,
                f"{job.attempts}/{job.max_attempts}",
                _when(job.run_at),
                _one_line(job.last_error, 40),
            ]
        )
    _table(rows, out)
    if more:
        out.write(f"\nmore: --after {jobs[-1].id}\n")
    return EXIT_OK


def cmd_show(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    job = store.jobs.get(args.id)
    if job is None:
        raise CliError(f"no job with id {args.id!r}", EXIT_REFUSED)
    data = job.to_dict()
    history = store.jobs.errors(args.id)
    if args.json:
        # the job's own fields, and its error history (SPEC §13) under "errors"
        shown_json = {**data, "errors": [entry.to_dict() for entry in history]}
        out.write(json.dumps(shown_json, ensure_ascii=False) + "\n")
        return EXIT_OK
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key == "last_error":
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        out.write(f"{key.ljust(width)}  {'-' if value is None else shown}\n")
    out.write(f"{'last_error'.ljust(width)}  {job.last_error or '-'}\n")
    if history:
        out.write(f"\nerror history ({len(history)} failed attempt(s), oldest first):\n")
        for entry in history:
            first = entry.error.splitlines()[0] if entry.error else ""
            line = first if len(first) <= 100 else first[:97] + "..."
            at = entry.at.isoformat(timespec="milliseconds")
            out.write(f"  attempt {entry.attempt}  {at}  {line}\n")
        last = history[-1]
        if last.traceback is not None:
            out.write(f"\ntraceback of attempt {last.attempt}:\n{last.traceback.rstrip()}\n")
    return EXIT_OK


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changed = store.jobs.cancel(args.id)
    out.write(f"cancelled {args.id}\n" if changed else f"{args.id} was already cancelled\n")
    return EXIT_OK


def cmd_requeue(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changed = store.jobs.requeue(
        args.id, drop_checkpoints=args.drop_checkpoints, reset_attempts=args.reset_attempts
    )
    said = f"requeued {args.id}" if changed else f"{args.id} was already pending"
    dropped = "; its checkpoints were dropped" if args.drop_checkpoints else ""
    out.write(f"{said}{dropped}\n")
    return EXIT_OK


def cmd_sweep(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    now = datetime_from_ms(store.runtime.now_ms())
    assert now is not None
    try:
        horizon = now - timedelta(seconds=args.older_than.seconds)
    except OverflowError:
        raise CliError(
            f"--older-than {clip(args.older_than.text)} reaches back before the year 1; "
            "nothing is that old"
        ) from None
    removed = store.jobs.sweep(settled_before=horizon, limit=args.limit)
    out.write(f"swept {removed} settled job(s) last changed before {horizon.isoformat()}\n")
    return EXIT_OK


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


def cmd_worker(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    handlers = dict(_load_handlers(args.handlers))
    if args.kinds:
        wanted = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not wanted:
            raise CliError(f"--kinds names no kind: {args.kinds!r}")
        unknown = sorted(set(wanted) - set(handlers))
        if unknown:
            raise CliError(f"--kinds names kinds with no handler: {', '.join(unknown)}")
        handlers = {k: handlers[k] for k in wanted}
    options: dict[str, Any] = {"concurrency": args.concurrency}
    if args.queues is not None:
        queues = [q.strip() for q in args.queues.split(",") if q.strip()]
        if not queues:
            raise CliError(f"--queues names no queue: {args.queues!r}")
        options["queues"] = queues
    if args.poll is not None:
        options["poll_seconds"] = args.poll
    try:
        worker = store.jobs.create_worker(handlers, **options)
    except (TypeError, ValueError) as exc:
        # the handlers came from the user's module: a bad entry is their input
        raise CliError(f"{args.handlers}: {exc}") from None
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {
        sig: os_signal.signal(sig, request_stop) for sig in (os_signal.SIGINT, os_signal.SIGTERM)
    }
    try:
        worker.start()
        # a path is bytes: one that is not UTF-8 is shown escaped, never a traceback
        out.write(
            f"worker {', '.join(sorted(handlers))} x{args.concurrency}"
            f"{'' if args.queues is None else ' (queues ' + ', '.join(options['queues']) + ')'} on "
            f"{shown_text(store.path or '')}; SIGINT or SIGTERM stops it\n"
        )
        out.flush()
        while not stop.wait(0.5):
            pass
        outcome = worker.stop(args.grace)
    finally:
        for sig, handler in previous.items():
            os_signal.signal(sig, handler)
    stats = worker.stats()
    out.write(
        f"stopped: {stats.completions} completed, {stats.failures} failed, "
        f"{stats.cancellations} cancelled, {stats.lost_settlements} lost; "
        f"{'drained' if outcome.drained else f'{outcome.in_flight} not drained'}\n"
    )
    return EXIT_OK


def _check_demo_target(path: str) -> None:
    """The demo writes only to a new file or a jaren_jobs database with no jobs."""
    target = Path(path)
    if not target.exists():
        if not target.parent.is_dir():
            raise CliError(f"demo: no directory {str(target.parent)!r} for {path!r}")
        return
    try:
        with opened(path, readonly=True) as store:
            counts = store.jobs.counts()
    except CliError as exc:
        raise CliError(f"demo: {exc}; pass a new path") from None
    held = sum(getattr(counts, state) for state in STATES)
    if held:
        raise CliError(
            f"demo: {path!r} already holds {held} job(s) and the demo's workers would run "
            "them; pass a new path"
        )


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from jaren_jobs.demo import run_demo  # noqa: PLC0415 - only the demo needs it

    # only an explicit --db: $JAREN_JOBS_DB may name a real queue
    if args.db is not None:
        _check_demo_target(args.db)
    return run_demo(db=args.db, jobs=args.jobs, out=out)


COMMANDS: dict[str, tuple[Callable[[Store, argparse.Namespace, TextIO], int], bool]] = {
    # command -> (function, read-only store)
    "counts": (cmd_counts, True),
    "ls": (cmd_ls, True),
    "show": (cmd_show, True),
    "cancel": (cmd_cancel, False),
    "requeue": (cmd_requeue, False),
    "sweep": (cmd_sweep, False),
    "worker": (cmd_worker, False),
}
