"""``requeue``, ``cancel`` and ``sweep``: one job, many ids, or every job a filter matches.

A bulk command walks its jobs in keyset pages (never all of them at once)
and acts on each in a transaction of its own, so one refusal stops nothing:
every job gets one result, ``changed`` (or would, with ``--dry-run``),
``unchanged`` (it already was where the command sends it, or its forced
cancel was already asked for) or ``refused`` (an unknown id, a settled job,
a live lease for requeue). The exit status is 0 when every job was changed or unchanged,
1 otherwise. ``--dry-run`` runs the very calls the real run makes, inside one
transaction that is then rolled back: its prediction is the real run's own
decision (a unique key another job holds refuses a requeue there too), and it
writes nothing. (It holds that transaction for its whole run: on SQLite,
other writers wait.)

SIGINT or SIGTERM stops a bulk run between two jobs, never in the middle of
one: the report says exactly what was changed, with ``"interrupted": true``
under ``--json``, and the exit status is 130 (SIGINT) or 143 (SIGTERM). A
second signal stops at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TextIO

from jaren_jobs.cli.arguments import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError, clip
from jaren_jobs.codec import datetime_from_ms
from jaren_jobs.errors import JobsError
from jaren_jobs.records import Job
from jaren_jobs.store import Jobs, Store

#: how many jobs a bulk command reads per keyset page
PAGE_SIZE = 500

Result = Literal["changed", "unchanged", "refused"]
_SETTLED_TEXT = {
    "done": "done: a completed job is not re-run; enqueue new work under a new id",
    "dead": "dead: already settled",
    "cancelled": "cancelled: already settled",
}


@dataclass(frozen=True)
class Verdict:
    """What became (or, in a dry run, would become) of one job."""

    id: str
    state: str | None  # before the command; None for an id no job has
    result: Result
    reason: str | None = None
    said: str | None = None  # the human line for a changed/unchanged job

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "result": self.result, "reason": self.reason}


class _Dry(Exception):
    """Rolls a dry run's transaction back, carrying what it counted."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


#: the exit status of a bulk run a signal stopped, by signal
_INTERRUPTED_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class _StopRequests:
    """SIGINT and SIGTERM, noted rather than raised while a bulk run goes on.

    A signal raised in the middle of a job's call could leave it unknown
    whether that call committed, and the report would then be a guess; noted,
    the run stops before its next job and reports exactly what it did. A
    second signal stops at once (KeyboardInterrupt), for an impatient operator.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def _note(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopRequests]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread: nothing to note here
            return
        previous = {sig: signal.signal(sig, self._note) for sig in _INTERRUPTED_STATUS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _targets(jobs: Jobs, args: argparse.Namespace) -> Iterator[tuple[str, Job | None]]:
    """Each job the command names: the ids given (read one by one), or a filter's
    matches, walked by id in pages of :data:`PAGE_SIZE` (a page is read, then acted on)."""
    if args.ids:
        for job_id in dict.fromkeys(args.ids):  # each id once, in the order given
            yield job_id, jobs.get(job_id)
        return
    for state in args.state or [None]:
        after: str | None = None
        while True:
            with jobs.page(
                state=state, kind=args.kind, queue=args.queue, after=after, limit=PAGE_SIZE
            ) as cursor:
                page = list(cursor)
            for job in page:
                yield job.id, job
            if len(page) < PAGE_SIZE:
                break
            after = page[-1].id


def check_selection(args: argparse.Namespace) -> None:
    """At least one id or filter, and not both kinds at once."""
    filters = args.state or args.kind is not None or args.queue is not None
    if not args.ids and not filters:
        raise CliError(
            f"{args.command}: name the jobs: one or more ids, or filters "
            "(--state, --kind, --queue)",
            EXIT_USAGE,
        )
    if args.ids and filters:
        raise CliError(
            f"{args.command}: give ids or filters (--state, --kind, --queue), not both",
            EXIT_USAGE,
        )


def _expired(job: Job, now_ms: int) -> bool:
    until = job.lease_until
    return until is not None and until.timestamp() * 1000 <= now_ms


def _unknown(job_id: str) -> Verdict:
    return Verdict(job_id, None, "refused", f"no job with id {job_id!r} (never enqueued, or swept)")


# ------------------------------------------------------------------ requeue


@dataclass(frozen=True)
class _Run:
    """What every job's action in one bulk run shares; ``dry`` only words its lines."""

    args: argparse.Namespace
    now_ms: int
    dry: bool


