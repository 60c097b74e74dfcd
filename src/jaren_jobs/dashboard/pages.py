"""The HTML pages: small builders over :func:`html.escape`; nothing from the database is
ever written unescaped, and no page carries a script of its own (the CSP allows only
``static/dashboard.js``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from jaren_jobs.dashboard.filters import Filters
from jaren_jobs.records import STATES, CorruptJson, Job

SHOWN_BYTES = 64 * 1024  # a payload or result longer than this is clipped on the page


@dataclass(frozen=True)
class View:
    root: str
    title: str
    actions: bool
    csrf: str | None
    backend: str
    poll_ms: int = 5000


def url(root: str, path: str, query: Mapping[str, str] | None = None) -> str:
    """A URL under the mount point (``root``), query escaped."""
    text = root + path
    if query:
        text += "?" + urlencode(dict(query))
    return text


def e(value: object) -> str:
    return escape(str(value), quote=True)


def _layout(view: View, heading: str, body: str, *, page: str) -> str:
    csrf = f'<meta name="csrf-token" content="{e(view.csrf)}">' if view.csrf else ""
    nav = "".join(
        f'<a href="{e(url(view.root, path))}"{" aria-current=page" if page == name else ""}>'
        f"{label}</a>"
        for name, path, label in (("overview", "/", "Overview"), ("jobs", "/jobs", "Jobs"))
    )
    mode = "actions on" if view.actions else "read-only"
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(heading)} · {e(view.title)}</title>{csrf}"
        f'<link rel="stylesheet" href="{e(url(view.root, "/static/dashboard.css"))}">'
        f'<script defer src="{e(url(view.root, "/static/dashboard.js"))}"></script>'
        f'</head><body data-root="{e(view.root)}" data-page="{e(page)}" '
        f'data-poll-ms="{view.poll_ms}">'
        f"<header><strong>{e(view.title)}</strong><nav>{nav}</nav>"
        f'<span class="mode" data-testid="mode">{e(view.backend)} · {mode}</span></header>'
        f"<main><h1>{e(heading)}</h1>{body}</main></body></html>\n"
    )


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, testid: str) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return (
        f'<table data-testid="{e(testid)}"><thead><tr>{head}</tr></thead>'
        f'<tbody data-table="{e(testid)}">{body}</tbody></table>'
    )


def _state(state: object) -> str:
    return f'<span class="state state-{e(state)}">{e(state)}</span>'


def _time(value: object) -> str:
    if value is None:
        return "—"
    return f'<time datetime="{e(value)}">{e(value)}</time>'


def _json_text(value: Any) -> str:
    if isinstance(value, CorruptJson):
        value = value.to_dict()
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > SHOWN_BYTES:
        text = text[:SHOWN_BYTES] + f"\n… ({len(text) - SHOWN_BYTES} more characters)"
    return text


# ------------------------------------------------------------------ overview


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "no ready job"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def chart(throughput: Mapping[str, Any]) -> str:
    """The last hour as inline SVG: done (green) and failed (red) bars per five minutes."""
    done: list[int] = list(throughput["done"])
    failed: list[int] = list(throughput["failed"])
    top = max([1, *done, *failed])
    width, height, slot = 600, 140, 50
    bars = []
    for index, (ok, bad) in enumerate(zip(done, failed, strict=False)):
        for offset, value, name in ((6, ok, "done"), (26, bad, "failed")):
            h = round(value / top * (height - 20))
            bars.append(
                f'<rect class="bar-{name}" data-bar="{name}-{index}" x="{index * slot + offset}" '
                f'y="{height - h}" width="18" height="{h}"><title>{value} {name}</title></rect>'
            )
    cap = throughput["cap"]
    more = f" (the most recent {cap:,} of each counted)" if throughput["truncated"] else ""
    return (
        f'<svg class="chart" data-testid="chart" viewBox="0 0 {width} {height + 16}" '
        f'role="img" aria-label="jobs done and dead-lettered per five minutes, last hour{more}">'
        f'<text x="2" y="12" class="axis" data-field="chart-top">{top}</text>'
        + "".join(bars)
        + f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" class="axis-line"/>'
        f'<text x="2" y="{height + 14}" class="axis">-60 min</text>'
        f'<text x="{width - 30}" y="{height + 14}" class="axis">now</text></svg>'
        '<p class="legend"><span class="key key-done"></span> done '
        '<span class="key key-failed"></span> dead-lettered, per five minutes'
        f'<span data-field="chart-note">{e(more)}</span></p>'
    )


def queue_rows(rows: Sequence[Mapping[str, Any]], root: str) -> list[list[str]]:
    """The by-queue table's cells, escaped HTML."""

    def link(text: object, query: Mapping[str, str]) -> str:
        return f'<a href="{e(url(root, "/jobs", query))}">{e(text)}</a>'

    return [
        [link(row["queue"], {"queue": row["queue"]})]
        + [link(row[state], {"queue": row["queue"], "state": state}) for state in STATES]
        for row in rows
    ]


