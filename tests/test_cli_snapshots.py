"""Snapshots where users meet them (issue #48): `air eval --snapshot-at` writes them beside each trajectory and says
where and how large, `air replay --from-turn K` resumes one instead of re-running turns 1..K-1 (no drift on a
deterministic task), `air eval --from` runs rollouts from one, `air debug --from` opens a shell in one; a snapshot
edited by hand is a one-line error (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from progress_lines import without_progress

pytestmark = pytest.mark.docker


def air(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], input=stdin, capture_output=True, text=True,
                          timeout=900, check=False, env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_snapshots_written_by_eval_are_replayed_from_run_from_and_debugged_from(images, tmp_path):
    run = tmp_path / "run"
    proc = air("eval", "prisoners-dilemma", "-n", "1", "--out", str(run), "--snapshot-at", "validate", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "snapshots: 3 written" in proc.stderr and "MB under" in proc.stderr, proc.stderr
    trajectory = run / "prisoners-dilemma" / "rollout-000.jsonl"
    folder = run / "prisoners-dilemma" / "rollout-000.snapshots"
    assert sorted(p.name for p in folder.iterdir()) == ["turn-002.airsnap", "turn-004.airsnap", "turn-007.airsnap"]
    records = [json.loads(line) for line in trajectory.read_text().splitlines()]
    original = records[-1]

    # Replay from turn 5: turns 1..4 are not run again; what follows matches the recording.
    proc = air("replay", str(trajectory), "--from-turn", "5", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["drift"] == []
    proc = air("replay", str(trajectory), "--from-turn", "4")
    assert proc.returncode == 2 and "no snapshot after turn 3" in proc.stderr and "1, 3, 5, 8" in proc.stderr

    # Two rollouts from the snapshot after turn 4: each continues the story and its rewards.
    snap = folder / "turn-004.airsnap"
    branches = tmp_path / "branches"
    proc = air("eval", "--from", str(snap), "-n", "2", "--out", str(branches), "--json")
    assert proc.returncode == 0, proc.stderr
    for i in range(2):
        lines = [json.loads(line) for line in (branches / "prisoners-dilemma" / f"rollout-00{i}.jsonl").open()]
        assert lines[0]["parent"]["turn"] == 4 and lines[0]["parent"]["episode"] == records[0]["episode"]
        assert [r["turn"] for r in lines if r["type"] == "step"] == [5, 6, 7, 8, 9]
        assert lines[-1]["total_reward"] == pytest.approx(original["total_reward"])
        assert lines[-1]["step_rewards"] == pytest.approx(original["step_rewards"])
        assert lines[0]["parent"]["snapshot"] == str(snap)
        assert [m["role"] for m in lines[0]["prefix"]][:3] == ["system", "user", "assistant"]
    # As SFT samples, the branches hold the whole conversation their model saw: the parent's 4 turns, then theirs.
    sft = tmp_path / "sft" / "train.jsonl"
    proc = air("export", "sft", str(run), str(branches), "--out", str(sft), "--no-dedupe")
    assert proc.returncode == 0, proc.stderr
    rows = {r["source"]: r["messages"] for r in map(json.loads, sft.read_text().splitlines())}
    parent_row = rows.pop(f"{trajectory}:1")
    prefix = parent_row[:2 + 2 * 4]  # system, task prompt, then 4 replies and their observations
    assert len(rows) == 2 and all(m[:len(prefix)] == prefix for m in rows.values())
    assert all(sum(m["role"] == "assistant" for m in messages) == 9 for messages in rows.values())
    # A branch replays from its own snapshot, without drift; the report shows the branches under their parent.
    proc = air("replay", str(branches), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["drift"] for r in json.loads(proc.stdout)] == [[], []]
    report = tmp_path / "report.html"
    proc = air("view", str(run), str(branches), "-o", str(report))
    assert proc.returncode == 0, proc.stderr
    html = report.read_text()
    assert "<h3>Branches</h3>" in html and records[0]["episode"] in html.split("<h3>Branches</h3>")[1]
    assert "missing" not in html  # a branch's turns start after its parent's: no turn reads as lost

    # A shell in the state after turn 4: the defecting strategy, and a validate that pays nothing new.
    proc = air("debug", "--from", str(snap), "--json", stdin="cat strategy.py\nvalidate\n")
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(line) for line in proc.stdout.splitlines()]
    assert steps[0]["turn"] == 5 and "return 1" in steps[0]["observation"]
    assert steps[1]["score"] == pytest.approx(2.0704, abs=1e-3) and steps[1]["reward"] == pytest.approx(0.0)

    # Edited by hand: refused in one line, before any sandbox.
    data = bytearray(snap.read_bytes())
    at = data.index(b'"paid":')
    data[at + 7:at + 8] = b"9" if data[at + 7:at + 8] != b"9" else b"8"
    snap.write_bytes(bytes(data))
    proc = air("eval", "--from", str(snap), "-n", "1", "--out", str(tmp_path / "never"))
    assert proc.returncode == 2 and "seal does not match" in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("action_format", ["text", "tools"])
def test_a_prefix_rollout_row_runs_through_vf_eval(images, tmp_path, action_format):
    """A snapshot as a row of air's verifiers taskset: its prompt is the conversation up to turn 4, and vf-eval's
    rollouts of it continue the episode (the scripted model answers turn 5 on); the return is the whole episode's.
    In the tools format the prompt holds the replies' tool calls and the tool messages answering them, in
    verifiers' own message types, and the rollouts go on in tool calls (the taskset left in its default format:
    the row's format is its snapshot's)."""
    from test_vf_eval import COMMAND_TIMEOUT, hand_computed_return

    run = tmp_path / "run"
    proc = air("eval", "prisoners-dilemma", "-n", "1", "--out", str(run), "--snapshot-at", "4",
               "--action-format", action_format, "--json")
    assert proc.returncode == 0, proc.stderr
    snap = run / "prisoners-dilemma" / "rollout-000.snapshots" / "turn-004.airsnap"
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-m", "air.policies.scripted_server", "--port", "0", "--port-file",
                               str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.1)
        out = tmp_path / "out"
        cmd = ["vf-eval", "air-mlgym", "-n", "1", "-r", "2", "-c", "2", "-m", "air-scripted", "--client.base-url",
               f"http://127.0.0.1:{port_file.read_text()}/v1", "--env.taskset.tasks", "[]",
               "--env.taskset.snapshots", json.dumps([str(snap)]), "--env.taskset.trajectory-dir",
               str(tmp_path / "traj"), *COMMAND_TIMEOUT, "--no-push", "--no-rich", "-o", str(out)]
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "CI": ""})
        assert ran.returncode == 0, ran.stderr[-3000:]
        (traces_file,) = out.rglob("traces.jsonl")
        episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    finally:
        server.terminate()
        server.wait(10)
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 2, ran.stderr[-3000:]
    for trace in traces:
        assert trace["ok"], trace.get("errors")
        assert trace["info"]["ended_by"] == "submitted" and len(trace["info"]["step_rewards"]) == 9
        reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert reward == pytest.approx(hand_computed_return("prisoners-dilemma"), abs=1e-9)
        messages = [n["message"] for n in trace["nodes"]]
        replies = [m for m in messages if m["role"] == "assistant"]
        assert len(replies) == 9  # the prompt's 4 and the rollout's 5
        calls = [m for m in replies if m.get("tool_calls")]
        if action_format == "tools":
            assert trace["info"]["action_format"] == "tools"
            assert len(calls) == 8  # turn 5 of the story acts on nothing (a format error)
            assert sum(m["role"] == "tool" for m in messages) == 7  # the last call's result was never shown
            prompt = trace["task"]["data"]["prompt"]
            assert [m["role"] for m in prompt[:3]] == ["user", "assistant", "tool"]
            assert prompt[1]["tool_calls"][0]["name"] == "bash" and prompt[2]["tool_call_id"] == \
                prompt[1]["tool_calls"][0]["id"]
        else:
            assert not calls and not any(m["role"] == "tool" for m in messages)
    # As SFT samples, each rollout's trace and its air trajectory (which records only its own turns, 5 on) hold the
    # same whole conversation; the scripted model plays both rollouts alike, so all four are one sample.
    proc = air("export", "sft", str(traces_file), str(tmp_path / "traj"), "--out", str(tmp_path / "sft.jsonl"),
               "--json")
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)
    assert (counts["read"], counts["kept"], counts["filtered"]) == (4, 1, {"duplicate": 3}), counts
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert all(sum(m["role"] == "assistant" for m in r["messages"]) == 9 for r in rows)


def test_air_run_snapshots_the_turns_asked_for_and_says_where(images, tmp_path):
    proc = air("run", "--task", "prisoners-dilemma", "--out", str(tmp_path), "--snapshot-at", "1,4", "--json")
    assert proc.returncode == 0, proc.stderr
    trajectory = json.loads(proc.stdout)["trajectory"]
    folder = tmp_path / (os.path.basename(trajectory).removesuffix(".jsonl") + ".snapshots")
    assert sorted(p.name for p in folder.iterdir()) == ["turn-001.airsnap", "turn-004.airsnap"]
    assert "snapshots: 2 written" in proc.stderr
    proc = air("run", "--snapshot-at", "0")
    assert proc.returncode == 2 and "--snapshot-at takes" in proc.stderr


def test_rollouts_from_a_snapshot_are_paid_as_the_parent_would_be_on_the_host_draw(images, tmp_path):
    """Under the draw users get (AIR_HIDDEN_DRAW=host: prisoners-dilemma scores every validation on a draw of its own,
    the baseline beside it), through the commands: `air eval --from` the snapshot after the story's turn 2 (the
    baseline validated) goes on with the story, each step paid against the snapshot's score on its own draw, and its
    return telescopes to its last normalised score; `air debug --from` it and validate the baseline again: paid 0,
    as the parent is (issue #63: the snapshot's scores normalised against the episode's baseline offset both)."""
    host = {"AIR_HIDDEN_DRAW": "host"}
    run = tmp_path / "run"
    proc = air("eval", "prisoners-dilemma", "-n", "1", "--out", str(run), "--snapshot-at", "2", "--json", env=host)
    assert proc.returncode == 0, proc.stderr
    snap = run / "prisoners-dilemma" / "rollout-000.snapshots" / "turn-002.airsnap"
    parent = [json.loads(line) for line in (run / "prisoners-dilemma" / "rollout-000.jsonl").open()]
    assert parent[0]["reward_baseline"]["source"] == "each evaluation's draw", parent[0]
    branches = tmp_path / "branches"
    proc = air("eval", "--from", str(snap), "-n", "1", "--out", str(branches), "--json", env=host)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in (branches / "prisoners-dilemma" / "rollout-000.jsonl").open()]
    scored = [r for r in lines if r.get("type") == "step" and r.get("normalized") is not None]
    assert len(scored) >= 2 and all(r["draw_baseline"] is not None for r in scored), scored
    assert lines[-1]["total_reward"] == pytest.approx(scored[-1]["normalized"], abs=1e-12), (lines[-1], scored[-1])
    proc = air("debug", "--from", str(snap), "--json", stdin="validate\n", env=host)
    assert proc.returncode == 0, proc.stderr
    (step,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert step["turn"] == 3 and step["reward"] == 0.0, step


def test_a_snapshot_its_sandbox_refuses_ends_air_eval_from_with_exit_2(images, tmp_path):
    """What only the sandbox's restore checks (every name): `air eval --from` ends with exit 2 and one line, as `air
    debug --from` does, not with N failed rollouts (exit 1); the benign twin runs."""
    from test_snapshot_refusals import CANONICAL_UID, KEY_HEX, _files, _snapshot

    stray = __import__("tarfile").TarInfo("home/other")
    stray.uid = CANONICAL_UID
    for extra, code in ((stray, 2), (None, 0)):
        path = tmp_path / f"s{code}.airsnap"
        path.write_bytes(_snapshot(_files(*([extra] if extra else []))))
        key = {"AIR_SNAPSHOT_KEY": KEY_HEX}
        proc = air("eval", "--from", str(path), "-n", "2", "--max-turns", "2", "--out", str(tmp_path / f"r{code}"),
                   "--json", env=key)
        assert proc.returncode == code, proc.stderr[-2000:]
        if code:
            assert "outside the places" in proc.stderr and len(without_progress(proc.stderr)) == 1, proc.stderr
        proc = air("debug", "--from", str(path), "--json", stdin="ls\n", env=key)
        assert proc.returncode == code, proc.stderr[-2000:]