# One job's action: the real call, made through ``jobs`` (the store's, or a dry run's
# transaction's)
Act = Callable[[Jobs, _Run, str, "Job | None"], Verdict]


def _requeue_one(jobs: Jobs, run: _Run, job_id: str, job: Job | None) -> Verdict:
    args = run.args
    state = None if job is None else str(job.state)
    try:
        changed = jobs.requeue(
            job_id, drop_checkpoints=args.drop_checkpoints, reset_attempts=args.reset_attempts
        )
    except JobsError as exc:
        return Verdict(job_id, state, "refused", str(exc))
    if not changed:
        return Verdict(
            job_id, state, "unchanged", "already pending", f"{job_id} was already pending"
        )
    if run.dry:
        return Verdict(job_id, state, "changed", None, f"would requeue {job_id}")
    dropped = "; its checkpoints were dropped" if args.drop_checkpoints else ""
    return Verdict(job_id, state, "changed", None, f"requeued {job_id}{dropped}")


def cmd_requeue(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    check_selection(args)
    extra = {"drop_checkpoints": args.drop_checkpoints, "reset_attempts": args.reset_attempts}
    return _bulk(store, args, out, _requeue_one, done_word="requeued", extra=extra)


# ------------------------------------------------------------------ cancel


_ALREADY_ASKED = "cancellation already requested"


def _cancel_one(jobs: Jobs, run: _Run, job_id: str, job: Job | None) -> Verdict:
    state = None if job is None else str(job.state)
    running = job is not None and state == "leased" and not _expired(job, run.now_ms)
    try:
        # forced: a running job is asked to stop (SPEC §13); a queued one is cancelled
        changed = jobs.cancel(job_id, force=True)
    except JobsError as exc:
        return Verdict(job_id, state, "refused", str(exc))
    if not changed and running:
        return Verdict(job_id, state, "unchanged", _ALREADY_ASKED, f"{job_id}: {_ALREADY_ASKED}")
    if not changed:
        return Verdict(
            job_id, state, "unchanged", "already cancelled", f"{job_id} was already cancelled"
        )
    if running:
        if run.dry:
            said = f"would request the cancellation of running {job_id}"
        else:
            said = (
                f"cancel requested for running {job_id}: its worker's signal aborts (at its "
                "next lease renewal at the latest), or it is cancelled when its lease expires"
            )
        return Verdict(job_id, state, "changed", None, said)
    return Verdict(
        job_id, state, "changed", None, f"{'would cancel' if run.dry else 'cancelled'} {job_id}"
    )


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    check_selection(args)
    return _bulk(store, args, out, _cancel_one, done_word="cancelled", extra={})


class _RolledBack(Exception):
    """Ends a dry run's transaction: nothing it did is kept."""


def _bulk(
    store: Store,
    args: argparse.Namespace,
    out: TextIO,
    act: Act,
    *,
    done_word: str,
    extra: dict[str, Any],
) -> int:
    now_ms = store.runtime.now_ms()
    with _StopRequests().installed() as stops:
        if not args.dry_run:
            verdicts: Iterable[Verdict] = (
                act(store.jobs, _Run(args, now_ms, dry=False), job_id, job)
                for job_id, job in _targets(store.jobs, args)
            )
            return _report(verdicts, args, out, stops, done_word=done_word, extra=extra)
        # the real calls, in one transaction rolled back at the end: the prediction is
        # the real run's own decision, each job seeing what the ones before it did
        try:
            with store.transaction() as tx:
                verdicts = (
                    act(tx.jobs, _Run(args, now_ms, dry=True), job_id, job)
                    for job_id, job in _targets(tx.jobs, args)
                )
                status = _report(verdicts, args, out, stops, done_word=done_word, extra=extra)
                raise _RolledBack
        except _RolledBack:
            return status


# ------------------------------------------------------------------ the report


def _report(
    verdicts: Iterable[Verdict],
    args: argparse.Namespace,
    out: TextIO,
    stops: _StopRequests,
    *,
    done_word: str,
    extra: dict[str, Any],
) -> int:
    """Print each verdict as it comes (human) or one object at the end (``--json``);
    a stop request ends the run before the next job, and the report says so."""
    tally: dict[str, int] = dict.fromkeys(("changed", "unchanged", "refused"), 0)
    kept: list[dict[str, Any]] = []
    bulk = not args.ids or len(args.ids) > 1
    pending = iter(verdicts)
    while stops.signum is None:
        verdict = next(pending, None)
        if verdict is None:
            break
        tally[verdict.result] += 1
        if args.json:
            kept.append(verdict.to_dict())
        elif verdict.result in ("changed", "unchanged"):
            out.write(f"{verdict.said}\n")
            out.flush()
        else:
            # one line on stderr per job that was refused, as a lone refusal is
            reason = verdict.reason or ""
            line = reason if repr(verdict.id) in reason else f"{verdict.id}: {reason}"
            _stderr(f"jaren-jobs: {line}")
    status = EXIT_OK if tally["refused"] == 0 else EXIT_REFUSED
    interrupted = stops.signum is not None
    if stops.signum is not None:
        status = _INTERRUPTED_STATUS.get(signal.Signals(stops.signum), 130)
        _stderr(
            f"jaren-jobs: {args.command}: interrupted; {tally['changed']} "
            f"{'would have been ' if args.dry_run else ''}{done_word} before it stopped"
        )
    if args.json:
        report = {
            "command": args.command,
            "dry_run": args.dry_run,
            **extra,
            **tally,
            "interrupted": interrupted,
            "jobs": kept,
        }
        out.write(json.dumps(report, ensure_ascii=False) + "\n")
    elif bulk:
        changed = f"{tally['changed']} {'would be ' if args.dry_run else ''}{done_word}"
        rest = ", ".join(f"{tally[key]} {key}" for key in ("unchanged", "refused") if tally[key])
        tail = "; dry run, nothing changed" if args.dry_run else ""
        out.write(f"{args.command}: {changed}{', ' + rest if rest else ''}{tail}\n")
    return status


def _stderr(line: str) -> None:
    import sys  # noqa: PLC0415 - stderr as the process has it at the time of writing

    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ sweep


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
    states = sorted(set(args.state)) if args.state else None

    def sweep(jobs: Any) -> int:
        count: int = jobs.sweep(settled_before=horizon, limit=args.limit, states=states)
        return count

    removed = _dry_count(store, sweep) if args.dry_run else sweep(store.jobs)
    if args.json:
        report = {
            "command": "sweep",
            "dry_run": args.dry_run,
            "swept": removed,
            "states": states or ["cancelled", "dead", "done"],
            "settled_before": _iso(horizon),
            "limit": args.limit,
        }
        out.write(json.dumps(report) + "\n")
        return EXIT_OK
    what = f"{'settled' if states is None else '/'.join(states)} job(s)"
    verb = "would sweep" if args.dry_run else "swept"
    tail = "; dry run, nothing deleted" if args.dry_run else ""
    out.write(f"{verb} {removed} {what} last changed before {horizon.isoformat()}{tail}\n")
    return EXIT_OK


def _dry_count(store: Store, sweep: Callable[[Any], int]) -> int:
    """The sweep's own count, from a transaction that is then rolled back."""
    try:
        with store.transaction() as tx:
            raise _Dry(sweep(tx.jobs))
    except _Dry as dry:
        return dry.count


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")
