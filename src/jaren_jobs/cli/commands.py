"""The commands: each takes the opened store, the parsed arguments and the output stream."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from jaren_jobs.cli import bulk, working
from jaren_jobs.cli.arguments import EXIT_OK, EXIT_REFUSED, INT64_MAX, CliError, shown_text
from jaren_jobs.cli.opening import opened
from jaren_jobs.records import STATES, Job
from jaren_jobs.store import Store


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
    # a second read: the queued jobs split at now, and the leases that ran out
    due = store.jobs.due_counts(queue=args.queue)
    if args.json:
        out.write(json.dumps({**counts.to_dict(), "due": due.to_dict()}, ensure_ascii=False) + "\n")
        return EXIT_OK
    if args.queue is not None:
        out.write(f"queue {shown_text(args.queue)}:\n")
    detail = {
        "pending": f"{due.pending_ready} ready now, {due.pending_scheduled} scheduled later",
        "failed": f"{due.failed_ready} ready now, {due.failed_scheduled} scheduled later",
        "leased": f"{due.leased_expired} with an expired lease",
    }
    rows = [["state", "jobs", "of which"]] + [
        [s, str(getattr(counts, s)), detail.get(s, "")] for s in STATES
    ]
    _table(rows, out)
    if counts.pending_kinds:
        out.write("\nqueued (pending + failed) by kind:\n")
        _table(
            [["kind", "jobs"]] + [[k, str(v)] for k, v in sorted(counts.pending_kinds.items())],
            out,
        )
    return EXIT_OK


def _lease_expired(job: Job, now_ms: int) -> bool:
    until = job.lease_until
    return str(job.state) == "leased" and until is not None and until.timestamp() * 1000 <= now_ms


def _state_cell(job: Job, now_ms: int) -> str:
    # an expired lease must not read as a live one: its holder is gone or late
    if _lease_expired(job, now_ms):
        return "leased (expired)"
    if job.cancel_requested and str(job.state) == "leased":
        return "leased (cancel requested)"
    return str(job.state)


def _listed(job: Job, now_ms: int) -> dict[str, Any]:
    return {**job.to_dict(), "lease_expired": _lease_expired(job, now_ms)}


def cmd_ls(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    jobs: list[Job] = []
    # one more than asked, to say whether there is more (and still 64 bits)
    limit = min(args.limit, INT64_MAX - 1) + 1
    with store.jobs.page(
        state=args.state,
        kind=args.kind,
        after=args.after,
        limit=limit,
        queue=args.queue,
        order=args.sort,
    ) as cursor:
        for job in cursor:
            jobs.append(job)
    now_ms = store.runtime.now_ms()
    more = len(jobs) > args.limit
    jobs = jobs[: args.limit]
    if args.json:
        for job in jobs:
            out.write(json.dumps(_listed(job, now_ms), ensure_ascii=False) + "\n")
        return EXIT_OK
    if not jobs:
        out.write("no jobs\n")
        return EXIT_OK
    rows = [
        ["id", "kind", "state", "attempts", "run_at", "updated_at", "lease_until", "last_error"]
    ]
    for job in jobs:
        rows.append(
            [
                job.id,
                job.kind,
                _state_cell(job, now_ms),
                f"{job.attempts}/{job.max_attempts}",
                _when(job.run_at),
                _when(job.updated_at),
                _when(job.lease_until) if str(job.state) == "leased" else "-",
                _one_line(job.last_error, 40),
            ]
        )
    _table(rows, out)
    if more:
        sort = "" if args.sort == "id" else f" --sort {args.sort}"
        out.write(f"\nmore: --after {jobs[-1].id}{sort}\n")
    return EXIT_OK


def cmd_show(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    job = store.jobs.get(args.id)
    if job is None:
        raise CliError(f"no job with id {args.id!r}", EXIT_REFUSED)
    data = job.to_dict()
    history = store.jobs.errors(args.id)
    expired = _lease_expired(job, store.runtime.now_ms())
    if args.json:
        # the job's own fields, whether its lease ran out, and its error history
        # (SPEC §13) under "errors"
        shown_json = {
            **data,
            "lease_expired": expired,
            "errors": [entry.to_dict() for entry in history],
        }
        out.write(json.dumps(shown_json, ensure_ascii=False) + "\n")
        return EXIT_OK
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key == "last_error":
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if key in ("state", "lease_until") and expired:
            shown += " (expired)" if key == "lease_until" else " (its lease expired)"
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
    return run_demo(db=args.db, jobs=args.jobs, out=out, as_json=args.json)


COMMANDS: dict[str, tuple[Callable[[Store, argparse.Namespace, TextIO], int], bool]] = {
    # command -> (function, read-only store)
    "counts": (cmd_counts, True),
    "ls": (cmd_ls, True),
    "show": (cmd_show, True),
    "cancel": (bulk.cmd_cancel, False),
    "requeue": (bulk.cmd_requeue, False),
    "sweep": (bulk.cmd_sweep, False),
    "worker": (working.cmd_worker, False),
}
