"""OpenTelemetry spans of a run, off unless the standard variables turn them on (docs/tracing.md).

On when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and `OTEL_SDK_DISABLED` is
not `true`: the SDK (opentelemetry-sdk, OTLP over HTTP/protobuf) is then set up once per process, with
`OTEL_SERVICE_NAME` (default `air`) and the SDK's own variables for the rest. Off, nothing of the SDK is imported
and no exporter starts: each hook is one check of a cached flag.

A rollout is one span (`invoke_agent air`, its task, rollout, episode, status, return under `air.`) with a child
per stage of it, as air.progress sees them: `air.lease` (a sandbox leased and staged), `chat` (waiting for the
model's reply), `execute_tool bash` (a command), `air.evaluate` (a validate, submit or final evaluation, with its
status, score and reward). GenAI semantic-convention names where they fit (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.tool.name`, `gen_ai.conversation.id`, `gen_ai.agent.name`); air's own under
`air.`. A rollout started for a request that carries W3C trace context (`traceparent`) is a child of the caller's
span, so a trainer's trace reaches into air.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import threading
from collections.abc import Mapping
from typing import Any

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None
_decided = False


def enabled() -> bool:
    """Whether the standard variables ask for spans (read once per process, at the first rollout)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def tracer():
    """The process's tracer, set up at the first call when tracing is on; None when it is off."""
    global _tracer, _decided
    if _decided:
        return _tracer
    with _lock:
        if not _decided:
            _tracer = _setup() if enabled() else None
            _decided = True
    return _tracer


def reset() -> None:
    """Forget whether tracing is on, so that the next rollout reads the variables again (a bench or test that
    changes them in one process); what was batched is sent first."""
    global _tracer, _provider, _decided
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _tracer = _provider = None
        _decided = False


def _setup():
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # asked for, not installed: said once, and the run goes on without spans
        import sys

        print(f"air: warning: OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing ({exc.name}): "
              "no spans are sent; pip install 'air[tracing]'", file=sys.stderr, flush=True)
        return None

    from air import __version__

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "air",
                                "service.version": __version__})
    global _provider
    _provider = TracerProvider(resource=resource)
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint, headers: the SDK's variables
    atexit.register(_provider.shutdown)  # what is batched goes out before the process ends
    return _provider.get_tracer("air", __version__)


def flush(timeout_ms: int = 10_000) -> None:
    """Send what is batched now (a command about to exit; a test reading the collector)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


STAGES = {"sandbox": ("air.lease", None), "model": ("chat", "chat"), "command": ("execute_tool bash", "execute_tool"),
          "scoring": ("air.evaluate", None)}


class RolloutSpans:
    """The spans of one rollout, driven by air.progress's events."""

    def __init__(self, tracer, task: str, label: str, carrier: Mapping[str, str] | None = None,
                 model: str | None = None):
        from opentelemetry import trace
        from opentelemetry.propagate import extract

        self._trace = trace
        self.model = model
        parent = extract(dict(carrier)) if carrier else None
        self.tracer = tracer
        self.root = tracer.start_span("invoke_agent air", context=parent, kind=trace.SpanKind.INTERNAL,
                                      attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "air",
                                                  "air.task": task, "air.rollout": label})
        self._context = trace.set_span_in_context(self.root)
        self.child = None

    def stage(self, what: str, detail: str, turn: int) -> None:
        self._end_child()
        name, operation = STAGES[what]
        attributes: dict[str, Any] = {"air.turn": turn}
        if operation:
            attributes["gen_ai.operation.name"] = operation
        if what == "model" and self.model:
            attributes["gen_ai.request.model"] = self.model
            name = f"chat {self.model}"
        if what == "command":
            attributes |= {"gen_ai.tool.name": "bash", "air.command": detail[:200]}
        self.child = self.tracer.start_span(name, context=self._context, attributes=attributes)

    def episode(self, episode_id: str) -> None:
        self.root.set_attribute("gen_ai.conversation.id", episode_id)
        self.root.set_attribute("air.episode", episode_id)

    def validated(self, status: str, score: float | None, normalized: float | None, reward: float,
                  draw: str | None = None) -> None:
        span = self.child if self.child is not None else self.root
        attributes = {"air.eval_status": status, "air.reward": reward, **({"air.score": score} if score is not None
                                                                          else {}),
                      **({"air.normalized": normalized} if normalized is not None else {}),
                      **({"air.draw": draw} if draw else {})}
        span.set_attributes(attributes)
        self.root.add_event("air.validate", attributes)

    def end(self, status: str, error: str | None = None, **attributes: Any) -> None:
        self._end_child()
        self.root.set_attributes({"air.status": status, **{f"air.{k}": v for k, v in attributes.items()
                                                           if v is not None}})
        if error is not None:
            self.root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error[:500]))
        self.root.end()

    def _end_child(self) -> None:
        if self.child is not None:
            self.child.end()
            self.child = None


incoming: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("air_trace_incoming", default=None)
"""The trace context of the request being served (air/services/guard.py sets it): rollouts it starts are its
children."""


def trace_headers(headers: Mapping[bytes, bytes]) -> dict[str, str] | None:
    """W3C trace context among raw ASGI headers (`traceparent`, `tracestate`), bounded; None without one."""
    found = {name: headers[name.encode()].decode("latin-1")[:512] for name in ("traceparent", "tracestate")
             if name.encode() in headers}
    return found if "traceparent" in found else None


def rollout_spans(task: str, label: str, carrier: Mapping[str, str] | None = None,
                  model: str | None = None) -> RolloutSpans | None:
    t = tracer()
    if t is None:
        return None
    return RolloutSpans(t, task, label, carrier or incoming.get(), model)


__all__ = ["RolloutSpans", "enabled", "flush", "rollout_spans", "tracer"]