def overview_rows(data: Mapping[str, Any], root: str) -> dict[str, list[list[str]]]:
    """The overview's tables as cells of escaped HTML (also what the poller redraws)."""

    def link(text: object, query: Mapping[str, str]) -> str:
        return f'<a href="{e(url(root, "/jobs", query))}">{e(text)}</a>'

    queues = queue_rows(data["queues"], root)
    kinds = [[link(kind, {"kind": kind}), e(count)] for kind, count in data["kinds"]]
    leases = [
        [
            e(row["owner"]),
            e(row["leases"]),
            e(row["expired"]),
            _time(row["soonest"]),
            _time(row["latest"]),
        ]
        for row in data["leases"]["owners"]
    ]
    periodic = [
        [
            e(row["name"]),
            e(row["kind"]),
            e(row["queue"]),
            e(row["schedule"]),
            e(row["timezone"]),
            _time(row["next"]),
        ]
        for row in data["periodic"]
    ]
    return {"queues": queues, "kinds": kinds, "leases": leases, "periodic": periodic}


def overview_page(view: View, data: Mapping[str, Any]) -> str:
    counts = data["counts"]
    cards = "".join(
        f'<a class="card card-{state}" href="{e(url(view.root, "/jobs", {"state": state}))}">'
        f'<span class="label">{state}</span>'
        f'<span class="count" data-testid="count-{state}" data-field="counts.{state}">'
        f"{e(counts[state])}</span></a>"
        for state in STATES
    )
    due = data["due"]
    oldest = data["oldest_ready"]
    rows = overview_rows(data, view.root)
    body = (
        f'<section class="cards">{cards}</section>'
        '<section class="facts"><p>Ready now: '
        f'<b data-field="due.pending_ready">{e(due["pending_ready"])}</b> pending, '
        f'<b data-field="due.failed_ready">{e(due["failed_ready"])}</b> retries; scheduled later: '
        f'<b data-field="due.pending_scheduled">{e(due["pending_scheduled"])}</b> pending, '
        f'<b data-field="due.failed_scheduled">{e(due["failed_scheduled"])}</b> retries; '
        f'expired leases: <b data-field="due.leased_expired">{e(due["leased_expired"])}</b>.</p>'
        f'<p>Oldest ready job waiting: <b data-testid="oldest-ready" data-field="oldest">'
        f"{e(_age(oldest['age_seconds']))}</b>. "
        f'As of <span data-field="now">{e(data["now"])}</span>.</p></section>'
        f"<h2>Last hour</h2>{chart(data['throughput'])}"
        "<h2>By queue</h2>"
        + _table(
            ["queue", *STATES],
            rows["queues"] or [["counting…", *([""] * len(STATES))]],
            testid="queues",
        )
        + f'<p class=hint>counted at most every 30 s; as of <span data-field="queues-as-of">'
        f"{e(data['queues_as_of'] or 'not yet')}</span></p>"
        + "<h2>Queued by kind</h2><p class=hint>pending and failed jobs</p>"
        + _table(["kind", "queued"], rows["kinds"], testid="kinds")
        + "<h2>Leases held</h2>"
        + _table(
            ["owner", "leases", "expired", "soonest expiry", "latest expiry"],
            rows["leases"],
            testid="leases",
        )
        + (
            "<p class=hint>only the first leases were read</p>"
            if data["leases"]["truncated"]
            else ""
        )
        + "<h2>Periodic schedules</h2>"
        + (
            _table(
                ["name", "kind", "queue", "schedule", "zone", "next tick"],
                rows["periodic"],
                testid="periodic",
            )
            if data["periodic"]
            else "<p class=hint>none given to the dashboard (create_app(..., periodic=[...]))</p>"
        )
    )
    return _layout(view, "Overview", body, page="overview")


