# examples/recipes/django/signups/jobs.py
from signups.queue import get_store, sql


def send_welcome(payload, ctx):
    # the record of the welcome and the job's completion commit together
    with get_store().transaction() as tx:
        tx.execute(
            sql("INSERT INTO welcomes (email, job_id) VALUES (?, ?)"),
            [payload["to"], ctx.job.id],
        )
        tx.jobs.complete(ctx.lease, {"sent": payload["to"]})


HANDLERS = {"send_welcome": send_welcome}
