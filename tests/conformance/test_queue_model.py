"""The queue against its model: a Hypothesis state machine over every engine call.

Each run opens a fresh store on a fake clock with deterministic ``uuid()`` and
``random()``, drives enqueue / enqueue_many / claim / claim_many / renew /
complete / fail / cancel / requeue / sweep and clock moves, and checks after
every step that the database holds exactly what the model
(:mod:`tests.properties.queue_model`) holds, and that every call answered
what the model predicted, down to WHICH refusal. Every lease ever minted is
kept, so stale, superseded, expired and foreign leases keep speaking.

It runs on every backend of :mod:`tests.harness`: one TestCase per backend
(``TestQueueModel_sqlite_file``, ...), and the deterministic walk through
the ``backend`` fixture. ``JAREN_MODEL_EXAMPLES`` sets the number of runs
(default 60 locally, 300 when ``CI`` is set), shared out evenly between the
backends, so that adding one does not add to the suite's time.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jaren_jobs import (
    ClaimedJob,
    Defaults,
    DuplicateJob,
    Job,
    JobsError,
    JobSettled,
    Lease,
    LeaseExpired,
    LeaseRequired,
    LeaseSuperseded,
    NewJob,
    Runtime,
)
from tests.conftest import require_postgres, schema_pool
from tests.harness import HARNESSES, POSTGRES_HARNESSES, Harness, SqliteFile

from .queue_model import (
    CODES,
    QUEUED,
    SETTLED,
    STATES,
    ModelJob,
    NewSpec,
    QueueModel,
    Refused,
)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
START_MS = 1_800_000_000_000

# Small numbers so that leases expire, backoff reaches its cap (at the second
# retry) and attempts run out within a 30-step run.
DEFAULTS = Defaults(
    lease_seconds=2.0, max_attempts=3, backoff_base_seconds=0.5, backoff_cap_seconds=0.75
)
KINDS = ("email", "report")
OWNERS = ("w1", "w2")
QUEUE_NAMES = ("default", "q1")
# explicit ids whose order differs from enqueue order, so the id tie-break matters
ID_POOL = ("m", "c", "x", "a", "q")
# lease lengths in whole ms, so no rounding question arises (None: the default)
LEASE_MS = (None, 1, 500, 1000, 4000)
ADVANCE_MS = (1, 250, 999, 1000, 2000, 3000, 30_000)

_EXAMPLES = os.environ.get("JAREN_MODEL_EXAMPLES")
# in CI, 300 examples per database (SQLite's two harnesses, PostgreSQL's two)
MAX_EXAMPLES = int(_EXAMPLES) if _EXAMPLES else (600 if os.environ.get("CI") else 60)
# the runs are shared out between the backends (each gets at least one)
EXAMPLES_PER_BACKEND = max(1, math.ceil(MAX_EXAMPLES / len(HARNESSES)))


def to_ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    assert value.utcoffset() == timedelta(0), f"{value!r} is not UTC"
    return (value - EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


class MsClock:
    """A manual clock kept in whole milliseconds (so ``now_ms`` is exact)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def now(self) -> float:
        return self.ms / 1000


payloads = st.one_of(
    st.none(), st.integers(-5, 5), st.sampled_from(["hi", "", "é"]), st.just({"n": [1, 2]})
)
# "sync" is never enqueued: a claim may name a kind with no jobs
kind_sets = st.lists(st.sampled_from((*KINDS, "sync")), min_size=1, max_size=3, unique=True)
timings = st.one_of(
    st.none(),
    st.tuples(st.just("delay"), st.sampled_from([0, 1, 1500, 2500])),
    # absolute run_at relative to now, with sub-ms noise that must round down
    st.tuples(st.just("run_at"), st.sampled_from([-5000, -1, 0, 1, 1500]), st.integers(0, 999)),
)
new_specs = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(KINDS),
        "payload": payloads,
        "id": st.one_of(st.none(), st.none(), st.sampled_from(ID_POOL)),
        # mostly equal priorities, so the run_at / created_at / id tie-breaks decide
        "priority": st.sampled_from([0, 0, 0, 1, -1]),
        "max_attempts": st.sampled_from([None, 1, 2, 5]),
        "timing": timings,
        "queue": st.sampled_from(QUEUE_NAMES[:1] * 2 + QUEUE_NAMES[1:]),
        # few keys, so they collide: a held key answers its holder (SPEC §12)
        "unique_key": st.sampled_from([None, None, "u1", "u2"]),
    }
)
# None (every queue) most often; or one or both of the queues
queue_sets = st.one_of(
    st.none(),
    st.none(),
    st.lists(st.sampled_from(QUEUE_NAMES), min_size=1, max_size=2, unique=True),
)
picks = st.integers(0, 2**16)
# live leases are what most calls hold; the rest keep every refusal in play
lease_kinds = st.sampled_from(["live", "live", "live", "settled", "superseded", "orphaned", "any"])


