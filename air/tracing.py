"""OpenTelemetry spans of a run, off unless the standard variables turn them on (docs/tracing.md).

On when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, or `OTEL_TRACES_EXPORTER`
names `otlp` or `console`, and `OTEL_SDK_DISABLED` is not `true`: the SDK (opentelemetry-sdk, OTLP over
HTTP/protobuf) is then set up once per process. Off, nothing of the SDK is imported and no exporter starts: each hook
is one check of a cached flag. Every standard variable that bears on traces is honoured or refused, each refusal in
one `air: warning:` line said once (VARIABLES below, `settings`): `OTEL_TRACES_EXPORTER=none` turns spans off,
`OTEL_EXPORTER_OTLP_PROTOCOL=grpc` is refused (no gRPC exporter here) and no spans are sent rather than sent
somewhere else, a timeout is milliseconds as the specification says.

A rollout is one trace: its span (`invoke_agent air`) with a child per stage of it, as air.progress sees them:
`air.lease` (a sandbox leased and staged), `chat MODEL` (one per turn: the model's reply, with the messages sent and
received, the token usage and the finish reason where air asks the model itself), `execute_tool bash` (a command,
its exit code), `air.evaluate` (a validate, submit or final evaluation, with its status, score and reward). The
rollouts of one process are grouped as a run: `air.run.id` and OpenInference's `session.id` on each rollout's span,
the project (`openinference.project.name`, Phoenix's) on the resource. Names follow the OpenTelemetry GenAI
conventions (`gen_ai.*`: the operation, model, messages as `gen_ai.input.messages` / `gen_ai.output.messages`,
usage) and OpenInference's (`openinference.span.kind`, `llm.*`, `input.value`, `output.value`, `tool.name`), so
that Phoenix and other GenAI viewers show them; air's own are under `air.`. Whatever is text of the model's or the
agent's is bounded (CONTENT_CHARS a text, MESSAGES a list) and redacted (`redact`: URLs' passwords, the process's
secret values, API keys and tokens by their shape) before it is put on a span; `OTEL_INSTRUMENTATION_GENAI_CAPTURE_
MESSAGE_CONTENT=false` leaves the texts off.

A rollout started for a request that carries W3C trace context (`traceparent`) is a child of the caller's span, so
a trainer's trace reaches into air; a model request air makes carries the chat span's `traceparent`, so the model
server's own spans join the rollout's trace.

A collector that is away costs a process at most EXIT_WAIT seconds at its exit and one `air:` line; the SDK's own
log lines never reach the terminal (they are the cause of that one line).
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import os
import re
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None
_decided = False
_settings: Settings | None = None

EXIT_WAIT = 2.0
"""Seconds a process waits at its exit for its last spans to reach the collector (then they are dropped, said once)."""
CONTENT_CHARS = 2000
"""The most of one text (a message's content, a command's output) put on a span: its head and tail, the middle
left out and said so."""
MESSAGES = 8
"""The most messages of a conversation put on a chat span: the first (the system prompt) and the latest (a chat
span of a 30-turn conversation stays about 32 KB)."""
COMMAND_CHARS = 200
"""`air.command`: a command's first characters."""

HONOURED = {
    "OTEL_SDK_DISABLED": "true turns spans off",
    "OTEL_SERVICE_NAME": "the resource's service.name (default air)",
    "OTEL_RESOURCE_ATTRIBUTES": "the resource's attributes (openinference.project.name among them names the project)",
    "OTEL_TRACES_EXPORTER": "otlp (the default where an endpoint is set), console (spans as JSON on stderr), none",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "the collector (its /v1/traces)",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the collector's traces URL, whole",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf only",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf only",
    "OTEL_EXPORTER_OTLP_HEADERS": "headers of each export (key=value,...)",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "headers of each export (key=value,...)",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "milliseconds an export may take (default 10000)",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "milliseconds an export may take",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip, deflate or none",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip, deflate or none",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "the CA file of an https collector",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "the CA file of an https collector",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY": "the client's key file (mutual TLS)",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "the client's key file (mutual TLS)",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "the client's certificate file (mutual TLS)",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "the client's certificate file (mutual TLS)",
    "OTEL_TRACES_SAMPLER": "always_on, always_off, traceidratio, parentbased_always_on (default), "
                           "parentbased_always_off, parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "the ratio of the traceidratio samplers, 0 to 1",
    "OTEL_PROPAGATORS": "tracecontext, baggage, none (the trace context read from requests and sent to the model)",
    "OTEL_BSP_SCHEDULE_DELAY": "milliseconds between batches",
    "OTEL_BSP_EXPORT_TIMEOUT": "milliseconds a batch's export may take",
    "OTEL_BSP_MAX_QUEUE_SIZE": "spans queued at most",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "spans a batch at most",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "characters an attribute at most",
    "OTEL_ATTRIBUTE_COUNT_LIMIT": "attributes a span at most",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "characters a span attribute at most",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "attributes a span at most",
    "OTEL_SPAN_EVENT_COUNT_LIMIT": "events a span at most",
    "OTEL_SPAN_LINK_COUNT_LIMIT": "links a span at most",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "attributes an event at most",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "attributes a link at most",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false leaves the messages' and commands' texts off the "
                                                          "spans (default: on, bounded and redacted)",
    "OTEL_LOG_LEVEL": "debug or info shows the SDK's own log lines (as air: lines); default: one line when the "
                      "collector is away",
}
"""The standard variables air reads, and how; every other OTEL_ variable set is refused in one line (air sends
traces only: no metrics, no logs)."""

