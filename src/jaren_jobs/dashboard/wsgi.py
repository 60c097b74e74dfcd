"""The WSGI adapter (PEP 3333) and an HTTP Basic wrapper for it."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterable
from typing import Any

from jaren_jobs.dashboard.core import MAX_BODY, SECURITY_HEADERS, Dashboard, Request, Response

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    500: "Internal Server Error",
}


def status_line(status: int) -> str:
    return f"{status} {_REASONS.get(status, 'Status')}"


def _text(value: str) -> str | None:
    """A WSGI "native string" (bytes as latin-1) as the UTF-8 text it carries."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return None


def _plain(status: int, message: str) -> Response:
    return Response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), *SECURITY_HEADERS],
        message.encode("utf-8"),
    )


class DashboardApp:
    """The dashboard as a WSGI application; ``.dashboard`` is its core."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        response = self._answer(environ)
        start_response(status_line(response.status), response.headers)
        if environ.get("REQUEST_METHOD", "GET").upper() == "HEAD":
            return [b""]
        return [response.body]

    def _answer(self, environ: dict[str, Any]) -> Response:
        path = _text(environ.get("PATH_INFO", "") or "/")
        root = _text(environ.get("SCRIPT_NAME", "") or "")
        query = _text(environ.get("QUERY_STRING", "") or "")
        if path is None or root is None or query is None:
            return _plain(400, "the request's path or query is not UTF-8")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _plain(400, "bad Content-Length")
        if length < 0:
            return _plain(400, "bad Content-Length")
        if length > MAX_BODY:
            return _plain(413, f"the request body is larger than {MAX_BODY} bytes")
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_") and isinstance(value, str)
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        request = Request(
            method=str(environ.get("REQUEST_METHOD", "GET")),
            path=path,
            root=root.rstrip("/"),
            query=query,
            headers=headers,
            body=body,
            scheme=str(environ.get("wsgi.url_scheme", "http")),
        )
        return self.dashboard.handle(request)


def basic_auth(app: WsgiApp, username: str, password: str, *, realm: str = "jaren_jobs") -> WsgiApp:
    """``app`` behind HTTP Basic: the credentials are compared in constant time."""
    expected = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", ""))
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "basic" and hmac.compare_digest(
            value.strip().encode("latin-1", "replace"), expected.encode("ascii")
        ):
            return app(environ, start_response)
        start_response(
            status_line(401),
            [
                ("WWW-Authenticate", f'Basic realm="{realm}", charset="UTF-8"'),
                ("Content-Type", "text/plain; charset=utf-8"),
            ],
        )
        return [b"authentication required\n"]

    return guarded
