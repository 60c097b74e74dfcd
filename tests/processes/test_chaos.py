"""Chaos: worker processes SIGKILLed at random while they drain a queue.

Four worker processes (two loops each, one-second leases) drain the queue
while a supervisor SIGKILLs a random one every few hundred milliseconds and
starts a replacement; now and then it freezes one (SIGSTOP) for longer than
a lease instead, so that its leases are lost while it lives. Each handler
records its execution in a side table of the same database before it
returns; each worker appends every outcome to a file as it happens. At the
end the store, the side table and the outcome files must agree: every job
done and settled exactly once, executed at least once, and re-executed only
where an earlier attempt died with its process or was told its lease was
lost.

``JAREN_SOAK=1 JAREN_SOAK_SECONDS=N`` keeps enqueueing and killing for N
seconds (a long soak) before the final drain and the same checks.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, open_store
from tests.processes.chaos_targets import (
    CHAOS_KIND,
    CREATE_EXECUTIONS,
    EXECUTIONS_TABLE,
    chaos_worker,
)

PROCESSES = 4
CONCURRENCY = 2
LEASE_SECONDS = 1.0
JOBS = 3000
KILL_EVERY = (0.15, 0.45)  # seconds between kills, drawn uniformly
DRAIN_DEADLINE = 100.0  # CI must finish in under two minutes, spawns included
SOAK = os.environ.get("JAREN_SOAK") == "1"
SOAK_SECONDS = float(os.environ.get("JAREN_SOAK_SECONDS", "600"))


@dataclass
class Supervisor:
    """Starts, kills and replaces worker processes; remembers who was killed."""

    folder: Path
    db_path: Path
    ctx: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))
    # incarnation -> (process, ready, stop). Each process has its OWN stop event:
    # a process SIGKILLed while it waits on a shared multiprocessing Event
    # never acknowledges the wake-up, and the parent's set() would hang forever
    live: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    # incarnation -> the timer that thaws it. A timer, not the supervisor loop:
    # a process frozen while it holds the write lock would otherwise block the
    # loop's own enqueue, and with it the thaw
    frozen: dict[str, threading.Timer] = field(default_factory=dict)
    freezes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(8))

    def spawn(self) -> None:
        incarnation = f"w{len(self.started) + 1:03d}"
        ready = self.ctx.Event()
        stop = self.ctx.Event()
        settings = {
            "folder": str(self.folder),
            "db_path": str(self.db_path),
            "durability": "normal",  # a SIGKILL is a process crash: NORMAL survives it
            "incarnation": incarnation,
            "concurrency": CONCURRENCY,
            "lease_seconds": LEASE_SECONDS,
            "poll_seconds": 0.05,
        }
        process = self.ctx.Process(
            target=chaos_worker, args=(settings, ready, stop), name=incarnation
        )
        process.start()
        self.started.append(incarnation)
        self.live[incarnation] = (process, ready, stop)

    def working(self) -> list[str]:
        with self.lock:
            return sorted(
                name
                for name, (_, ready, _) in self.live.items()
                if ready.is_set() and name not in self.frozen
            )

    def freeze_one(self) -> bool:
        """SIGSTOP one working process for longer than a lease, so its leases are lost."""
        working = self.working()
        if len(working) < 2:
            return False
        victim = self.rng.choice(working)
        with self.lock:
            os.kill(self.live[victim][0].pid, signal.SIGSTOP)
            timer = threading.Timer(
                self.rng.uniform(1.5, 2.5) * LEASE_SECONDS, self.thaw, (victim,)
            )
            self.frozen[victim] = timer
            self.freezes += 1
        timer.start()
        return True

    def thaw(self, name: str) -> None:
        with self.lock:
            timer = self.frozen.pop(name, None)
            if timer is not None:
                timer.cancel()
                os.kill(self.live[name][0].pid, signal.SIGCONT)

    def kill_one(self) -> bool:
        """SIGKILL one random working process and start its replacement."""
        working = self.working()
        # leave at least one working process, so the drain always makes progress
        if len(working) < 2:
            return False
        victim = self.rng.choice(working)
        with self.lock:
            process, _, _ = self.live.pop(victim)
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        assert process.exitcode == -signal.SIGKILL, (victim, process.exitcode)
        self.killed.add(victim)
        self.spawn()
        return True

    def shut_down(self) -> dict[str, int | None]:
        for name in list(self.frozen):
            self.thaw(name)
        for _, _, stop in self.live.values():
            stop.set()
        codes: dict[str, int | None] = {}
        for name, (process, _, _) in self.live.items():
            process.join(60)
            if process.is_alive():  # pragma: no cover - only on a hung child
                process.kill()
                process.join(10)
            codes[name] = process.exitcode
        return codes


def unfinished(db_path: Path) -> int:
    connection = sqlite3.connect(db_path, timeout=30)
    try:
        row = connection.execute(
            "SELECT COUNT(*) FROM \"_jaren_jobs\" WHERE state != 'done'"
        ).fetchone()
    finally:
        connection.close()
    return int(row[0])


def read_outcomes(folder: Path) -> list[dict[str, Any]]:
    outcomes: list[dict[str, Any]] = []
    for path in sorted(folder.glob("outcomes-*.jsonl")):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        # one write() per line: even a killed process leaves whole lines only
        assert lines[-1] == "", f"{path.name} ends in a torn line: {lines[-1]!r}"
        outcomes.extend(json.loads(line) for line in lines[:-1])
    return outcomes


@pytest.mark.slow
def test_killed_workers_lose_nothing_and_settle_nothing_twice(tmp_path: Path) -> None:
    db_path = tmp_path / "chaos.db"
    all_ids: set[str] = set()
    work = random.Random(3)
    with open_store(db_path, durability="normal") as store:
        with store.transaction() as tx:
            tx.execute(CREATE_EXECUTIONS)
        created = store.jobs.enqueue_many(
            NewJob(CHAOS_KIND, {"work_ms": work.choice((0, 5, 20, 50))}, max_attempts=1000)
            for _ in range(JOBS)
        )
        all_ids.update(job.id for job in created)

        supervisor = Supervisor(tmp_path, db_path)
        began = time.monotonic()
        for _ in range(PROCESSES):
            supervisor.spawn()
        pause = threading.Event()  # never set: the pacing between kills
        kills = 0
        soak_until = began + SOAK_SECONDS if SOAK else began
        deadline = soak_until + DRAIN_DEADLINE
        try:
            while True:
                pause.wait(supervisor.rng.uniform(*KILL_EVERY))
                now = time.monotonic()
                if now < soak_until:
                    fresh = store.jobs.enqueue_many(
                        NewJob(
                            CHAOS_KIND, {"work_ms": work.choice((0, 5, 20, 50))}, max_attempts=1000
                        )
                        for _ in range(40)
                    )
                    all_ids.update(job.id for job in fresh)
                elif unfinished(db_path) == 0:
                    break
                assert now < deadline, (
                    f"the queue did not drain within {deadline - began:.0f}s: "
                    f"{unfinished(db_path)} jobs not done after {kills} kills"
                )
                if supervisor.rng.random() < 0.2:
                    supervisor.freeze_one()
                else:
                    kills += supervisor.kill_one()
        finally:
            codes = supervisor.shut_down()
        elapsed = time.monotonic() - began

    survivors = sorted(codes)
    assert codes == dict.fromkeys(survivors, 0)
    assert len(survivors) == PROCESSES
    assert kills >= 5, f"only {kills} kills: the chaos never really happened"
    killed = supervisor.killed

    # -- the store: every job done, nothing leased, one settling generation each
    connection = sqlite3.connect(db_path)
    try:
        rows = connection.execute(
            "SELECT id, state, attempts, lease_generation, settled_generation, lease_token, "
            'lease_until, result FROM "_jaren_jobs"'
        ).fetchall()
        executions = connection.execute(
            f"SELECT job_id, attempt, generation, pid, incarnation FROM {EXECUTIONS_TABLE}"
        ).fetchall()
    finally:
        connection.close()
    assert {row[0] for row in rows} == all_ids
    settled: dict[str, tuple[int, dict[str, Any]]] = {}
    for job_id, state, attempts, generation, settled_generation, token, until, result in rows:
        assert (state, token, until) == ("done", None, None), job_id
        assert settled_generation == generation, job_id
        # each claim was one attempt, except a claim handed back unstarted
        # (a stopping worker's batch), which moved the generation only
        assert 1 <= attempts <= generation, job_id
        settled[job_id] = (generation, json.loads(result))

    # -- the side table: who executed what
    by_job: dict[str, dict[int, str]] = defaultdict(dict)
    for job_id, attempt, generation, _pid, incarnation in executions:
        assert attempt <= generation
        assert generation not in by_job[job_id], f"{job_id} ran twice in generation {generation}"
        by_job[job_id][generation] = incarnation
    assert set(by_job) == all_ids, "some job never executed"

    # -- the outcomes, from every process (killed ones left theirs behind too)
    outcomes = read_outcomes(tmp_path)
    lost = {
        (o["incarnation"], o["job_id"], o["generation"]) for o in outcomes if o["outcome"] == "lost"
    }
    completions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for outcome in outcomes:
        assert outcome["outcome"] in ("completed", "lost"), outcome
        if outcome["outcome"] == "completed":
            completions[outcome["job_id"]].append(outcome)

    unreported = 0
    reexecuted = 0
    for job_id, (generation, result) in settled.items():
        runs = by_job[job_id]
        attempts = next(row[2] for row in rows if row[0] == job_id)
        assert len(runs) <= attempts, (job_id, runs)  # every execution spent an attempt
        # the settling attempt executed, and it is the one whose result is stored
        assert runs.get(generation) == result["by"], (job_id, runs, result)
        assert result["generation"] == generation
        assert max(runs) == generation, f"{job_id} executed after it was settled: {runs}"
        # settled exactly once: at most one completion reported, by the settling attempt
        reported = completions.get(job_id, [])
        assert len(reported) <= 1, (job_id, reported)
        if reported:
            assert (reported[0]["generation"], reported[0]["incarnation"]) == (
                generation,
                result["by"],
            )
        else:
            # committed, then killed before it could report
            assert result["by"] in killed, (job_id, result)
            unreported += 1
        # re-executed only where the earlier attempt died or lost its lease
        for earlier, incarnation in runs.items():
            if earlier == generation:
                continue
            reexecuted += 1
            assert incarnation in killed or (incarnation, job_id, earlier) in lost, (
                f"{job_id}: generation {earlier} ran on {incarnation}, which was neither "
                f"killed nor told its lease was lost; runs {runs}"
            )
    assert sum(len(c) for c in completions.values()) + unreported == len(all_ids)

    # -- the survivors' own accounts add up
    for name in survivors:
        report = json.loads((tmp_path / f"report-{name}.json").read_text())
        assert report["error"] is None, f"{name}:\n{report['error']}"
        assert report["stop"] == {"drained": True, "in_flight": 0}
        stats = report["stats"]
        mine = Counter(o["outcome"] for o in outcomes if o["incarnation"] == name)
        assert mine == Counter(report["outcomes"])
        assert mine["completed"] == stats["completions"]
        assert mine["lost"] == stats["lost_settlements"]
        assert (stats["failures"], stats["cancellations"], stats["in_flight"]) == (0, 0, 0)
        assert stats["claims"] == stats["completions"] + stats["lost_settlements"]
        assert stats["claim_errors"] == 0, report["problems"]
        assert not [p for p in report["problems"] if p.startswith(("ERROR", "CRITICAL"))]

    rescued = sum(1 for generation, _ in settled.values() if generation > 1)
    assert rescued > 0, "no kill ever hit a claimed job: the chaos proved nothing"
    print(
        f"\n{len(all_ids)} jobs, {len(supervisor.started)} processes started, {kills} killed, "
        f"{supervisor.freezes} frozen, "
        f"{elapsed:.1f}s; {rescued} jobs needed more than one attempt, {reexecuted} "
        f"re-executions, {len(lost)} lost outcomes, {unreported} completions unreported "
        "(killed between commit and report)"
    )
