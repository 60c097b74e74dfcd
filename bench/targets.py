"""The targets of issue 28, checked against a run's figures, and the spread over rounds.

:func:`sqlite` and :func:`postgres` read one run's :class:`~bench.report.Report`
and return a :class:`~bench.report.Target` per target of that database: the
measured ratio (or latency, or share of a core) and met or missed, or ``met``
None with "not measured" when the run left the workload out. :func:`merge`
folds several rounds of the same run into one report: each figure's median,
its ratios' min and max, and each target's median and min-max.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench import POLL_SECONDS, median
from bench.pg import PG_POLL
from bench.report import JAREN, Figure, Report, Target

__all__ = ["merge", "postgres", "spread_text", "sqlite"]


def _value(report: Report, key: str, subject: str = JAREN) -> float | None:
    figure = report.figure(key)
    return None if figure is None else figure.values.get(subject)


def _raw(report: Report, key: str) -> float | None:
    figure = report.figure(key)
    return None if figure is None else figure.raw


def _quotient(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def _target(
    key: str,
    text: str,
    value: float | None,
    goal: float,
    *,
    better: str = "higher",
    unit: str = "×",
) -> Target:
    if value is None:
        return Target(text, "not measured", None, None, goal, better, unit, key=key)
    met = value >= goal if better == "higher" else value <= goal
    return Target(text, _format(value, unit), met, value, goal, better, unit, key=key)


def _format(value: float, unit: str) -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "%":
        return f"{value:.2f}%"
    return f"{value:.1f} {unit}"


def _fastest_peer(report: Report, key: str) -> tuple[str, float] | None:
    figure = report.figure(key)
    if figure is None:
        return None
    peers = [(s, v) for s, v in figure.values.items() if s != JAREN and " " not in s]
    return max(peers, key=lambda p: p[1]) if peers else None


def _duplicates(report: Report) -> int | None:
    """jaren_jobs' duplicate executions over every several-process drain of the run."""
    counts = [
        f.extra["duplicates"][JAREN]
        for f in report.figures
        if JAREN in f.extra.get("duplicates", {})
    ]
    return sum(counts) if counts else None


def _common(report: Report, targets: list[Target], idle: str) -> None:
    """The targets both databases share (workloads 4, 7 to 9); ``idle`` names the idle
    worker's setting (the poll its latency rows were measured with)."""
    targets.append(
        _target(
            "async_vs_thread",
            "the AsyncWorker ≥ 0.9× the thread worker (concurrency 4, no-op jobs)",
            _quotient(_value(report, "4.async"), _value(report, "4.c4")),
            0.9,
        )
    )
    sevens = [f for f in report.figures if f.workload == 7]
    if sevens:
        smallest = min(sevens, key=lambda f: f.extra["settled"] + f.extra["pending"])
        largest = max(sevens, key=lambda f: f.extra["settled"] + f.extra["pending"])
        targets.append(
            _target(
                "claim_flat",
                f"claim p50 at {largest.extra['settled']:,} settled + "
                f"{largest.extra['pending']:,} pending within 1.5× of "
                f"{smallest.extra['settled']:,} + {smallest.extra['pending']:,}",
                largest.values[JAREN] / smallest.values[JAREN],
                1.5,
                better="lower",
            )
        )
    else:
        targets.append(
            _target("claim_flat", "claim cost flat (workload 7)", None, 1.5, better="lower")
        )
    targets.append(
        _target(
            "idle_cpu",
            f"idle worker under 1% of a core ({idle})",
            _value(report, "8"),
            1.0,
            better="lower",
            unit="%",
        )
    )
    # a leak is objects kept per job: < 16 KiB per 10k jobs after warm-up (< 2 bytes a job)
    targets.append(
        _target(
            "heap_growth",
            "no memory growth per job (Python heap slope < 16 KiB per 10k jobs)",
            _value(report, "9.heap"),
            16,
            better="lower",
            unit="KiB/10k jobs",
        )
    )


