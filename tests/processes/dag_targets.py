"""Spawn targets for the DAG crash-resume tests (importable, so spawn can find them).

The same document and task implementations run in the crashing child and in
the worker that resumes it: the run identity (document revision, input hash,
task versions) must agree for the resume to be allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaren_jobs import Runtime, Task, create_dag_job_runner, open_store

KIND = "five"
# the fixed instant the crashing child lives at (tests.conftest.START): its
# lease expires at START + LEASE_SECONDS, whatever the wall clock says
START = 1_800_000_000.0
LEASE_SECONDS = 1.0

DOCUMENT: dict[str, Any] = {
    "nodes": {
        "n1": {"task": "seed"},
        "n2": {"task": "double", "needs": ["n1"]},
        "n3": {"task": "add", "needs": ["n1", "n2"]},
        "n4": {"task": "double", "needs": ["n3"]},
        "n5": {"task": "add", "needs": ["n2", "n4"]},
    },
    "output": "n5",
}
ORDER = ("n1", "n2", "n3", "n4", "n5")


def make_tasks(side_file: Path, marker: Path, crash_in: str) -> dict[str, Any]:
    """Tasks that append their node id to ``side_file`` as they start.

    The task of node ``crash_in`` kills its process (``os._exit(1)``: no
    cleanup, no settlement, the lease left dangling) the first time it runs,
    i.e. while ``marker`` does not exist yet.
    """

    def noted(fn: Any) -> Any:
        def task(inputs: dict[str, Any], ctx: Any) -> Any:
            # closed before anything else happens, so the line survives os._exit
            with side_file.open("a", encoding="utf-8") as out:
                out.write(ctx.node_id + "\n")
            if ctx.node_id == crash_in and not marker.exists():
                marker.touch()
                os._exit(1)
            return fn(inputs)

        return task

    def needs(inputs: dict[str, Any]) -> list[int]:
        return [value for key, value in inputs.items() if key != "input"]

    return {
        "seed": noted(lambda inputs: inputs["input"]["x"]),
        "double": Task(noted(lambda inputs: 2 * sum(needs(inputs))), version=1),
        "add": Task(noted(lambda inputs: sum(needs(inputs))), version="2"),
    }


def crash_in_a_node(settings: dict[str, Any]) -> None:
    """Run one claim of the DAG job; the task of ``crash_in`` kills this process.

    If the run ever returned, the child would exit 0 and the test would see it.
    """
    runtime = Runtime(now=lambda: START)
    store = open_store(settings["db_path"], runtime=runtime)
    worker = create_dag_job_runner(
        store,
        documents={KIND: DOCUMENT},
        tasks=make_tasks(
            Path(settings["side_file"]), Path(settings["marker"]), settings["crash_in"]
        ),
        lease_seconds=LEASE_SECONDS,
        renew=False,
        owner="doomed-child",
    )
    worker.run_once()
    store.close()