# ------------------------------------------------------------------ jobs


def _filter_form(view: View, filters: Filters) -> str:
    options = '<option value="">any state</option>' + "".join(
        f'<option value="{s}"{" selected" if filters.state == s else ""}>{s}</option>'
        for s in STATES
    )
    orders = "".join(
        f'<option value="{value}"{" selected" if filters.order == value else ""}>{label}</option>'
        for value, label in (
            ("id", "by id"),
            ("newest", "newest first (sorts: slow on big tables)"),
        )
    )
    return (
        f'<form class="filters" method="get" action="{e(url(view.root, "/jobs"))}">'
        f'<label>State <select name="state">{options}</select></label>'
        f'<label>Kind <input name="kind" value="{e(filters.kind or "")}"></label>'
        f'<label>Queue <input name="queue" value="{e(filters.queue or "")}"></label>'
        f'<label>Order <select name="order">{orders}</select></label>'
        f'<label>Per page <input name="limit" type="number" min="1" max="500" '
        f'value="{filters.limit}"></label>'
        "<button type=submit>Filter</button></form>"
    )


def _hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{e(name)}" value="{e(value)}">'


def jobs_page(view: View, filters: Filters, page: Any) -> str:
    jobs: Sequence[Job] = page.items
    rows = []
    for job in jobs:
        error = job.last_error or ""
        if len(error) > 80:
            error = error[:80] + "…"
        check = (
            f'<input type="checkbox" name="ids" value="{e(job.id)}" form="bulk-ids" '
            f'aria-label="select {e(job.id)}">'
            if view.actions
            else ""
        )
        cells = [
            f'<a href="{e(url(view.root, "/job", {"id": job.id}))}">{e(job.id)}</a>',
            e(job.kind),
            e(job.queue),
            _state(job.state),
            f"{job.attempts}/{job.max_attempts}",
            _time(job.run_at.isoformat(timespec="seconds")),
            _time(job.updated_at.isoformat(timespec="seconds")),
            e(error),
        ]
        rows.append(([check] if view.actions else []) + cells)
    headers = ["id", "kind", "queue", "state", "attempts", "run at", "updated", "last error"]
    if view.actions:
        headers = ["", *headers]
    nav = [f'<a href="{e(url(view.root, "/jobs", filters.query(after=None)))}">first page</a>']
    if page.has_more:
        nav.append(
            f'<a rel="next" data-testid="next-page" href="'
            f'{e(url(view.root, "/jobs", filters.query(after=page.continuation)))}">next page →</a>'
        )
    body = (
        _filter_form(view, filters)
        + f'<p class="hint" data-testid="shown">{len(jobs)} shown'
        + (" (more on the next page)" if page.has_more else "")
        + "</p>"
        + _table(headers, rows, testid="jobs")
        + f'<nav class="pager">{" ".join(nav)}</nav>'
    )
    if view.actions:
        body += _bulk_forms(view, filters)
    return _layout(view, "Jobs", body, page="jobs")


