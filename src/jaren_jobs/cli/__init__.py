"""The ``jaren-jobs`` command line (also ``python -m jaren_jobs``).

Exit status: 0 success; 1 the store refused (unknown id, a settled job, a
live lease; for a bulk ``requeue``/``cancel``: some job was not done, the rest
were; for ``worker``: it stopped without draining); 2 bad usage or input (also
``jaren-jobs`` alone, which prints a short help) (a missing database, a file that is not a
jaren_jobs database, a bad duration, a number out of range, an argument that
is not UTF-8, a module that fails to import); 130 interrupted (a worker
stopped at once by a second signal); 141 the reader
of stdout went away (``jaren-jobs ls | head``). Errors are one line on stderr,
never a traceback for a user mistake.

The read-only commands (``counts``, ``ls``, ``show``) never change the file:
they open it read-only, and a file whose job tables are an older schema is
read through an upgraded private copy (a note on stderr says so); the write
commands upgrade it in place, as every read-write open does.

Layout: ``arguments`` (the parser, value checks, exit statuses), ``opening``
(from ``--db`` to a store), ``commands`` (one function per command); this
module dispatches and turns failures into one line and a status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from jaren_jobs.cli.arguments import (
    EXIT_BROKEN_PIPE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    build_parser,
    parse_duration,
)
from jaren_jobs.cli.commands import COMMANDS, cmd_demo
from jaren_jobs.cli.opening import opened
from jaren_jobs.cli.serving import cmd_dashboard
from jaren_jobs.errors import JobsError

__all__ = ["main", "parse_duration"]


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    stream = out if out is not None else sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # `jaren-jobs` alone (or with only --db): what it does and how to ask
        sys.stderr.write(short_help(parser))
        return EXIT_USAGE
    try:
        return _run(args, stream)
    except BrokenPipeError:
        # the reader went away (`jaren-jobs ls | head`): not an error to report;
        # point stdout at devnull so the interpreter's final flush stays quiet
        if stream is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def short_help(parser: argparse.ArgumentParser) -> str:
    """The usage line and one line per command: what ``jaren-jobs`` alone prints."""
    lines = [parser.format_usage().rstrip(), "", "commands:"]
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for choice in getattr(action, "_choices_actions", ()):
            lines.append(f"  {choice.dest:<9} {choice.help}")
    lines += ["", "jaren-jobs COMMAND --help tells more; --db names the database."]
    return "\n".join(lines) + "\n"


def _run(args: argparse.Namespace, stream: TextIO) -> int:
    try:
        if args.command == "demo":
            return cmd_demo(args, stream)
        if args.command == "dashboard":
            return cmd_dashboard(args, stream)
        command, readonly = COMMANDS[args.command]
        db = args.db if args.db is not None else os.environ.get("JAREN_JOBS_DB")
        with opened(db, readonly=readonly) as store:
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
