"""``jaren-jobs dashboard``: the dashboard (SPEC §15) served by the standard library's
WSGI server, one thread per request.

It binds 127.0.0.1 unless told otherwise, and refuses any other address unless
HTTP Basic credentials are set (``JAREN_JOBS_DASHBOARD_USER`` and
``JAREN_JOBS_DASHBOARD_PASSWORD``) or ``--insecure`` says the network in front
of it is trusted. With credentials set, every request needs them, on loopback too.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
import threading
from socketserver import ThreadingMixIn
from types import FrameType
from typing import Any, TextIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from jaren_jobs.cli.arguments import EXIT_OK, CliError
from jaren_jobs.cli.opening import opened
from jaren_jobs.dashboard import basic_auth, create_app

USER_VARIABLE = "JAREN_JOBS_DASHBOARD_USER"
PASSWORD_VARIABLE = "JAREN_JOBS_DASHBOARD_PASSWORD"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # one access line per request on stderr, as the worker logs there too
        sys.stderr.write(f"jaren-jobs dashboard: {self.address_string()} {format % args}\n")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _credentials() -> tuple[str, str] | None:
    user = os.environ.get(USER_VARIABLE)
    password = os.environ.get(PASSWORD_VARIABLE)
    if not user and not password:
        return None
    if not user or not password:
        raise CliError(f"set both {USER_VARIABLE} and {PASSWORD_VARIABLE}, or neither")
    if ":" in user:
        raise CliError(f"{USER_VARIABLE} cannot hold ':' (HTTP Basic splits on it)")
    return user, password


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def cmd_dashboard(args: argparse.Namespace, stream: TextIO) -> int:
    """Serve the dashboard until SIGINT or SIGTERM."""
    host: str = args.host
    port: int = args.port
    if not 0 <= port <= 65535:
        raise CliError(f"--port must be from 0 to 65535, got {port}")
    credentials = _credentials()
    if not _loopback(host) and credentials is None and not args.insecure:
        raise CliError(
            f"refusing to serve on {host!r} without credentials: set {USER_VARIABLE} and "
            f"{PASSWORD_VARIABLE} (HTTP Basic), put it behind your own authentication, or "
            "pass --insecure if the network in front of it is trusted"
        )
    db = args.db if args.db is not None else os.environ.get("JAREN_JOBS_DB")
    with opened(db, readonly=not args.allow_actions) as store:
        app: Any = create_app(store, read_only=not args.allow_actions)
        if credentials is not None:
            app = basic_auth(app, *credentials)
        try:
            server = make_server(host, port, app, server_class=_Server, handler_class=_Handler)
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        # SIGTERM stops it as Ctrl-C does (a handler can only be set on the main thread)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _stop) if main else None
        try:
            shown = f"[{host}]" if ":" in host else host
            mode = "actions on" if args.allow_actions else "read-only"
            guard = ", HTTP Basic" if credentials is not None else ""
            print(
                f"jaren-jobs dashboard: serving http://{shown}:{server.server_port}/ "
                f"({mode}{guard}); Ctrl-C stops it",
                file=stream,
                flush=True,
            )
            with contextlib.suppress(KeyboardInterrupt):
                server.serve_forever(poll_interval=0.5)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            server.server_close()
    return EXIT_OK