class QueueMachine(RuleBasedStateMachine):
    # the backend a run opens its store on (one subclass per backend, below)
    harness: ClassVar[type[Harness]] = SqliteFile

    def __init__(self, backend: Harness | None = None) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="jaren-model-")
        # Hypothesis makes each run's machine itself; the walk below hands it the fixture's
        self.backend = backend or self._harness()
        self._owns_backend = backend is None
        self.clock = MsClock(START_MS)
        self.draw = 0.5
        self.minted: list[str] = []
        runtime = Runtime(now=self.clock.now, random=lambda: self.draw, uuid=self._uuid)
        # durability="normal": WAL without an fsync per commit keeps 9,000 steps fast;
        # durability is not what this test is about
        self.store = self.backend.open(
            runtime=runtime,
            defaults=DEFAULTS,
            durability="normal",
        )
        self.jobs = self.store.jobs
        self.model = QueueModel(
            lease_ms=round(DEFAULTS.lease_seconds * 1000),
            max_attempts=DEFAULTS.max_attempts,
            backoff_base=DEFAULTS.backoff_base_seconds,
            backoff_cap=DEFAULTS.backoff_cap_seconds,
        )
        self.leases: list[Lease] = []  # every lease ever minted, superseded ones too
        self.known_ids: set[str] = set()  # every id ever enqueued, swept ones too
        self.failures = 0
        self.last: Any = None  # the engine's last answer: a value, or the refusal class

    def _harness(self) -> Harness:
        path = Path(self.directory) / "jobs.db"
        if self.harness in POSTGRES_HARNESSES:
            # a migrated schema of the session's, emptied after the run (tests/pg_schemas.py)
            require_postgres()
            return self.harness(path, schemas=schema_pool())  # type: ignore[call-arg]
        return self.harness(path)

    def teardown(self) -> None:
        try:
            self.store.close()
            if self._owns_backend:
                self.backend.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------ plumbing

    def _uuid(self) -> str:
        value = f"u{len(self.minted):05d}"
        self.minted.append(value)
        return value

    def now(self) -> int:
        # SPEC §1: the clock as integer epoch ms, rounded down
        return math.floor(self.clock.now() * 1000)

    def _both(self, predict: Callable[[], Any], act: Callable[[], Any]) -> tuple[bool, Any, Any]:
        """Ask the model, then the engine; they must agree on refusing and on the class.

        Returns ``(refused, expected, actual)``.
        """
        try:
            expected, refusal = predict(), None
        except Refused as exc:
            expected, refusal = None, exc
        error: JobsError | None = None
        try:
            actual = act()
        except JobsError as exc:
            actual, error = None, exc
        if error is not None:
            if refusal is None:
                raise AssertionError(
                    f"the model expected {expected!r}, the engine refused: {error!r}"
                ) from error
            assert type(error) is refusal.error, (
                f"the model expected {refusal.error.__name__} ({refusal.why}), "
                f"the engine raised {type(error).__name__}: {error}"
            )
            assert error.code == CODES[refusal.error], error.code
            self.last = refusal.error
            return True, None, None
        assert refusal is None, (
            f"the model expected {refusal.error.__name__} ({refusal.why}), "
            f"the engine answered {actual!r}"
        )
        self.last = actual
        return False, expected, actual

    def _fresh_since(self, mark: int) -> set[str]:
        return set(self.minted[mark:])

    def _check_job(self, job: Job, model: ModelJob, where: str) -> None:
        assert isinstance(job, Job), where
        got = {
            "id": job.id,
            "kind": job.kind,
            "payload": job.payload,
            "state": job.state,
            "priority": job.priority,
            "attempts": job.attempts,
            "max_attempts": job.max_attempts,
            "run_at": to_ms(job.run_at),
            "lease_until": to_ms(job.lease_until),
            "lease_owner": job.lease_owner,
            "lease_generation": job.lease_generation,
            "result": job.result,
            "created_at": to_ms(job.created_at),
            "updated_at": to_ms(job.updated_at),
            "queue": job.queue,
            "unique_key": job.unique_key,
            "last_error": job.last_error is not None,
        }
        want = {name: getattr(model, name) for name in got if name != "last_error"}
        want["last_error"] = model.last_error is not None
        assert got == want, f"{where}: job {job.id!r}\n engine {got}\n model  {want}"
        if model.last_error is not None:
            assert job.last_error is not None
            assert model.last_error in job.last_error, (job.last_error, model.last_error)
        # a record anyone can read never carries the capability to settle it
        text = json.dumps(job.to_dict())
        assert "lease_token" not in text
        if model.lease_token is not None:
            assert model.lease_token not in text

    def _check_lease(self, lease: Lease, model: ModelJob, fresh: set[str], where: str) -> None:
        assert isinstance(lease, Lease), where
        assert lease.token in fresh, f"{where}: token {lease.token!r} was not minted by this call"
        assert lease.token not in {old.token for old in self.leases}, f"{where}: reused token"
        assert (lease.job_id, lease.generation, lease.attempt, lease.owner) == (
            model.id,
            model.lease_generation,
            model.attempts,
            model.lease_owner,
        ), f"{where}: {lease!r} vs {model}"
        assert to_ms(lease.expires_at) == model.lease_until, where

    def _spec(self, raw: dict[str, Any]) -> tuple[NewSpec, NewJob]:
        timing = raw["timing"]
        run_at_ms = delay_ms = None
        run_at = delay_seconds = None
        if timing is not None and timing[0] == "delay":
            delay_ms = timing[1]
            delay_seconds = delay_ms / 1000
        elif timing is not None:
            run_at_ms = self.now() + timing[1]
            run_at = from_ms(run_at_ms) + timedelta(microseconds=timing[2])
        spec = NewSpec(
            kind=raw["kind"],
            payload=raw["payload"],
            id=raw["id"],
            priority=raw["priority"],
            max_attempts=raw["max_attempts"],
            run_at_ms=run_at_ms,
            delay_ms=delay_ms,
            queue=raw.get("queue", "default"),
            unique_key=raw.get("unique_key"),
        )
        new = NewJob(
            raw["kind"],
            raw["payload"],
            id=raw["id"],
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=raw["max_attempts"],
            priority=raw["priority"],
            queue=raw.get("queue", "default"),
            unique_key=raw.get("unique_key"),
        )
        return spec, new

    def _pick_lease(self, pick: int, which: str) -> Lease:
        """A lease from the bag, steered toward one class so every fence branch is met.

        ``live``: the job's current token; ``settled``: an attempt that settled its
        job (any of its leases, pre-renewal ones too); ``superseded``: the job is
        leased under another token (a renewal or a rescuing claim); ``orphaned``:
        the job is not leased and this attempt did not settle it (requeued,
        settled by another, swept); ``any``: the whole bag. An empty class
        falls back to the whole bag.
        """
        classes: dict[str, list[Lease]] = {
            "live": [],
            "settled": [],
            "superseded": [],
            "orphaned": [],
        }
        for lease in self.leases:
            job = self.model.jobs.get(lease.job_id)
            if job is None:
                classes["orphaned"].append(lease)
            elif job.state == "leased":
                same = job.lease_token == lease.token
                classes["live" if same else "superseded"].append(lease)
            elif job.settled_generation == lease.generation and self.model.settled_by(job, lease):
                classes["settled"].append(lease)
            else:
                classes["orphaned"].append(lease)
        chosen = classes.get(which) or self.leases
        return chosen[pick % len(chosen)]

    def _pick_id(self, pick: int, fit: Callable[[ModelJob], bool] | None = None) -> str:
        """A job id; with ``fit``, one whose job the call would act on (if there is one).

        Without it, swept ids and one that never existed are candidates too.
        """
        if fit is not None:
            fitting = sorted(job.id for job in self.model.jobs.values() if fit(job))
            if fitting:
                return fitting[pick % len(fitting)]
        candidates = sorted(self.known_ids | {"ghost"})
        return candidates[pick % len(candidates)]

    # ------------------------------------------------------------ enqueue

    def _enqueue(self, raws: list[dict[str, Any]], many: bool) -> None:
        pairs = [self._spec(raw) for raw in raws]
        specs = [spec for spec, _ in pairs]
        now = self.now()
        mark = len(self.minted)

        def act() -> list[Job]:
            if many:
                return self.jobs.enqueue_many([new for _, new in pairs])
            new = pairs[0][1]
            return [
                self.jobs.enqueue(
                    new.kind,
                    new.payload,
                    id=new.id,
                    run_at=new.run_at,
                    delay_seconds=new.delay_seconds,
                    max_attempts=new.max_attempts,
                    priority=new.priority,
                    queue=new.queue,
                    unique_key=new.unique_key,
                )
            ]

        refused, _, created = self._both(lambda: self.model.check_enqueue(specs), act)
        if refused:
            return
        assert isinstance(created, list)
        assert len(created) == len(specs)
        fresh = self._fresh_since(mark)
        # item by item, as SPEC §12 says: a key held (by an older job, or an earlier
        # item of this batch) answers its holder and writes nothing
        for spec, job in zip(specs, created, strict=True):
            held = self.model.holder(spec.unique_key)
            if held is not None:
                assert job.id == held.id, f"key {spec.unique_key!r}: {job.id!r} vs {held.id!r}"
                self._check_job(job, held, "enqueue (a held key)")
                continue
            if spec.id is None:
                # a minted id: drawn from the runtime during this call, never seen before
                assert job.id in fresh, job.id
                assert job.id not in self.known_ids
            else:
                assert job.id == spec.id
            self._check_job(job, self.model.add(spec, job.id, now), "enqueue")
            self.known_ids.add(job.id)

    @rule(raw=new_specs)
    def enqueue(self, raw: dict[str, Any]) -> None:
        self._enqueue([raw], many=False)

    @rule(raws=st.lists(new_specs, min_size=1, max_size=3))
    def enqueue_many(self, raws: list[dict[str, Any]]) -> None:
        self._enqueue(raws, many=True)

    # ------------------------------------------------------------ claims

    def _lease_args(self, lease_ms: int | None) -> tuple[int, float | None]:
        if lease_ms is None:
            return self.model.lease_ms, None
        return lease_ms, lease_ms / 1000

    def _record_claims(self, claimed: list[ClaimedJob], predicted: list[ModelJob], mark: int):
        fresh = self._fresh_since(mark)
        assert [c.id for c in claimed] == [m.id for m in predicted], (
            f"claim order: engine {[c.id for c in claimed]}, model {[m.id for m in predicted]}"
        )
        for got, model in zip(claimed, predicted, strict=True):
            assert isinstance(got, ClaimedJob)
            self.model.minted(model, got.lease.token)
            self._check_job(got, model, "claim")
            self._check_lease(got.lease, model, fresh, "claim")
            self.leases.append(got.lease)

    @precondition(lambda self: self.model.jobs)
    @rule(
        kinds=kind_sets,
        owner=st.sampled_from(OWNERS),
        lease_ms=st.sampled_from(LEASE_MS),
        queues=queue_sets,
    )
    def claim(
        self,
        kinds: list[str],
        owner: str,
        lease_ms: int | None,
        queues: list[str] | None = None,
    ) -> None:
        ms, seconds = self._lease_args(lease_ms)
        now = self.now()
        mark = len(self.minted)
        _, predicted, got = self._both(
            lambda: self.model.claim(kinds, owner, ms, now, queues),
            lambda: self.jobs.claim(kinds, owner=owner, lease_seconds=seconds, queues=queues),
        )
        if predicted is None:
            assert got is None, f"the model found nothing to claim, the engine claimed {got!r}"
            return
        assert got is not None, f"the model claims {predicted.id!r}, the engine found nothing"
        self._record_claims([got], [predicted], mark)

    @precondition(lambda self: self.model.jobs)
    @rule(
        kinds=kind_sets,
        owner=st.sampled_from(OWNERS),
        limit=st.integers(1, 4),
        lease_ms=st.sampled_from(LEASE_MS),
        queues=queue_sets,
    )
    def claim_many(
        self,
        kinds: list[str],
        owner: str,
        limit: int,
        lease_ms: int | None,
        queues: list[str] | None = None,
    ) -> None:
        ms, seconds = self._lease_args(lease_ms)
        now = self.now()
        mark = len(self.minted)

        def predict() -> list[ModelJob]:
            out = []
            for _ in range(limit):
                job = self.model.claim(kinds, owner, ms, now, queues)
                if job is None:
                    break
                out.append(job)
            return out

        _, predicted, got = self._both(
            predict,
            lambda: self.jobs.claim_many(
                kinds, owner=owner, limit=limit, lease_seconds=seconds, queues=queues
            ),
        )
        assert isinstance(got, list)
        self._record_claims(got, predicted, mark)

    # ------------------------------------------------------------ settling calls

    @precondition(lambda self: self.leases)
    @rule(pick=picks, which=lease_kinds, lease_ms=st.sampled_from(LEASE_MS))
    def renew(self, pick: int, which: str, lease_ms: int | None) -> None:
        self.do_renew(self._pick_lease(pick, which), lease_ms)

    def do_renew(self, lease: Lease, lease_ms: int | None = None) -> None:
        ms, seconds = self._lease_args(lease_ms)
        now = self.now()
        mark = len(self.minted)
        refused, model, renewed = self._both(
            lambda: self.model.renew(lease, ms, now),
            lambda: self.jobs.renew(lease, lease_seconds=seconds),
        )
        if refused:
            return
        self.model.minted(model, renewed.token, renewal_of=lease.token)
        self._check_lease(renewed, model, self._fresh_since(mark), "renew")
        assert (renewed.generation, renewed.attempt) == (lease.generation, lease.attempt)
        self.leases.append(renewed)

    @precondition(lambda self: self.leases)
    @rule(pick=picks, which=lease_kinds, result=payloads)
    def complete(self, pick: int, which: str, result: Any) -> None:
        self.do_complete(self._pick_lease(pick, which), result)

    def do_complete(self, lease: Lease, result: Any = None) -> None:
        now = self.now()
        refused, expected, answer = self._both(
            lambda: self.model.complete(lease, result, now),
            lambda: self.jobs.complete(lease, result),
        )
        if not refused:
            assert answer is expected, (answer, expected)

    # ---- snooze (SPEC §12): a block of its own

    @precondition(lambda self: self.leases)
    @rule(pick=picks, which=lease_kinds, delay_ms=st.sampled_from([0, 1, 500, 60_000]))
    def snooze(self, pick: int, which: str, delay_ms: int) -> None:
        self.do_snooze(self._pick_lease(pick, which), delay_ms)

    def do_snooze(self, lease: Lease, delay_ms: int = 0) -> None:
        now = self.now()
        refused, expected, answer = self._both(
            lambda: self.model.snooze(lease, delay_ms, now),
            lambda: self.jobs.snooze(lease, delay_ms / 1000),
        )
        if not refused:
            assert answer is expected, (answer, expected)

    # ---- end of snooze

    @precondition(lambda self: self.leases)
    @rule(
        pick=picks,
        which=lease_kinds,
        retry=st.sampled_from([True, True, True, False]),
        draw=st.sampled_from([0.0, 0.25, 0.5, 0.999]),
    )
    def fail(self, pick: int, which: str, retry: bool, draw: float) -> None:
        self.do_fail(self._pick_lease(pick, which), retry, draw)

    def do_fail(self, lease: Lease, retry: bool = True, draw: float = 0.5) -> None:
        now = self.now()
        self.draw = draw
        self.failures += 1
        # delimited, so "<boom-1>" cannot be found inside "<boom-12>"
        text = f"<boom-{self.failures}>"
        error = ValueError(text)
        refused, expected, answer = self._both(
            lambda: self.model.fail(lease, text, retry=retry, draw=draw, now=now),
            lambda: self.jobs.fail(lease, error, retry=retry),
        )
        if not refused:
            assert answer is expected, (answer, expected)

    @precondition(lambda self: self.leases)
    @rule(
        pick=picks,
        which=lease_kinds,
        call=st.sampled_from(["renew", "complete", "fail", "cancel"]),
        given=st.sampled_from(["id", "owner", "token"]),
    )
    def settle_without_lease(self, pick: int, which: str, call: str, given: str) -> None:
        """An id, an owner or a bare token where a lease belongs: LeaseRequired, nothing written."""
        lease = self._pick_lease(pick, which)
        stand_in = {"id": lease.job_id, "owner": lease.owner, "token": lease.token}[given]
        act: Callable[[], Any] = {
            "renew": lambda: self.jobs.renew(stand_in),
            "complete": lambda: self.jobs.complete(stand_in, 1),
            "fail": lambda: self.jobs.fail(stand_in, "x"),
            "cancel": lambda: self.jobs.cancel(lease.job_id, lease=stand_in),
        }[call]

        def predict() -> None:
            raise Refused(LeaseRequired, "not a Lease")

        self._both(predict, act)

    # ------------------------------------------------------------ cancel / requeue / sweep

    @precondition(lambda self: self.known_ids)
    @rule(pick=picks, fit=st.booleans())
    def cancel_queued(self, pick: int, fit: bool) -> None:
        self.do_cancel(self._pick_id(pick, (lambda job: job.state in QUEUED) if fit else None))

    def do_cancel(self, job_id: str, lease: Lease | None = None) -> None:
        now = self.now()
        refused, expected, answer = self._both(
            lambda: self.model.cancel(job_id, lease, now),
            lambda: self.jobs.cancel(job_id, lease=lease),
        )
        if not refused:
            assert answer is expected, (answer, expected)

    @precondition(lambda self: self.leases)
    @rule(pick=picks, which=lease_kinds, foreign=st.booleans(), other=picks)
    def cancel_with_lease(self, pick: int, which: str, foreign: bool, other: int) -> None:
        lease = self._pick_lease(pick, which)
        self.do_cancel(self._pick_id(other) if foreign else lease.job_id, lease)

    @precondition(lambda self: self.known_ids)
    @rule(pick=picks, fit=st.booleans())
    def requeue(self, pick: int, fit: bool) -> None:
        now = self.now()

        def movable(job: ModelJob) -> bool:
            expired = job.state == "leased" and (job.lease_until or 0) <= now
            return expired or job.state in ("failed", "dead", "cancelled")

        self.do_requeue(self._pick_id(pick, movable if fit else None))

    def do_requeue(self, job_id: str) -> None:
        now = self.now()
        refused, expected, answer = self._both(
            lambda: self.model.requeue(job_id, now), lambda: self.jobs.requeue(job_id)
        )
        if not refused:
            assert answer is expected, (answer, expected)

    @precondition(lambda self: any(job.state in SETTLED for job in self.model.jobs.values()))
    @rule(
        offset=st.sampled_from([-5000, -1000, -1, 0, 1]),
        limit=st.one_of(st.none(), st.integers(1, 3)),
    )
    def sweep(self, offset: int, limit: int | None) -> None:
        horizon = self.now() + offset
        _, swept, count = self._both(
            lambda: self.model.sweep(horizon, limit),
            lambda: self.jobs.sweep(settled_before=from_ms(horizon), limit=limit),
        )
        assert count == len(swept), f"sweep removed {count}, the model {swept}"

    # ------------------------------------------------------------ time

    @rule(ms=st.sampled_from(ADVANCE_MS))
    def advance(self, ms: int) -> None:
        self.clock.ms += ms

    @precondition(
        lambda self: any(
            job.state == "leased" and job.lease_until is not None and job.lease_until > self.now()
            for job in self.model.jobs.values()
        )
    )
    @rule(pick=picks, edge=st.sampled_from([-1, 0]))
    def advance_to_lease_edge(self, pick: int, edge: int) -> None:
        """Stand on the last valid ms of a live lease (-1) or the first expired one (0)."""
        live = sorted(
            job.lease_until
            for job in self.model.jobs.values()
            if job.state == "leased"
            and job.lease_until is not None
            and job.lease_until > self.now()
        )
        target = live[pick % len(live)] + edge
        self.clock.ms = max(self.clock.ms, target)

    # ------------------------------------------------------------ the database equals the model

    @invariant()
    def database_equals_model(self) -> None:
        for job_id in sorted(self.known_ids | {"ghost"}):
            model = self.model.jobs.get(job_id)
            job = self.jobs.get(job_id)
            if model is None:
                assert job is None, f"{job_id!r} should not exist (swept or never enqueued)"
            else:
                assert job is not None, f"{job_id!r} is missing from the database"
                self._check_job(job, model, "get")
        counts = self.jobs.counts()
        by_state, kinds = self.model.counts()
        assert {state: getattr(counts, state) for state in STATES} == by_state
        assert dict(counts.pending_kinds) == kinds
        # one queue's counts (the default queue's are the rest; one read per step is enough)
        counts = self.jobs.counts(queue="q1")
        by_state, kinds = self.model.counts("q1")
        assert {state: getattr(counts, state) for state in STATES} == by_state
        assert dict(counts.pending_kinds) == kinds