_INTEGERS = ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE",
             "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
             "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
             "OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT")
_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")
_EXPORTERS = ("otlp", "console", "none")
_PROPAGATORS = ("tracecontext", "baggage", "none")
_COMPRESSIONS = ("gzip", "deflate", "none")
_LOG_LEVELS = ("debug", "info", "warn", "warning", "error", "fatal", "critical", "off", "none")


@dataclass
class Settings:
    """What the standard variables ask for, as air reads them (`settings`)."""

    on: bool = False
    exporters: tuple[str, ...] = ()
    endpoint: str = ""
    """Where spans go (OTLP), for the line that says it is away."""
    timeout: float | None = None
    """Seconds an export may take (the variables say milliseconds); None: the SDK's default."""
    propagators: tuple[str, ...] = ("tracecontext", "baggage")
    content: bool = True
    log_level: str = ""
    refused: list[str] = field(default_factory=list)
    """One line each: a variable set that air does not honour, and what it does instead."""


def _number(name: str, value: str, refused: list[str], low: float = 0.0, high: float | None = None,
            integer: bool = False) -> float | None:
    try:
        number = float(value)
        if integer and number != int(number):
            raise ValueError
    except ValueError:
        refused.append(f"{name}={value!r} is not {'a whole number' if integer else 'a number'}: the SDK's default "
                       "is used")
        return None
    if number < low or (high is not None and number > high) or number != number:
        refused.append(f"{name}={value!r} is out of range ({low:g} to {high:g}): the default is used" if high
                       is not None else f"{name}={value!r} is below {low:g}: the default is used")
        return None
    return number


