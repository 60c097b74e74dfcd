# examples/recipes/flask/gunicorn_conf.py
"""gunicorn -c gunicorn_conf.py shop.eager:app — the app imported once, then forked."""

preload_app = True
workers = 2


def post_fork(server, worker):
    # runs in each worker right after fork(), before it serves a request
    from shop import eager  # noqa: PLC0415 (the app module, imported by then)

    eager.reopen_store()
