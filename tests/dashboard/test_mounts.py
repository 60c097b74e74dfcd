"""The dashboard mounted under a prefix in a real Flask app (WSGI) and a real Starlette app
(ASGI, under uvicorn), requested over HTTP, on both databases."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from jaren_jobs import Store
from jaren_jobs.dashboard import create_app, create_asgi_app

from .support import fill, serving

PREFIX = "/ops/jobs"


@contextmanager
def uvicorn_serving(app: Any) -> Iterator[str]:
    """``app`` under uvicorn in a thread, on a socket bound before it starts (so the
    first request waits in the listen queue instead of racing the start-up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn")
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert not thread.is_alive()


def _exercise(base: str, db: Store) -> None:
    """What a mounted dashboard must do: pages, links, assets and actions under the prefix."""
    filled = fill(db)
    with httpx.Client(base_url=base, timeout=30) as client:
        home = client.get("/")
        assert home.status_code == 200
        assert home.text == "the application's own page"
        overview = client.get(PREFIX + "/")
        assert overview.status_code == 200
        assert f'href="{PREFIX}/static/dashboard.css"' in overview.text
        assert f'href="{PREFIX}/jobs?state=dead"' in overview.text
        assert client.get(PREFIX + "/static/dashboard.js").status_code == 200
        cookie = overview.headers["set-cookie"]
        assert f"Path={PREFIX}" in cookie
        assert "HttpOnly" in cookie
        assert client.get(PREFIX + "/api/counts").json()["dead"] == 1
        listed = client.get(PREFIX + "/api/jobs", params={"state": "dead"}).json()
        assert [item["id"] for item in listed["items"]] == [filled.dead]
        page = client.get(PREFIX + "/jobs", params={"state": "pending", "limit": 2})
        assert f'href="{PREFIX}/jobs?state=pending&amp;after=p-1&amp;limit=2"' in page.text
        job = client.get(PREFIX + "/job", params={"id": filled.dead})
        assert "this one is hopeless" in job.text
        token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', job.text)
        assert token is not None
        # the page's own form: redirected back to the job page under the prefix
        answer = client.post(
            PREFIX + "/actions/job",
            data={"csrf_token": token.group(1), "id": filled.dead, "action": "requeue"},
            headers={"Origin": base},
        )
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"].startswith(f"{PREFIX}/job?id={filled.dead}")
        assert db.jobs.get(filled.dead).state == "pending"
        assert client.get(PREFIX + "/api/jobs/nope").status_code == 404


def test_mounted_in_flask(db: Store) -> None:
    flask_app = Flask(__name__)

    @flask_app.route("/")
    def home() -> str:
        return "the application's own page"

    flask_app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        flask_app.wsgi_app, {PREFIX: create_app(db, read_only=False)}
    )
    with serving(flask_app) as base:
        _exercise(base, db)


def test_mounted_in_starlette(db: Store) -> None:
    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the application's own page")

    app = Starlette(
        routes=[Route("/", home), Mount(PREFIX, app=create_asgi_app(db, read_only=False))]
    )
    with uvicorn_serving(app) as base:
        _exercise(base, db)


def test_asgi_app_alone_under_uvicorn(db: Store) -> None:
    fill(db)
    with uvicorn_serving(create_asgi_app(db)) as base, httpx.Client(base_url=base) as client:
        assert client.get("/api/counts").json()["pending"] == 4
        refused = client.post("/api/jobs/work-dead/requeue")
        assert refused.status_code == 403
        assert client.get("/api/jobs", params={"limit": "-1"}).status_code == 400
        assert client.get("/jobs", params={"kind": "\x00"}).status_code == 400
