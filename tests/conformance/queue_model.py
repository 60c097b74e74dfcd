"""A pure-Python model of the fenced queue (SPEC sections 2 and 3), for the stateful test.

The model holds one record per job and answers every call the way SPEC says
the store must: a value, or :class:`Refused` naming the exact error class.
It never touches SQLite. Times are integer epoch milliseconds.

Two things the model cannot predict are handed to it by the test after the
engine answered: the identifier an enqueue without ``id`` minted and the
token a claim or renewal minted (both are opaque draws from the injected
``uuid()``; the test checks separately that they are fresh).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from jaren_jobs import (
    DuplicateJob,
    JobsError,
    JobSettled,
    LeaseExpired,
    LeaseRequired,
    LeaseSuperseded,
)

QUEUED = ("pending", "failed")
# the states in which a job holds its unique key (SPEC §12)
HOLDING = ("pending", "failed", "leased")
SETTLED = ("done", "dead", "cancelled")
STATES = ("pending", "leased", "done", "failed", "dead", "cancelled")

# The codes SPEC §4 fixes for each class: checked literally, not read back
# from the classes under test.
CODES: dict[type[JobsError], str] = {
    JobSettled: "JD2065",
    LeaseSuperseded: "JD2066",
    LeaseExpired: "JD2067",
    LeaseRequired: "JD2068",
    DuplicateJob: "JD2090",
}


class Refused(Exception):
    """The model's answer when SPEC says the call must raise ``error``."""

    def __init__(self, error: type[JobsError], why: str) -> None:
        super().__init__(f"{error.__name__}: {why}")
        self.error = error
        self.why = why


# Sentinel the fence check answers when this same attempt settled the row.
_SAME_ATTEMPT = object()


@dataclass
class ModelJob:
    id: str
    kind: str
    payload: Any
    priority: int
    max_attempts: int
    run_at: int
    created_at: int
    updated_at: int
    state: str = "pending"
    attempts: int = 0
    lease_until: int | None = None
    lease_owner: str | None = None
    lease_generation: int = 0
    lease_token: str | None = None
    # the token the current (or last) attempt's claim minted: names that attempt
    claim_token: str | None = None
    # the generation whose attempt settled the row (None: not settled by an attempt)
    settled_generation: int | None = None
    # the claim token of the attempt that settled the row (None: not settled by one)
    settled_by: str | None = None
    # what last_error must contain (None: must be absent)
    last_error: str | None = None
    result: Any = None
    queue: str = "default"
    unique_key: str | None = None

    def claim_key(self) -> tuple[int, int, int, str]:
        # SPEC §3: highest priority first, then run_at, created_at, id
        return (-self.priority, self.run_at, self.created_at, self.id)


@dataclass(frozen=True)
class NewSpec:
    """One job to enqueue, already resolved to model terms."""

    kind: str
    payload: Any
    id: str | None
    priority: int
    max_attempts: int | None
    run_at_ms: int | None = None  # an absolute run_at, already rounded down
    delay_ms: int | None = None
    queue: str = "default"
    unique_key: str | None = None


