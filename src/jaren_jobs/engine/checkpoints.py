"""Per-attempt checkpoints (SPEC §6).

A :class:`CheckpointStore` is bound to ONE attempt of one job. Every row it
writes is stamped with that attempt's generation, which is what keeps a stale
attempt from erasing a live one's work:

* ``save`` carries the fence, so a superseded or expired attempt writes nothing;
* ``load`` reads generations up to its own, so a re-claimed attempt resumes
  from its predecessor's work;
* ``complete`` prunes only generations up to its own, in the same transaction
  that completes the job, so a failure leaves neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaren_jobs.backend import JobsSession, Missed
from jaren_jobs.codec import check_text, decode_json, encode_json, encode_result
from jaren_jobs.core import fence
from jaren_jobs.errors import JobSettled, StorageError
from jaren_jobs.records import Lease

__all__ = ["CheckpointStore"]


class CheckpointStore:
    """Checkpoints of one attempt; ``run_id`` is the job's id."""

    def __init__(
        self,
        session: JobsSession,
        now_ms: Callable[[], int],
        job_id: str,
        lease: Callable[[], Lease],
        settled: Callable[[], None] | None = None,
    ) -> None:
        # the engine's session and clock, not the engine: checkpoints sit beside
        # the engine in the layers, and neither imports the other's module
        self._session = session
        self._now_ms = now_ms
        self._job_id = job_id
        # a callable, so a worker's store follows the attempt's CURRENT lease
        # across renewals (the generation never changes within an attempt)
        self._lease = lease
        # what a completion's commit calls: the store's wait()ers read again
        self._settled = settled

    @property
    def job_id(self) -> str:
        return self._job_id

    @property
    def generation(self) -> int:
        return self._lease().generation

    def _check_run(self, run_id: object, what: str) -> str:
        if not isinstance(run_id, str):
            raise TypeError(f"{what}: run_id must be a str, got {type(run_id).__name__}")
        if run_id != self._job_id:
            raise ValueError(
                f"{what}: this checkpoint store is bound to job {self._job_id!r}; "
                f"run_id {run_id!r} is another run"
            )
        return run_id

    def load(self, run_id: str) -> dict[str, Any] | None:
        """Node id → value over rows of generation ≤ this attempt's; ``None`` if none."""
        what = "checkpoint load()"
        self._check_run(run_id, what)
        generation = self.generation
        rows = self._session.load_checkpoints(run_id, generation, what)
        if not rows:
            return None
        values: dict[str, Any] = {}
        for node_id, text in rows:
            try:
                values[node_id] = decode_json(text)
            except ValueError as exc:
                raise StorageError(
                    f"{what}: checkpoint {node_id!r} of run {run_id!r} is not JSON ({exc})",
                    run_id=run_id,
                    node_id=node_id,
                ) from exc
        return values

    def save(self, run_id: str, node_id: str, value: Any) -> None:
        """Record one node's value; fenced like any settling call."""
        what = "checkpoint save()"
        self._check_run(run_id, what)
        if not isinstance(node_id, str):
            raise TypeError(f"{what}: node_id must be a non-empty str, got {node_id!r}")
        if node_id == "":
            raise ValueError(f"{what}: node_id must be a non-empty string")
        check_text(node_id, f"{what}: node_id")
        text = encode_json(value, f"{what}: value")
        lease = self._lease()
        answer = self._session.save_checkpoint(lease, run_id, node_id, text, what)
        if isinstance(answer, Missed):
            # a checkpoint is not a settlement: after the job is settled
            # (even by this attempt) there is nothing left to checkpoint
            raise fence.refusal(answer.row, lease, self._now_ms(), what) or JobSettled(
                f"{what} refused: job {lease.job_id!r} is already settled",
                job_id=lease.job_id,
            )

    def complete(self, run_id: str, result: Any = None) -> bool:
        """Complete the job and prune this run's rows (generation ≤ its own): ONE transaction."""
        what = "checkpoint complete()"
        self._check_run(run_id, what)
        text = encode_result(result, what)
        lease = self._lease()
        answer = self._session.complete_run(lease, run_id, text, what)
        if isinstance(answer, Missed):
            refusal = fence.refusal(answer.row, lease, self._now_ms(), what)
            if refusal is not None:
                raise refusal
        elif self._settled is not None:
            self._session.after_commit(self._settled)
        return True