def _bulk_forms(view: View, filters: Filters) -> str:
    action = e(url(view.root, "/actions/bulk"))
    csrf = _hidden("csrf_token", view.csrf)
    by_filter = "".join(
        _hidden(name, value)
        for name, value in (
            ("state", filters.state),
            ("kind", filters.kind),
            ("queue", filters.queue),
        )
        if value
    )
    described = (
        ", ".join(
            f"{name} = {value}"
            for name, value in (
                ("state", filters.state),
                ("kind", filters.kind),
                ("queue", filters.queue),
            )
            if value
        )
        or "every job"
    )
    return (
        '<section class="bulk"><h2>Bulk actions</h2>'
        f'<form id="bulk-ids" method="post" action="{action}">{csrf}{_hidden("mode", "ids")}'
        '<label><input type="checkbox" name="reset_attempts" value="1"> reset attempts</label> '
        "<button name=action value=requeue>Requeue selected…</button> "
        "<button name=action value=run_now>Run now selected…</button> "
        "<button name=action value=cancel>Cancel selected…</button></form>"
        f'<form method="post" action="{action}">{csrf}{_hidden("mode", "filter")}{by_filter}'
        f"<p>Everything matching this filter ({e(described)}):</p>"
        '<label><input type="checkbox" name="reset_attempts" value="1"> reset attempts</label> '
        '<button name=action value=requeue data-testid="bulk-filter-requeue">Requeue all…</button> '
        '<button name=action value=run_now data-testid="bulk-filter-run_now">Run now all…</button> '
        "<button name=action value=cancel>Cancel all…</button></form></section>"
    )


def _said(verb: str) -> str:
    return verb.replace("_", " ")  # run_now: "run now"


def bulk_confirm(
    view: View,
    verb: str,
    *,
    mode: str,
    ids: Sequence[str],
    filters: Filters | None,
    capped: bool,
    cap: int,
    reset: bool,
) -> str:
    fields = [
        _hidden("csrf_token", view.csrf),
        _hidden("action", verb),
        _hidden("mode", mode),
        _hidden("confirm", "yes"),
    ]
    if reset:
        fields.append(_hidden("reset_attempts", "1"))
    if filters is None:
        fields += [_hidden("ids", job_id) for job_id in ids]
    else:
        fields += [
            _hidden(name, value)
            for name, value in (
                ("state", filters.state),
                ("kind", filters.kind),
                ("queue", filters.queue),
            )
            if value
        ]
    more = f" More match: only the first {cap} are acted on." if capped else ""
    shown = "".join(f"<li>{e(job_id)}</li>" for job_id in ids[:20])
    if len(ids) > 20:
        shown += f"<li>… and {len(ids) - 20} more</li>"
    body = (
        f'<p data-testid="bulk-count">{_said(verb).capitalize()} <b>{len(ids)}</b> '
        f"job{'s' if len(ids) != 1 else ''}{' (attempts reset)' if reset else ''}?{e(more)}</p>"
        f"<ul>{shown}</ul>"
        f'<form method="post" action="{e(url(view.root, "/actions/bulk"))}">{"".join(fields)}'
        f'<button type=submit data-testid="bulk-confirm">Yes, {e(_said(verb))} them</button> '
        f'<a href="{e(url(view.root, "/jobs"))}">no, back to the jobs</a></form>'
    )
    return _layout(view, "Confirm", body, page="confirm")


def bulk_done(view: View, verb: str, results: Sequence[tuple[str, bool, str]], capped: bool) -> str:
    ok = sum(1 for _, done, _ in results if done)
    rows = [
        [
            f'<a href="{e(url(view.root, "/job", {"id": job_id}))}">{e(job_id)}</a>',
            "yes" if done else "no",
            e(message),
        ]
        for job_id, done, message in results
    ]
    body = (
        f'<p data-testid="bulk-result">{e(_said(verb))}: {ok} of {len(results)} done'
        f"{' (capped)' if capped else ''}.</p>"
        + _table(["job", "done", "what happened"], rows, testid="bulk-results")
    )
    return _layout(view, "Done", body, page="done")


