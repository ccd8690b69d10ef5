"""OpenTelemetry spans (air/tracing.py, docs/tracing.md): off unless the standard variables turn them on; on, a span
per rollout with a child per stage, GenAI names and air's own under `air.`, a caller's trace context honoured.

Without Docker: a rollout's events driven through air.progress in a subprocess, sent to a receiver here that decodes
what arrives with OpenTelemetry's own protobuf messages (and, with the variables unset, sees nothing arrive and no
SDK imported). With Docker: `air eval` sending to a real collector, Arize Phoenix, read back through its own API."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is in air's [test] extra")

ROLLOUT = """
import sys
from air import progress, tracing
r = progress.rollout("regression-rmse", "#0", model="m-1",
                     carrier={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
r.episode("ep1")
r.doing("model")
r.doing("command", "python train.py")
r.turn = 1
r.doing("scoring")
r.validated(2, "ok", 1.5, 0.25, 0.25, "d1")
r.ended("submitted", 2, 0.25)
tracing.flush()
print("sdk" if "opentelemetry.sdk" in sys.modules else "no sdk")
"""


class _Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _receiver(port: int = 0):
    got: list[tuple[str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            got.append((self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = _Receiver(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", ROLLOUT], env={**clean, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=120)


def _spans(got: list[tuple[str, bytes]]) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for path, body in got:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return spans


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = v.string_value or v.double_value or v.int_value or v.bool_value
    return out


def test_with_the_variables_unset_no_exporter_starts_and_nothing_is_sent():
    """The SDK's default endpoint (localhost:4318) listened on: nothing arrives there, and the SDK is not even
    imported; the positive control below is the same rollout with the variable set."""
    try:
        server, got = _receiver(4318)
    except OSError:
        pytest.skip("port 4318 (OTLP/HTTP's default) is taken here")
    try:
        proc = _run({})
        time.sleep(1)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0 and proc.stdout.strip() == "no sdk", proc.stderr
    assert got == []
    proc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"})
    assert proc.stdout.strip() == "no sdk", proc.stderr


def test_a_rollout_is_a_span_with_a_child_per_stage_under_the_callers_trace():
    server, got = _receiver()
    try:
        proc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                     "OTEL_SERVICE_NAME": "air-test"})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0 and proc.stdout.strip() == "sdk", proc.stderr
    spans = _spans(got)
    by_name = {s.name: s for s in spans}
    root = by_name["invoke_agent air"]
    assert root.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace
    assert root.parent_span_id.hex() == "b7ad6b7169203331"
    attrs = _attrs(root)
    assert attrs["gen_ai.operation.name"] == "invoke_agent" and attrs["gen_ai.conversation.id"] == "ep1"
    assert attrs["air.task"] == "regression-rmse" and attrs["air.status"] == "ok"
    assert attrs["air.total_reward"] == 0.25 and attrs["air.ended_by"] == "submitted"
    children = [s for s in spans if s.parent_span_id == root.span_id]
    assert [s.name for s in sorted(children, key=lambda s: s.start_time_unix_nano)] == [
        "air.lease", "chat m-1", "execute_tool bash", "air.evaluate"]
    assert _attrs(by_name["chat m-1"])["gen_ai.request.model"] == "m-1"
    assert _attrs(by_name["execute_tool bash"])["air.command"] == "python train.py"
    evaluate = _attrs(by_name["air.evaluate"])
    assert (evaluate["air.score"], evaluate["air.reward"], evaluate["air.draw"]) == (1.5, 0.25, "d1")


# ----- a real collector ----------------------------------------------------------------------------------------
PHOENIX = Path.home() / ".cache" / "air" / "otel-venvs" / "phoenix"


def _phoenix() -> Path:
    """Arize Phoenix in an environment of its own (its server's dependencies are many, and none of air's needs
    them): made from PyPI once, kept in air's cache."""
    python = PHOENIX / "bin" / "python"
    if not (PHOENIX / "air-installed").is_file():
        shutil.rmtree(PHOENIX, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(PHOENIX)], check=True)
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "arize-phoenix"], capture_output=True,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            if "Network is unreachable" in proc.stderr or "Temporary failure" in proc.stderr:
                pytest.skip("PyPI is unreachable from here: Phoenix cannot be installed")
            raise AssertionError(proc.stderr[-2000:])
        (PHOENIX / "air-installed").write_text("arize-phoenix\n")
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.docker
@pytest.mark.slow
def test_eval_spans_read_back_from_phoenix_parent_and_child_with_rewards(tmp_path):
    import httpx

    python = _phoenix()
    port, grpc = _free_port(), _free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"), "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_HOST": "127.0.0.1",
           # Only loopback here: no telemetry pixels, fonts or downloads of its own.
           "PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false"}
    server = subprocess.Popen([str(python), "-m", "phoenix.server.main", "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "phoenix.log", "w"))
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            raise AssertionError((tmp_path / "phoenix.log").read_text()[-2000:])
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = subprocess.run([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "-n", "2", "-c", "2",
                               "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=900, cwd=ROOT,
                              env={**clean, "PYTHONPATH": str(ROOT), "AIR_PROGRESS": "off",
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_SERVICE_NAME": "air"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len([s for s in spans if s["name"] == "invoke_agent air"]) < 2:
            answer = httpx.get(f"{base}/v1/projects/default/spans", params={"limit": 1000}, timeout=10)
            assert answer.status_code == 200, answer.text[:500]
            spans = answer.json()["data"]
            time.sleep(1)
        roots = [s for s in spans if s["name"] == "invoke_agent air"]
        assert len(roots) == 2, [s["name"] for s in spans]
        for root in roots:
            attributes = root["attributes"]
            assert attributes["air.task"] == "prisoners-dilemma" and attributes["air.status"] == "ok"
            assert "air.total_reward" in attributes
            children = [s for s in spans if s.get("parent_id") == root["context"]["span_id"]]
            names = {s["name"] for s in children}
            assert {"air.lease", "chat", "execute_tool bash", "air.evaluate"} <= names, names
            scored = [s for s in children if s["name"] == "air.evaluate"]
            assert scored and all("air.reward" in s["attributes"] for s in scored)
    finally:
        server.terminate()
        server.wait(timeout=60)


SERVED = """
import asyncio, httpx
from fastapi import FastAPI
from air import progress, tracing
from air.services.guard import Guard

api = FastAPI()

@api.post("/reset")
async def reset():  # as a served episode is opened: inside the request
    r = progress.rollout("regression-rmse", "served")
    r.ended("closed", 0, 0.0)
    return {}

async def main():
    transport = httpx.ASGITransport(app=Guard(api, 1 << 20, None))
    async with httpx.AsyncClient(transport=transport, base_url="http://air") as client:
        answer = await client.post("/reset", headers={
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        assert answer.status_code == 200, answer.text

asyncio.run(main())
tracing.flush()
"""


def test_a_served_request_s_trace_context_is_the_rollouts_parent():
    """`air serve agentgym|openenv`: a trainer that sends `traceparent` with its request sees air's rollout span
    in its own trace (the guard in front of every served app takes it)."""
    server, got = _receiver()
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = subprocess.run([sys.executable, "-c", SERVED], capture_output=True, text=True, timeout=120,
                              env={**clean, "PYTHONPATH": str(ROOT),
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    (root,) = [s for s in _spans(got) if s.name == "invoke_agent air"]
    assert root.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert root.parent_span_id.hex() == "00f067aa0ba902b7"
