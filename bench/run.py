"""The runner: ``python -m bench`` or ``python bench/run.py``.

Every workload runs against raw ``sqlite3`` and jaren_jobs (and the installed
peers, for workloads 1, 3, 4, 5, 6 and 10; :mod:`bench.sqlite_run`) in the same
run, on fresh files in one scratch directory, and every figure is printed beside
the raw baseline as a ratio. Given a PostgreSQL server (``--pg-url`` or
``$JAREN_JOBS_BENCH_PG_URL``) the same command then runs :mod:`bench.pg_run`
against it; each database gets its table of issue 28's targets
(:mod:`bench.targets`). ``--quick`` is the short run the test suite uses; the
default is the full run that ``docs/performance.md`` reports.

The JSON (``--json``, ``--save``) is one report (``meta``, ``figures``,
``targets``, ``notes``) when one database ran, and ``{"sqlite": report,
"postgres": report}`` when both did; ``--from`` reads either back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jaren_jobs
from bench import (
    FULL,
    QUICK,
    Sizes,
    dumps,
    filesystem_of,
    sqlite_version,
)
from bench import targets as issue_targets
from bench.peers import PEERS, Peer
from bench.pg_peers import OBAN_PYTHON_ENV, PG_PEERS, PgPeer, resolve
from bench.report import (
    JAREN,
    REPO,
    WORKLOADS,
    Figure,
    Report,
    Target,
    log,
)
from bench.sqlite_run import Runner
from bench.targets import spread_text

# ---------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover - not Linux
        pass
    memory = None
    try:
        with open("/proc/meminfo") as info:
            memory = int(info.readline().split()[1]) // 1024
    except OSError:  # pragma: no cover
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_mib": memory,
        "python": platform.python_version(),
        "sqlite": sqlite_version(),
        "jaren_jobs": getattr(jaren_jobs, "__version__", "dev"),
    }


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("jobs/s",):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def print_text(report: Report) -> None:
    meta = report.meta
    m = meta["machine"]
    print(
        f"jaren_jobs bench — durability {meta['durability'].upper()}, {meta['mode']} run, "
        f"{meta['seconds']:.0f} s"
    )
    print(
        f"machine: {m['cores']} × {m['cpu']}, {m['memory_mib']} MiB, {m['platform']}; "
        f"Python {m['python']}, SQLite {m['sqlite']}; files on {meta['filesystem']}; "
        f"load {meta['load_before']} → {meta['load_after']}"
    )
    baseline = meta.get("baseline", "raw sqlite3")
    print(f"ratio = subject ÷ {baseline} measured in this run (↑ higher is better, ↓ lower)")
    current = 0
    for figure in report.figures:
        if figure.workload != current:
            current = figure.workload
            print(f"\n[{current}] {WORKLOADS[current]}")
        arrow = "↑" if figure.better == "higher" else "↓"
        print(f"  {figure.label} ({figure.unit} {arrow})")
        raw_is = figure.extra.get("raw_is")
        print(
            f"    {baseline:<22}{format_value(figure.raw, figure.unit):>12}"
            + (f"   ({raw_is})" if raw_is else "")
        )
        for subject, value in figure.values.items():
            line = (
                f"    {subject:<22}{format_value(value, figure.unit):>12}"
                f"   {format_ratio(figure.ratio(subject))} raw"
            )
            duplicates = figure.extra.get("duplicates", {}).get(subject)
            if duplicates is not None:
                line += f", {duplicates} duplicate executions"
            errors = figure.extra.get("errors", {}).get(subject)
            if errors:
                line += f", {errors} 'database is locked' errors retried"
            spread = figure.extra.get("spread", {}).get(subject)
            if spread and meta.get("rounds", 1) > 1:
                line += f"; ratio over rounds {spread[0]:.2f}× ({spread[1]:.2f}–{spread[2]:.2f})"
            print(line)
        duplicates = figure.extra.get("duplicates", {}).get("raw")
        if duplicates:
            print(f"    (raw: {duplicates} duplicate executions)")
    if report.targets:
        database = "PostgreSQL" if meta.get("backend") == "postgres" else "SQLite"
        rounds = meta.get("rounds", 1)
        print(
            f"\ntargets of issue 28, {database}"
            + (f" (median of {rounds} rounds, min – max)" if rounds > 1 else " (one round)")
        )
        width = max(len(t.text) for t in report.targets)
        for target in report.targets:
            status = {True: "met", False: "MISSED", None: "not run"}[target.met]
            spread = spread_text(target)
            print(
                f"  {target.text:<{width}}  {target.measured:>14}  {status:<7}"
                + (f"  ({spread})" if spread else "")
            )
    if report.notes:
        print("\npeer notes")
        for name, notes in report.notes.items():
            for note in notes:
                print(f"  {name}: {note}")
    for line in meta.get("skipped", []):
        print(f"\nskipped: {line}")


def print_markdown(report: Report) -> None:
    subjects: list[str] = [JAREN, *report.meta["peers"]]
    baseline = report.meta.get("baseline", "raw sqlite3")
    print(f"| workload | unit | {baseline} | " + " | ".join(subjects) + " |")
    print("|---|---|---:|" + "---:|" * len(subjects))
    for figure in report.figures:
        arrow = "↑" if figure.better == "higher" else "↓"
        cells = []
        for subject in subjects:
            key = subject if subject in figure.values else f"{subject} c=4"
            value = figure.values.get(key)
            if value is None:
                cells.append("")
                continue
            cell = f"{format_value(value, figure.unit)} ({format_ratio(figure.ratio(key))})"
            duplicates = figure.extra.get("duplicates", {}).get(subject)
            if duplicates:
                cell += f", {duplicates} dup."
            errors = figure.extra.get("errors", {}).get(subject)
            if errors:
                cell += f", {errors} locked errors"
            cells.append(cell)
        print(
            f"| {figure.workload}. {figure.label} | {figure.unit} {arrow} | "
            f"{format_value(figure.raw, figure.unit)} | " + " | ".join(cells) + " |"
        )
    if report.targets:
        print("\n| target | measured | spread | |\n|---|---:|---|---|")
        for target in report.targets:
            status = {True: "met", False: "missed", None: "not run"}[target.met]
            print(
                f"| {target.text} | {target.measured} | {spread_text(target) or '—'} | {status} |"
            )


def to_json(report: Report) -> dict[str, Any]:
    figures = []
    for figure in report.figures:
        entry = asdict(figure)
        entry["ratios"] = {s: figure.ratio(s) for s in figure.values}
        figures.append(entry)
    return {
        "meta": report.meta,
        "figures": figures,
        "targets": [asdict(t) for t in report.targets],
        "notes": report.notes,
    }


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="jaren_jobs against raw sqlite3 (and, with --pg-url, raw psycopg) and "
        "their peers, every figure as a ratio to the raw baseline measured in the same run.",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (well under a minute)")
    parser.add_argument("--durability", choices=("full", "normal"), default="full")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    parser.add_argument(
        "--only", default="", help="comma-separated workload numbers (default: all of them)"
    )
    parser.add_argument(
        "--peers",
        default=None,
        help="'all' (every installed peer), 'none', or a comma-separated list of "
        + ", ".join([*PEERS, *PG_PEERS])
        + " (default: all, but no PostgreSQL peer in a --quick run)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the selected workloads N times; report the median and the min-max "
        "of every ratio and target (each round measures once, not three times)",
    )
    parser.add_argument(
        "--plots",
        metavar="DIR",
        default=None,
        help="write PNG plots here, for every database run (default: docs/ in a full run, "
        "none in a quick run)",
    )
    parser.add_argument("--no-plots", action="store_true", help="never draw plots")
    parser.add_argument("--save", metavar="PATH", default=None, help="also write the JSON here")
    parser.add_argument(
        "--from",
        dest="load",
        metavar="PATH",
        default=None,
        help="run nothing: print (and with --plots redraw) a run saved with --save",
    )
    parser.add_argument(
        "--dir", default=None, help="where the scratch databases go (default: the temp dir)"
    )
    parser.add_argument(
        "--backend",
        choices=("sqlite", "postgres", "both"),
        default=None,
        help="default: SQLite, and PostgreSQL too when a server is given (--pg-url or "
        "$JAREN_JOBS_BENCH_PG_URL)",
    )
    parser.add_argument(
        "--pg-url",
        default=None,
        help="the PostgreSQL server (each measurement in a schema of its own, dropped after; "
        "default: $JAREN_JOBS_BENCH_PG_URL, and for --backend postgres also "
        "$JAREN_JOBS_TEST_POSTGRES_URL)",
    )
    parser.add_argument(
        "--oban-python",
        metavar="PYTHON",
        default=None,
        help="a Python >= 3.12 interpreter with oban installed, which runs the oban peer "
        "when this one cannot (oban needs 3.12; default: $" + OBAN_PYTHON_ENV + ")",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def choose_peers(
    option: str | None,
    quick: bool,
    skipped: list[str],
    pg_skipped: list[str],
    oban_python: str | None = None,
) -> tuple[list[Peer], list[PgPeer]]:
    """The SQLite and PostgreSQL peers to run; what was left out, and why, in the lists."""
    if option == "none":
        return [], []
    every = [*PEERS, *PG_PEERS]
    if option is None or option == "all":
        names = every
        if option is None and quick:  # the PostgreSQL peers take minutes: not in the suite's run
            names = [*PEERS]
            pg_skipped.append(
                f"PostgreSQL peers ({', '.join(PG_PEERS)}) are left out of a --quick run "
                "(--peers all)"
            )
    else:
        names = [n.strip() for n in option.split(",") if n.strip()]
    sqlite_peers: list[Peer] = []
    pg_peers: list[PgPeer] = []
    for name in names:
        if name in PEERS:
            if PEERS[name].available():
                sqlite_peers.append(PEERS[name])
            else:
                skipped.append(f"peer {name} is not installed (pip install -e '.[bench]')")
        elif name in PG_PEERS:
            peer = resolve(name, oban_python)
            if isinstance(peer, str):
                pg_skipped.append(peer)
            else:
                pg_peers.append(peer)
        else:
            raise SystemExit(f"bench: unknown peer {name!r}; choose from {', '.join(every)}")
    return sqlite_peers, pg_peers


def selected(option: str, known: Sequence[int]) -> set[int]:
    """The workloads ``--only`` names that this database runs (all of them by default)."""
    only = {int(n) for n in option.split(",") if n.strip()} or set(known)
    return only & set(known)


def run_sqlite(
    args: argparse.Namespace, sizes: Sizes, peers: Sequence[Peer], skipped: list[str]
) -> Report:
    """One round of the SQLite workloads."""
    only = selected(args.only, list(WORKLOADS))
    scratch = Path(tempfile.mkdtemp(prefix="jaren-bench-", dir=args.dir))
    report = Report(
        meta={
            "backend": "sqlite",
            "mode": "quick" if args.quick else "full",
            "durability": args.durability,
            "machine": machine(),
            "filesystem": filesystem_of(scratch),
            "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "peers": [p.name for p in peers],
            "peer_versions": {p.name: p.version() for p in peers},
            "workloads": sorted(only),
            "skipped": skipped,
        },
        notes={p.name: list(p.notes) for p in peers},
    )
    runner = Runner(sizes, args.durability, scratch, peers)
    began = time.monotonic()
    try:
        for number in sorted(only):
            log(f"bench: workload {number}: {WORKLOADS[number]}")
            started = time.monotonic()
            if number == 4:
                three = report.figure("3")
                report.figures.extend(runner.w4(None if three is None else three.raw))
            else:
                report.figures.extend(getattr(runner, f"w{number}")())
            report.meta.setdefault("workload_seconds", {})[number] = round(
                time.monotonic() - started, 2
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.meta["seconds"] = time.monotonic() - began
    report.meta["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return report


def run_postgres(
    args: argparse.Namespace, sizes: Sizes, url: str, peers: Sequence[PgPeer], skipped: list[str]
) -> Report:
    """One round of the PostgreSQL workloads."""
    from bench import pg_run

    only = selected(args.only, pg_run.PG_WORKLOADS)
    report = Report(
        meta={
            "backend": "postgres",
            "mode": "quick" if args.quick else "full",
            "durability": args.durability,
            "machine": machine(),
            "filesystem": "server",
            "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "peers": [p.name for p in peers],
            "peer_versions": {p.name: p.version() for p in peers},
            "workloads": sorted(only),
            "skipped": skipped,
        },
        notes={p.name: list(p.notes) for p in peers},
    )
    began = time.monotonic()
    pg_run.run(report, sizes, args.durability, url, only, peers)
    report.meta["seconds"] = time.monotonic() - began
    return report


def in_rounds(
    rounds: int, one: Callable[[], Report], check: Callable[[Report], list[Target]]
) -> Report:
    """``one()`` run ``rounds`` times: the report itself, or the rounds merged."""
    reports = []
    for number in range(rounds):
        if rounds > 1:
            log(f"bench: round {number + 1} of {rounds}")
        reports.append(one())
    if rounds == 1:
        reports[0].targets = check(reports[0])
        reports[0].meta["rounds"] = 1
        return reports[0]
    return issue_targets.merge(reports, check)


def from_json(data: dict[str, Any]) -> Report:
    """A report saved by ``--save`` (one database's part of it)."""
    figures = [
        Figure(**{k: v for k, v in entry.items() if k != "ratios"}) for entry in data["figures"]
    ]
    targets = [
        Target(**{**entry, "spread": None if entry["spread"] is None else tuple(entry["spread"])})
        for entry in data["targets"]
    ]
    return Report(meta=data["meta"], figures=figures, targets=targets, notes=data["notes"])


def run_all(args: argparse.Namespace, sizes: Sizes) -> dict[str, Report]:
    """SQLite, and PostgreSQL when a server is given (or only one, by --backend)."""
    url = args.pg_url or os.environ.get("JAREN_JOBS_BENCH_PG_URL")
    if args.backend == "postgres" and not url:
        url = os.environ.get("JAREN_JOBS_TEST_POSTGRES_URL")
    backend = args.backend or ("both" if url else "sqlite")
    if backend != "sqlite" and not url:
        raise SystemExit("bench: PostgreSQL needs --pg-url URL (or $JAREN_JOBS_BENCH_PG_URL)")
    skipped: list[str] = []
    pg_skipped: list[str] = []
    peers, pg_peers = choose_peers(args.peers, args.quick, skipped, pg_skipped, args.oban_python)
    reports: dict[str, Report] = {}
    if backend in ("sqlite", "both"):
        reports["sqlite"] = in_rounds(
            args.rounds, lambda: run_sqlite(args, sizes, peers, skipped), issue_targets.sqlite
        )
    if backend in ("postgres", "both"):
        assert url is not None
        pg_url = url
        reports["postgres"] = in_rounds(
            args.rounds,
            lambda: run_postgres(args, sizes, pg_url, pg_peers, pg_skipped),
            issue_targets.postgres,
        )
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds > 1:  # the rounds give the spread; one measurement each
        sizes = replace(sizes, rounds=1)
    unknown = {int(n) for n in args.only.split(",") if n.strip()} - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"bench: no workload {sorted(unknown)}; they are 1 to {len(WORKLOADS)}")

    if args.load:
        saved = json.loads(Path(args.load).read_text())
        parts = saved if "meta" not in saved else {saved["meta"].get("backend", "sqlite"): saved}
        reports = {name: from_json(part) for name, part in parts.items()}
    else:
        reports = run_all(args, sizes)

    plots_dir = None if args.no_plots else args.plots
    if plots_dir is None and not args.quick and not args.no_plots and not args.load:
        plots_dir = str(REPO / "docs")
    if plots_dir is not None:
        from bench.plots import draw

        for report in reports.values():
            written, why = draw(report, Path(plots_dir))
            report.meta["plots"] = [str(p) for p in written]
            if why:
                report.meta["skipped"].append(why)

    if len(reports) == 1:
        document: dict[str, Any] = to_json(next(iter(reports.values())))
    else:
        document = {name: to_json(report) for name, report in reports.items()}
    if args.save:
        Path(args.save).write_text(dumps(document) + "\n")
    if args.json:
        print(dumps(document))
    else:
        for index, report in enumerate(reports.values()):
            if index:
                print("\n" + "=" * 78 + "\n")
            print_text(report)
            if args.markdown:
                print()
                print_markdown(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
