"""Paging through a queue loses nothing and repeats nothing, even while it changes.

Hypothesis builds a queue (random ids, kinds, states and payload sizes),
picks a filter, and drains it page by page with random ``limit`` and
``max_bytes``, adding and deleting jobs between pages. Every page must be
exactly the next slice of the filtered rows *as they are when it is read*:
so the pages concatenate to the filtered rows in id order, deleted jobs
vanish, and jobs added past the continuation appear.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaren_jobs import ItemTooLarge, Job, NewJob, Page, Runtime, Store, drain_page, open_store
from jaren_jobs.records import STATES
from tests.conftest import FakeClock, Sequence

KINDS = ("x", "y")
job_ids = st.text(alphabet="abcdefg", min_size=1, max_size=4)
rows = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(KINDS),
        "state": st.sampled_from(STATES),
        # "é" is two UTF-8 bytes: sizes differ from character counts
        "payload": st.text(alphabet="aé", max_size=120),
    }
)

_files = itertools.count()


def open_fresh(directory: Path) -> Store:
    clock = FakeClock()
    seq = Sequence()
    runtime = Runtime(now=clock.now, random=seq.random, uuid=seq.uuid)
    return open_store(directory / f"paging-{next(_files)}.db", runtime=runtime)


def add(store: Store, new: dict[str, dict[str, Any]]) -> None:
    store.jobs.enqueue_many(
        NewJob(spec["kind"], spec["payload"], id=job_id) for job_id, spec in new.items()
    )
    # paging reads rows however they got their state: set it directly
    with store.transaction() as tx:
        for job_id, spec in new.items():
            tx.execute('UPDATE "_jaren_jobs" SET state = ? WHERE id = ?', (spec["state"], job_id))


def delete(store: Store, job_id: str) -> None:
    with store.transaction() as tx:
        tx.execute('DELETE FROM "_jaren_jobs" WHERE id = ?', (job_id,))


def json_bytes(job: Job) -> int:
    text = json.dumps(job.to_dict(), ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8"))


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    initial=st.dictionaries(job_ids, rows, max_size=30),
    state=st.none() | st.sampled_from(STATES),
    kind=st.none() | st.sampled_from(KINDS),
    data=st.data(),
)
def test_pages_concatenate_to_exactly_the_filtered_rows(
    tmp_path: Path,
    initial: dict[str, dict[str, Any]],
    state: str | None,
    kind: str | None,
    data: st.DataObject,
) -> None:
    store = open_fresh(tmp_path)
    try:
        if initial:
            add(store, initial)
        live = {job_id: (spec["kind"], spec["state"]) for job_id, spec in initial.items()}

        def matches(job_id: str) -> bool:
            job_kind, job_state = live[job_id]
            return (state is None or job_state == state) and (kind is None or job_kind == kind)

        never_touched = {job_id for job_id in live if matches(job_id)}
        added_ahead: set[str] = set()  # added past the continuation, and still there
        vanished: set[str] = set()  # deleted past the continuation, not added again
        delivered: list[str] = []
        continuation: str | None = None

        for _ in range(200):
            expected = sorted(j for j in live if j > (continuation or "") and matches(j))
            limit = data.draw(st.integers(1, 3), label="limit")
            max_bytes = data.draw(st.none() | st.integers(250, 900), label="max_bytes")
            page: Page[Job] | None = None
            refusal: ItemTooLarge | None = None
            try:
                page = drain_page(
                    store.jobs.page(state=state, kind=kind, after=continuation),
                    limit=limit,
                    max_bytes=max_bytes,
                    after=continuation,
                )
            except ItemTooLarge as refused:
                refusal = refused
            if refusal is not None:
                # only the very next item, alone over the bound, is refused,
                # and the continuation stays where it was
                event("an item alone was too large")
                assert expected
                assert max_bytes is not None
                first = store.jobs.get(expected[0])
                assert first is not None
                assert json_bytes(first) > max_bytes
                assert refusal.details["item_id"] == expected[0]
                assert refusal.details["continuation"] == continuation
                max_bytes = None
                page = drain_page(
                    store.jobs.page(state=state, kind=kind, after=continuation),
                    limit=limit,
                    after=continuation,
                )

            assert page is not None
            got = [job.id for job in page.items]
            count = len(got)
            # exactly the next slice of the rows as they are now
            assert got == expected[:count]
            if expected:
                assert count >= 1
            if count < min(limit, len(expected)):
                # only the byte bound ends a page early, at an item boundary
                event("the byte bound ended a page")
                assert max_bytes is not None
                following = store.jobs.get(expected[count])
                assert following is not None
                used = sum(json_bytes(job) for job in page.items)
                assert used + json_bytes(following) > max_bytes
            if max_bytes is not None:
                assert sum(json_bytes(job) for job in page.items) <= max_bytes
            assert page.has_more == (len(expected) > count)
            assert page.continuation == (got[-1] if got else continuation)
            for job in page.items:
                assert (job.kind, job.state) == live[job.id]
                assert job == store.jobs.get(job.id)

            delivered += got
            continuation = page.continuation
            if not page.has_more:
                break

            # the queue changes between pages
            for _op in range(data.draw(st.integers(0, 4), label="changes")):
                if live and data.draw(st.booleans(), label="delete?"):
                    victim = data.draw(st.sampled_from(sorted(live)), label="delete")
                    delete(store, victim)
                    del live[victim]
                    never_touched.discard(victim)
                    added_ahead.discard(victim)
                    if victim > (continuation or ""):
                        vanished.add(victim)
                        event("a job was deleted past the continuation")
                else:
                    new_id = data.draw(job_ids, label="add")
                    if new_id in live:
                        continue  # ids are unique: this draw adds nothing
                    spec = data.draw(rows, label="row")
                    add(store, {new_id: spec})
                    live[new_id] = (spec["kind"], spec["state"])
                    vanished.discard(new_id)
                    if new_id > (continuation or "") and matches(new_id):
                        added_ahead.add(new_id)
                        event("a job was added past the continuation")
        else:
            raise AssertionError("paging did not finish")

        # in id order, nothing repeated
        assert delivered == sorted(set(delivered))
        # nothing lost: every matching job that was never deleted, and every
        # matching job added past the continuation and kept, was delivered
        assert never_touched <= set(delivered)
        assert added_ahead <= set(delivered)
        # and nothing deleted before its page was read
        assert not vanished & set(delivered)
    finally:
        store.close()