def sqlite(report: Report) -> list[Target]:
    """Issue 28's SQLite targets (and the shared ones this run measures)."""
    ceiling = _raw(report, "4.batched")
    c4 = _value(report, "4.c4")
    five = _value(report, "5")
    duplicates = _duplicates(report)
    targets = [
        _target(
            "c4_vs_batched",
            "worker at concurrency 4 ≥ 0.5× the raw batched loop (100 jobs per transaction)",
            _quotient(c4, ceiling),
            0.5,
        ),
        _target(
            "processes_vs_batched",
            "4 worker processes ≥ 0.4× the raw batched loop",
            _quotient(five, ceiling),
            0.4,
        ),
        _target(
            "duplicates",
            "0 duplicate executions across processes",
            None if duplicates is None else float(duplicates),
            0,
            better="lower",
            unit="duplicates",
        ),
        _target(
            "c1_vs_raw_one",
            "worker at concurrency 1 ≥ 6× raw one-at-a-time claim + complete",
            _quotient(_value(report, "4.c1"), _raw(report, "4.c1")),
            6,
        ),
        _target(
            "enqueue_many_4000",
            "enqueue_many of 4,000 jobs ≥ 0.6× raw executemany of the same rows",
            _quotient(_value(report, "2.one"), _raw(report, "2.one")),
            0.6,
        ),
        _target(
            "enqueue_one",
            "one-at-a-time enqueue ≥ 0.9× a raw INSERT",
            _quotient(_value(report, "1"), _raw(report, "1")),
            0.9,
        ),
    ]
    _common(report, targets, f"{POLL_SECONDS * 1000:g} ms poll")
    return targets


def postgres(report: Report) -> list[Target]:
    """Issue 28's PostgreSQL targets."""
    targets: list[Target] = []
    c4 = _value(report, "4.c4")
    fastest = _fastest_peer(report, "4.c4")
    targets.append(
        _target(
            "c4_vs_peer",
            "worker at concurrency 4 ≥ 2× the fastest peer's drain"
            + (f" ({fastest[0]})" if fastest else ""),
            None if fastest is None else _quotient(c4, fastest[1]),
            2,
        )
    )
    targets.append(
        _target(
            "c4_vs_batched",
            "worker at concurrency 4 ≥ 0.5× the raw batched loop (4 connections, 100 jobs "
            "per statement)",
            _quotient(c4, _raw(report, "4.batched")),
            0.5,
        )
    )
    fastest = _fastest_peer(report, "5")
    targets.append(
        _target(
            "processes_vs_peer",
            "4 worker processes ≥ 2× the fastest peer's" + (f" ({fastest[0]})" if fastest else ""),
            None if fastest is None else _quotient(_value(report, "5"), fastest[1]),
            2,
        )
    )
    duplicates = _duplicates(report)
    targets.append(
        _target(
            "duplicates",
            "0 duplicate executions across processes",
            None if duplicates is None else float(duplicates),
            0,
            better="lower",
            unit="duplicates",
        )
    )
    targets.append(
        _target(
            "enqueue_one",
            "one-at-a-time enqueue ≥ 0.9× a raw INSERT",
            _quotient(_value(report, "1"), _raw(report, "1")),
            0.9,
        )
    )
    targets.append(
        _target(
            "claim_complete_one",
            "lone claim + complete ≥ 0.7× raw",
            _quotient(_value(report, "3"), _raw(report, "3")),
            0.7,
        )
    )
    for name, goal in (("p50", 1.5), ("p99", 5.0)):
        targets.append(
            _target(
                f"remote_{name}",
                f"cross-process enqueue-to-start {name} ≤ {goal:g} ms, idle worker",
                _value(report, f"6.remote.{name}"),
                goal,
                better="lower",
                unit="ms",
            )
        )
        figure = report.figure(f"6.remote.{name}")
        peers = [] if figure is None else [(s, v) for s, v in figure.values.items() if s != JAREN]
        if peers:
            best = min(peers, key=lambda p: p[1])
            mine = figure.values[JAREN] if figure is not None else None
            # ahead of every peer: the best peer's latency over ours, above 1
            targets.append(
                _target(
                    f"remote_{name}_vs_peers",
                    f"cross-process {name} ahead of every peer (best: {best[0]}, ratio = "
                    "its latency ÷ ours)",
                    _quotient(best[1], mine),
                    1.0,
                )
            )
    tens = [f for f in report.figures if f.workload == 10]
    if tens:
        widest = max(tens, key=lambda f: f.extra["processes"])
        fastest = _fastest_peer(report, widest.key)
        if fastest is not None:
            targets.append(
                _target(
                    "scaleout_vs_peer",
                    f"scale-out: {widest.extra['processes']} worker processes against the "
                    f"fastest peer's ({fastest[0]}; reported, no goal in the issue)",
                    _quotient(widest.values.get(JAREN), fastest[1]),
                    1.0,
                )
            )
    # an idle PostgreSQL worker as workload 6 runs it: a notification wakes it, the
    # poll is only the fallback (figure "8.fast" keeps the 50 ms poll beside raw's)
    _common(report, targets, f"{PG_POLL:g} s poll, LISTEN/NOTIFY, as in the latency rows")
    return targets


