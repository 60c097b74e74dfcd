"""``python -m bench.cpu``: CPU time per operation, for comparing two trees on a busy machine.

Wall-clock rates (``python -m bench``) move with whatever else the machine
runs; the CPU time a process spends per job moves much less. This prints,
as JSON, the microseconds of CPU (``time.process_time()``, every thread of
the process) per job for workloads 1-4's calls, at durability NORMAL so the
disk's flush is not in it. Compare two checkouts by running it alternately
with ``PYTHONPATH=<tree>/src``, several rounds each; set
``MALLOC_TRIM_THRESHOLD_=268435456`` to keep glibc's heap trimming (which
makes some runs pay twice for the same statements) out of the comparison.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Any

import jaren_jobs
from jaren_jobs import NewJob, Outcome

JOBS = 2000


def measure(jobs: int = JOBS) -> dict[str, float]:
    """µs of CPU per job for each call."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = jaren_jobs.open_store(os.path.join(folder, "cpu.db"), durability="normal")
        began = time.process_time()
        for n in range(jobs):
            store.jobs.enqueue("one", {"n": n})
        out["enqueue"] = (time.process_time() - began) / jobs * 1e6
        began = time.process_time()
        for _ in range(jobs // 100):
            store.jobs.enqueue_many([NewJob("many", {"n": n}) for n in range(100)])
        out["enqueue_many"] = (time.process_time() - began) / jobs * 1e6
        began = time.process_time()
        for _ in range(jobs):
            claimed = store.jobs.claim(["one"], owner="cpu")
            assert claimed is not None
            store.jobs.complete(claimed.lease, None)
        out["claim_complete"] = (time.process_time() - began) / jobs * 1e6
        done = threading.Event()
        seen = [0]
        lock = threading.Lock()

        def counted(_: Outcome) -> None:
            with lock:
                seen[0] += 1
                if seen[0] == jobs:
                    done.set()

        def noop(payload: Any, ctx: Any) -> None:
            return None

        worker = store.jobs.create_worker(
            {"many": noop}, concurrency=4, on_outcome=counted, poll_seconds=0.05
        )
        began = time.process_time()
        worker.start()
        done.wait(300)
        worker.stop()
        out["worker_c4"] = (time.process_time() - began) / jobs * 1e6
        store.close()
    return {name: round(value, 1) for name, value in out.items()}


if __name__ == "__main__":
    print(json.dumps(measure()))
