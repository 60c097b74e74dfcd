"""A small typed program: it must pass ``mypy --strict`` (tests/unit/test_typing.py).

Never imported by the suite; only type-checked. It uses the API the way an
application does, so a public annotation that turns into ``Any`` or goes
wrong shows up as a mypy error here.
"""

from __future__ import annotations

from typing import assert_type

from jaren_jobs import (
    AsyncStore,
    AsyncWorker,
    Job,
    JobContext,
    JobState,
    JsonValue,
    StopOutcome,
    Worker,
    open_store,
)


def send_email(payload: object, ctx: JobContext) -> JsonValue:
    return {"sent": True, "attempt": ctx.job.attempts}


def describe(job: Job) -> str:
    assert_type(job.state, JobState)
    if job.state == JobState.DEAD:
        return f"{job.id} died: {job.last_error}"
    if job.state in (JobState.DONE, JobState.CANCELLED):
        return f"{job.id} settled"
    return f"{job.id} is {job.state.value}"


def is_dead(job: Job) -> bool:
    # a state still compares with its plain string
    return job.state == "dead"


def result_of(job: Job) -> JsonValue:
    result = job.result
    if isinstance(result, dict):
        sent = result.get("sent")
        assert_type(sent, JsonValue)
        return sent
    return None


def run(path: str) -> StopOutcome:
    with open_store(path) as store:
        job = store.jobs.enqueue("email", {"to": "a@example.com", "tags": ["x", 1, 2.5, None]})
        worker = store.jobs.create_worker(
            {"email": send_email}, concurrency=4, poll_seconds=0.5, lease_seconds=30.0
        )
        assert_type(worker, Worker)
        worker.start()
        describe(job)
        again = store.jobs.requeue(job.id, reset_attempts=True)
        assert_type(again, bool)
        return worker.stop(grace_seconds=5.0)


async def run_async(store: AsyncStore) -> StopOutcome:
    worker = store.jobs.create_worker({"email": send_email}, concurrency=2)
    assert_type(worker, AsyncWorker)
    await worker.start()
    assert_type(await store.jobs.requeue("j", reset_attempts=False), bool)
    return await worker.stop()
