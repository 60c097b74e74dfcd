"""The dashboard's core: one request in, one response out, for the WSGI and ASGI adapters.

It knows nothing of either protocol: :class:`Request` is what an adapter read
(the path below the mount point, the prefix it is mounted at, the headers,
the body) and :class:`Response` what it writes back. Every read and every
action goes through the store's public API.

Safety, in one place: every answer carries a Content-Security-Policy allowing
only the package's own script and style, and ``X-Frame-Options: DENY``; a POST
is refused (403) in read-only mode, from another origin (``Origin`` /
``Sec-Fetch-Site``), or without the session's CSRF token (compared in constant
time). Bad arguments are a 400 with a message; a failure, a 500 saying nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from jaren_jobs.cursor import drain_page
from jaren_jobs.dashboard import pages
from jaren_jobs.dashboard.filters import DEFAULT_LIMIT, Filters
from jaren_jobs.dashboard.overview import QueueCounts, overview, queue_names
from jaren_jobs.errors import JobsError, JobSettled, LeaseRequired, UnknownJob
from jaren_jobs.periodic import Periodic
from jaren_jobs.records import STATES, Job
from jaren_jobs.store import Store

log = logging.getLogger("jaren_jobs.dashboard")

MAX_LIMIT = 500
MAX_BODY = 256 * 1024
MAX_FIELD = 2000  # longer filters and ids than any real one: refused, not searched
COOKIE = "jaren_jobs_dashboard"
#: what an action's redirect may show on the job page
FLASHES = frozenset(
    {
        "cancelled",
        "already cancelled",
        "cancellation requested (the running attempt is told to stop)",
        "requeued",
        "already pending",
        "requeued with its attempts reset",
        "made due now",
        "already due",
    }
)
ORDERS = ("id", "newest")

SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    # not no-referrer: under it Chromium sends "Origin: null" with the pages' own form POSTs
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}


class HttpError(Exception):
    """An answer other than 200, with the message shown to the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """What an adapter read: ``path`` is below the mount point (``/``, ``/jobs``, ...)."""

    method: str
    path: str
    root: str
    query: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes = b""
    scheme: str = "http"


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def _clip(text: str, width: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


def parse_fields(text: str) -> dict[str, list[str]]:
    """A query string or form body; refusals are a 400."""
    try:
        parsed = parse_qs(
            text, keep_blank_values=True, strict_parsing=False, max_num_fields=1200, errors="strict"
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise HttpError(400, f"bad query or form: {exc}") from None
    for name, values in parsed.items():
        for value in values:
            if "\x00" in value or "\x00" in name:
                raise HttpError(400, f"{name[:40]!r} holds a NUL character")
    return parsed


def one(fields: Mapping[str, list[str]], name: str, *, allow_long: bool = False) -> str | None:
    """The one value of a field; absent or empty is ``None``; twice is a 400."""
    values = fields.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise HttpError(400, f"give {name} once, not {len(values)} times")
    value = values[0]
    if not allow_long and len(value) > MAX_FIELD:
        raise HttpError(400, f"{name} is {len(value)} characters long; at most {MAX_FIELD}")
    return value or None


def read_filters(fields: Mapping[str, list[str]]) -> Filters:
    """The job list's filters, checked here so each mistake is a 400 that names it."""
    state = one(fields, "state")
    if state is not None and state not in STATES:
        raise HttpError(400, f"state must be one of {', '.join(STATES)}; got {_clip(state)}")
    order = one(fields, "order") or "id"
    if order not in ORDERS:
        raise HttpError(400, f"order must be 'id' or 'newest'; got {_clip(order)}")
    text = one(fields, "limit")
    limit = DEFAULT_LIMIT
    if text is not None:
        if not text.isascii() or not text.isdigit() or len(text) > 6:
            raise HttpError(
                400, f"limit must be a whole number from 1 to {MAX_LIMIT}; got {_clip(text)}"
            )
        limit = int(text)
        if not 1 <= limit <= MAX_LIMIT:
            raise HttpError(400, f"limit must be from 1 to {MAX_LIMIT}; got {limit}")
    return Filters(
        state=state,
        kind=one(fields, "kind"),
        queue=one(fields, "queue"),
        after=one(fields, "after"),
        limit=limit,
        order=order,
    )


def _json(status: int, value: Any) -> Response:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    # < > & only ever occur inside JSON strings: escaped, no answer can be read as markup
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    body = text.encode("utf-8")
    return Response(status, [("Content-Type", "application/json; charset=utf-8")], body)


def _html(status: int, text: str) -> Response:
    return Response(status, [("Content-Type", "text/html; charset=utf-8")], text.encode("utf-8"))


class Dashboard:
    """The dashboard over one store: see :func:`jaren_jobs.dashboard.create_app`."""

    def __init__(
        self,
        store: Store,
        *,
        read_only: bool = True,
        periodic: Sequence[Periodic] = (),
        queues: Sequence[str] | None = None,
        bulk_cap: int = 1000,
        trusted_origins: Sequence[str] = (),
        title: str = "jaren_jobs",
        poll_seconds: float = 5.0,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"the dashboard needs a jaren_jobs Store, got {type(store).__name__}")
        if isinstance(bulk_cap, bool) or not isinstance(bulk_cap, int) or bulk_cap < 1:
            raise ValueError(f"bulk_cap must be an int >= 1, got {bulk_cap!r}")
        self.store = store
        self.read_only = bool(read_only)
        self.periodic = tuple(periodic)
        for schedule in self.periodic:
            if not isinstance(schedule, Periodic):
                raise TypeError(f"periodic holds a {type(schedule).__name__}, not a Periodic")
        self.queues = None if queues is None else tuple(queues)
        self.bulk_cap = bulk_cap
        self.trusted_origins = frozenset(origin.rstrip("/") for origin in trusted_origins)
        self.title = title
        if isinstance(poll_seconds, bool) or not isinstance(poll_seconds, (int, float)):
            raise TypeError(f"poll_seconds must be a number, got {type(poll_seconds).__name__}")
        if not 0.1 <= poll_seconds <= 3600:
            raise ValueError(f"poll_seconds must be from 0.1 to 3600, got {poll_seconds!r}")
        self.poll_ms = round(poll_seconds * 1000)
        self.queue_counts = QueueCounts()
        # signs the CSRF token of each session; a restart starts new sessions
        self._secret = secrets.token_bytes(32)

    # ------------------------------------------------------------ entry

    def handle(self, request: Request) -> Response:
        """Answer one request; never raises (a failure is a 500 with no detail)."""
        session, fresh = self._session(request)
        try:
            response = self._route(request, session)
        except HttpError as exc:
            response = self._error(request, session, exc.status, exc.message)
        except Exception:
            log.exception("dashboard: %s %s failed", request.method, request.path[:200])
            response = self._error(request, session, 500, "internal error (see the server's log)")
        response.headers.extend(SECURITY_HEADERS)
        if fresh:
            path = request.root or "/"
            secure = "; Secure" if request.scheme == "https" else ""
            response.headers.append(
                (
                    "Set-Cookie",
                    f"{COOKIE}={session}; Path={path}; HttpOnly; SameSite=Strict{secure}",
                )
            )
        return response

    def _error(self, request: Request, session: str, status: int, message: str) -> Response:
        if request.path.startswith("/api/"):
            return _json(status, {"error": message, "status": status})
        return _html(status, pages.error_page(self._view(request, session), status, message))

    # ------------------------------------------------------------ sessions and CSRF

    def _session(self, request: Request) -> tuple[str, bool]:
        raw = request.headers.get("cookie", "")
        try:
            cookie: SimpleCookie = SimpleCookie(raw)
        except CookieError:
            cookie = SimpleCookie()
        morsel = cookie.get(COOKIE)
        if morsel is not None and 20 <= len(morsel.value) <= 100 and morsel.value.isascii():
            return morsel.value, False
        return secrets.token_urlsafe(24), True

    def csrf_token(self, session: str) -> str:
        """The session's CSRF token: a MAC of the session id under this app's secret."""
        return hmac.new(self._secret, session.encode("ascii"), hashlib.sha256).hexdigest()

    def _check_post(self, request: Request, session: str, form: Mapping[str, list[str]]) -> None:
        if self.read_only:
            raise HttpError(
                403, "this dashboard is read-only: actions need read_only=False (--allow-actions)"
            )
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise HttpError(403, f"refused a {site} request: actions come from this dashboard only")
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            own = f"{request.scheme}://{request.headers.get('host', '')}"
            if origin.rstrip("/") != own and origin.rstrip("/") not in self.trusted_origins:
                raise HttpError(403, "refused a request from another origin")
        elif origin == "null":
            raise HttpError(403, "refused a request from an opaque origin")
        given = request.headers.get("x-csrf-token")
        if given is None:
            values = form.get("csrf_token") or []
            given = values[0] if len(values) == 1 else None
        cookie_present = COOKIE in request.headers.get("cookie", "")
        expected = self.csrf_token(session)
        if (
            not cookie_present
            or given is None
            or not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("ascii"))
        ):
            raise HttpError(403, "missing or wrong CSRF token: reload the page and try again")

    # ------------------------------------------------------------ routing

    def _view(self, request: Request, session: str) -> pages.View:
        return pages.View(
            root=request.root,
            title=self.title,
            actions=not self.read_only,
            csrf=None if self.read_only else self.csrf_token(session),
            backend=self.store.backend,
            poll_ms=self.poll_ms,
        )

    def _route(self, request: Request, session: str) -> Response:
        path = request.path or "/"
        method = request.method.upper()
        fields = parse_fields(request.query)
        if method in ("GET", "HEAD"):
            return self._get(request, session, path, fields)
        if method != "POST":
            raise HttpError(405, f"method {method[:20]} is not allowed here")
        form = self._form(request)
        self._check_post(request, session, form)
        merged = {**fields, **form}
        if path.startswith("/api/jobs/"):
            rest = path[len("/api/jobs/") :]
            for verb in ("cancel", "requeue", "run_now"):
                if rest.endswith("/" + verb) and len(rest) > len(verb) + 1:
                    job_id = rest[: -len(verb) - 1]
                    return _json(200, self._act(job_id, verb, merged))
            raise HttpError(404, "no such action: POST /api/jobs/<id>/cancel, /requeue or /run_now")
        view = self._view(request, session)
        if path == "/actions/job":
            target = one(merged, "id", allow_long=True)
            if target is None:
                raise HttpError(400, "which job? give id")
            answer = self._act(target, one(merged, "action") or "", merged)
            return self._redirect(request, "/job", {"id": target, "done": answer["message"]})
        if path == "/actions/bulk":
            return _html(200, self._bulk(view, merged))
        raise HttpError(404, f"nothing to POST at {_clip(path)}")

    def _redirect(self, request: Request, path: str, query: Mapping[str, str]) -> Response:
        location = pages.url(request.root, path, query)
        return Response(303, [("Location", location), ("Content-Type", "text/plain")], b"")

    def _form(self, request: Request) -> dict[str, list[str]]:
        if not request.body:
            return {}
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise HttpError(400, "the request body is not UTF-8") from None
        if kind == "application/json":
            try:
                value = json.loads(text)
            except ValueError:
                raise HttpError(400, "the request body is not JSON") from None
            if not isinstance(value, dict):
                raise HttpError(400, "the JSON body must be an object")
            return {str(key): [_field_text(item)] for key, item in value.items()}
        return parse_fields(text)

    def _get(
        self, request: Request, session: str, path: str, fields: Mapping[str, list[str]]
    ) -> Response:
        jobs = self.store.jobs
        if path.startswith("/static/"):
            return self._static(path[len("/static/") :])
        if path == "/metrics":
            return _metrics(self.store)
        if path == "/api/counts":
            return _json(200, jobs.counts().to_dict())
        if path == "/api/overview":
            data = self.overview()
            if one(fields, "rows") is not None:
                # the overview's tables as the page draws them, for its poller
                data["rows"] = pages.overview_rows(data, request.root)
            return _json(200, data)
        if path == "/api/queues":
            data = self.queues_now()
            if one(fields, "rows") is not None:
                data["rows"] = pages.queue_rows(data["queues"], request.root)
            return _json(200, data)
        if path == "/api/jobs":
            filters = read_filters(fields)
            page = self._page(filters)
            return _json(
                200,
                {
                    "items": [job.to_dict() for job in page.items],
                    "continuation": page.continuation,
                    "has_more": page.has_more,
                },
            )
        if path.startswith("/api/jobs/"):
            job_id = path[len("/api/jobs/") :]
            job = self._job(job_id)
            return _json(200, {**job.to_dict(), "errors": self._errors(job.id)})
        view = self._view(request, session)
        if path == "/":
            return _html(200, pages.overview_page(view, self.overview()))
        if path == "/jobs":
            filters = read_filters(fields)
            return _html(200, pages.jobs_page(view, filters, self._page(filters)))
        if path == "/job":
            wanted = one(fields, "id", allow_long=True)
            if wanted is None:
                raise HttpError(400, "which job? give ?id=")
            job = self._job(wanted)
            done = one(fields, "done")
            if done not in FLASHES:
                done = None  # only the dashboard's own words: a crafted link says nothing
            ahead = job.run_at.timestamp() > self.store.runtime.now()
            return _html(200, pages.job_page(view, job, self._errors(job.id), done, waiting=ahead))
        raise HttpError(404, f"no page at {_clip(path)}")

    # ------------------------------------------------------------ reads

    def overview(self) -> dict[str, Any]:
        """The overview's data; the per-queue counts as last counted (``/api/queues``)."""
        data = overview(self.store, queues=self.queues, periodic=self.periodic)
        data["queues"], data["queues_as_of"] = self.queue_counts.cached()
        return data

    def queues_now(self) -> dict[str, Any]:
        """Jobs per state in each queue (counted at most every 30 s)."""
        if self.queues is None:
            names = queue_names(self.store, self.periodic)
        else:
            names = list(self.queues)
        rows, as_of = self.queue_counts.get(self.store, names)
        return {"queues": rows, "as_of": as_of}

    def _page(self, filters: Filters) -> Any:
        try:
            cursor = self.store.jobs.page(
                state=filters.state,
                kind=filters.kind,
                queue=filters.queue,
                after=filters.after,
                order=filters.order,
                limit=filters.limit + 1,
            )
            return drain_page(cursor, limit=filters.limit, after=filters.after)
        except (ValueError, TypeError) as exc:
            raise HttpError(400, str(exc)) from None

    def _job(self, job_id: str) -> Job:
        if job_id == "":
            raise HttpError(400, "which job? the id is empty")
        if len(job_id) > 4 * MAX_FIELD:
            raise HttpError(400, f"a job id of {len(job_id)} characters: no job has one")
        if "\x00" in job_id:
            # no job id holds one (PostgreSQL text cannot), and get() on PostgreSQL would
            # answer a StorageError where SQLite answers None
            raise HttpError(400, "a job id holds a NUL character: no job has one")
        try:
            job = self.store.jobs.get(job_id)
        except (ValueError, TypeError) as exc:
            raise HttpError(400, str(exc)) from None
        if job is None:
            raise HttpError(404, f"no job {_clip(job_id)}")
        return job

    def _errors(self, job_id: str) -> list[dict[str, Any]]:
        try:
            return [entry.to_dict() for entry in self.store.jobs.errors(job_id)]
        except UnknownJob:
            return []  # swept between the two reads

    def _static(self, name: str) -> Response:
        kind = STATIC.get(name)
        if kind is None:
            raise HttpError(404, f"no asset {_clip(name)}")
        body = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
        return Response(200, [("Content-Type", kind)], body)

    # ------------------------------------------------------------ actions

    def _act(self, job_id: str, verb: str, fields: Mapping[str, list[str]]) -> dict[str, Any]:
        """One action on one job; the answer says what happened."""
        job = self._job(job_id)
        reset = (one(fields, "reset_attempts") or "").lower() in ("1", "true", "on", "yes")
        jobs = self.store.jobs
        try:
            if verb == "cancel":
                changed = jobs.cancel(job.id, force=True)
                message = "cancelled" if changed else "already cancelled"
                if changed and job.state == "leased":
                    message = "cancellation requested (the running attempt is told to stop)"
            elif verb == "requeue":
                changed = jobs.requeue(job.id, reset_attempts=reset)
                message = "requeued" if changed else "already pending"
                if changed and reset:
                    message = "requeued with its attempts reset"
            elif verb == "run_now":
                changed = jobs.run_now(job.id)
                message = "made due now" if changed else "already due"
            else:
                raise HttpError(400, f"no action {_clip(verb)}: cancel, requeue or run_now")
        except (JobSettled, LeaseRequired) as exc:
            raise HttpError(409, exc.message) from None
        except UnknownJob:
            raise HttpError(404, f"no job {_clip(job_id)}") from None
        except JobsError as exc:
            raise HttpError(409, exc.message) from None
        after = jobs.get(job.id)
        return {
            "id": job.id,
            "action": verb,
            "changed": changed,
            "message": message,
            "state": None if after is None else str(after.state),
        }

    def _bulk(self, view: pages.View, fields: Mapping[str, list[str]]) -> str:
        verb = one(fields, "action") or ""
        if verb not in ("cancel", "requeue", "run_now"):
            raise HttpError(400, f"bulk action is cancel, requeue or run_now; not {_clip(verb)}")
        mode = one(fields, "mode") or "ids"
        if mode == "ids":
            ids = [value for value in fields.get("ids", []) if value]
            if not ids:
                raise HttpError(400, "no jobs selected")
            if len(ids) > self.bulk_cap:
                raise HttpError(400, f"{len(ids)} jobs selected; at most {self.bulk_cap} at once")
            filters = None
        elif mode == "filter":
            filters = read_filters(fields)
            filters = Filters(state=filters.state, kind=filters.kind, queue=filters.queue)
            ids = self._matching(filters)
        else:
            raise HttpError(400, "mode must be ids or filter")
        reset = (one(fields, "reset_attempts") or "").lower() in ("1", "true", "on", "yes")
        capped = len(ids) > self.bulk_cap
        ids = ids[: self.bulk_cap]
        if one(fields, "confirm") != "yes":
            return pages.bulk_confirm(
                view,
                verb,
                mode=mode,
                ids=ids,
                filters=filters,
                capped=capped,
                cap=self.bulk_cap,
                reset=reset,
            )
        results = []
        for job_id in ids:
            try:
                answer = self._act(job_id, verb, {"reset_attempts": ["1" if reset else ""]})
                results.append((job_id, True, answer["message"]))
            except HttpError as exc:
                results.append((job_id, False, exc.message))
        return pages.bulk_done(view, verb, results, capped)

    def _matching(self, filters: Filters) -> list[str]:
        """The ids a filter matches now, at most ``bulk_cap + 1`` (one more says "capped")."""
        found: list[str] = []
        try:
            cursor = self.store.jobs.page(
                state=filters.state, kind=filters.kind, queue=filters.queue, limit=500
            )
        except (ValueError, TypeError) as exc:
            raise HttpError(400, str(exc)) from None
        with cursor:
            for job in cursor:
                found.append(job.id)
                if len(found) > self.bulk_cap:
                    break
        return found


def _metrics(store: Store) -> Response:
    """``/metrics`` (SPEC §17): the store's Prometheus metrics, with the extra installed."""
    try:
        from jaren_jobs.observability.metrics import exposition  # noqa: PLC0415 - optional
    except ImportError:
        raise HttpError(404, "/metrics needs prometheus_client (jaren_jobs[prometheus])") from None
    body, content_type = exposition(store)
    return Response(200, [("Content-Type", content_type)], body)


def _field_text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else ""
    if value is None:
        return ""
    if isinstance(value, (str, int, float)):
        return str(value)
    raise HttpError(400, "JSON body fields must be strings, numbers or booleans")


Handler = Callable[[Request], Response]
