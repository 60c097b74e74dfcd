"""The benchmark's quick run, so the harness cannot rot: it runs and it reports.

Nothing here asserts a speed: only that every workload ran, against raw
sqlite3 in the same run, and was reported with its ratio (and that the
multi-process drain executed every job exactly once).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench import run_bench

REPO = Path(__file__).resolve().parents[2]
PG_PEER_NAMES = ("procrastinate", "pgqueuer", "chancy", "oban")


@pytest.mark.slow
def test_quick_run_reports_every_workload_beside_raw(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("JAREN_JOBS_BENCH_PG_URL", None)  # SQLite alone: one report, not two
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--json",
            "--plots",
            str(tmp_path / "plots"),
            "--dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout)

    meta = report["meta"]
    assert meta["mode"] == "quick"
    assert meta["durability"] == "full"
    assert meta["workloads"] == list(range(1, 11))
    assert meta["backend"] == "sqlite"
    assert meta["machine"]["cores"] >= 1

    figures = report["figures"]
    assert {f["workload"] for f in figures} == set(range(1, 11))
    for figure in figures:
        assert figure["raw"] is not None, figure["key"]
        assert figure["values"], figure["key"]
        if figure["raw"] > 0:
            for subject, value in figure["values"].items():
                # a growth figure is negative when the second half peaked lower
                if figure["key"] not in ("9.heap", "9.growth"):
                    assert value >= 0, (figure["key"], subject)
                ratio = figure["ratios"][subject]
                assert ratio is not None
                assert abs(ratio - value / figure["raw"]) < 1e-9 * max(1.0, ratio)
    for workload in range(1, 11):
        assert any("jaren_jobs" in f["values"] for f in figures if f["workload"] == workload)

    # the peers that are installed ran workloads 1, 3, 4, 5 and 6 through their own API
    for peer in meta["peers"]:
        for workload in (1, 3, 4, 5, 6):
            assert any(peer in f["values"] for f in figures if f["workload"] == workload), (
                peer,
                workload,
            )
        assert report["notes"][peer]

    # four processes drained the queue: every job ran, none twice
    (five,) = [f for f in figures if f["workload"] == 5]
    assert five["extra"]["duplicates"]["jaren_jobs"] == 0

    # scale-out: the raw batched loop and jaren_jobs at each process count, no duplicates
    tens = [f for f in figures if f["workload"] == 10]
    assert [f["extra"]["processes"] for f in tens] == [1, 2]
    for figure in tens:
        assert figure["extra"]["duplicates"] == {"raw": 0, "jaren_jobs": 0}

    # the table sizes of workload 7 were built and measured
    sevens = [f for f in figures if f["workload"] == 7]
    assert len(sevens) == len({(f["extra"]["settled"], f["extra"]["pending"]) for f in sevens}) >= 2

    # plots: drawn when matplotlib is present, and said to be skipped when not
    if importlib.util.find_spec("matplotlib") is not None:
        plots = [Path(p) for p in meta["plots"]]
        assert {p.name for p in plots} == {
            "bench-throughput.png",
            "bench-claim-cost.png",
            "bench-scaleout-sqlite.png",
        }
        for plot in plots:
            assert plot.read_bytes().startswith(b"\x89PNG")
    else:
        assert any("matplotlib" in line for line in meta["skipped"])

    # issue 28's SQLite targets, each with its measured value and met or missed
    targets = {t["key"]: t for t in report["targets"]}
    assert len(targets) == len(report["targets"]) == 10
    for target in targets.values():
        assert target["met"] in (True, False), target
        assert isinstance(target["value"], float), target
    zero = targets["duplicates"]
    assert (zero["value"], zero["met"]) == (0.0, True)


def test_rounds_report_the_median_and_spread_and_a_saved_run_reads_back(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    completed = run_bench(
        "--quick", "--json", "--rounds", "2", "--only", "1,2", "--peers", "none",
        "--dir", str(tmp_path), "--save", str(saved),
    )  # fmt: skip
    report = json.loads(completed.stdout)
    assert report["meta"]["rounds"] == 2
    for figure in report["figures"]:
        median, low, high = figure["extra"]["spread"]["jaren_jobs"]
        assert low <= median <= high, figure["key"]
    targets = {t["key"]: t for t in report["targets"]}
    for key in ("enqueue_one", "enqueue_many_4000"):
        target = targets[key]
        assert len(target["rounds"]) == 2
        low, high = target["spread"]
        assert low <= target["value"] <= high
        assert (
            target["value"]
            == sorted(target["rounds"])[0]
            + (sorted(target["rounds"])[1] - sorted(target["rounds"])[0]) / 2
        )  # the median of two rounds
        assert target["met"] is (target["value"] >= target["goal"])
    # the workloads not run are reported as such, not as met or missed
    assert targets["c4_vs_batched"]["met"] is None

    # --from reads the saved run back, running nothing: the same document, the same table
    replay = run_bench("--from", str(saved), "--json")
    assert json.loads(replay.stdout) == json.loads(saved.read_text()) == report
    assert replay.stderr == ""
    table = run_bench("--from", str(saved)).stdout
    assert "targets of issue 28, SQLite (median of 2 rounds" in table


def test_the_cpu_comparison_runs_and_reports_every_call() -> None:
    from bench.cpu import measure

    figures = measure(jobs=200)
    assert set(figures) == {"enqueue", "enqueue_many", "claim_complete", "worker_c4"}
    assert all(value > 0 for value in figures.values())


def _asynciorun_bench(*args: str) -> dict[str, Any]:
    """``python -m bench.asyncio_lag --jobs 200 ARGS``'s figures, checked for their shape."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    completed = subprocess.run(
        [sys.executable, "-m", "bench.asyncio_lag", "--jobs", "200", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    figures: dict[str, Any] = json.loads(completed.stdout)
    for name in (
        "async enqueue, 8 tasks",
        "AsyncWorker, concurrency 16, no-op async jobs",
        "thread Worker beside the loop",
    ):
        assert figures[name]["jobs_per_s"] > 0
        assert figures[name]["loop_lag"]["ticks"] > 0
    assert figures["async enqueue, one task"]["jobs_per_s"] > 0
    assert figures["one busy Python thread beside the loop"]["loop_lag"]["ticks"] > 0
    assert set(figures["ratios"]) == {
        "async enqueue / sync enqueue",
        "async enqueue one task / sync enqueue",
        "AsyncWorker / thread Worker",
    }
    assert f"backend {figures['backend']}" in completed.stderr
    return figures


def test_the_asyncio_bench_reports_loop_lag_and_rates_beside_sync() -> None:
    assert _asynciorun_bench()["backend"] == "sqlite"


def test_the_asyncio_bench_runs_the_same_workloads_on_postgres() -> None:
    from tests.processes.pg_support import base_url

    url = base_url()  # skips without a server (fails in CI)
    assert _asynciorun_bench("--db", url)["backend"] == "postgres"


@pytest.mark.slow
def test_quick_postgres_run_reports_every_workload_beside_raw_psycopg(
    tmp_path: Path,
) -> None:
    from tests.processes.pg_support import base_url

    url = base_url()  # skips without a server (fails in CI)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    argv = ["-m", "bench", "--quick", "--json", "--backend", "postgres", "--pg-url", url]
    completed = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout)
    meta = report["meta"]
    assert (meta["backend"], meta["baseline"], meta["workloads"]) == (
        "postgres",
        "raw psycopg",
        list(range(1, 11)),
    )
    assert meta["postgres"]["server_version"]
    # the PostgreSQL peers are left out of a quick run, and the report names them
    assert meta["peers"] == []
    assert any(
        "left out of a --quick run" in line and all(name in line for name in PG_PEER_NAMES)
        for line in meta["skipped"]
    ), meta["skipped"]
    figures = report["figures"]
    assert {f["workload"] for f in figures} == set(range(1, 11))
    sevens = [f for f in figures if f["workload"] == 7]
    assert len(sevens) == len({(f["extra"]["settled"], f["extra"]["pending"]) for f in sevens}) >= 2
    for figure in figures:
        assert figure["raw"] is not None, figure["key"]
        subject = "jaren_jobs c=4" if figure["key"] == "4.batched" else "jaren_jobs"
        if figure["key"] in ("9.heap", "9.growth"):  # slopes: near 0, of either sign
            assert subject in figure["values"], figure["key"]
            continue
        assert figure["raw"] > 0, figure["key"]
        assert figure["values"][subject] >= 0, figure["key"]
        assert figure["ratios"][subject] is not None
    assert {f["extra"]["concurrency"] for f in figures if f["key"].startswith("4.c")} == {
        1,
        4,
        16,
    }
    (five,) = [f for f in figures if f["workload"] == 5]
    assert five["extra"]["duplicates"] == {"raw": 0, "jaren_jobs": 0}
    tens = [f for f in figures if f["workload"] == 10]
    assert [f["extra"]["processes"] for f in tens] == [1, 2]
    for figure in tens:
        assert figure["extra"]["duplicates"] == {"raw": 0, "jaren_jobs": 0}
    assert {f["key"] for f in figures if f["workload"] == 6} == {
        "6.local.p50",
        "6.local.p99",
        "6.remote.p50",
        "6.remote.p99",
    }
    # an idle worker as workload 6 runs it (notifications wake it, a 1 s poll is the
    # fallback), and with the 50 ms poll SQLite's cross-process wake-up needs
    eights = {f["key"]: f["extra"]["poll_seconds"] for f in figures if f["workload"] == 8}
    assert eights == {"8": 1.0, "8.fast": 0.05}
    # issue 28's PostgreSQL targets: the peer comparisons are not run without the peers
    targets = {t["key"]: t for t in report["targets"]}
    for key in ("enqueue_one", "claim_complete_one", "c4_vs_batched", "remote_p50"):
        assert targets[key]["met"] in (True, False), targets[key]
    assert targets["async_vs_thread"]["met"] in (True, False)
    assert targets["duplicates"]["met"] is True
    for key in ("idle_cpu", "heap_growth", "claim_flat"):
        assert targets[key]["met"] in (True, False), targets[key]
    # the peers are not run by a quick run: said so, never counted as met
    for key in ("c4_vs_peer", "processes_vs_peer"):
        assert targets[key]["met"] is None, targets[key]
