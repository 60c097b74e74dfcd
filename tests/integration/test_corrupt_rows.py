"""A row written outside the library with a payload that is not JSON."""

from __future__ import annotations

from typing import Any

from jaren_jobs import CorruptJson, Outcome, Store


def corrupt(store: Store, job_id: str, text: str = "{not json") -> None:
    with store.transaction() as tx:
        tx.execute('UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?', (text, job_id))


def test_get_and_page_still_work_and_name_the_bad_row(store: Store) -> None:
    for n in range(3):
        store.jobs.enqueue("k", {"n": n}, id=f"j{n}")
    corrupt(store, "j1")
    got = store.jobs.get("j1")
    assert got is not None
    assert isinstance(got.payload, CorruptJson)
    assert got.payload.text == "{not json"
    assert got.to_dict()["payload"]["corrupt_json"] == "{not json"
    with store.jobs.page() as cursor:
        jobs = list(cursor)
    assert [job.id for job in jobs] == ["j0", "j1", "j2"]
    assert [isinstance(job.payload, CorruptJson) for job in jobs] == [False, True, False]


def test_a_worker_fails_the_corrupt_job_without_calling_the_handler_and_goes_on(
    store: Store, clock: Any
) -> None:
    store.jobs.enqueue("k", {"n": 0}, id="bad", max_attempts=2)
    store.jobs.enqueue("k", {"n": 1}, id="good")
    corrupt(store, "bad")
    seen: list[Any] = []
    outcomes: list[Outcome] = []

    def handler(payload: Any, ctx: Any) -> Any:
        seen.append(payload)
        return payload["n"]

    worker = store.jobs.create_worker(
        {"k": handler}, on_outcome=outcomes.append, backoff_base_seconds=1.0
    )
    assert worker.run_once()  # "bad" sorts first: same priority and run_at, id order
    assert worker.run_once()
    clock.advance(5)  # past the retry's backoff
    assert worker.run_once()
    assert not worker.run_once()
    worker.stop()

    assert seen == [{"n": 1}]  # the handler never saw the corrupt payload
    bad = store.jobs.get("bad")
    assert bad is not None
    assert bad.state == "dead"
    assert bad.attempts == 2
    assert bad.last_error is not None
    assert bad.last_error.startswith("JD2099: ")
    assert "'bad'" in bad.last_error
    assert "not JSON" in bad.last_error
    good = store.jobs.get("good")
    assert good is not None
    assert good.state == "done"
    assert good.result == 1
    assert sorted((o.job_id, o.outcome) for o in outcomes) == [
        ("bad", "failed"),
        ("bad", "failed"),
        ("good", "completed"),
    ]
