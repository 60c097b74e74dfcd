"""The benchmark's report: its figures, targets and workloads, shared by ``run`` and ``pg_run``.

A module of its own so that ``run`` (which calls ``pg_run``) and ``pg_run`` (which fills
the report) need not import each other.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import percentile

__all__ = [
    "JAREN",
    "REPO",
    "WORKLOADS",
    "Figure",
    "Report",
    "Target",
    "latency_figures",
    "log",
    "memory_figures",
    "scale_figure",
]

JAREN = "jaren_jobs"
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Figure:
    """One measured quantity: raw's value, and each subject's value beside it."""

    workload: int
    key: str
    label: str
    unit: str
    better: str  # "higher" or "lower"
    raw: float | None
    values: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def ratio(self, subject: str) -> float | None:
        value = self.values.get(subject)
        if value is None or not self.raw:
            return None
        return value / self.raw


@dataclass
class Target:
    """One target of issue 28, checked against this run's figures.

    ``value`` is the measured quantity (a ratio, or ms, or %), ``goal`` the
    bound it must reach (``value >= goal`` when ``better`` is ``higher``);
    ``met`` is None when the run did not measure it. Over several rounds,
    ``value`` is the median and ``spread`` the (min, max) of the rounds.
    """

    text: str
    measured: str
    met: bool | None
    value: float | None = None
    goal: float | None = None
    better: str = "higher"
    unit: str = "×"
    spread: tuple[float, float] | None = None
    rounds: list[float] = field(default_factory=list)
    key: str = ""  # stable name for JSON readers (the text may name a peer)


@dataclass
class Report:
    meta: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def figure(self, key: str) -> Figure | None:
        return next((f for f in self.figures if f.key == key), None)


WORKLOADS = {
    1: "enqueue one at a time",
    2: "enqueue_many in batches",
    3: "claim + complete one at a time",
    4: "a worker draining no-op jobs",
    5: "worker processes on one queue",
    6: "enqueue-to-start latency, idle worker",
    7: "claim cost against table size",
    8: "CPU of an idle worker",
    9: "memory while draining",
    10: "scale-out: drain rate against worker processes",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def memory_figures(
    samples: dict[str, list[tuple[int, int]]],
    heap_jobs: int,
    rss_jobs: int,
    raw_is: str,
) -> list[Figure]:
    """Workload 9's three figures from the drains' samples (raw and ours, heap and RSS)."""
    from bench import growth_per_10k, peak_mib

    raw_heap, our_heap = samples["raw heap"], samples["our heap"]
    raw_rss, our_rss = samples["raw rss"], samples["our rss"]
    return [
        Figure(
            9,
            "9.heap",
            f"Python heap growth (fitted slope), draining {heap_jobs:,} jobs (tracemalloc)",
            "KiB per 10k jobs",
            "lower",
            growth_per_10k(raw_heap, heap_jobs),
            {JAREN: growth_per_10k(our_heap, heap_jobs)},
            extra={"samples": {"raw": raw_heap, JAREN: our_heap}},
        ),
        Figure(
            9,
            "9.growth",
            f"RSS growth (fitted slope), draining {rss_jobs:,} jobs",
            "KiB per 10k jobs",
            "lower",
            growth_per_10k(raw_rss, rss_jobs),
            {JAREN: growth_per_10k(our_rss, rss_jobs)},
            extra={"samples": {"raw": raw_rss, JAREN: our_rss}, "raw_is": raw_is},
        ),
        Figure(
            9,
            "9.peak",
            "peak RSS while draining",
            "MiB",
            "lower",
            peak_mib(raw_rss),
            {JAREN: peak_mib(our_rss)},
        ),
    ]


def scale_figure(processes: int, where: str, raw_is: str) -> Figure:
    """Workload 10's figure for ``processes`` worker processes on one ``where`` (file, database)."""
    plural = "es" if processes > 1 else ""
    return Figure(
        10,
        f"10.p{processes}",
        f"{processes} worker process{plural} on one {where}",
        "jobs/s",
        "higher",
        None,
        extra={"processes": processes, "duplicates": {}, "raw_is": raw_is},
    )


def latency_figures(
    local: dict[str, list[float]], remote: dict[str, list[float]], poll: str
) -> list[Figure]:
    """Workload 6's p50 and p99 figures, in ms, from the start delays (s) of each subject
    ("raw" among them), in process and from another; ``poll`` names the idle setting."""
    figures = []
    for where, samples in (("local", local), ("remote", remote)):
        place = "in-process" if where == "local" else "from another process"
        for name, fraction in (("p50", 0.5), ("p99", 0.99)):
            figure = Figure(
                6,
                f"6.{where}.{name}",
                f"enqueue-to-start {name}, {place} ({poll})",
                "ms",
                "lower",
                percentile(samples["raw"], fraction) * 1000,
                extra={"samples": len(samples["raw"])},
            )
            for subject, values in samples.items():
                if subject != "raw":
                    figure.values[subject] = percentile(values, fraction) * 1000
            figures.append(figure)
    return figures
