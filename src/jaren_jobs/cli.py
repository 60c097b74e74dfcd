"""The ``jaren-jobs`` command line (also ``python -m jaren_jobs``).

Exit status: 0 success; 1 the store refused (unknown id, a settled job, a
live lease); 2 bad usage or input (a missing database, a file that is not a
jaren_jobs database, a bad duration, a number out of range, an argument that
is not UTF-8, a module that fails to import); 130 interrupted; 141 the reader
of stdout went away (``jaren-jobs ls | head``). Errors are one line on stderr,
never a traceback for a user mistake.

The read-only commands (``counts``, ``ls``, ``show``) never change the file:
they open it read-only, and a file whose job tables are an older schema is
read through an upgraded private copy (a note on stderr says so); the write
commands upgrade it in place, as every read-write open does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import signal as os_signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TextIO

from .backends.sqlite.connection import copy_database
from .backends.sqlite.errors import is_not_a_database
from .backends.sqlite.queries import SCHEMA_VERSION
from .codec import datetime_from_ms
from .errors import JobsError, SchemaError
from .records import STATES, Job
from .runtime import MAX_SECONDS
from .store import Store, open_store

__all__ = ["main", "parse_duration"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a writer killed by SIGPIPE

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# what SQLite's INTEGER (and so every count and limit of the library) holds
_INT64_MAX = 2**63 - 1
# bounds for what would otherwise start that many threads or jobs, not fail
MAX_CONCURRENCY = 1024
MAX_DEMO_JOBS = 100_000


class CliError(Exception):
    """A user-facing failure: one line, and an exit status."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


