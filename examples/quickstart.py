"""Enqueue work, run a worker over it, and print what became of every job.

Runs on a throwaway database: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import jaren_jobs


class OneLine(logging.Formatter):
    """One line per record: the traceback a failed attempt carries is left out here."""

    def formatException(self, ei: Any) -> str:
        return ""


def send_email(payload: dict[str, Any], ctx: Any) -> str:
    return f"sent to {payload['to']}"


def flaky(payload: dict[str, Any], ctx: Any) -> None:
    # fails on its first attempt, succeeds on the retry
    if ctx.job.attempts < 2:
        raise RuntimeError("upstream timed out")


def main() -> None:
    # the library logs under "jaren_jobs" and leaves handlers to the application:
    # here one line per record, without the tracebacks the failed attempts carry
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(OneLine("log: %(levelname)s %(name)s %(message)s"))
    logging.getLogger("jaren_jobs").addHandler(handler)
    logging.getLogger("jaren_jobs").setLevel(logging.INFO)
    path = Path(tempfile.mkdtemp()) / "app.db"
    defaults = {"backoff_base_seconds": 0.05, "poll_seconds": 0.05}
    with jaren_jobs.open_store(path, defaults=defaults) as store:
        with store.transaction() as tx:  # the job exists iff the business write commits
            tx.execute("CREATE TABLE signups (email TEXT)")
            tx.execute("INSERT INTO signups VALUES (?)", ["ada@example.com"])
            tx.jobs.enqueue("send_email", {"to": "ada@example.com"})
        for n in range(3):
            store.jobs.enqueue("flaky", {"n": n})

        finished = threading.Event()
        settled: list[jaren_jobs.Outcome] = []

        def on_outcome(event: jaren_jobs.Outcome) -> None:
            settled.append(event)
            if sum(e.outcome == "completed" for e in settled) == 4:
                finished.set()

        worker = store.jobs.create_worker(
            {"send_email": send_email, "flaky": flaky}, concurrency=2, on_outcome=on_outcome
        )
        worker.start()
        finished.wait(timeout=30)
        worker.stop()
        for event in settled:
            print(f"{event.kind:<11} attempt {event.attempt}: {event.outcome}")
        print(store.jobs.counts().to_dict())


if __name__ == "__main__":
    main()
