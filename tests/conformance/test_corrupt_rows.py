"""Rows written outside the library: a payload that is not JSON, text that is not UTF-8,
JSON nested past the decoder's recursion limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jaren_jobs import CorruptJson, NewJob, Outcome, Store
from tests.harness import Harness, app_sql_for


def corrupt(store: Store, job_id: str, text: str = "{not json") -> None:
    with store.transaction() as tx:
        tx.execute(
            app_sql_for(store, 'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?'), (text, job_id)
        )


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


# ------------------------------------------------------------------ poison rows
#
# Written through the harness's own connection, as another program would
# leave them: text that is not UTF-8, and JSON nested deeper than Python's
# decoder can recurse. Neither may wedge reads, claims or the kind. Only
# SQLite keeps bytes that are not UTF-8 in a TEXT column: the tests below run
# with that poison in tests/backends/sqlite/test_corrupt_rows.py.

NOT_UTF8 = b'{"name": "caf\xe9"}'  # latin-1 bytes stored as TEXT
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, far past the recursion limit
POISONS = {"not-utf8": NOT_UTF8, "deep": DEEP}
POISON_PARAMS = ["deep"]


def expect_marker(value: Any, poison: str) -> None:
    assert isinstance(value, CorruptJson)
    value.text.encode("utf-8")  # the marker itself is printable, storable text
    json.dumps(value.to_dict())
    if poison == "not-utf8":
        assert "UTF-8" in value.error
        assert value.text == '{"name": "caf\\xe9"}'  # the bad byte shown escaped
    else:
        assert "deep" in value.error
        assert value.text == DEEP


@pytest.mark.parametrize("poison", POISON_PARAMS)
@pytest.mark.parametrize("column", ["payload", "result"])
def test_a_poison_text_reads_as_a_marker_from_get_and_page(
    store: Store, backend: Harness, column: str, poison: str
) -> None:
    for n in range(3):
        store.jobs.enqueue("k", {"n": n}, id=f"j{n}")
    if column == "result":
        for claimed in store.jobs.claim_many(["k"], owner="w", limit=3):
            assert store.jobs.complete(claimed.lease, {"n": claimed.payload["n"]})
    backend.write_raw_row("j1", **{column: POISONS[poison]})

    got = store.jobs.get("j1")
    assert got is not None
    expect_marker(getattr(got, column), poison)
    json.dumps(got.to_dict())
    with store.jobs.page() as cursor:
        jobs = list(cursor)
    assert [job.id for job in jobs] == ["j0", "j1", "j2"]
    assert [isinstance(getattr(job, column), CorruptJson) for job in jobs] == [False, True, False]
    expect_marker(getattr(jobs[1], column), poison)


@pytest.mark.parametrize("poison", POISON_PARAMS)
def test_a_batch_claim_over_a_poison_row_claims_every_row(
    store: Store, backend: Harness, poison: str
) -> None:
    store.jobs.enqueue_many(NewJob("k", {"n": n}, id=f"j{n}") for n in range(8))
    backend.write_raw_row("j3", payload=POISONS[poison])
    claimed = store.jobs.claim_many(["k"], owner="w", limit=8)
    assert [job.id for job in claimed] == [f"j{n}" for n in range(8)]
    expect_marker(claimed[3].payload, poison)
    for job in claimed:
        assert store.jobs.complete(job.lease, "ok") is True
    # one by one, too
    store.jobs.enqueue("k", id="z")
    backend.write_raw_row("z", payload=POISONS[poison])
    lone = store.jobs.claim(["k"], owner="w")
    assert lone is not None
    expect_marker(lone.payload, poison)


@pytest.mark.parametrize("poison", POISON_PARAMS)
def test_a_worker_fails_a_poison_row_and_its_kind_goes_on(
    store: Store, backend: Harness, clock: Any, poison: str
) -> None:
    store.jobs.enqueue_many(
        NewJob("k", {"n": n}, id=f"j{n}", max_attempts=1 if n == 2 else 5) for n in range(6)
    )
    backend.write_raw_row("j2", payload=POISONS[poison])
    seen: list[Any] = []
    outcomes: list[Outcome] = []

    def handler(payload: Any, ctx: Any) -> Any:
        seen.append(payload)
        return payload["n"]

    worker = store.jobs.create_worker({"k": handler}, on_outcome=outcomes.append)
    for _ in range(20):
        if not worker.run_once():
            break
    worker.stop()

    assert seen == [{"n": n} for n in range(6) if n != 2]
    bad = store.jobs.get("j2")
    assert bad is not None
    assert (bad.state, bad.attempts, bad.lease_until) == ("dead", 1, None)
    assert bad.last_error is not None
    assert bad.last_error.startswith("JD2099: ")
    assert "'j2'" in bad.last_error
    for n in (0, 1, 3, 4, 5):
        job = store.jobs.get(f"j{n}")
        assert job is not None
        assert (job.state, job.result) == ("done", n)
    assert sorted((o.job_id, o.outcome) for o in outcomes) == sorted(
        [(f"j{n}", "completed") for n in (0, 1, 3, 4, 5)] + [("j2", "failed")]
    )