def parse_duration(text: str) -> float:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` (or ``500ms``) as seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"bad duration {_clip(text)}: use a number and a unit, like 30s, 15m, 12h, 7d or 2w"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"bad duration {_clip(text)}: too large")
    return seconds


def _shown(text: str) -> str:
    """Text as a user typed it, printable: bytes that are not UTF-8 come out escaped."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _clip(text: str, width: int = 40) -> str:
    # an argument of 5000 digits is still one short line
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


def _utf8(text: str) -> str:
    # the interpreter hands argv bytes that are not UTF-8 over as lone
    # surrogates; no job, kind or module can be named by one
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = repr(text.encode("utf-8", "surrogateescape"))
        raw = raw if len(raw) <= 40 else raw[:36] + "...'"
        raise argparse.ArgumentTypeError(f"not valid UTF-8: {raw}") from None
    return text


class _Duration(NamedTuple):
    seconds: float
    text: str


def _duration_arg(text: str) -> _Duration:
    try:
        return _Duration(parse_duration(_utf8(text)), text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(maximum: int = _INT64_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # not a number, or thousands of digits
            raise argparse.ArgumentTypeError(
                f"expected a positive integer, got {_clip(text)}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {_clip(text)}")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"expected a positive integer of at most {maximum}, got {_clip(text)}"
            )
        return value

    return parse


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return _utf8(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {_clip(text)}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, got {_clip(text)}"
        )
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds of at most {MAX_SECONDS:.0f} (a century), "
            f"got {_clip(text)}"
        )
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, argparse's status 2, no usage dump for a user mistake
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jaren-jobs",
        description="Inspect and operate a jaren_jobs queue in a SQLite database.",
    )
    parser.add_argument(
        "--db",
        metavar="PATH",
        help="the database file (default: $JAREN_JOBS_DB; the demo ignores it)",
    )
    # `--db` is accepted after the subcommand too; SUPPRESS keeps the global
    # value (or $JAREN_JOBS_DB) when it is not repeated there
    db_after = _Parser(add_help=False)
    db_after.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def add_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = commands.add_parser(
            name, help=help_text, parents=[db_after]
        )
        return command

    counts = add_command("counts", "jobs per state, and queued jobs per kind")
    counts.add_argument("--json", action="store_true", help="print one JSON object")

    ls = add_command("ls", "list jobs by id (keyset paging)")
    ls.add_argument("--state", choices=STATES, help="only jobs in this state")
    ls.add_argument("--kind", type=_non_empty, help="only jobs of this kind")
    ls.add_argument("--after", type=_non_empty, metavar="ID", help="continue after this id")
    ls.add_argument("--limit", type=_positive_int(), default=50, help="at most N jobs (50)")
    ls.add_argument("--json", action="store_true", help="JSON Lines, one job per line")

    show = add_command("show", "every field of one job")
    show.add_argument("id", type=_non_empty)
    show.add_argument("--json", action="store_true", help="print one JSON object")

    cancel = add_command("cancel", "cancel a queued job")
    cancel.add_argument("id", type=_non_empty)

    requeue = add_command("requeue", "return a failed/dead/cancelled job to pending")
    requeue.add_argument("id", type=_non_empty)
    requeue.add_argument(
        "--drop-checkpoints",
        action="store_true",
        help="also delete its checkpoints: a DAG run starts over instead of resuming",
    )

    sweep = add_command("sweep", "delete settled jobs older than a duration")
    sweep.add_argument(
        "--older-than",
        required=True,
        type=_duration_arg,
        metavar="DURATION",
        help="e.g. 30s, 15m, 12h, 7d",
    )
    sweep.add_argument("--limit", type=_positive_int(), help="at most N jobs")

    worker = add_command("worker", "run a worker until SIGINT/SIGTERM")
    worker.add_argument(
        "handlers", metavar="MODULE:ATTR", type=_utf8, help="a dict of kind -> handler"
    )
    worker.add_argument(
        "--concurrency",
        type=_positive_int(MAX_CONCURRENCY),
        default=1,
        help=f"handler threads (1; at most {MAX_CONCURRENCY})",
    )
    worker.add_argument("--kinds", type=_utf8, help="comma-separated subset of the handlers' kinds")
    worker.add_argument("--poll", type=_positive_float, help="poll interval in seconds")
    worker.add_argument("--grace", type=_positive_float, help="stop grace period in seconds")

    demo = add_command("demo", "a self-contained run on a temporary database")
    demo.add_argument(
        "--jobs",
        type=_positive_int(MAX_DEMO_JOBS),
        default=300,
        help=f"how many jobs (300; at most {MAX_DEMO_JOBS})",
    )
    return parser


# ------------------------------------------------------------------ opening


def _require_db(path: str | None) -> str:
    if not path:
        raise CliError("no database: pass --db PATH or set JAREN_JOBS_DB")
    if not Path(path).is_file():
        raise CliError(f"no database at {path!r}")
    return path


def _upgradable(refusal: SchemaError) -> bool:
    """Whether a read-only store refused only because the schema is older."""
    missing = refusal.details.get("missing")
    if missing:
        return "_jaren_jobs" not in missing
    if "version" not in refusal.details:
        return False
    version = refusal.details["version"]
    return version is None or version < SCHEMA_VERSION


@contextlib.contextmanager
def _opened(path: str | None, *, readonly: bool) -> Iterator[Store]:
    """The store a command works on; a read-only command never changes the file."""
    checked = _require_db(path)
    older: SchemaError | None = None
    try:
        # probe read-only first, so that no command ever creates job tables in
        # a file that is not a jaren_jobs database
        probe = open_store(checked, readonly=True)
    except SchemaError as exc:
        if not _upgradable(exc):
            if "_jaren_jobs" in exc.details.get("missing", ()):
                raise CliError(
                    f"{checked!r} is not a jaren_jobs database (no job tables)"
                ) from None
            raise CliError(f"cannot open {checked!r}: {exc.message}") from None
        older = exc  # an older (or partial) jaren_jobs schema
    except JobsError as exc:
        if exc.__cause__ is not None and is_not_a_database(exc.__cause__):
            raise CliError(
                f"{checked!r} is not a jaren_jobs database (it is not an SQLite file)"
            ) from None
        raise CliError(f"cannot open {checked!r}: {exc.message}") from None
    if older is None and readonly:
        with contextlib.closing(probe):
            yield probe
        return
    if older is None:
        probe.close()
    if older is not None and readonly:
        with _upgraded_copy(checked, older) as copy:
            yield copy
        return
    try:
        # read-write upgrades an older schema in place, forward only, as the
        # library does on every open
        store = open_store(checked)
    except JobsError as exc:
        raise CliError(f"cannot open {checked!r}: {exc.message}") from None
    with contextlib.closing(store):
        yield store


@contextlib.contextmanager
def _upgraded_copy(path: str, older: SchemaError) -> Iterator[Store]:
    """A private, upgraded copy of an older-schema file, for reading it unchanged.

    A read-only connection cannot run the upgrade, and the queries are the
    current schema's: so the file is copied (SQLite's online backup, through
    a read-only connection) into a temporary directory, and the copy is
    upgraded and read. Only the read-only commands take this path.
    """
    version = older.details.get("version")
    schema = "pre-fence" if version is None else f"version {version}"
    with tempfile.TemporaryDirectory(prefix="jaren-jobs-read-") as folder:
        copy = os.path.join(folder, "copy.db")
        try:
            copy_database(path, copy)
            store = open_store(copy, durability="normal")
        except (OSError, JobsError) as exc:
            raise CliError(
                f"cannot read {path!r}: its job tables are an older schema ({schema}) and an "
                f"upgraded copy to read could not be made ({exc}); a write command (cancel, "
                "requeue, sweep, worker) upgrades the file in place"
            ) from None
        print(
            f"jaren-jobs: note: {path!r} holds an older schema of the job tables ({schema}); "
            "read from an upgraded private copy, the file is unchanged (a write command "
            "upgrades it in place)",
            file=sys.stderr,
        )
        with contextlib.closing(store):
            yield store


# ------------------------------------------------------------------ output


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
    counts = store.jobs.counts()
    if args.json:
        out.write(json.dumps(counts.to_dict(), ensure_ascii=False) + "\n")
        return EXIT_OK
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
    limit = min(args.limit, _INT64_MAX - 1) + 1
    with store.jobs.page(state=args.state, kind=args.kind, after=args.after, limit=limit) as cursor:
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
    if args.json:
        out.write(json.dumps(data, ensure_ascii=False) + "\n")
        return EXIT_OK
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key == "last_error":
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        out.write(f"{key.ljust(width)}  {'-' if value is None else shown}\n")
    out.write(f"{'last_error'.ljust(width)}  {job.last_error or '-'}\n")
    return EXIT_OK


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changed = store.jobs.cancel(args.id)
    out.write(f"cancelled {args.id}\n" if changed else f"{args.id} was already cancelled\n")
    return EXIT_OK


def cmd_requeue(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changed = store.jobs.requeue(args.id, drop_checkpoints=args.drop_checkpoints)
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
            f"--older-than {_clip(args.older_than.text)} reaches back before the year 1; "
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
            f"worker {', '.join(sorted(handlers))} x{args.concurrency} on "
            f"{_shown(store.path or '')}; SIGINT or SIGTERM stops it\n"
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
        with _opened(path, readonly=True) as store:
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
    from .demo import run_demo  # noqa: PLC0415 - only the demo needs it

    # only an explicit --db: $JAREN_JOBS_DB may name a real queue
    if args.db is not None:
        _check_demo_target(args.db)
    return run_demo(db=args.db, jobs=args.jobs, out=out)


_COMMANDS: dict[str, tuple[Callable[[Store, argparse.Namespace, TextIO], int], bool]] = {
    # command -> (function, read-only store)
    "counts": (cmd_counts, True),
    "ls": (cmd_ls, True),
    "show": (cmd_show, True),
    "cancel": (cmd_cancel, False),
    "requeue": (cmd_requeue, False),
    "sweep": (cmd_sweep, False),
    "worker": (cmd_worker, False),
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    stream = out if out is not None else sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return _run(args, stream)
    except BrokenPipeError:
        # the reader went away (`jaren-jobs ls | head`): not an error to report;
        # point stdout at devnull so the interpreter's final flush stays quiet
        if stream is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace, stream: TextIO) -> int:
    try:
        if args.command == "demo":
            return cmd_demo(args, stream)
        command, readonly = _COMMANDS[args.command]
        db = args.db if args.db is not None else os.environ.get("JAREN_JOBS_DB")
        with _opened(db, readonly=readonly) as store:
            return command(store, args, stream)
    except CliError as exc:
        print(f"jaren-jobs: {exc}", file=sys.stderr)
        return exc.status
    except JobsError as exc:
        print(f"jaren-jobs: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, OverflowError) as exc:
        # the library refuses a bad argument with ValueError, and every
        # argument here came from the user: their mistake, in one line
        print(f"jaren-jobs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("jaren-jobs: interrupted", file=sys.stderr)
        return 130