@dataclass
class QueueModel:
    lease_ms: int
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    jobs: dict[str, ModelJob] = field(default_factory=dict)
    # every lease token ever minted -> the token its attempt's claim minted
    attempt_of: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------ helpers

    def backoff_ms(self, retry: int, draw: float) -> int:
        """SPEC §3: d = min(cap, base * 2**(n-1)), delay = d/2 + random()*d/2; ms rounded down."""
        d = min(self.backoff_cap, self.backoff_base * 2.0 ** (retry - 1))
        return math.floor((d / 2 + draw * d / 2) * 1000)

    def _fence(self, lease: Any, now: int, what: str) -> ModelJob | object:
        """The job if the fence admits ``lease`` now, the same-attempt sentinel, or Refused.

        "This same attempt already settled it" is read from ``settled_generation``
        (the generation whose attempt settled the row), not from the row's
        ``lease_generation`` as SPEC's sentence literally says: an attempt whose
        expired lease was requeued never settled the job, so it is told
        JobSettled, not True. A renewal keeps the generation, so every lease
        of the settling attempt, pre-renewal ones too, gets the idempotent True.
        The attempt is its claim, not just its generation: once a swept id is
        enqueued again its generations start over, and a lease of the old life
        must not pass for the attempt that settled the new one.
        """
        job = self.jobs.get(lease.job_id)
        if job is None:
            raise Refused(JobSettled, f"{what}: job {lease.job_id!r} is unknown")
        if job.state != "leased":
            if job.settled_generation == lease.generation and self.settled_by(job, lease):
                return _SAME_ATTEMPT
            raise Refused(JobSettled, f"{what}: job is {job.state}, not by this attempt")
        if job.lease_token != lease.token:
            raise Refused(LeaseSuperseded, f"{what}: token differs")
        assert job.lease_until is not None
        if job.lease_until <= now:
            raise Refused(LeaseExpired, f"{what}: lease ran out at {job.lease_until} <= {now}")
        return job

    def settled_by(self, job: ModelJob, lease: Any) -> bool:
        """Whether the attempt ``lease`` belongs to is the one that settled ``job``."""
        return job.settled_by is not None and job.settled_by == self.attempt_of.get(lease.token)

    def minted(self, job: ModelJob, token: str, renewal_of: str | None = None) -> None:
        """Record the token a claim (or a renewal of ``renewal_of``) minted for ``job``."""
        job.lease_token = token
        if renewal_of is None:
            job.claim_token = token
            self.attempt_of[token] = token
        else:
            self.attempt_of[token] = self.attempt_of[renewal_of]

    def _settle(self, job: ModelJob, state: str, now: int) -> None:
        job.state = state
        job.lease_until = None
        job.lease_token = None
        job.settled_generation = job.lease_generation
        job.settled_by = job.claim_token
        job.updated_at = now

    # ------------------------------------------------------------ enqueue

    def _new(self, spec: NewSpec, job_id: str, now: int) -> ModelJob:
        if spec.run_at_ms is not None:
            run_at = max(spec.run_at_ms, now)  # a past run_at runs now
        elif spec.delay_ms is not None:
            run_at = now + spec.delay_ms
        else:
            run_at = now
        return ModelJob(
            id=job_id,
            kind=spec.kind,
            payload=spec.payload,
            priority=spec.priority,
            max_attempts=self.max_attempts if spec.max_attempts is None else spec.max_attempts,
            run_at=run_at,
            created_at=now,
            updated_at=now,
            queue=spec.queue,
            unique_key=spec.unique_key,
        )

    def check_enqueue(self, specs: Iterable[NewSpec]) -> None:
        """Refuse a batch naming an existing id, or one id twice; nothing is written."""
        seen: set[str] = set()
        for spec in specs:
            if spec.id is None:
                continue
            if spec.id in self.jobs or spec.id in seen:
                raise Refused(DuplicateJob, f"id {spec.id!r} exists")
            seen.add(spec.id)

    def holder(self, key: str | None, other_than: str | None = None) -> ModelJob | None:
        """The job holding unique ``key`` (pending, failed or leased), if any."""
        if key is None:
            return None
        for job in self.jobs.values():
            if job.unique_key == key and job.state in HOLDING and job.id != other_than:
                return job
        return None

    def add(self, spec: NewSpec, job_id: str, now: int) -> ModelJob:
        """One item of a checked batch whose key no job holds; ``job_id`` is its final id."""
        assert self.holder(spec.unique_key) is None
        job = self._new(spec, job_id, now)
        assert job.id not in self.jobs
        self.jobs[job.id] = job
        return replace(job)

    def enqueue(self, specs: list[NewSpec], ids: list[str], now: int) -> list[ModelJob]:
        """Add a checked batch; ``ids`` are the final ids (minted ones filled in by the test)."""
        created = [self._new(spec, job_id, now) for spec, job_id in zip(specs, ids, strict=True)]
        for job in created:
            assert job.id not in self.jobs
            self.jobs[job.id] = job
        return [replace(job) for job in created]

    # ------------------------------------------------------------ claims

    def claimable(
        self, kinds: Iterable[str], now: int, queues: Iterable[str] | None = None
    ) -> list[ModelJob]:
        wanted = set(kinds)
        from_queues = None if queues is None else set(queues)
        ready = [
            job
            for job in self.jobs.values()
            if job.kind in wanted
            and (from_queues is None or job.queue in from_queues)
            and job.run_at <= now
            and (
                job.state in QUEUED
                or (
                    job.state == "leased" and job.lease_until is not None and job.lease_until <= now
                )
            )
        ]
        return sorted(ready, key=ModelJob.claim_key)

    def claim(
        self,
        kinds: Iterable[str],
        owner: str,
        lease_ms: int,
        now: int,
        queues: Iterable[str] | None = None,
    ) -> ModelJob | None:
        """Lease the next job; its token is left ``None`` for the test to fill in."""
        ready = self.claimable(kinds, now, queues)
        if not ready:
            return None
        job = ready[0]
        job.state = "leased"
        job.lease_owner = owner
        job.lease_until = now + lease_ms
        job.lease_generation += 1
        job.lease_token = None
        job.claim_token = None
        job.settled_generation = None
        job.settled_by = None
        job.attempts += 1
        job.updated_at = now
        return job

    # ------------------------------------------------------------ settling calls

    def renew(self, lease: Any, lease_ms: int, now: int) -> ModelJob:
        """Extend the lease; the new token is left ``None`` for the test to fill in."""
        found = self._fence(lease, now, "renew")
        if found is _SAME_ATTEMPT:
            # SPEC: a settled job cannot be renewed, whoever settled it
            raise Refused(JobSettled, "renew: this attempt already settled the job")
        assert isinstance(found, ModelJob)
        found.lease_until = now + lease_ms
        found.lease_token = None
        found.updated_at = now
        return found

    def complete(self, lease: Any, result: Any, now: int) -> bool:
        found = self._fence(lease, now, "complete")
        if found is _SAME_ATTEMPT:
            return True  # idempotent: writes nothing
        assert isinstance(found, ModelJob)
        self._settle(found, "done", now)
        found.result = result
        return True

    def fail(self, lease: Any, error_text: str, *, retry: bool, draw: float, now: int) -> bool:
        found = self._fence(lease, now, "fail")
        if found is _SAME_ATTEMPT:
            return True
        assert isinstance(found, ModelJob)
        if not retry or found.attempts >= found.max_attempts:
            self._settle(found, "dead", now)
        else:
            run_at = now + self.backoff_ms(found.attempts, draw)
            self._settle(found, "failed", now)
            found.run_at = run_at
        found.last_error = error_text
        return True

    def cancel(self, job_id: str, lease: Any | None, now: int) -> bool:
        if lease is not None:
            if lease.job_id != job_id:
                raise Refused(LeaseRequired, "cancel: the lease belongs to another job")
            found = self._fence(lease, now, "cancel")
            if found is _SAME_ATTEMPT:
                return False  # this attempt already settled it
            assert isinstance(found, ModelJob)
            self._settle(found, "cancelled", now)
            found.last_error = "cancelled"
            return True
        job = self.jobs.get(job_id)
        if job is None:
            raise Refused(JobSettled, "cancel: unknown job")
        if job.state in QUEUED:
            # one write, no lease; the attempt that settled a failed row stays recorded
            job.state = "cancelled"
            job.last_error = "cancelled"  # as the reference engine records it
            job.lease_until = None
            job.lease_token = None
            job.updated_at = now
            return True
        if job.state == "cancelled":
            return False
        if job.state == "leased":
            # even when that lease has expired
            raise Refused(LeaseRequired, "cancel: a claimed job needs its lease")
        raise Refused(JobSettled, f"cancel: job is {job.state}")

    # ------------------------------------------------------------ snooze (SPEC §12)
    #
    # A block of its own: a snooze is a settlement that spends no attempt. The
    # job is pending again at now + delay, the claim's attempt given back, the
    # lease cleared, the generation kept; the row records the attempt that
    # settled it (a repeat of that attempt is idempotent, as for any settlement).

    def snooze(self, lease: Any, delay_ms: int, now: int) -> bool:
        found = self._fence(lease, now, "snooze")
        if found is _SAME_ATTEMPT:
            return True  # idempotent: writes nothing
        assert isinstance(found, ModelJob)
        self._settle(found, "pending", now)
        found.attempts -= 1
        found.lease_owner = None
        found.run_at = now + delay_ms
        return True

    # ------------------------------------------------------------ administration

    def requeue(self, job_id: str, now: int) -> bool:
        job = self.jobs.get(job_id)
        if job is None:
            raise Refused(JobSettled, "requeue: unknown job")
        expired = job.state == "leased" and job.lease_until is not None and job.lease_until <= now
        if job.state in ("dead", "cancelled"):
            held = self.holder(job.unique_key, other_than=job.id)
            if held is not None:
                raise Refused(DuplicateJob, f"requeue: job {held.id!r} now holds the key")
        if job.state in ("failed", "dead", "cancelled") or expired:
            # attempts, generation and last_error are history: kept
            job.state = "pending"
            job.run_at = now
            job.lease_until = None
            job.lease_token = None
            job.lease_owner = None
            job.updated_at = now
            return True
        if job.state == "pending":
            return False
        if job.state == "leased":
            raise Refused(LeaseRequired, "requeue: a live lease is not stolen")
        raise Refused(JobSettled, f"requeue: job is {job.state}")

    def sweep(self, horizon: int, limit: int | None) -> list[str]:
        """Delete settled jobs last changed before ``horizon``, oldest first; the ids swept."""
        old = sorted(
            (
                job
                for job in self.jobs.values()
                if job.state in SETTLED and job.updated_at < horizon
            ),
            key=lambda job: (job.updated_at, job.id),
        )
        if limit is not None:
            old = old[:limit]
        for job in old:
            del self.jobs[job.id]
        return [job.id for job in old]

    def counts(self, queue: str | None = None) -> tuple[dict[str, int], dict[str, int]]:
        by_state = dict.fromkeys(STATES, 0)
        kinds: dict[str, int] = {}
        for job in self.jobs.values():
            if queue is not None and job.queue != queue:
                continue
            by_state[job.state] += 1
            if job.state in QUEUED:
                kinds[job.kind] = kinds.get(job.kind, 0) + 1
        return by_state, kinds
