"""Every way a run ends (issue 35), from the outside with real Docker: SIGTERM and SIGHUP end it as Ctrl-C does (what
finished kept, records closed, nothing left in Docker, one line, exit 143 and 129); a run directory deleted while it
runs ends in exit 1 with no result pointing at a file that is gone; a model endpoint that refuses every other
request is asked again, and the trajectory counts each retry.
"""

from __future__ import annotations

import json
import shutil
import signal

import pytest
from aiohttp import web

from test_cli_failures import ModelDouble, air, interrupt_when, outputs, records, remove_run, spawn, wait_for

pytestmark = pytest.mark.docker


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_eval_ended_by_a_signal_keeps_what_finished_and_closes_the_rest(images, tmp_path, run_id, sig):
    double = ModelDouble(hangs_for=("tabular-classification",), from_turn=2)
    with double as url:
        proc = spawn("eval", "prisoners-dilemma", "tabular-classification", "-c", "2", "--base-url", url,
                     "--model", "test-double", "--out", "run", cwd=tmp_path, env={"AIR_RUN_ID": run_id})
        done = tmp_path / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
        stdout = interrupt_when(lambda: (("tabular-classification", 2) in double.asked and done.is_file()
                                         and '"type": "end"' in done.read_text()),
                                "one rollout done, one waiting", proc, tmp_path, run_id, sig)
    assert "stopped after 1 finished rollout(s)" in " ".join(stdout.split()), stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and "running" not in summary
    assert [(r["task"], r["ok"]) for r in summary["rollouts"]] == [("prisoners-dilemma", True)]
    assert records(tmp_path / "run" / "tabular-classification" / "rollout-000.jsonl")[-1]["kind"] == "interrupted"


@pytest.mark.slow
def test_run_ended_by_sigterm_leaves_its_trajectory_closed(images, tmp_path, run_id):
    double = ModelDouble(hangs_for=("*",), from_turn=3)
    with double as url:
        proc = spawn("run", "--base-url", url, "--model", "test-double", "--out", "runs", cwd=tmp_path,
                     env={"AIR_RUN_ID": run_id})
        stdout = interrupt_when(lambda: len(double.asked) >= 3, "the model thinking at turn 3", proc, tmp_path,
                                run_id, signal.SIGTERM)
    assert "interrupted after 2 turn(s)" in " ".join(stdout.split()), stdout
    (trajectory,) = (tmp_path / "runs").glob("*.jsonl")
    assert [r["type"] for r in records(trajectory)] == ["start", "step", "step", "failed"]
    assert records(trajectory)[-1]["kind"] == "interrupted"


@pytest.mark.slow
def test_a_run_directory_deleted_mid_run_is_exit_1_and_no_result_points_at_nothing(images, tmp_path, run_id):
    proc = spawn("eval", "prisoners-dilemma", "-n", "3", "-c", "1", "--out", "run", "--json", cwd=tmp_path,
                 env={"AIR_RUN_ID": run_id})
    try:
        first = tmp_path / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
        wait_for(lambda: first.is_file() and '"type": "end"' in first.read_text(), "the first rollout's end",
                 proc=proc)
        shutil.rmtree(tmp_path / "run")
        assert proc.wait(600) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        remove_run(run_id)
    stdout, stderr = outputs(tmp_path)
    shown = json.loads(stdout)["rollouts"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["rollouts"]
    for rollouts in (shown, summary):
        assert not rollouts[0]["ok"] and "was deleted" in rollouts[0]["error"], rollouts
        assert all(r["ok"] == (r["trajectory"] is not None) for r in rollouts)
        assert all((tmp_path / r["trajectory"]).is_file() for r in rollouts if r["ok"]), rollouts


class BusyDouble(ModelDouble):
    """The scripted policy's replies, but every other request is refused with HTTP 429 and `Retry-After: 0`."""

    refused = 0

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.served = getattr(self, "served", 0) + 1
        if self.served % 2:
            self.refused += 1
            return web.json_response({"error": "rate limited"}, status=429, headers={"Retry-After": "0"})
        return await super()._completions(request)


@pytest.mark.slow
def test_an_endpoint_refusing_every_other_request_loses_no_rollout_and_each_retry_is_counted(images, tmp_path,
                                                                                            run_id):
    double = BusyDouble()
    with double as url:
        proc = air("eval", "prisoners-dilemma", "-n", "2", "-c", "2", "--base-url", url, "--model", "test-double",
                   "--out", "run", "--json", cwd=tmp_path, env={"AIR_RUN_ID": run_id})
    remove_run(run_id)
    assert proc.returncode == 0, proc.stderr
    assert [r["ok"] for r in json.loads(proc.stdout)["rollouts"]] == [True, True]
    retries = sum(r.get("model_retries", 0) for path in (tmp_path / "run").rglob("rollout-*.jsonl")
                  for r in records(path) if r["type"] == "step")
    assert double.refused > 0 and retries == double.refused
