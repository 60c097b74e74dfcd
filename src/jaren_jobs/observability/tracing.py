"""OpenTelemetry traces (SPEC §17): a producer span per enqueue, a consumer span per attempt.

The enqueuing span's context is stored with the job as a W3C ``traceparent``
(the ``trace_context`` column), so each attempt's span is a child of the span
that enqueued it — in whatever process or host runs it. Spans follow
OpenTelemetry's messaging conventions; nothing here ever sees a lease token
(attributes are read from the job's public fields and the attempt's
:class:`~jaren_jobs.Outcome`).

Needs ``opentelemetry-api`` (the extra ``jaren_jobs[otel]``); spans are
recorded by whatever SDK the application configured.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    NoOpTracer,
    ProxyTracerProvider,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)

from jaren_jobs.errors import JobsError
from jaren_jobs.observe import UNOBSERVED, Observer, Sending, add, remove

__all__ = ["format_traceparent", "instrument", "parse_traceparent", "uninstrument"]

_log = logging.getLogger("jaren_jobs.observability")

SYSTEM = "jaren_jobs"
_VERSION = "0.1.0"

# version 00's four fields as W3C Trace Context writes them ("vv-" 32 hex "-" 16 hex
# "-ff", lowercase); a later version's first four fields read the same (the spec's
# forward-compatibility rule) and it may add more after a "-". A prefix match
# without groups: the fields are then sliced at their fixed positions
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_SAMPLED, _UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)


# a lost attempt's error.type: the refusal's class name, by its code
def _coded(cls: type[JobsError]) -> dict[str, str]:
    found = {cls.code: cls.__name__} if "code" in vars(cls) else {}
    for sub in cls.__subclasses__():
        found = {**_coded(sub), **found}  # a class names its code before its subclasses
    return found


_REFUSALS = _coded(JobsError)


def format_traceparent(span_context: SpanContext) -> str:
    """A span context as a W3C ``traceparent`` header value (version 00)."""
    # %-formatting: measured at half the time of the f-string with int() on the flags
    return "00-%032x-%016x-%02x" % (  # noqa: UP031
        span_context.trace_id,
        span_context.span_id,
        span_context.trace_flags,
    )


def parse_traceparent(value: object) -> SpanContext | None:
    """The remote span context a stored ``traceparent`` names, or ``None`` if it is not one.

    Anything else — another type, a malformed text, an all-zero id, version
    ``ff`` — is ``None``: a row written by an older release or a foreign
    writer never fails an attempt.
    """
    if type(value) is not str or _TRACEPARENT.match(value) is None:
        return None
    version = value[:2]
    if version == "ff" or (len(value) > 55 and (version == "00" or value[55] != "-")):
        return None
    if "\n" in value:  # a header value is one line
        return None
    trace_id, span_id = int(value[3:35], 16), int(value[36:52], 16)
    if not trace_id or not span_id:
        return None
    # only the sampled flag is kept (the other bits are not defined for version 00)
    flags = _SAMPLED if int(value[53:55], 16) & TraceFlags.SAMPLED else _UNSAMPLED
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _global_provider_set() -> bool:
    # OpenTelemetry's own test of it (ProxyTracer's): the public equivalent,
    # get_tracer_provider(), reads os.environ on each call while no provider is
    # set (a microsecond, per enqueue and per attempt). Should the name ever go,
    # this answers yes and OpenTelemetry's ProxyTracer decides, as it always may.
    return getattr(trace, "_TRACER_PROVIDER", True) is not None


class _Send(Sending):
    """One enqueue call: a producer span per job (``enqueue_many``: per item)."""

    def __init__(
        self,
        tracer: trace.Tracer,
        items: Sequence[Any],
        shapes: dict[tuple[str, str], tuple[str, dict[str, Any]]],
    ) -> None:
        start = tracer.start_span
        spans: list[Span] = []
        for item in items:
            queue, kind = item.queue, item.kind
            shape = shapes.get((queue, kind))
            if shape is None:
                shape = shapes[queue, kind] = (
                    f"send {queue}",
                    {
                        "messaging.system": SYSTEM,
                        "messaging.operation.type": "send",
                        "messaging.operation.name": "send",
                        "messaging.destination.name": queue,
                        "jaren_jobs.kind": kind,
                    },
                )
            # a copy: a sampler is handed the dict and may keep or change it
            spans.append(start(shape[0], kind=SpanKind.PRODUCER, attributes=dict(shape[1])))
        self._spans = spans

    def stamp(self, items: Sequence[Any]) -> Sequence[Any]:
        stamped = list(items)
        for index, span in enumerate(self._spans):
            context = span.get_span_context()
            if context.is_valid:  # else a no-op tracer: nothing to join
                stamped[index] = stamped[index]._replace(trace_context=format_traceparent(context))
        return stamped

    def sent(self, jobs: Sequence[Any], after_commit: Callable[[Callable[[], None]], None]) -> None:
        for span, job in zip(self._spans, jobs, strict=True):
            # a unique key's holder is answered in place of a new job: its id, as sent
            span.set_attribute("messaging.message.id", job.id)
            # the span ends when the job is visible to workers: at the commit. A
            # rolled-back enqueue never ends it, so no span claims a send that never was
            after_commit(span.end)


class _Tracing(Observer):
    wraps = True  # the attempt's span is current while its handler runs

    def __init__(self, tracer: trace.Tracer | None) -> None:
        # None: OpenTelemetry's global provider is still its placeholder, so no span
        # could be recorded; each enqueue and attempt checks again, since an
        # application may configure its SDK after instrument()
        self._tracer = tracer
        # per (queue, kind): the span's name and the attributes every one of its spans has
        self._sends: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._processes: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    def _resolved(self) -> trace.Tracer | None:
        if not _global_provider_set():
            return None
        self._tracer = tracer = trace.get_tracer("jaren_jobs", _VERSION)
        return tracer

    def enqueueing(self, items: Sequence[Any]) -> Sending | None:
        tracer = self._tracer
        if tracer is None and (tracer := self._resolved()) is None:
            return None
        return _Send(tracer, items, self._sends)

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        tracer = self._tracer
        if tracer is None and (tracer := self._resolved()) is None:
            return UNOBSERVED
        stored = job.trace_context
        parent = None
        if stored is not None:
            remote = parse_traceparent(stored)
            if remote is None:
                _log.debug(
                    "jaren_jobs: job %r holds a trace context that is not a W3C traceparent "
                    "(%.80r); its attempt's span starts a trace of its own",
                    job.id,
                    stored,
                )
            else:
                parent = trace.set_span_in_context(NonRecordingSpan(remote))
        queue, kind = job.queue, job.kind
        shape = self._processes.get((queue, kind))
        if shape is None:
            shape = self._processes[queue, kind] = (
                f"process {queue}",
                {
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": queue,
                    "jaren_jobs.kind": kind,
                },
            )
        return tracer.start_span(
            shape[0],
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                **shape[1],
                "messaging.message.id": job.id,
                "jaren_jobs.attempt": job.lease.attempt,
            },
        )

    def entering(self, state: Any) -> Any:
        return otel_context.attach(trace.set_span_in_context(state))

    def leaving(self, state: Any, entered: Any) -> None:
        otel_context.detach(entered)

    def checkpoint_saved(self, state: Any, job: Any, node_id: str) -> None:
        if not node_id.startswith("\x1f"):  # the DAG runner's own records are no node
            state.add_event("checkpoint", {"jaren_jobs.node": node_id})

    def attempt_ended(
        self, state: Any, job: Any, outcome: Any, error: BaseException | None
    ) -> None:
        span: Span = state
        name = outcome.outcome
        span.set_attribute("jaren_jobs.outcome", name)
        if name == "failed" and error is not None:
            span.record_exception(error)
            span.set_attribute("error.type", _error_type(error))
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
        elif name == "failed":
            span.set_status(Status(StatusCode.ERROR))
        elif name == "lost":
            refusal = _REFUSALS.get(outcome.code or "", "LeaseLost")
            span.set_attribute("error.type", refusal)
            span.set_status(Status(StatusCode.ERROR, refusal))
        span.end()


_installed: _Tracing | None = None
_lock = threading.Lock()


def instrument(*, tracer_provider: TracerProvider | None = None) -> None:
    """Trace every enqueue and every attempt of every store in this process (SPEC §17).

    ``tracer_provider``: where the spans go (default: the global provider).
    Idempotent; a later call with another provider replaces the earlier one.
    While the global provider is still OpenTelemetry's placeholder (no SDK set
    yet) no span is made and next to nothing is paid per job; an SDK set later
    is used from the next enqueue and attempt. A provider that can never record
    (``NoOpTracerProvider``) installs nothing.
    """
    global _installed
    # the global provider (whose first read also loads one OTEL_PYTHON_TRACER_PROVIDER names)
    provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
    tracer = None
    if not isinstance(provider, ProxyTracerProvider) or _global_provider_set():
        tracer = trace.get_tracer("jaren_jobs", _VERSION, tracer_provider=provider)
    with _lock:
        if _installed is not None:
            remove(_installed)
        _installed = _Tracing(tracer)
        # a no-op tracer (a NoOpTracerProvider, an SDK turned off) records nothing, ever:
        # the process stays unobserved, as if never instrumented
        if not isinstance(tracer, NoOpTracer):
            add(_installed)


def uninstrument() -> None:
    """Stop tracing (idempotent). Attempts already started still end their spans."""
    global _installed
    with _lock:
        if _installed is not None:
            remove(_installed)
            _installed = None
