"""The command line's arguments: the parser, its value checks, exit statuses and ``CliError``."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NamedTuple, NoReturn

from jaren_jobs.records import SETTLED_STATES, STATES
from jaren_jobs.runtime import MAX_SECONDS

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a writer killed by SIGPIPE

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# what SQLite's INTEGER (and so every count and limit of the library) holds
INT64_MAX = 2**63 - 1
# bounds for what would otherwise start that many threads or jobs, not fail
MAX_CONCURRENCY = 1024
MAX_DEMO_JOBS = 100_000
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


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
            f"bad duration {clip(text)}: use a number and a unit, like 30s, 15m, 12h, 7d or 2w"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"bad duration {clip(text)}: too large")
    return seconds


def shown_text(text: str) -> str:
    """Text as a user typed it, printable: bytes that are not UTF-8 come out escaped."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def clip(text: str, width: int = 40) -> str:
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


def _positive_int(maximum: int = INT64_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # not a number, or thousands of digits
            raise argparse.ArgumentTypeError(
                f"expected a positive integer, got {clip(text)}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {clip(text)}")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"expected a positive integer of at most {maximum}, got {clip(text)}"
            )
        return value

    return parse


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return _utf8(text)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {clip(text)}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {clip(text)}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {clip(text)}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {clip(text)}")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds of at most {MAX_SECONDS:.0f} (a century), "
            f"got {clip(text)}"
        )
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, argparse's status 2, no usage dump for a user mistake
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jaren-jobs",
        description="Inspect and operate a jaren_jobs queue in a SQLite database "
        "or a PostgreSQL one (--db postgresql://...).",
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
    # no command at all: main() prints the short help (see SHORT_HELP)
    commands.required = False

    def add_command(
        name: str, help_text: str, epilog: str | None = None
    ) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = commands.add_parser(
            name, help=help_text, description=help_text, epilog=epilog, parents=[db_after]
        )
        return command

    counts = add_command("counts", "jobs per state, and queued jobs per kind")
    counts.add_argument("--json", action="store_true", help="print one JSON object")
    counts.add_argument("--queue", type=_non_empty, help="only the jobs of this queue")

    ls = add_command("ls", "list jobs by id or newest first (keyset paging)")
    ls.add_argument("--state", choices=STATES, help="only jobs in this state")
    ls.add_argument("--kind", type=_non_empty, help="only jobs of this kind")
    ls.add_argument("--queue", type=_non_empty, help="only jobs of this queue")
    ls.add_argument(
        "--sort",
        choices=("id", "newest"),
        default="id",
        help="by id (default), or newest first by updated_at",
    )
    ls.add_argument("--after", type=_non_empty, metavar="ID", help="continue after this job")
    ls.add_argument("--limit", type=_positive_int(), default=50, help="at most N jobs (50)")
    ls.add_argument("--json", action="store_true", help="JSON Lines, one job per line")

    show = add_command("show", "every field of one job")
    show.add_argument("id", type=_non_empty)
    show.add_argument("--json", action="store_true", help="print one JSON object")

    def add_selection(command: argparse.ArgumentParser, verb: str) -> None:
        command.add_argument(
            "ids", nargs="*", type=_non_empty, metavar="ID", help=f"the job(s) to {verb}"
        )
        command.add_argument(
            "--state",
            action="append",
            choices=STATES,
            help=f"{verb} every job in this state (repeat for several)",
        )
        command.add_argument("--kind", type=_non_empty, help="only jobs of this kind")
        command.add_argument("--queue", type=_non_empty, help="only jobs of this queue")
        command.add_argument(
            "--dry-run", action="store_true", help="say what would change; change nothing"
        )
        command.add_argument(
            "--json", action="store_true", help="print one JSON object: a result per job"
        )

    bulk_epilog = (
        "Give one or more ids, or filters (--state, --kind, --queue; they combine), not both. "
        "Each job is acted on in its own transaction; a refusal stops nothing. Exit status: 0 "
        "when every job was done (or already was so), 1 when some job was unknown or refused "
        "(the rest were still done), 2 for bad usage."
    )
    cancel = add_command(
        "cancel", "cancel jobs; a running one is asked to stop (forced cancel)", bulk_epilog
    )
    add_selection(cancel, "cancel")

    requeue = add_command(
        "requeue", "return failed/dead/cancelled (or lease-expired) jobs to pending", bulk_epilog
    )
    add_selection(requeue, "requeue")
    requeue.add_argument(
        "--drop-checkpoints",
        action="store_true",
        help="also delete its checkpoints: a DAG run starts over instead of resuming",
    )
    requeue.add_argument(
        "--reset-attempts",
        action="store_true",
        help="start its attempt count over: it gets max_attempts tries again, not one",
    )

    sweep = add_command("sweep", "delete settled jobs older than a duration")
    sweep.add_argument(
        "--older-than",
        required=True,
        type=_duration_arg,
        metavar="DURATION",
        help="e.g. 30s, 15m, 12h, 7d",
    )
    sweep.add_argument(
        "--state",
        action="append",
        choices=sorted(SETTLED_STATES),
        help="only jobs in this settled state (repeat for several; default: all three)",
    )
    sweep.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )
    sweep.add_argument("--json", action="store_true", help="print one JSON object")
    sweep.add_argument("--limit", type=_positive_int(), help="at most N jobs")

    worker = add_command(
        "worker",
        "run a worker until SIGINT/SIGTERM (or, with --burst, until nothing is due)",
        "Exit status: 0 when it stopped and drained; 1 when it stopped without draining "
        "(an attempt outlived the grace period, or a --burst run was stopped before it ran "
        "dry); 130 when a second SIGINT/SIGTERM stopped it at once (the attempts under way "
        "are left to their leases, which expire, and the jobs are re-claimed).",
    )
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
    worker.add_argument(
        "--queues", type=_utf8, help="comma-separated queues to claim from (default: every queue)"
    )
    worker.add_argument("--poll", type=_positive_float, help="poll interval in seconds")
    worker.add_argument("--grace", type=_positive_float, help="stop grace period in seconds")
    worker.add_argument(
        "--lease",
        type=_positive_float,
        metavar="SECONDS",
        help="lease length in seconds (renewed while a handler runs; how soon a job left "
        "behind is re-claimed)",
    )
    worker.add_argument(
        "--burst",
        action="store_true",
        help="run what is due now, then stop and exit (a job due later is left for later)",
    )
    worker.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="log the jaren_jobs logger tree to stderr at this level "
        "(default: only Python's last-resort WARNING lines)",
    )
    worker.add_argument(
        "--json", action="store_true", help="the ready line and the final report as JSON"
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics at http://127.0.0.1:N/metrics (0: any free port; "
        "needs jaren_jobs[prometheus])",
    )

    demo = add_command("demo", "a self-contained run on a temporary database")
    demo.add_argument(
        "--jobs",
        type=_positive_int(MAX_DEMO_JOBS),
        default=300,
        help=f"how many jobs (300; at most {MAX_DEMO_JOBS})",
    )
    demo.add_argument(
        "--json", action="store_true", help="one JSON object at the end, not the running report"
    )

    dashboard = add_command("dashboard", "serve the dashboard in the browser (read-only)")
    dashboard.add_argument("--host", type=_utf8, default="127.0.0.1", help="(127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8787, help="(8787; 0: any free port)")
    dashboard.add_argument(
        "--allow-actions", action="store_true", help="cancel and requeue from the browser"
    )
    dashboard.add_argument(
        "--insecure", action="store_true", help="serve another address without credentials"
    )
    return parser
