# examples/recipes/flask/shop/web.py
"""The Flask app: a signup and its welcome job commit together, or neither does."""

from flask import Flask, abort, request

from shop.db import get_store, sql

app = Flask(__name__)


@app.post("/signup")
def signup():
    email = request.get_json()["email"]
    with get_store().transaction() as tx:
        tx.execute(sql("INSERT INTO signups (email) VALUES (?)"), [email])
        job = tx.jobs.enqueue("send_welcome", {"to": email})
        if email.endswith("@spam.example"):
            abort(400)  # raises inside the transaction: the row and the job roll back
    return {"ok": True, "job": job.id}
