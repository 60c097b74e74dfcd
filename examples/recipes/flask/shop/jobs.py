# examples/recipes/flask/shop/jobs.py
"""The handlers, as a dict of kind -> handler, for any worker: `shop.jobs:HANDLERS`."""

from shop.db import get_store, sql


def send_welcome(payload, ctx):
    # ... call the mail provider here, with ctx.job.id as its idempotency key
    # (an outside effect is at-least-once); then record it exactly once: the
    # row and the job's completion commit in one transaction, and a stale
    # attempt's transaction is refused by the fence and rolls back its row
    with get_store().transaction() as tx:
        tx.execute(
            sql("INSERT INTO welcomes (email, job_id) VALUES (?, ?)"),
            [payload["to"], ctx.job.id],
        )
        tx.jobs.complete(ctx.lease, {"sent": payload["to"]})


HANDLERS = {"send_welcome": send_welcome}
