"""The typos of issue 17: each line marked ``# error`` must be a ``mypy --strict`` error.

Never imported by the suite; tests/unit/test_typing.py type-checks it and
asserts on exactly these errors, line by line.
"""

from __future__ import annotations

from jaren_jobs import Job, JobContext, JobState, Store


def handler(payload: object, ctx: JobContext) -> None:
    return None


def typos(store: Store, job: Job) -> None:
    worker = store.jobs.create_worker({"k": handler}, concurency=4)  # error: call-arg
    worker.strat()  # error: attr-defined
    if job.state == JobState.DAED:  # error: attr-defined
        pass
    store.jobs.requeue(job.id, reset_attempts="yes")  # error: arg-type
    count: int = job.payload  # error: assignment
    print(count)