def _pairs(name: str, value: str, refused: list[str]) -> dict[str, str] | None:
    """`key=value,key=value` (W3C baggage's form: headers, resource attributes), or None (refused) when malformed."""
    out: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            refused.append(f"{name} is not a list of key=value pairs (at {item.strip()[:40]!r}): it is ignored")
            return None
        out[key.strip()] = val.strip()
    return out


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """What the standard variables ask for: whether spans are on, where they go, and one line per variable air
    refuses (a value it cannot honour, or a variable of metrics or logs, which air does not send)."""
    env = os.environ if environ is None else environ
    out = Settings()
    refused = out.refused

    def get(name: str) -> str:
        return (env.get(name) or "").strip()

    if get("OTEL_SDK_DISABLED").lower() == "true":
        return out  # the SDK disabled: nothing else is read, nothing said

    exporters: list[str] = []
    named = [e.strip().lower() for e in get("OTEL_TRACES_EXPORTER").split(",") if e.strip()]
    for exporter in named:
        if exporter in _EXPORTERS:
            exporters.append(exporter)
        else:
            refused.append(f"OTEL_TRACES_EXPORTER={exporter} is not one air has (otlp, console, none): no spans go "
                           "there")
    endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not named:  # unset: OTLP where an endpoint is set, nothing otherwise
        exporters = ["otlp"] if endpoint else []
    if "none" in exporters:
        exporters = []  # honoured: none means none, whatever else is named beside it

    if "otlp" in exporters:
        protocol_name = next((n for n in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
                              if get(n)), None)
        protocol = get(protocol_name).lower() if protocol_name else "http/protobuf"
        if protocol != "http/protobuf":
            refused.append(f"{protocol_name}={protocol} is not supported (air sends OTLP over http/protobuf; set "
                           "it, and the collector's HTTP endpoint, usually port 4318): no spans are sent")
            exporters.remove("otlp")
        shown = endpoint or "http://localhost:4318"
        if endpoint and not re.match(r"^https?://[^/\s]", endpoint):
            name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") else \
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            refused.append(f"{name}={endpoint[:80]!r} is not an http:// or https:// URL: no spans are sent")
            if "otlp" in exporters:
                exporters.remove("otlp")
        from air.secrets import redact_url

        out.endpoint = redact_url(shown)
        for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
            if get(name):
                millis = _number(name, get(name), refused, 0.0)
                if millis is not None:
                    out.timeout = millis / 1000
                break
        for name in ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"):
            if get(name) and get(name).lower() not in _COMPRESSIONS:
                refused.append(f"{name}={get(name)} is not gzip, deflate or none: exports are not compressed")
        for name in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
            if get(name):
                _pairs(name, get(name), refused)
        for name in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                     "OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                     "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"):
            if get(name) and not os.path.isfile(get(name)):
                refused.append(f"{name}={get(name)} is not a file: no spans are sent")
                if "otlp" in exporters:
                    exporters.remove("otlp")
    out.exporters = tuple(dict.fromkeys(exporters))
    out.on = bool(out.exporters)

    sampler = get("OTEL_TRACES_SAMPLER").lower()
    if sampler and sampler not in _SAMPLERS:
        refused.append(f"OTEL_TRACES_SAMPLER={sampler} is not one of {', '.join(_SAMPLERS)}: "
                       "parentbased_always_on is used")
    if get("OTEL_TRACES_SAMPLER_ARG") and sampler.endswith("traceidratio"):
        _number("OTEL_TRACES_SAMPLER_ARG", get("OTEL_TRACES_SAMPLER_ARG"), refused, 0.0, 1.0)
    propagators = [p.strip().lower() for p in get("OTEL_PROPAGATORS").split(",") if p.strip()]
    if propagators:
        unknown = [p for p in propagators if p not in _PROPAGATORS]
        if unknown:
            refused.append(f"OTEL_PROPAGATORS: {', '.join(unknown)} not supported (tracecontext, baggage, none): "
                           "left out")
        kept = [p for p in propagators if p in _PROPAGATORS]
        out.propagators = () if "none" in kept else tuple(kept) if kept else out.propagators
    for name in _INTEGERS:
        if get(name):
            _number(name, get(name), refused, 0.0, integer=True)
    if get("OTEL_RESOURCE_ATTRIBUTES"):
        _pairs("OTEL_RESOURCE_ATTRIBUTES", get("OTEL_RESOURCE_ATTRIBUTES"), refused)
    capture = get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").lower()
    if capture in ("false", "0", "no", "off"):
        out.content = False
    elif capture and capture not in ("true", "1", "yes", "on"):
        refused.append(f"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT={capture} is not true or false: the "
                       "texts are kept (bounded and redacted)")
    level = get("OTEL_LOG_LEVEL").lower()
    if level and level not in _LOG_LEVELS:
        refused.append(f"OTEL_LOG_LEVEL={level} is not one of debug, info, warn, error: warn is used")
    out.log_level = level if level in _LOG_LEVELS else ""
    for name in sorted(env):
        value = (env.get(name) or "").strip()
        if name in ("OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER") and value.lower() == "none":
            continue  # honoured: air sends none
        if name.startswith("OTEL_") and name not in HONOURED and value:
            refused.append(f"{name} is not used: air sends traces only (no metrics, no logs), and reads the "
                           "variables docs/tracing.md lists")
    return out


def enabled() -> bool:
    """Whether the standard variables ask for spans."""
    return settings().on


def tracer():
    """The process's tracer, set up at the first call when tracing is on; None when it is off. The refusals of
    the variables are said then, once."""
    global _tracer, _decided, _settings
    if _decided:
        return _tracer
    with _lock:
        if not _decided:
            _settings = settings()
            if _settings.on or _settings.refused:
                for line in _settings.refused:
                    _say(f"air: warning: {line}")
            _tracer = _setup(_settings) if _settings.on else None
            _decided = True
    return _tracer


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed stderr never fails a rollout
        pass