def _model_test_for(harness: type[Harness]) -> Any:
    """The state machine run as a TestCase on one backend."""
    name = harness.name.replace("-", "_")
    machine = type(f"QueueMachine_{name}", (QueueMachine,), {"harness": harness})
    # TestCase is made (and cached) per machine class, so each gets its own settings
    machine.TestCase.settings = settings(
        max_examples=EXAMPLES_PER_BACKEND,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return machine.TestCase


# TestQueueModel_sqlite_file, TestQueueModel_sqlite_connection, ...: one per backend
for _harness in HARNESSES:
    globals()[f"TestQueueModel_{_harness.name.replace('-', '_')}"] = _model_test_for(_harness)


def _raw(job_id: str, **overrides: Any) -> dict[str, Any]:
    raw = {
        "kind": "email",
        "payload": None,
        "id": job_id,
        "priority": 0,
        "max_attempts": None,
        "timing": None,
    }
    raw.update(overrides)
    return raw


def test_fence_paths_walked_once(backend: Harness) -> None:
    """The fence paths that matter most, walked deterministically through the same machine.

    Random runs meet each of these many times; this walk guarantees every run
    of the suite meets each at least once, with the model and the database
    compared after every step exactly as in the random runs.
    """
    machine = QueueMachine(backend)
    try:

        def step(call: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
            call(*args, **kwargs)
            machine.database_equals_model()
            return machine.last

        # one attempt renewed, then settled: every one of its leases settles again idempotently
        step(machine.enqueue, _raw("a"))
        assert isinstance(step(machine.claim, ["email"], "w1", None), ClaimedJob)
        first = machine.leases[-1]
        assert isinstance(step(machine.do_renew, first), Lease)
        renewed = machine.leases[-1]
        assert step(machine.do_complete, first, "early") is LeaseSuperseded
        assert step(machine.do_complete, renewed, "ok") is True
        assert step(machine.do_complete, first, "again") is True  # the pre-renewal lease
        assert step(machine.do_fail, renewed) is True
        assert step(machine.do_cancel, "a", first) is False
        assert step(machine.do_renew, first) is JobSettled
        assert step(machine.do_requeue, "a") is JobSettled  # done is not re-run

        # an expired lease: LeaseExpired; requeued, its attempt never settled it: JobSettled
        step(machine.enqueue, _raw("b"))
        step(machine.claim, ["email"], "w1", 500)
        expired = machine.leases[-1]
        step(machine.advance, 500)  # lease_until == now: expired
        assert step(machine.do_complete, expired) is LeaseExpired
        assert step(machine.do_cancel, "b") is LeaseRequired  # claimed: even an expired lease
        assert step(machine.do_requeue, "b") is True
        assert step(machine.do_complete, expired) is JobSettled
        assert step(machine.do_fail, expired) is JobSettled

        # a crashed attempt is rescued by a new claim; the old lease is superseded
        step(machine.claim, ["email"], "w1", 500)
        crashed = machine.leases[-1]
        step(machine.advance, 1000)
        rescued = step(machine.claim, ["email"], "w2", None)
        assert isinstance(rescued, ClaimedJob)
        assert (rescued.id, rescued.attempts, rescued.lease_generation) == ("b", 3, 3)
        assert step(machine.do_complete, crashed) is LeaseSuperseded
        assert step(machine.do_cancel, "a", rescued.lease) is LeaseRequired  # foreign lease

        # a retry with backoff, then a second retry at the cap, then dead-lettering
        step(machine.enqueue, _raw("c", kind="report", max_attempts=3))
        for attempt in (1, 2):
            step(machine.claim, ["report"], "w1", None)
            assert step(machine.do_fail, machine.leases[-1], True, 0.999) is True
            assert machine.model.jobs["c"].state == "failed"
            # not claimable until the backoff (499 ms, then 749 ms at the cap) has passed
            assert machine.model.claimable(["report"], machine.now()) == []
            assert step(machine.claim, ["report"], "w2", None) is None
            step(machine.advance, 750)
            ready = machine.model.claimable(["report"], machine.now())
            assert [job.id for job in ready] == ["c"], attempt
        step(machine.claim, ["report"], "w1", None)
        assert step(machine.do_fail, machine.leases[-1], True, 0.0) is True
        assert machine.model.jobs["c"].state == "dead"
        assert step(machine.sweep, 1, None) == 2  # a (done) and c (dead); b is leased

        # "a" again, swept and enqueued anew: its generations start over, and the
        # old life's leases do not pass for the attempt that settled the new one
        step(machine.enqueue, _raw("a"))
        again = step(machine.claim, ["email"], "w1", None)
        assert isinstance(again, ClaimedJob)
        assert (again.id, again.lease_generation) == ("a", first.generation)
        assert step(machine.do_complete, machine.leases[-1], "new life") is True
        for stale in (first, renewed):
            assert step(machine.do_complete, stale, "stale") is JobSettled
            assert step(machine.do_fail, stale) is JobSettled
            assert step(machine.do_cancel, "a", stale) is JobSettled
        assert step(machine.do_complete, machine.leases[-1], "again") is True
    finally:
        machine.teardown()


def test_queue_and_unique_key_paths_walked_once(backend: Harness) -> None:
    """SPEC §12's paths through the same machine: a held key answers its holder (also
    within one batch), a settled one frees it, a requeue that would take a key another
    job holds is refused, and claims by queue take only those queues."""
    machine = QueueMachine(backend)
    try:

        def step(call: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
            call(*args, **kwargs)
            machine.database_equals_model()
            return machine.last

        held = step(machine.enqueue, _raw("k1", unique_key="u1", queue="q1"))[0]
        assert held.id == "k1"
        assert [j.id for j in step(machine.enqueue, _raw(None, unique_key="u1"))] == ["k1"]
        batch = step(
            machine.enqueue_many,
            [_raw(None, unique_key="u2"), _raw("k3", unique_key="u2"), _raw("k4")],
        )
        assert batch[1].id == batch[0].id
        assert machine.jobs.get("k3") is None
        # claims by queue
        # (one instant: the id decides, "k4" < the minted "u…")
        assert step(machine.claim, ["email"], "w1", None, ["default"]).id == "k4"
        assert step(machine.claim, ["email"], "w1", None, ["default"]).id == batch[0].id
        assert step(machine.claim, ["email"], "w1", None, ["default"]) is None
        claimed = step(machine.claim, ["email"], "w2", None, ["q1"])
        assert claimed.id == "k1"
        # leased: still held
        assert [j.id for j in step(machine.enqueue, _raw("k5", unique_key="u1"))] == ["k1"]
        assert step(machine.do_cancel, "k1", claimed.lease) is True
        # cancelled: free; the new holder then bars the old job's requeue
        assert [j.id for j in step(machine.enqueue, _raw("k6", unique_key="u1"))] == ["k6"]
        assert step(machine.do_requeue, "k1") is DuplicateJob
        assert step(machine.do_cancel, "k6") is True
        assert step(machine.do_requeue, "k1") is True
    finally:
        machine.teardown()


def test_snooze_paths_walked_once(backend: Harness) -> None:
    """The snooze paths (SPEC §12), walked deterministically through the same machine:
    the attempt given back, the fence's three refusals, the idempotent repeat."""
    machine = QueueMachine(backend)
    try:

        def step(call: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
            call(*args, **kwargs)
            machine.database_equals_model()
            return machine.last

        step(machine.enqueue, _raw("s", max_attempts=1))
        for _ in range(3):  # max_attempts=1, snoozed again and again: never dead
            assert isinstance(step(machine.claim, ["email"], "w1", None), ClaimedJob)
            held = machine.leases[-1]
            assert step(machine.do_snooze, held, 500) is True
            assert machine.model.jobs["s"].attempts == 0
            assert step(machine.do_snooze, held, 60_000) is True  # a repeat: idempotent
            assert step(machine.claim, ["email"], "w2", None) is None  # not due yet
            step(machine.advance, 500)
        assert isinstance(step(machine.claim, ["email"], "w1", 500), ClaimedJob)
        current = machine.leases[-1]
        assert step(machine.do_snooze, held, 0) is LeaseSuperseded  # an older attempt's
        assert isinstance(step(machine.do_renew, current), Lease)
        assert step(machine.do_snooze, current, 0) is LeaseSuperseded  # the pre-renewal lease
        renewed = machine.leases[-1]
        step(machine.advance, 30_000)
        assert step(machine.do_snooze, renewed, 0) is LeaseExpired
        assert step(machine.do_requeue, "s") is True
        assert step(machine.do_snooze, renewed, 0) is JobSettled
        step(machine.claim, ["email"], "w1", None)
        assert step(machine.do_complete, machine.leases[-1], "done at last") is True
        # the expired attempt was spent (requeue keeps the history); no snooze was
        assert machine.model.jobs["s"].attempts == 2
    finally:
        machine.teardown()
