"""A real FastAPI app under uvicorn, driven by real HTTP requests (SPEC §11).

The signup endpoint writes a row and enqueues a welcome job inside one async
transaction, and refuses half of the requests *after* the enqueue: exactly
the committed signups must have jobs, and the in-process ``AsyncWorker``
started in the app's lifespan runs each once. This is the scenario that,
through the sync API, committed refused signups and their jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

import jaren_jobs
from tests.harness import Harness

fastapi = pytest.importorskip("fastapi", reason="the dev extra installs fastapi")
uvicorn = pytest.importorskip("uvicorn", reason="the dev extra installs uvicorn")
httpx = pytest.importorskip("httpx", reason="the dev extra installs httpx")

REQUESTS = 200
WAIT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_app(where: dict[str, Any], backend: Harness, ran: list[str]) -> Any:
    state: dict[str, Any] = {}
    insert = backend.app_sql("INSERT INTO signups (email) VALUES (?)")

    async def send_welcome(payload: Any, ctx: jaren_jobs.AsyncJobContext) -> Any:
        await asyncio.sleep(0)
        ran.append(payload["to"])
        return {"sent": payload["to"]}

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with jaren_jobs.open_async_store(**where) as store:
            async with store.transaction() as tx:
                await tx.execute("CREATE TABLE signups (email TEXT PRIMARY KEY)")
            state["store"] = store
            worker = store.jobs.create_worker(
                {"send_welcome": send_welcome}, concurrency=8, poll_seconds=0.05
            )
            async with worker:
                state["worker"] = worker
                yield

    app = fastapi.FastAPI(lifespan=lifespan)

    @app.post("/signup")
    async def signup(body: dict[str, Any]) -> dict[str, Any]:
        store = state["store"]
        async with store.transaction() as tx:
            await tx.execute(insert, [body["email"]])
            await tx.jobs.enqueue("send_welcome", {"to": body["email"]})
            await asyncio.sleep(0)  # other requests run while this transaction is open
            if body["refuse"]:
                raise fastapi.HTTPException(status_code=400, detail="card declined")
        return {"ok": True}

    @app.get("/done")
    async def done() -> dict[str, Any]:
        counts = await state["store"].jobs.counts()
        return {"done": counts.done, "pending": counts.pending, "leased": counts.leased}

    return app


def test_exactly_the_committed_signups_have_jobs_each_run_once(backend: Harness) -> None:
    connect = getattr(backend, "connect", None)
    where: dict[str, Any] = (
        {"connection": connect()}
        if connect is not None
        else {"path": getattr(backend, "url", None) or backend.db_path}
    )
    ran: list[str] = []
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            make_app(where, backend, ran), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn")
    thread.start()
    try:

        async def drive() -> list[int]:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                timeout=WAIT,
                limits=httpx.Limits(max_connections=REQUESTS),
            ) as client:
                for _ in range(500):  # until uvicorn listens
                    try:
                        await client.get("/done")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.02)
                answers = await asyncio.gather(
                    *(
                        client.post(
                            "/signup", json={"email": f"user{n}@example.com", "refuse": n % 2 == 1}
                        )
                        for n in range(REQUESTS)
                    )
                )
                for _ in range(int(WAIT / 0.05)):  # the worker drains what committed
                    state = (await client.get("/done")).json()
                    if state["done"] == REQUESTS // 2:
                        break
                    await asyncio.sleep(0.05)
                return [answer.status_code for answer in answers]

        statuses = asyncio.run(drive())
    finally:
        server.should_exit = True
        thread.join(WAIT)
    assert not thread.is_alive()
    assert statuses == [200 if n % 2 == 0 else 400 for n in range(REQUESTS)]
    good = sorted(f"user{n}@example.com" for n in range(0, REQUESTS, 2))
    assert sorted(r[0] for r in backend.query("SELECT email FROM signups")) == good
    assert sorted(ran) == good  # each committed signup's welcome ran exactly once
    rows = backend.query('SELECT state, payload FROM "_jaren_jobs"')
    assert len(rows) == REQUESTS // 2
    assert {state for state, _ in rows} == {"done"}
