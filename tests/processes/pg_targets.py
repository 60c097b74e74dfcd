"""Spawn targets for the PostgreSQL process tests (importable, so ``spawn`` finds them).

The worker is :mod:`tests.processes.chaos_targets`' own, on a URL; like it, every
target reports through files
(append-only JSON Lines, one ``write()`` per line, so a SIGKILL never tears
one) or multiprocessing primitives: a process the test kills must leave behind
what it wrote before it died. Run as ``python -m tests.processes.pg_targets
worker SETTINGS_JSON`` it is a worker for a process started by a command line
(``ip netns exec``), with files for its ready and stop events.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from jaren_jobs import JobsError, open_store
from tests.processes.chaos_targets import FileEvent, _LineLog, chaos_worker

KIND = "pgwork"
EXECUTIONS = "pg_executions"
CREATE_EXECUTIONS = (
    f"CREATE TABLE IF NOT EXISTS {EXECUTIONS} (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
    "generation INTEGER NOT NULL, pid INTEGER NOT NULL, incarnation TEXT NOT NULL)"
)


def pg_worker(settings: dict[str, Any], ready: Any, stop: Any, started: Any = None) -> None:
    """:func:`tests.processes.chaos_targets.chaos_worker` on ``settings["url"]``: the jobs
    of :data:`KIND`, executions recorded in :data:`EXECUTIONS` (``"placeholder": "?"`` in
    ``settings`` runs it on an SQLite file, a dry run)."""
    chaos_worker(
        {"kind": KIND, "executions": EXECUTIONS, "placeholder": "%s", **settings},
        ready,
        stop,
        started,
    )


def pg_enqueuer(settings: dict[str, Any], ready: Any, stop: Any) -> None:
    """Enqueue one job at a time until ``stop``; log every id it was told was enqueued.

    ``acked.jsonl`` gets an id only after ``enqueue`` returned for it;
    ``refused.jsonl`` gets the ids whose enqueue raised (with the error's
    class and code), which may or may not exist afterwards.
    """
    folder = Path(settings["folder"])
    acked = _LineLog(folder / "acked.jsonl")
    refused = _LineLog(folder / "refused.jsonl")
    pause = threading.Event()
    report: dict[str, Any] = {"error": None, "raw": []}
    try:
        with open_store(settings["url"], durability="full") as store:
            ready.set()
            n = 0
            while not stop.is_set():
                n += 1
                job_id = f"e-{n:06d}"
                try:
                    store.jobs.enqueue(KIND, {"work_ms": 2}, id=job_id, max_attempts=1000)
                except JobsError as exc:
                    refused.write({"id": job_id, "error": type(exc).__name__, "code": exc.code})
                    pause.wait(0.05)  # the server is away: do not spin
                    continue
                except Exception as exc:  # a raw driver error: the test fails on it
                    report["raw"].append(repr(exc))
                    refused.write({"id": job_id, "error": repr(exc), "code": None})
                    continue
                acked.write({"id": job_id, "at": time.monotonic()})
                pause.wait(settings.get("every_seconds", 0.005))
    except BaseException:
        report["error"] = traceback.format_exc()
    finally:
        acked.close()
        refused.close()
    (folder / "report-enqueuer.json").write_text(json.dumps(report), encoding="utf-8")


def main(argv: list[str]) -> int:
    command, settings_text = argv
    if command != "worker":
        raise SystemExit(f"unknown command {command!r}")
    settings = json.loads(settings_text)
    pg_worker(settings, FileEvent(settings["ready"]), FileEvent(settings["stop"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
