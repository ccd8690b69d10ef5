"""TEST DOUBLES for the telemetry tests (tests/test_tracing.py, tests/test_progress_turns.py): a collector and a model
endpoint, both in-process HTTP servers on loopback, neither of them the real thing.

- `OtlpReceiver`: a collector double. It takes OTLP/HTTP exports (`POST /v1/traces`) and decodes them with
  OpenTelemetry's own protobuf messages (opentelemetry-proto, which comes with the exporter), so what a test reads
  is what a real collector would parse; it keeps the raw bodies too (a secret must not be in them, in any field).
- `ModelDouble`: an OpenAI-compatible chat endpoint double. It answers `POST /v1/chat/completions` with the next
  scripted reply, after a delay of its own, with `usage`, the reply's `logprobs` (one per word, when the request
  asks `logprobs: true`) and `reasoning_content` as vLLM sends them, and records each request's headers and body.
- `episode_script`: a Python program that plays one rollout through air's real runner, episode loop, OpenAI policy
  and progress reporter, with only the sandbox's shell and the task's evaluation faked (no Docker).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class OtlpReceiver:
    """A collector double: OTLP/HTTP protobuf exports, decoded (module docstring)."""

    def __init__(self, port: int = 0):
        self.bodies: list[tuple[str, bytes]] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                outer.bodies.append((self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))
                outer.headers.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = _Server(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def requests(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        for path, body in self.bodies:
            assert path == "/v1/traces", path
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            out.append(request)
        return out

    def spans(self) -> list:
        return [s for r in self.requests() for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def resources(self) -> list[dict]:
        return [attrs(rs.resource) for r in self.requests() for rs in r.resource_spans]


def attrs(thing) -> dict:
    """A span's (or resource's) attributes as a dict of plain values."""
    out = {}
    for kv in thing.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, kind) if kind else None
    return out


class ModelDouble:
    """A model endpoint double (module docstring): `replies` in order (the last repeated), `delay` seconds each."""

    def __init__(self, replies: list[str], delay: float = 0.0, delays: dict[int, float] | None = None):
        self.replies, self.delay, self.delays = list(replies), delay, delays or {}
        self.requests: list[tuple[dict[str, str], dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._send({"object": "list", "data": [{"id": "double-1", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                n = len(outer.requests)
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                time.sleep(outer.delays.get(n, outer.delay))
                text = outer.replies[min(n, len(outer.replies) - 1)]
                words = text.split(" ")
                choice = {"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": text, "reasoning_content": f"thinking {n}"}}
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": w, "logprob": -0.25, "bytes": None,
                                                       "top_logprobs": []} for w in words]}
                self._send({"id": f"chatcmpl-double-{n}", "object": "chat.completion", "created": int(time.time()),
                            "model": "double-1", "choices": [choice],
                            "usage": {"prompt_tokens": 100 + n, "completion_tokens": len(words),
                                      "total_tokens": 100 + n + len(words),
                                      "prompt_tokens_details": {"cached_tokens": 64}}})

            def _send(self, value: dict) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ModelDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


EPISODE = """
import asyncio, contextlib, sys
from pathlib import Path
from types import SimpleNamespace
from air import progress, tracing
from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.policies.openai_compat import OpenAIPolicy
from air.tasks.hidden import RewardBaseline
from air.tasks.registry import load_task
from air.tasks.scoring_cell import EvalOutcome

class Session:  # the sandbox's shell, faked: `false` fails, anything else prints the key the agent could read
    async def run(self, text, timeout, merge_stderr=True):
        failed = text.strip() == "false"
        return SimpleNamespace(stdout="" if failed else f"$ {text}\\nOPENAI_API_KEY=" + __import__("os").environ[
                                   "OPENAI_API_KEY"] + "\\n", timed_out=False, oom_killed=False, shell_restarted=False,
                               exit_code=1 if failed else 0, dropped_bytes=0, duration=0.01, cwd="/home/agent")

class Sandbox:
    short_id = "4b1d2c3e5f60"
    image_id = "sha256:9f2c4e"
    spec = SimpleNamespace(image="air/cpu:latest")
    session = Session()

class TaskEnv:  # the task's real spec; each evaluation scores 1.5
    def __init__(self, task):
        self.spec = load_task(task)
        self.baseline = RewardBaseline.of_record(self.spec)

    @contextlib.asynccontextmanager
    async def lease(self):
        yield Sandbox()

    async def evaluate(self, sandbox):
        return EvalOutcome(status="ok", metrics={self.spec.primary.name: 1.5}, submission="/s.csv", duration=0.01)

async def main(base, out, rollouts, model="double-1", max_tokens="2048", turns="12"):
    for i in range(rollouts):
        policy = OpenAIPolicy(base, model, logprobs=True, timeout=600, max_tokens=int(max_tokens))
        await run_episode(TaskEnv("regression-rmse"), policy,
                          EpisodeConfig(max_turns=int(turns), max_format_errors=int(turns)),
                          trajectory=Path(out) / f"rollout-{i:03d}.jsonl", meta={"rollout": i,
                          "policy": {"kind": "openai", "model": model}})
        await policy.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:]))
tracing.flush()
print("played", flush=True)
"""
"""The rollout program: `python -c EPISODE BASE_URL OUT_DIR ROLLOUTS [MODEL MAX_TOKENS TURNS]`."""