def reset() -> None:
    """Forget whether tracing is on, so that the next rollout reads the variables again (a bench or test that
    changes them in one process); what was batched is sent first (at most EXIT_WAIT)."""
    global _tracer, _provider, _decided, _settings, _run
    with _lock:
        if _provider is not None:
            _shutdown_bounded(_provider)
        _tracer = _provider = None
        _decided = False
        _settings = None
        _run = None


# ----- the SDK's set-up, its log lines and a bounded exit ---------------------------------------------------------
_away_said = False


class _SdkLines(logging.Handler):
    """The SDK's own log lines (a failed export, its retries): never written as they are. The first failure is
    one `air:` line naming the collector; OTEL_LOG_LEVEL=debug or info shows every line, as an air: line."""

    def __init__(self, endpoint: str, verbose: bool):
        super().__init__(logging.DEBUG if verbose else logging.WARNING)
        self.endpoint, self.verbose = endpoint, verbose

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
        except (TypeError, ValueError):  # a record whose arguments do not format: no traceback for it
            text = str(record.msg)
        from air.secrets import redact_text

        if self.verbose:
            _say(f"air: opentelemetry: {redact_text(text)[:300]}")
        elif record.levelno >= logging.WARNING:
            _collector_away(self.endpoint, text)


def _collector_away(endpoint: str, why: str) -> None:
    global _away_said
    with _lock_away:
        if _away_said:
            return
        _away_said = True
    from air.secrets import redact_text

    reason = re.sub(r"\s+", " ", why)
    refused = re.search(r"\[Errno \d+\] [^\")']+", reason)
    shown = refused.group(0) if refused else redact_text(reason)[:160]
    _say(f"air: warning: the OpenTelemetry collector at {endpoint} did not take spans ({shown}): spans of this "
         "process may be lost; its exit waits for it at most "
         f"{EXIT_WAIT:g} s (OTEL_EXPORTER_OTLP_ENDPOINT, docs/tracing.md)")


_lock_away = threading.Lock()


def _setup(chosen: Settings):
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        if "otlp" in chosen.exporters:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:  # asked for, not installed: said once, and the run goes on without spans
        _say(f"air: warning: OpenTelemetry spans are asked for (OTEL_EXPORTER_OTLP_ENDPOINT or "
             f"OTEL_TRACES_EXPORTER) but the SDK is missing ({exc.name}): no spans are sent; "
             "pip install 'air[tracing]'")
        return None

    from air import __version__

    verbose = chosen.log_level in ("debug", "info")
    sdk_log = logging.getLogger("opentelemetry")
    sdk_log.handlers = [_SdkLines(chosen.endpoint, verbose)]
    sdk_log.setLevel(logging.DEBUG if verbose else logging.WARNING)
    sdk_log.propagate = False  # Python's last-resort handler would print them raw

    given = _pairs("", os.environ.get("OTEL_RESOURCE_ATTRIBUTES") or "", []) or {}
    # OTEL_SERVICE_NAME first, then OTEL_RESOURCE_ATTRIBUTES' service.name, as the specification orders them.
    attributes: dict[str, Any] = {"service.name": (os.environ.get("OTEL_SERVICE_NAME") or "").strip()
                                  or given.get("service.name") or "air", "service.version": __version__}
    if "openinference.project.name" not in given:  # Phoenix's project: the service's name unless one is given
        attributes["openinference.project.name"] = attributes["service.name"]
    global _provider
    # shutdown_on_exit off: air's own exit hook bounds the wait (EXIT_WAIT); the SDK's would wait for retries.
    _provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    if "otlp" in chosen.exporters:
        # endpoint, headers, compression, certificates: the SDK's variables; the timeout as the specification means it.
        exporter = OTLPSpanExporter(**({"timeout": chosen.timeout} if chosen.timeout is not None else {}))
        _provider.add_span_processor(BatchSpanProcessor(exporter))
    if "console" in chosen.exporters:
        _provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    atexit.register(_at_exit)
    return _provider.get_tracer("air", __version__)


def _shutdown_bounded(provider) -> bool:
    """Shut the provider down (its batches sent), waiting at most EXIT_WAIT seconds; False if it did not finish."""
    done = threading.Thread(target=provider.shutdown, name="air-otel-shutdown", daemon=True)
    done.start()
    done.join(EXIT_WAIT)
    return not done.is_alive()


def _at_exit() -> None:
    provider = _provider
    if provider is None:
        return
    if not _shutdown_bounded(provider) and _settings is not None:
        _collector_away(_settings.endpoint, f"no answer within {EXIT_WAIT:g} s")