# ---------------------------------------------------------------- rounds


def merge(reports: Sequence[Report], check: Callable[[Report], list[Target]]) -> Report:
    """One report from several rounds of the same run: medians, with each ratio's min-max.

    A figure's raw and subject values are the medians over the rounds; its
    ``extra["spread"][subject]`` is ``[median, min, max]`` of the per-round
    ratios. Each target is checked per round; the merged target's value is
    the median, ``spread`` the (min, max), and met is judged on the median.
    """
    first = reports[0]
    merged = Report(meta=dict(first.meta), notes=first.notes)
    merged.meta["rounds"] = len(reports)
    merged.meta["seconds"] = sum(r.meta.get("seconds", 0.0) for r in reports)
    merged.meta["load_after"] = reports[-1].meta.get("load_after", "")
    for figure in first.figures:
        rounds = [r.figure(figure.key) for r in reports]
        present = [f for f in rounds if f is not None]
        raws = [f.raw for f in present if f.raw is not None]
        combined = Figure(
            figure.workload,
            figure.key,
            figure.label,
            figure.unit,
            figure.better,
            median(raws) if raws else None,
            extra=dict(figure.extra),
        )
        spread: dict[str, list[float]] = {}
        for subject in figure.values:
            values = [f.values[subject] for f in present if subject in f.values]
            combined.values[subject] = median(values)
            ratios = [r for f in present if (r := f.ratio(subject)) is not None]
            if ratios:
                spread[subject] = [median(ratios), min(ratios), max(ratios)]
        combined.extra["spread"] = spread
        duplicates: dict[str, int] = {}
        for f in present:
            for subject, count in f.extra.get("duplicates", {}).items():
                duplicates[subject] = duplicates.get(subject, 0) + count
        if duplicates:
            combined.extra["duplicates"] = duplicates  # summed: any duplicate in any round
        merged.figures.append(combined)
    per_round = [check(r) for r in reports]
    for index, target in enumerate(per_round[0]):
        values = [
            t.value
            for targets in per_round
            if index < len(targets) and (t := targets[index]).value is not None
        ]
        if not values:
            merged.targets.append(target)
            continue
        value = median(values)
        assert target.goal is not None
        met = value >= target.goal if target.better == "higher" else value <= target.goal
        merged.targets.append(
            Target(
                target.text,
                _format(value, target.unit),
                met,
                value,
                target.goal,
                target.better,
                target.unit,
                (min(values), max(values)),
                values,
                target.key,
            )
        )
    return merged


def spread_text(target: Target) -> str:
    if target.spread is None:
        return ""
    low, high = target.spread
    return f"{_format(low, target.unit)} – {_format(high, target.unit)}"
