"""The ASGI adapter: the same core, each request answered on a thread (the store is sync)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from jaren_jobs.dashboard.core import MAX_BODY, SECURITY_HEADERS, Dashboard, Request, Response

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DashboardAsgiApp:
    """The dashboard as an ASGI 3 application; ``.dashboard`` is its core."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        response = await self._answer(scope, receive)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (name.lower().encode("latin-1"), value.encode("latin-1"))
                    for name, value in response.headers
                ],
            }
        )
        body = b"" if scope.get("method") == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, receive: Receive) -> Response:
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return Response(400, list(SECURITY_HEADERS), b"")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                return Response(
                    413,
                    [("Content-Type", "text/plain; charset=utf-8"), *SECURITY_HEADERS],
                    f"the request body is larger than {MAX_BODY} bytes".encode(),
                )
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        root = str(scope.get("root_path", "") or "")
        path = str(scope.get("path", "") or "/")
        # ASGI servers and routers differ on whether ``path`` still holds the mount prefix
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :] or "/"
        try:
            query = bytes(scope.get("query_string", b"")).decode("utf-8")
        except UnicodeDecodeError:
            return Response(
                400,
                [("Content-Type", "text/plain; charset=utf-8"), *SECURITY_HEADERS],
                b"the query string is not UTF-8",
            )
        headers = {
            bytes(name).decode("latin-1").lower(): bytes(value).decode("latin-1")
            for name, value in scope.get("headers", [])
        }
        request = Request(
            method=str(scope.get("method", "GET")),
            path=path if path.startswith("/") else "/" + path,
            root=root.rstrip("/"),
            query=query,
            headers=headers,
            body=b"".join(chunks),
            scheme="https" if scope.get("scheme") == "https" else "http",
        )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.dashboard.handle, request)
