import sys, threading, traceback, os
from jaren_jobs import NewJob, Outcome, Store
from tests.integration.test_worker import Outcomes

def test_hang(store: Store) -> None:
    count, loops = 20_000, 16
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    peak = [0]
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: None}, concurrency=loops, poll_seconds=3600, on_outcome=outcomes
    )
    original = outcomes.__call__
    def observe(event: Outcome) -> None:
        peak[0] = max(peak[0], worker.stats().in_flight)
        original(event)
    worker._on_outcome = observe
    with worker:
        with outcomes._cond:
            ok = outcomes._cond.wait_for(lambda: len(outcomes.events) >= count, 40)
        if not ok:
            w = worker
            print("HANG at", len(outcomes.events))
            print("counts", store.jobs.counts())
            print("batches", [(b.unstarted(), b.refill, b.running, b.stalled, b.want) for b in w._batches])
            print("held", len(w._held), [(h.job.id, h.cancelled, h.attempt) for h in list(w._held.values())[:10]])
            print("refills", len(w._refills), "posted", len(w._posted), "retrying", len(w._retrying), "busy", w._busy, "attempts", len(w._attempts))
            print("stats", w.stats())
            for tid, frame in sys._current_frames().items():
                name = [t.name for t in threading.enumerate() if t.ident == tid]
                print("---", name); print("".join(traceback.format_stack(frame)[-3:]))
            sys.stdout.flush()
            os._exit(1)
