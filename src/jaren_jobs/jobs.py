"""``store.jobs`` and ``tx.jobs``: :class:`Jobs`, the engine and the workers built over it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jaren_jobs.engine.engine import JobEngine, session_of
from jaren_jobs.periodic import Periodic
from jaren_jobs.records import Lease, Outcome
from jaren_jobs.worker import Handler, Worker, WorkerHost, create_worker

__all__ = ["Jobs"]


class Jobs(JobEngine):
    """``store.jobs`` and ``tx.jobs``: the engine, and workers built over it (SPEC §3, §7)."""

    def create_worker(
        self,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 1,
        poll_seconds: float | None = None,
        lease_seconds: float | None = None,
        owner: str | None = None,
        renew: bool = True,
        on_outcome: Callable[[Outcome], Any] | None = None,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
        stop_grace_seconds: float | None = None,
        on_renewal: Callable[[Lease], Any] | None = None,
        on_idle: Callable[[], Any] | None = None,
        periodic: Sequence[Periodic] | None = None,
        queues: Iterable[str] | None = None,
    ) -> Worker:
        """A worker running ``handlers`` over this store, not started (SPEC §7).

        Its own database calls are root-scoped and tracked even when it is
        created through ``tx.jobs``: a worker never joins a transaction's fate.
        ``periodic``: :class:`~jaren_jobs.Periodic` schedules whose ticks it
        enqueues (SPEC §12).
        """
        return self.worker_for_host(
            handlers,
            None,
            concurrency=concurrency,
            poll_seconds=poll_seconds,
            lease_seconds=lease_seconds,
            owner=owner,
            renew=renew,
            on_outcome=on_outcome,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            stop_grace_seconds=stop_grace_seconds,
            on_renewal=on_renewal,
            on_idle=on_idle,
            periodic=periodic,
            queues=queues,
        )

    def worker_for_host(
        self, handlers: Mapping[str, Handler], host: WorkerHost | None, **options: Any
    ) -> Worker:
        """:meth:`create_worker` for a host: an AsyncWorker builds its thread worker here,
        giving itself as the host of its queue runs, renewals and grace end."""
        # other processes' enqueues wake it too, where the database can say so
        backend = session_of(self).store_backend
        backend.wake_on_commits(self._hub.wake)
        # another process's cancel(id, force=True) of a job it holds: renew it now
        backend.wake_on_cancel_requests(self._hub.cancel_requested)
        return create_worker(self, self._hub, handlers, host=host, **options)
