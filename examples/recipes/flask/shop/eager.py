# examples/recipes/flask/shop/eager.py
"""The same app with its store opened at import, as many apps do.

Fine when each gunicorn worker imports the app itself. Under --preload the
arbiter imports it once and forks: each worker would inherit the arbiter's
store, whose first use raises StoreClosed (JD2091). gunicorn_conf.py's
post_fork hook gives each worker its own.
"""

from flask import Flask, abort, request

import jaren_jobs
from shop.db import DATABASE, sql

store = jaren_jobs.open_store(DATABASE)  # under --preload: the arbiter's
app = Flask(__name__)


def reopen_store():
    """Open this process's own store (called in each forked worker)."""
    global store
    store = jaren_jobs.open_store(DATABASE)


@app.post("/signup")
def signup():
    email = request.get_json()["email"]
    with store.transaction() as tx:
        tx.execute(sql("INSERT INTO signups (email) VALUES (?)"), [email])
        job = tx.jobs.enqueue("send_welcome", {"to": email})
        if email.endswith("@spam.example"):
            abort(400)
    return {"ok": True, "job": job.id}
