"""What the dashboard tests share: stores on both databases filled with jobs in every
state, and a real HTTP server on 127.0.0.1 serving a WSGI app from a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from jaren_jobs import Store

XSS = "<script>window.__pwned = true</script>"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served over HTTP on 127.0.0.1 (a free port); yields its base URL."""
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@dataclass
class Filled:
    """The ids of the jobs :func:`fill` made, by what they are."""

    pending: list[str]
    leased: str
    done: list[str]
    failed: str
    dead: str
    cancelled: str
    hostile: str


def _boom(message: str) -> Exception:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def fill(store: Store) -> Filled:
    """Jobs in every state, on two queues, with a traceback and a hostile payload.

    pending 4 (one holds ``<script>``), leased 1, done 2, failed 1, dead 1, cancelled 1.
    """
    jobs = store.jobs
    pending = [
        jobs.enqueue("email", {"to": f"user{i}@example.com"}, id=f"p-{i}").id for i in range(3)
    ]
    hostile = jobs.enqueue("email", {"html": XSS}, id="p-hostile").id
    pending.append(hostile)
    for kind in ("work-done-a", "work-done-b", "work-leased", "work-failed", "work-dead"):
        jobs.enqueue(kind, {"n": 1}, id=kind, queue="reports")
    done = []
    for kind in ("work-done-a", "work-done-b"):
        claimed = jobs.claim([kind], owner="worker-a")
        assert claimed is not None
        jobs.complete(claimed.lease, {"ok": True})
        done.append(claimed.id)
    leased = jobs.claim(["work-leased"], owner="worker-b")
    assert leased is not None
    failing = jobs.claim(["work-failed"], owner="worker-a")
    assert failing is not None
    jobs.fail(failing.lease, _boom("the mail server said no"))
    dying = jobs.claim(["work-dead"], owner="worker-a")
    assert dying is not None
    jobs.fail(dying.lease, _boom("this one is hopeless"), retry=False)
    cancelled = jobs.enqueue("email", {"to": "nobody"}, id="c-1").id
    jobs.cancel(cancelled)
    return Filled(
        pending=pending,
        leased=leased.id,
        done=done,
        failed=failing.id,
        dead=dying.id,
        cancelled=cancelled,
        hostile=hostile,
    )