def _action_form(view: View, job: Job, verb: str, label: str, *, reset: bool = False) -> str:
    extra = (
        '<label><input type="checkbox" name="reset_attempts" value="1"> reset attempts</label> '
        if reset
        else ""
    )
    return (
        f'<form class="action" method="post" action="{e(url(view.root, "/actions/job"))}">'
        f"{_hidden('csrf_token', view.csrf)}{_hidden('id', job.id)}{_hidden('action', verb)}"
        f'{extra}<button type=submit data-testid="action-{verb}">{e(label)}</button></form>'
    )


def job_page(
    view: View,
    job: Job,
    errors: Sequence[Mapping[str, Any]],
    done: str | None,
    *,
    waiting: bool = False,
) -> str:
    """One job; ``waiting``: queued with its ``run_at`` still ahead (what "Run now" moves)."""
    record = job.to_dict()
    facts = [
        ("id", e(job.id)),
        ("kind", e(job.kind)),
        ("queue", e(job.queue)),
        (
            "state",
            f'<span data-testid="job-state">{_state(job.state)}</span>'
            + (" (cancellation requested)" if job.cancel_requested else ""),
        ),
        ("priority", e(job.priority)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run at", _time(record["run_at"])),
        ("lease owner", e(job.lease_owner or "—")),
        ("lease expires", _time(record["lease_until"])),
        ("lease generation", e(job.lease_generation)),
        ("unique key", e(job.unique_key or "—")),
        ("created", _time(record["created_at"])),
        ("updated", _time(record["updated_at"])),
        ("last error", e(job.last_error or "—")),
    ]
    body = ""
    if done:
        body += f'<p class="flash" data-testid="flash">{e(done)}</p>'
    body += "<dl>" + "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts) + "</dl>"
    if view.actions:
        forms = []
        if job.state in ("pending", "failed", "leased"):
            forms.append(_action_form(view, job, "cancel", "Cancel"))
        if job.state in ("failed", "dead", "cancelled", "leased"):
            forms.append(_action_form(view, job, "requeue", "Requeue", reset=True))
        if waiting and job.state in ("pending", "failed"):
            forms.append(_action_form(view, job, "run_now", "Run now"))
        body += f'<section class="actions" data-testid="actions">{"".join(forms)}</section>'
    body += f'<h2>Payload</h2><pre data-testid="payload">{e(_json_text(job.payload))}</pre>'
    body += f'<h2>Result</h2><pre data-testid="result">{e(_json_text(job.result))}</pre>'
    body += f"<h2>Errors ({len(errors)})</h2>"
    if not errors:
        body += "<p class=hint>no failed attempt</p>"
    for entry in errors:
        body += (
            f'<article class="error"><h3>attempt {e(entry["attempt"])} · {_time(entry["at"])}</h3>'
            f"<p>{e(entry['error'])}</p>"
            + (
                f'<pre class="traceback" data-testid="traceback">{e(entry["traceback"])}</pre>'
                if entry["traceback"]
                else ""
            )
            + "</article>"
        )
    api = url(view.root, "/api/jobs/" + quote(job.id, safe=""))
    body += f'<p class="hint"><a href="{e(api)}">as JSON</a> · ' + (
        f'<a href="{e(url(view.root, "/jobs", {"state": str(job.state)}))}">'
        f"other {e(job.state)} jobs</a></p>"
    )
    return _layout(view, f"Job {job.id[:80]}", body, page="job")


def error_page(view: View, status: int, message: str) -> str:
    body = f'<p class="error-message" data-testid="error">{e(status)}: {e(message)}</p>'
    return _layout(view, "Not possible", body, page="error")
