"""What the overview shows, gathered through the public API only, each read bounded.

``counts()`` and ``due_counts()`` answer the totals (and the oldest ready job's
``run_at``) in one statement each, ``queues()`` the queues of live jobs. What
they cannot say (who holds leases) is read with ``page()`` filtered by state and
walked a bounded number of rows,
and only for states ``counts()`` says are not empty; a walk that hit its bound
says so (``truncated``). Throughput is counted from the stored settled jobs by
``settled_buckets()`` (an index read, bounded by ``SETTLED_CAP``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from jaren_jobs.periodic import Periodic
from jaren_jobs.records import STATES, DueCounts
from jaren_jobs.store import Store

#: the chart: one hour in twelve five-minute buckets
BUCKETS = 12
BUCKET_SECONDS = 300
#: how many settled jobs of a state the chart counts at most (the most recent)
SETTLED_CAP = 50_000
LEASE_CAP = 200
MAX_QUEUES = 20
#: how long the per-queue counts are reused before they are counted again
QUEUE_COUNTS_SECONDS = 30.0


def _now(store: Store) -> datetime:
    return datetime.fromtimestamp(store.runtime.now(), tz=timezone.utc)


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def throughput(store: Store, now: datetime) -> dict[str, Any]:
    """Jobs done and dead-lettered per five minutes over the hour up to ``now``.

    Read from the stored jobs by ``settled_buckets()``: each bucket counts the
    jobs whose settlement (their last change) falls in it, so it shows what
    happened whether or not a dashboard was watching, and forgets what a sweep
    deleted. At most ``SETTLED_CAP`` jobs per state are read, the most recent
    first, so its cost is bounded however busy the queue: past that
    (``truncated``) the older buckets fall short, and the page says so.
    """
    # the window (now - 1 h, now]: a job settled at this very instant is counted
    since = now - timedelta(seconds=BUCKETS * BUCKET_SECONDS) + timedelta(milliseconds=1)
    counted = store.jobs.settled_buckets(
        since=since, bucket_seconds=BUCKET_SECONDS, buckets=BUCKETS, limit=SETTLED_CAP
    )
    return {
        "bucket_seconds": BUCKET_SECONDS,
        "since": _iso(since),
        "done": list(counted.done),
        "failed": list(counted.dead),
        "truncated": bool(counted.truncated & {"done", "dead"}),
        "cap": SETTLED_CAP,
    }


def oldest_ready(now: datetime, due: DueCounts) -> dict[str, Any]:
    """How long the oldest ready job has waited (``due_counts()`` reads its run_at)."""
    oldest = due.oldest_ready_at
    age = None if oldest is None else round((now - oldest).total_seconds(), 3)
    return {"age_seconds": age, "run_at": _iso(oldest)}


def leases(store: Store, now: datetime, leased: int) -> dict[str, Any]:
    """The leases held now, by owner (owner, count, soonest and latest expiry).

    Read only when ``counts()`` says there are any, and at most ``LEASE_CAP``.
    """
    owners: dict[str, dict[str, Any]] = {}
    read = 0
    truncated = False
    if leased:
        with store.jobs.page(state="leased", limit=min(LEASE_CAP, leased) + 1) as jobs:
            for job in jobs:
                read += 1
                if read > LEASE_CAP:
                    truncated = True
                    break
                owner = job.lease_owner or "(unknown)"
                entry = owners.setdefault(
                    owner,
                    {"owner": owner, "leases": 0, "expired": 0, "soonest": None, "latest": None},
                )
                entry["leases"] += 1
                until = job.lease_until
                if until is not None:
                    if until <= now:
                        entry["expired"] += 1
                    if entry["soonest"] is None or until < entry["soonest"]:
                        entry["soonest"] = until
                    if entry["latest"] is None or until > entry["latest"]:
                        entry["latest"] = until
                if read >= leased:
                    break  # every lease counts() reported is seen
    rows = []
    for entry in sorted(owners.values(), key=lambda item: str(item["owner"])):
        rows.append({**entry, "soonest": _iso(entry["soonest"]), "latest": _iso(entry["latest"])})
    return {"owners": rows, "truncated": truncated}


def schedules(periodic: Sequence[Periodic], now: datetime) -> list[dict[str, Any]]:
    """Each periodic schedule and its next tick after now (pure: no database read)."""
    rows = []
    for schedule in periodic:
        every = schedule.every_seconds
        rows.append(
            {
                "name": schedule.name,
                "kind": schedule.kind,
                "queue": schedule.queue,
                "schedule": schedule.cron if schedule.cron is not None else f"every {every:g}s",
                "timezone": schedule.timezone,
                "next": _iso(schedule.next_after(now)),
            }
        )
    return rows


class QueueCounts:
    """``counts(queue=...)`` per queue, kept for ``QUEUE_COUNTS_SECONDS``.

    Each reads every job of the queue from an index (tens of milliseconds for a
    queue of a few hundred thousand jobs), so the overview does not wait for
    them: its page fetches them from ``/api/queues`` after it is drawn, and the
    answer is reused by every poll for a while instead of being counted again
    each time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: float | None = None
        self._names: list[str] = []
        self._rows: list[dict[str, Any]] = []

    def cached(self) -> tuple[list[dict[str, Any]], str | None]:
        with self._lock:
            at = self._at
            rows = list(self._rows)
        return rows, None if at is None else _iso(datetime.fromtimestamp(at, tz=timezone.utc))

    def get(self, store: Store, names: Sequence[str]) -> tuple[list[dict[str, Any]], str | None]:
        now = store.runtime.now()
        with self._lock:
            fresh = (
                self._at is not None
                and now - self._at < QUEUE_COUNTS_SECONDS
                and self._names == list(names)
            )
        if not fresh:
            rows = []
            for queue in names:
                counted = store.jobs.counts(queue=queue).to_dict()
                rows.append({"queue": queue, **{state: counted[state] for state in STATES}})
            with self._lock:
                self._at, self._names, self._rows = now, list(names), rows
        return self.cached()


def queue_names(store: Store, periodic: Sequence[Periodic]) -> list[str]:
    """The queues of live jobs (``queues()``) and of the schedules, sorted, at most
    ``MAX_QUEUES``; a queue with only settled jobs is left out."""
    live = store.jobs.queues(limit=MAX_QUEUES)
    return sorted({*live, *(p.queue for p in periodic)})[:MAX_QUEUES]


def overview(
    store: Store,
    *,
    queues: Sequence[str] | None,
    periodic: Sequence[Periodic],
) -> dict[str, Any]:
    """Everything the overview page shows, as JSON (what ``/api/overview`` answers)."""
    now = _now(store)
    counts = store.jobs.counts()
    due = store.jobs.due_counts()
    held = leases(store, now, counts.leased)
    named = queue_names(store, periodic) if queues is None else list(queues)
    return {
        "now": _iso(now),
        "counts": counts.to_dict(),
        "due": due.to_dict(),
        "queue_names": named[:MAX_QUEUES],
        "kinds": sorted(counts.pending_kinds.items()),
        "throughput": throughput(store, now),
        "leases": held,
        "oldest_ready": oldest_ready(now, due),
        "periodic": schedules(periodic, now),
    }
