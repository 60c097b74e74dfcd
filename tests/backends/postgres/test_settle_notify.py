"""PostgreSQL: a settlement's ``NOTIFY`` (what ``wait()`` in other processes wakes on).

One notification per settle transaction, folded into a statement the
settlement runs anyway (never a round trip more), on a channel of its own
(settlements never wake idle workers), delivered with the commit. Counted on
the wire (the statements the store's connection sends) and on a listening
connection of the test's own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jaren_jobs import Store
from jaren_jobs.backends.postgres.session import settled_channel
from jaren_jobs.backends.postgres.store import channel_name
from jaren_jobs.core.commands import Failure
from jaren_jobs.core.settle import Completion, SettleBatch, Snoozing
from jaren_jobs.jobs import engine_of
from tests.backends.postgres.test_round_trips import _on_tables, wire
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

WAIT = 10.0


class Listening:
    """A connection of the test's own, LISTENing on the store's two channels."""

    def __init__(self, pg: PostgresUrl, store: Store) -> None:
        conn = store._backend.db.connection  # type: ignore[attr-defined]
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        self.enqueued = channel_name(schema)
        self.settled = settled_channel(self.enqueued)
        self.conn = psycopg.connect(pg.url, autocommit=True)
        for channel in (self.enqueued, self.settled):
            self.conn.execute(f'LISTEN "{channel}"')

    def received(self) -> list[str]:
        """Every notification delivered so far, by channel (waits briefly for stragglers)."""
        return [n.channel for n in self.conn.notifies(timeout=0.3)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listening(pg: PostgresUrl, store: Store) -> Iterator[Listening]:
    listener = Listening(pg, store)
    try:
        yield listener
    finally:
        listener.close()


def _notifies(sent: list[str]) -> int:
    return sum(statement.count("pg_notify") for statement in sent)


def test_a_batch_of_settlements_sends_one_notify_in_its_own_statements(
    store: Store, listening: Listening
) -> None:
    for name in "abcde":
        store.jobs.enqueue("k", id=name, max_attempts=1)
    listening.received()  # the enqueues' own notifications
    claimed = store.jobs.claim_many(["k"], owner="w", limit=5)
    completions = tuple(Completion(c.lease, '"ok"') for c in claimed[:3])
    failure = Failure(claimed[3].lease, "boom", False, 1.0, 1.0)
    snooze = Snoozing(claimed[4].lease, 60_000)
    with wire(store) as sent:
        answer = engine_of(store.jobs).settle(
            SettleBatch((*completions, failure, snooze)), "settle"
        )
    assert answer.settled == (True,) * 5
    # completions (one statement), the failure, the snooze: three statements, one NOTIFY
    assert len(_on_tables(sent)) == 3, sent
    assert _notifies(sent) == 1
    assert listening.received() == [listening.settled]


def test_a_lone_completion_notifies_in_its_one_round_trip(
    store: Store, listening: Listening
) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    listening.received()
    with wire(store) as sent:
        assert store.jobs.complete(claimed.lease, 1) is True
    assert len(_on_tables(sent)) == 1
    assert _notifies(sent) == 1
    assert listening.received() == [listening.settled]


def test_a_snooze_alone_wakes_nobody_while_the_job_is_not_due(
    store: Store, listening: Listening
) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    listening.received()
    assert store.jobs.snooze(claimed.lease, 60) is True
    assert listening.received() == []  # nothing settled, nothing claimable yet


def test_a_zero_snooze_wakes_the_other_processes_workers(
    store: Store, listening: Listening
) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    listening.received()
    assert store.jobs.snooze(claimed.lease, 0) is True
    assert listening.received() == [listening.enqueued]


def test_the_notify_goes_with_the_commit_never_before(store: Store, listening: Listening) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    listening.received()
    with store.transaction() as tx:
        assert tx.jobs.complete(claimed.lease, "in a tx") is True
        assert listening.received() == []  # not committed: nobody is told
    assert listening.received() == [listening.settled]


def test_cancels_notify_settlement_too(store: Store, listening: Listening) -> None:
    store.jobs.enqueue("k", id="a")
    store.jobs.enqueue("k", id="b")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == "a"
    listening.received()
    assert store.jobs.cancel("b") is True  # queued: no lease needed
    assert listening.received() == [listening.settled]
    assert store.jobs.cancel("a", lease=claimed.lease) is True
    assert listening.received() == [listening.settled]