def flush(timeout_ms: int = 10_000) -> None:
    """Send what is batched now (a command about to exit; a test reading the collector)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


# ----- the run ----------------------------------------------------------------------------------------------------
_run: dict[str, str] | None = None


def run() -> dict[str, str]:
    """The run this process's rollouts belong to: an id made once per process (`air.run.id`, also OpenInference's
    `session.id`, which Phoenix groups traces by) and the command that runs it (`air.run.command`)."""
    global _run
    if _run is None:
        command = " ".join([os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
                            *sys.argv[1:]])
        _run = {"air.run.id": uuid.uuid4().hex, "air.run.command": redact(command)[:500]}
    return _run


# ----- what goes on a span: bounded, redacted -------------------------------------------------------------------
_SHAPES = [
    (re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|$)", re.S),
     "-----BEGIN PRIVATE KEY----- *** -----END PRIVATE KEY-----"),
    (re.compile(r"\b(sk|rk|pk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{16,}"), r"\1-***"),  # OpenAI, Anthropic, Stripe
    (re.compile(r"\b(gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}"), r"\1***"),  # GitHub
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "hf_***"),  # Hugging Face
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), r"\1***"),  # AWS access key ids
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "xox-***"),  # Slack
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), "AIza***"),  # Google
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "eyJ***"),  # JWTs
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    (re.compile(r"(?i)(--?[\w-]*(?:password|passwd|secret|token|api[_-]?key)[\w-]*\s+)([^\s-]\S{3,})"), r"\1***"),
    (re.compile(r"(?i)([\w.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)"
                r"[\w.-]*[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]{4,})"), r"\1***"),
]
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)


def _environment_secrets() -> list[str]:
    """Values of this process's variables named like a secret (OPENAI_API_KEY, HF_TOKEN, ...), 8 characters or
    longer: whatever the agent's command prints of them is hidden too."""
    found = {value for name, value in os.environ.items() if _SECRET_NAME.search(name) and len(value) >= 8
             and not name.startswith("OTEL_")}
    return sorted(found, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` without secrets: URLs' passwords and secret query values, the secret values this process holds (air's
    secret variables, any variable named like a key or token), and keys, tokens and private keys by their shape."""
    from air.secrets import HIDDEN, redact_text

    text = redact_text(text)
    for value in _environment_secrets():
        text = text.replace(value, HIDDEN)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


def bounded(text: str, limit: int = CONTENT_CHARS) -> str:
    """At most `limit` characters of `text`, redacted: its head and tail, the middle said as left out. Redacted
    before the cut that is kept (a secret across the cut is then in the part left out, never half shown)."""
    if len(text) <= limit:
        return redact(text)
    if len(text) > 4 * limit:  # the regular expressions over what may be kept only (an output of megabytes)
        text = text[:2 * limit] + "\0" + text[-2 * limit:]
    text = redact(text)
    half = limit // 2
    left_out = len(text) - 2 * half - text.count("\0")
    return f"{text[:half]}\n[... {left_out} characters left out ...]\n{text[-half:]}"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's parts: the text ones
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _messages_kept(messages: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
    """The first message and the latest, MESSAGES at most; and how many were left out between."""
    messages = list(messages)
    if len(messages) <= MESSAGES:
        return messages, 0
    return [messages[0], *messages[-(MESSAGES - 1):]], len(messages) - MESSAGES


def message_attributes(prefix: str, messages: Sequence[Mapping[str, Any]], content: bool = True) -> dict[str, Any]:
    """OpenInference's flattened messages (`llm.input_messages.0.message.role`, ...), bounded and redacted."""
    attributes: dict[str, Any] = {}
    for i, message in enumerate(messages):
        head = f"{prefix}.{i}.message"
        attributes[f"{head}.role"] = str(message.get("role") or "")
        if content:
            text = _content_text(message.get("content"))
            if text:
                attributes[f"{head}.content"] = bounded(text)
        if message.get("tool_call_id"):
            attributes[f"{head}.tool_call_id"] = str(message["tool_call_id"])
        for j, call in enumerate(c for c in message.get("tool_calls") or [] if isinstance(c, dict)):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            attributes[f"{head}.tool_calls.{j}.tool_call.id"] = str(call.get("id") or "")
            attributes[f"{head}.tool_calls.{j}.tool_call.function.name"] = str(function.get("name") or "")
            if content:
                attributes[f"{head}.tool_calls.{j}.tool_call.function.arguments"] = \
                    bounded(str(function.get("arguments") or ""))
    return attributes


def genai_messages(messages: Sequence[Mapping[str, Any]], content: bool = True,
                   finish_reason: str | None = None) -> list[dict[str, Any]]:
    """Messages as the GenAI conventions write them (`gen_ai.input.messages`: role and parts), bounded and
    redacted; without `content`, the parts' texts are left out."""
    out = []
    for message in messages:
        role = str(message.get("role") or "")
        parts: list[dict[str, Any]] = []
        text = _content_text(message.get("content"))
        if role == "tool":
            parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                          **({"response": bounded(text)} if content else {})})
        elif text:
            parts.append({"type": "text", **({"content": bounded(text)} if content else {})})
        for call in (c for c in message.get("tool_calls") or [] if isinstance(c, dict)):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            parts.append({"type": "tool_call", "id": call.get("id"), "name": function.get("name"),
                          **({"arguments": bounded(str(function.get("arguments") or ""))} if content else {})})
        entry: dict[str, Any] = {"role": role, "parts": parts}
        if finish_reason is not None:
            entry["finish_reason"] = finish_reason
        out.append(entry)
    return out


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


STAGES = {"sandbox": ("air.lease", None, "CHAIN"), "model": ("chat", "chat", "LLM"),
          "command": ("execute_tool bash", "execute_tool", "TOOL"), "scoring": ("air.evaluate", None, "EVALUATOR")}


class RolloutSpans:
    """The spans of one rollout, driven by air.progress's events (and, for a model air asks itself, by its policy:
    `chat_request`, `chat_answer`, `chat_failed`, `headers`). No method raises."""

    def __init__(self, tracer, task: str, label: str, carrier: Mapping[str, str] | None = None,
                 model: str | None = None, chosen: Settings | None = None):
        from opentelemetry import trace

        self._trace = trace
        self.model = model
        self.settings = chosen or Settings(on=True)
        self.content = self.settings.content
        parent = self._extract(carrier) if carrier else None
        self.tracer = tracer
        self.usage = {"input": 0, "output": 0}
        self.root = tracer.start_span("invoke_agent air", context=parent, kind=trace.SpanKind.INTERNAL,
                                      attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "air",
                                                  "openinference.span.kind": "AGENT", "air.task": task,
                                                  "air.rollout": label, **run(),
                                                  "session.id": run()["air.run.id"]})
        self._context = trace.set_span_in_context(self.root)
        self.child = None
        self.child_kind: str | None = None
        self.turn = 0
        self._answered = False

    # ----- W3C trace context in and out ------------------------------------------------------------------------
    def _propagator(self):
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        kinds = {"tracecontext": TraceContextTextMapPropagator, "baggage": W3CBaggagePropagator}
        return CompositePropagator([kinds[p]() for p in self.settings.propagators if p in kinds])

    def _extract(self, carrier: Mapping[str, str]):
        return self._propagator().extract(dict(carrier)) if self.settings.propagators else None

    def headers(self) -> dict[str, str]:
        """The W3C trace context of the current stage's span (`traceparent`, and `tracestate` where there is one),
        for a request air makes to the model: the model server's spans join this rollout's trace."""
        if not self.settings.propagators:
            return {}
        span = self.child if self.child is not None else self.root
        carrier: dict[str, str] = {}
        self._propagator().inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    # ----- stages ------------------------------------------------------------------------------------------------
    def stage(self, what: str, detail: str, turn: int) -> None:
        self._end_child()
        name, operation, kind = STAGES[what]
        self.turn = turn
        attributes: dict[str, Any] = {"air.turn": turn, "openinference.span.kind": kind}
        if operation:
            attributes["gen_ai.operation.name"] = operation
        if what == "model":
            attributes |= {"gen_ai.provider.name": "openai"}
            if self.model:
                attributes |= {"gen_ai.request.model": self.model, "llm.model_name": self.model}
                name = f"chat {self.model}"
        if what == "command":
            attributes |= {"gen_ai.tool.name": "bash", "tool.name": "bash",
                           "air.command": redact(detail[:COMMAND_CHARS])}
            if self.content:
                attributes |= {"input.value": bounded(detail), "gen_ai.tool.call.arguments": _json(
                    {"command": bounded(detail)})}
        self.child = self.tracer.start_span(name, context=self._context, attributes=attributes)
        self.child_kind = what
        self._answered = False

    def _chat(self):
        return self.child if self.child_kind == "model" and self.child is not None else None

    def chat_request(self, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any] | None = None,
                     whole: bool = True) -> None:
        """The messages air sends the model for this turn (`whole`: the conversation; else the turn's new
        messages only, where a trainer holds the rest), and the request's parameters."""
        span = self._chat()
        if span is None:
            return
        kept, left_out = _messages_kept(messages)
        attributes: dict[str, Any] = {"gen_ai.input.messages": _json(genai_messages(kept, self.content)),
                                      **message_attributes("llm.input_messages", kept, self.content),
                                      "air.input.messages": len(messages), "air.input.whole": whole}
        if left_out:
            attributes["air.input.messages_left_out"] = left_out
        if self.content and kept:
            last = kept[-1]
            attributes |= {"input.value": bounded(_content_text(last.get("content"))), "input.mime_type": "text/plain"}
        for key, name in (("temperature", "gen_ai.request.temperature"), ("max_tokens", "gen_ai.request.max_tokens"),
                          ("top_p", "gen_ai.request.top_p"), ("seed", "gen_ai.request.seed")):
            value = (parameters or {}).get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[name] = value
        if parameters:
            shown = {k: v for k, v in parameters.items() if isinstance(v, str | int | float | bool)}
            attributes["llm.invocation_parameters"] = _json(shown)
        span.set_attributes(attributes)

    def chat_answer(self, completion: Mapping[str, Any]) -> None:
        """What the model answered (an OpenAI chat completion): its message, finish reason, model, id and usage."""
        span = self._chat()
        if span is None:
            return
        attributes: dict[str, Any] = {}
        try:
            choice = completion["choices"][0]
            message = choice.get("message") or {}
            finish = choice.get("finish_reason")
        except (LookupError, TypeError, AttributeError):
            return
        if isinstance(finish, str):
            attributes["gen_ai.response.finish_reasons"] = [finish]
        if isinstance(completion.get("id"), str):
            attributes["gen_ai.response.id"] = completion["id"]
        if isinstance(completion.get("model"), str):
            attributes["gen_ai.response.model"] = completion["model"]
        attributes |= self._output(message, finish if isinstance(finish, str) else None)
        usage = completion.get("usage")
        if isinstance(usage, dict):
            attributes |= self._usage(usage)
        span.set_attributes(attributes)
        self._answered = True

    def replied(self, message: Mapping[str, Any]) -> None:
        """The reply as the episode got it, for a chat span whose model air did not ask itself (a trainer's)."""
        span = self._chat()
        if span is None or self._answered:
            return
        span.set_attributes(self._output(message, None))
        self._answered = True

    def _output(self, message: Mapping[str, Any], finish: str | None) -> dict[str, Any]:
        message = {"role": "assistant", **message}
        attributes = {"gen_ai.output.messages": _json(genai_messages([message], self.content, finish)),
                      **message_attributes("llm.output_messages", [message], self.content)}
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if self.content:
            text = _content_text(message.get("content"))
            calls = message.get("tool_calls") or []
            if not text and calls:
                text = _json([{"name": (c.get("function") or {}).get("name"),
                               "arguments": (c.get("function") or {}).get("arguments")}
                              for c in calls if isinstance(c, dict)])
            attributes |= {"output.value": bounded(text), "output.mime_type": "text/plain"}
            if isinstance(reasoning, str) and reasoning:
                attributes["air.reasoning"] = bounded(reasoning)
        return attributes

    def _usage(self, usage: Mapping[str, Any]) -> dict[str, Any]:
        def count(value: Any) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

        prompt, completion = count(usage.get("prompt_tokens")), count(usage.get("completion_tokens"))
        total = count(usage.get("total_tokens"))
        attributes: dict[str, Any] = {}
        if prompt is not None:
            attributes |= {"gen_ai.usage.input_tokens": prompt, "llm.token_count.prompt": prompt}
            self.usage["input"] += prompt
        if completion is not None:
            attributes |= {"gen_ai.usage.output_tokens": completion, "llm.token_count.completion": completion}
            self.usage["output"] += completion
        if total is None and prompt is not None and completion is not None:
            total = prompt + completion
        if total is not None:
            attributes["llm.token_count.total"] = total
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and count(details.get("cached_tokens")) is not None:
            attributes["llm.token_count.prompt_details.cache_read"] = details["cached_tokens"]
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and count(details.get("reasoning_tokens")) is not None:
            attributes["llm.token_count.completion_details.reasoning"] = details["reasoning_tokens"]
        return attributes

    def chat_failed(self, error: str) -> None:
        """The model's request failed (unreachable, an HTTP error, an answer that is no chat completion)."""
        span = self._chat()
        if span is None:
            return
        span.set_attribute("error.type", "ModelUnavailable")
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, redact(error)[:500]))

    def command_done(self, exit_code: int | None, timed_out: bool, oom_killed: bool, output: str) -> None:
        """A command's end: its exit code (`process.exit.code`), why it ended if it did not exit by itself, and
        what it printed; a command that failed is a span with status ERROR saying how."""
        span = self.child if self.child_kind == "command" else None
        if span is None:
            return
        attributes: dict[str, Any] = {"air.timed_out": timed_out, "air.oom_killed": oom_killed}
        if exit_code is not None:
            attributes |= {"process.exit.code": exit_code, "air.exit_code": exit_code}
        if self.content:
            attributes |= {"output.value": bounded(output), "gen_ai.tool.call.result": bounded(output)}
        why = ("timed out" if timed_out else "killed: out of memory" if oom_killed else
               f"exit code {exit_code}" if exit_code not in (0, None) else None)
        if why is not None:
            attributes["error.type"] = "timeout" if timed_out else "oom" if oom_killed else "exit_code"
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, why))
        span.set_attributes(attributes)

    def episode(self, episode_id: str, prompt: str | None = None) -> None:
        self.root.set_attribute("gen_ai.conversation.id", episode_id)
        self.root.set_attribute("air.episode", episode_id)
        if prompt and self.content:
            self.root.set_attributes({"input.value": bounded(prompt), "input.mime_type": "text/plain"})

    def validated(self, status: str, score: float | None, normalized: float | None, reward: float,
                  draw: str | None = None, message: str | None = None) -> None:
        span = self.child if self.child is not None else self.root
        attributes = {"air.eval_status": status, "air.reward": reward, **({"air.score": score} if score is not None
                                                                          else {}),
                      **({"air.normalized": normalized} if normalized is not None else {}),
                      **({"air.draw": draw} if draw else {})}
        span.set_attributes(attributes)
        if self.child_kind == "scoring" and self.child is not None:
            self.child.set_attributes({"output.value": f"{status}, score {score}, reward {reward:+.6g}"})
            if status != "ok":
                self.child.set_attribute("error.type", status)
                self.child.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                                         redact(f"evaluation {status}: {message or ''}")[:500]))
        self.root.add_event("air.validate", attributes)

    def end(self, status: str, error: str | None = None, **attributes: Any) -> None:
        self._end_child()
        usage = {**({"gen_ai.usage.input_tokens": self.usage["input"]} if self.usage["input"] else {}),
                 **({"gen_ai.usage.output_tokens": self.usage["output"]} if self.usage["output"] else {})}
        said = {"output.value": ", ".join(f"{k} {v}" for k, v in attributes.items() if v is not None) or status}
        self.root.set_attributes({"air.status": status, **usage, **said,
                                  **{f"air.{k}": v for k, v in attributes.items() if v is not None}})
        if error is not None:
            self.root.set_attribute("error.type", str(attributes.get("failure") or "error"))
            self.root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, redact(error)[:500]))
        self.root.end()

    def _end_child(self) -> None:
        if self.child is not None:
            self.child.end()
            self.child = None
            self.child_kind = None


incoming: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("air_trace_incoming", default=None)
"""The trace context of the request being served (air/services/guard.py sets it): rollouts it starts are its
children."""


def trace_headers(headers: Mapping[bytes, bytes]) -> dict[str, str] | None:
    """W3C trace context among raw ASGI headers (`traceparent`, `tracestate`, `baggage`), bounded; None without
    one."""
    found = {name: headers[name.encode()].decode("latin-1")[:512] for name in ("traceparent", "tracestate", "baggage")
             if name.encode() in headers}
    return found if "traceparent" in found else None


def rollout_spans(task: str, label: str, carrier: Mapping[str, str] | None = None,
                  model: str | None = None) -> RolloutSpans | None:
    t = tracer()
    if t is None:
        return None
    return RolloutSpans(t, task, label, carrier or incoming.get(), model, _settings)


__all__ = ["HONOURED", "RolloutSpans", "Settings", "bounded", "enabled", "flush", "redact", "rollout_spans", "run",
           "settings", "tracer"]
