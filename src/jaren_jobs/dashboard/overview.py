"""What the overview shows, gathered through the public API only, each read bounded.

``counts()`` and ``due_counts()`` answer the totals in one statement each. What
they cannot say (throughput over the last hour, who holds leases, the oldest
ready job) is read with ``page()`` filtered by state and walked a bounded
number of rows, so the overview costs the same on a table of a million jobs
as on one of a hundred; a walk that hit its bound says so (``truncated``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from jaren_jobs.periodic import Periodic
from jaren_jobs.records import STATES, Job
from jaren_jobs.store import Store

#: the chart: one hour in twelve five-minute buckets
BUCKETS = 12
BUCKET_SECONDS = 300
#: how many rows each bounded walk reads at most
SCAN_CAP = 2000
LEASE_CAP = 200
#: queues discovered from the newest jobs when the app is given none
QUEUE_SAMPLE = 500
MAX_QUEUES = 20


def _now(store: Store) -> datetime:
    return datetime.fromtimestamp(store.runtime.now(), tz=timezone.utc)


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def discover_queues(store: Store, configured: Sequence[str] | None) -> list[str]:
    """The queues to count: the configured ones, else those of the newest jobs (bounded)."""
    if configured is not None:
        return list(configured)[:MAX_QUEUES]
    seen: dict[str, None] = {}
    with store.jobs.page(order="newest", limit=QUEUE_SAMPLE) as jobs:
        for index, job in enumerate(jobs):
            if index >= QUEUE_SAMPLE:
                break
            seen.setdefault(job.queue, None)
    return sorted(seen)[:MAX_QUEUES]


def throughput(store: Store, now: datetime) -> dict[str, Any]:
    """Jobs settled done, and jobs failed or dead, per five-minute bucket of the last hour.

    Counted by each job's last change (``updated_at``): a job that failed twice
    in the hour counts once. Each state's walk reads at most ``SCAN_CAP`` rows,
    newest first, and stops at the first row older than the hour.
    """
    start = now.timestamp() - BUCKETS * BUCKET_SECONDS
    series: dict[str, list[int]] = {"done": [0] * BUCKETS, "failed": [0] * BUCKETS}
    truncated = False
    for state, name in (("done", "done"), ("failed", "failed"), ("dead", "failed")):
        read = 0
        with store.jobs.page(state=state, order="newest", limit=200) as jobs:
            for job in jobs:
                at = job.updated_at.timestamp()
                if at < start:
                    break
                read += 1
                if read > SCAN_CAP:
                    truncated = True
                    break
                index = min(BUCKETS - 1, max(0, int((at - start) // BUCKET_SECONDS)))
                series[name][index] += 1
    return {
        "bucket_seconds": BUCKET_SECONDS,
        "since": _iso(datetime.fromtimestamp(start, tz=timezone.utc)),
        "done": series["done"],
        "failed": series["failed"],
        "truncated": truncated,
    }


def leases(store: Store, now: datetime) -> dict[str, Any]:
    """The leases held now, by owner (owner, count, soonest and latest expiry); bounded."""
    owners: dict[str, dict[str, Any]] = {}
    read = 0
    truncated = False
    with store.jobs.page(state="leased", limit=LEASE_CAP + 1) as jobs:
        for job in jobs:
            read += 1
            if read > LEASE_CAP:
                truncated = True
                break
            owner = job.lease_owner or "(unknown)"
            entry = owners.setdefault(
                owner, {"owner": owner, "leases": 0, "expired": 0, "soonest": None, "latest": None}
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
    rows = []
    for entry in sorted(owners.values(), key=lambda item: str(item["owner"])):
        rows.append({**entry, "soonest": _iso(entry["soonest"]), "latest": _iso(entry["latest"])})
    return {"owners": rows, "truncated": truncated}


def oldest_ready(store: Store, now: datetime) -> dict[str, Any]:
    """The oldest ``run_at`` among ready queued jobs, from a bounded walk in id order.

    No public read orders queued jobs by ``run_at``; the walk reads at most
    ``SCAN_CAP`` pending and failed jobs, and says when it stopped there.
    """
    oldest: Job | None = None
    truncated = False
    for state in ("pending", "failed"):
        with store.jobs.page(state=state, limit=500) as jobs:
            for index, job in enumerate(jobs):
                if index >= SCAN_CAP:
                    truncated = True
                    break
                if job.run_at <= now and (oldest is None or job.run_at < oldest.run_at):
                    oldest = job
    if oldest is None:
        return {"id": None, "age_seconds": None, "truncated": truncated}
    return {
        "id": oldest.id,
        "age_seconds": round((now - oldest.run_at).total_seconds(), 3),
        "truncated": truncated,
    }


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


def overview(
    store: Store, *, queues: Sequence[str] | None, periodic: Sequence[Periodic]
) -> dict[str, Any]:
    """Everything the overview page shows, as JSON (what ``/api/overview`` answers)."""
    now = _now(store)
    counts = store.jobs.counts()
    by_queue = []
    for queue in discover_queues(store, queues):
        counted = store.jobs.counts(queue=queue).to_dict()
        by_queue.append({"queue": queue, **{state: counted[state] for state in STATES}})
    return {
        "now": _iso(now),
        "counts": counts.to_dict(),
        "due": store.jobs.due_counts().to_dict(),
        "queues": by_queue,
        "kinds": sorted(counts.pending_kinds.items()),
        "throughput": throughput(store, now),
        "leases": leases(store, now),
        "oldest_ready": oldest_ready(store, now),
        "periodic": schedules(periodic, now),
    }
