"""Round 1's schema (SQLite version 3, PostgreSQL migration 1) holding live rows in every
state: what the queues-and-unique-keys schema step must upgrade in place (SPEC §12)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from jaren_jobs import Lease, Outcome, Store
from jaren_jobs.core.rows import claim_key
from tests.conftest import START, FakeClock

NOW_MS = int(START * 1000)

# every column round 1 had, in one order (PostgreSQL's seq aside)
COLUMNS = (
    "id", "kind", "payload", "state", "run_at", "attempts", "max_attempts", "lease_until",
    "lease_owner", "last_error", "result", "created_at", "updated_at", "priority",
    "lease_generation", "lease_token", "settled_generation", "claim_key",
)  # fmt: skip

LIVE_TOKEN = "tok-live"  # l1's lease, minted by a round-1 worker still running its attempt


def _row(job_id: str, state: str, **columns: Any) -> tuple[Any, ...]:
    base: dict[str, Any] = {
        "id": job_id, "kind": "mail", "payload": '{"n":1}', "state": state,
        "run_at": NOW_MS - 10_000, "attempts": 0, "max_attempts": 5, "lease_until": None,
        "lease_owner": None, "last_error": None, "result": None, "created_at": NOW_MS - 20_000,
        "updated_at": NOW_MS - 15_000, "priority": 0, "lease_generation": 0,
        "lease_token": None, "settled_generation": None, "claim_key": None,
    }  # fmt: skip
    base.update(columns)
    return tuple(base[name] for name in COLUMNS)


ROWS: list[tuple[Any, ...]] = [
    _row("p1", "pending", priority=3),
    _row("f1", "failed", attempts=1, last_error="Error: smtp down", lease_generation=1,
         settled_generation=1, claim_key=claim_key("tok-f1"), run_at=NOW_MS - 1000),
    _row("l1", "leased", attempts=1, lease_generation=1, lease_owner="w-old",
         lease_until=NOW_MS + 60_000, lease_token=LIVE_TOKEN, claim_key=claim_key(LIVE_TOKEN)),
    _row("l2", "leased", kind="legacy", attempts=2, lease_generation=2, lease_owner="w-dead",
         lease_until=NOW_MS - 1, lease_token="tok-l2", claim_key=claim_key("tok-l2")),
    _row("d1", "done", attempts=1, result='{"sent":true}', lease_generation=1,
         settled_generation=1, claim_key=claim_key("tok-d1")),
    _row("x1", "dead", attempts=5, max_attempts=5, last_error="Error: gave up",
         lease_generation=5, settled_generation=5, claim_key=claim_key("tok-x1")),
    _row("c1", "cancelled", last_error="cancelled"),
]  # fmt: skip

# (run_id, node_id, value, generation)
CHECKPOINTS = [("l1", "fetch", '"page"', 1), ("l1", "parse", "[1,2]", 1), ("d1", "x", "1", 1)]


def live_lease() -> Lease:
    """The lease the round-1 worker holding l1 still has in memory."""
    return Lease(
        job_id="l1",
        token=LIVE_TOKEN,
        generation=1,
        attempt=1,
        owner="w-old",
        expires_at=datetime.fromtimestamp((NOW_MS + 60_000) / 1000, timezone.utc),
        claim_key=claim_key(LIVE_TOKEN),
    )


def check_upgraded(
    store: Store, query: Callable[[str], list[tuple[Any, ...]]], clock: FakeClock
) -> None:
    """Every row kept every field and sits in the default queue; a worker drains them."""
    names = ", ".join(COLUMNS)
    rows = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
            for row in query(f'SELECT {names} FROM "_jaren_jobs" ORDER BY id')]  # fmt: skip
    assert rows == sorted(ROWS)
    assert query('SELECT DISTINCT queue FROM "_jaren_jobs"') == [("default",)]
    assert query('SELECT count(*) FROM "_jaren_jobs" WHERE unique_key IS NOT NULL') == [(0,)]
    checkpoints = query(
        'SELECT run_id, node_id, value, generation FROM "_jaren_job_checkpoints" ORDER BY 1, 2'
    )
    assert checkpoints == sorted(CHECKPOINTS)
    for job_id in ("p1", "f1", "l1", "l2", "d1", "x1", "c1"):
        job = store.jobs.get(job_id)
        assert job is not None
        assert job.queue == "default"
        assert job.unique_key is None
    # the attempt that was running across the upgrade still settles its job, by its lease
    assert store.jobs.complete(live_lease(), {"ok": True}) is True
    # a worker drains the rest (l2's lease expired: rescued), by queue too
    seen: list[str] = []

    def observe(outcome: Outcome) -> None:
        seen.append(f"{outcome.job_id}:{outcome.outcome}")

    handlers = {"mail": lambda payload, ctx: "sent", "legacy": lambda payload, ctx: "sent"}
    worker = store.jobs.create_worker(handlers, queues=["default"], on_outcome=observe)
    while worker.run_once():
        pass
    assert sorted(seen) == ["f1:completed", "l2:completed", "p1:completed"]
    counts = store.jobs.counts(queue="default")
    assert (counts.done, counts.dead, counts.cancelled, counts.pending, counts.leased) == (
        5, 1, 1, 0, 0,
    )  # fmt: skip
    # the new columns work on the upgraded rows: a dead job comes back, keys dedupe
    assert store.jobs.requeue("x1") is True
    first = store.jobs.enqueue("mail", unique_key="k", queue="other")
    assert store.jobs.enqueue("mail", unique_key="k") == first
    clock.advance(1)
