"""PNG plots of a run, drawn when matplotlib is installed (the ``bench`` extra).

* ``bench-throughput.png``: workload 4, jobs/s against worker concurrency,
  every subject, with raw sqlite3's one-at-a-time and batched rates as lines;
* ``bench-claim-cost.png``: workload 7, a claim's cost against the number of
  settled rows, one line per pending count, jaren_jobs beside raw;
* ``bench-scaleout-sqlite.png``: workload 10, jobs/s against worker processes,
  jaren_jobs beside each peer and the raw batched loop.

A PostgreSQL run draws the same three with ``-postgres`` in their names
(``bench-scaleout-postgres.png``; its baseline is raw psycopg).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["draw"]


def draw(report: Any, directory: Path) -> tuple[list[Path], str | None]:
    """Draw what the report has data for; returns (files written, why not, if skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots: matplotlib is not installed (pip install -e '.[bench]')"
    directory.mkdir(parents=True, exist_ok=True)
    meta = report.meta
    postgres = meta.get("backend") == "postgres"
    suffix = "-postgres" if postgres else ""
    raw = "raw psycopg" if postgres else "raw sqlite3"
    database = (
        f"PostgreSQL {meta.get('postgres', {}).get('server_version', '')}"
        if postgres
        else f"SQLite {meta['machine']['sqlite']}"
    )
    caption = (
        f"durability {meta['durability'].upper()}, {meta['machine']['cores']} cores "
        f"({meta['machine']['cpu']}), {database}"
    )
    written = []

    drains = [f for f in report.figures if f.key.startswith("4.c")]
    if drains:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        concurrency = [f.extra["concurrency"] for f in drains]
        subjects = list(dict.fromkeys(s for f in drains for s in f.values))
        for subject in subjects:
            points = [
                (f.extra["concurrency"], f.values[subject]) for f in drains if subject in f.values
            ]
            ax.plot(
                [c for c, _ in points],
                [v for _, v in points],
                marker="o",
                linewidth=2.5 if subject == "jaren_jobs" else 1.5,
                label=subject,
            )
        ax.axhline(
            drains[0].raw,
            color="grey",
            linestyle="--",
            label=f"{raw}, one job per transaction",
        )
        ceiling = report.figure("4.batched")
        if ceiling is not None and ceiling.raw:
            ax.axhline(
                ceiling.raw,
                color="black",
                linestyle=":",
                label=f"{raw}, 100 jobs per transaction" + (", 4 connections" if postgres else ""),
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrency, [str(c) for c in concurrency])
        ax.set_yscale("log")
        ax.set_xlabel("worker concurrency (threads)")
        ax.set_ylabel("no-op jobs drained per second")
        ax.set_title(f"Throughput against concurrency ({'PostgreSQL' if postgres else 'SQLite'})")
        # beside the axes: inside, it hides whichever line is highest
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(True, which="both", alpha=0.3)
        fig.text(0.01, 0.01, caption, fontsize=7, color="grey")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = directory / f"bench-throughput{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    sevens = [f for f in report.figures if f.workload == 7]
    if sevens:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for pending in sorted({f.extra["pending"] for f in sevens}):
            rows = sorted(
                (f for f in sevens if f.extra["pending"] == pending),
                key=lambda f: f.extra["settled"],
            )
            settled = [f.extra["settled"] for f in rows]
            ax.plot(
                settled,
                [f.values["jaren_jobs"] for f in rows],
                marker="o",
                linewidth=2.5,
                label=f"jaren_jobs claim, {pending:,} pending",
            )
            ax.plot(
                settled,
                [f.raw for f in rows],
                marker="x",
                linestyle="--",
                label=f"{raw} claim, {pending:,} pending",
            )
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("settled rows in the table")
        ax.set_ylabel("one claim, ms (median)")
        ax.set_title(f"Claim cost against table size ({'PostgreSQL' if postgres else 'SQLite'})")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.text(0.01, 0.01, caption, fontsize=7, color="grey")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = directory / f"bench-claim-cost{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    tens = sorted(
        (f for f in report.figures if f.workload == 10), key=lambda f: f.extra["processes"]
    )
    if tens:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        processes = [f.extra["processes"] for f in tens]
        ax.plot(
            processes,
            [f.raw for f in tens],
            color="black",
            linestyle=":",
            marker="x",
            label=f"{raw}, 100 jobs per transaction (the ceiling)",
        )
        subjects = list(dict.fromkeys(s for f in tens for s in f.values))
        for subject in subjects:
            points = [
                (f.extra["processes"], f.values[subject]) for f in tens if subject in f.values
            ]
            ax.plot(
                [p for p, _ in points],
                [v for _, v in points],
                marker="o",
                linewidth=2.5 if subject == "jaren_jobs" else 1.5,
                label=subject,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(processes, [str(p) for p in processes])
        ax.set_yscale("log")
        ax.set_xlabel("worker processes (concurrency 1 each)")
        ax.set_ylabel("no-op jobs drained per second")
        ax.set_title(f"Scale-out ({'PostgreSQL' if postgres else 'SQLite'})")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(True, which="both", alpha=0.3)
        fig.text(0.01, 0.01, caption, fontsize=7, color="grey")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = directory / f"bench-scaleout-{'postgres' if postgres else 'sqlite'}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written, None
