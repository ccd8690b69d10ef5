"""`air export sft`: air episodes into prime-rl's SFT dataset, from both trajectory formats.

The fixtures are real trajectories, made without Docker: air's own JSONL is written by the real episode
loop (air.episode.loop.Episode with its TrajectoryWriter) driving a real bundled task spec, with only the
sandbox shell and the evaluation faked; vf-eval lines are the same episodes as air_mlgym's env records them
on a trace (`_record`), serialised by verifiers' own `WireEpisode` model exactly as vf-eval writes
traces.jsonl (`model_dump_json(exclude_none=True)`).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import verifiers.v1 as vf
from typer.testing import CliRunner

from air.actions import Reply, ToolCall
from air.episode.config import EpisodeConfig
from air.episode.loop import Episode
from air.episode.snapshot import Snapshot
from air.episode.trajectory import TrajectoryWriter, read_trajectory
from air.errors import UsageError
from air.export.sft import ExportOptions, export_sft_files, sft_rows
from air.tasks.hidden import RewardBaseline
from air.tasks.registry import load_task
from air.tasks.scoring_cell import EvalOutcome

# ----- fixtures: real episodes, faked sandbox ---------------------------------------------------------------
WRITE_MODEL = ("```bash\ncat > train.py <<'EOF'\nfrom sklearn.ensemble import GradientBoostingRegressor\n"
               "EOF\n```")
RUN = "I train the model.\n\n```bash\npython train.py\n```"
VALIDATE = "```\nvalidate\n```"
SUBMIT = "Good enough.\n\n```\nsubmit\n```"
LOOK = "First the files.\n\n```bash\nls -la\n```"


class FakeSession:
    async def run(self, text: str, timeout: float, merge_stderr: bool = True):
        return SimpleNamespace(stdout=f"$ {text.splitlines()[0]}\nok\n", timed_out=False, oom_killed=False,
                               shell_restarted=False, exit_code=0, dropped_bytes=0, duration=0.02,
                               cwd="/home/agent/workspace")


class FakeSandbox:
    short_id = "4b1d2c3e5f60"
    image_id = "sha256:9f2c4e"
    spec = SimpleNamespace(image="air/cpu:latest")
    session = FakeSession()


class FakeTaskEnv:
    """The task's real spec; each evaluation returns the next scripted score (None: the evaluation failed)."""

    def __init__(self, task: str, scores: list[float | None]):
        self.spec = load_task(task)
        self.baseline = RewardBaseline.of_record(self.spec)  # the tests use the record's draw
        self.scores = list(scores)

    async def evaluate(self, sandbox) -> EvalOutcome:
        score = self.scores.pop(0)
        if score is None:
            return EvalOutcome(status="invalid_submission", message="submission.csv has 3 rows, expected 200")
        return EvalOutcome(status="ok", metrics={self.spec.primary.name: score},
                           submission="/submission/submission.csv", duration=0.4)


async def play(path: Path, task: str, replies: list[str], scores: list[float | None], *, max_turns: int = 30,
               stop_early: bool = False) -> list[dict]:
    """One episode through the real loop, written by the real TrajectoryWriter; returns its records."""
    with TrajectoryWriter(path) as writer:
        episode = Episode(FakeTaskEnv(task, scores), FakeSandbox(), EpisodeConfig(max_turns=max_turns),
                          writer, meta={"trace": path.stem})
        for reply in replies:
            if (await episode.step(reply)).done:
                break
        if stop_early and not episode.done:
            await episode.finish("stopped")  # what AirEnv does when the framework ends the exchange
    return read_trajectory(path)


def vf_eval_line(records: list[dict], *, ok: bool = True) -> str:
    """The episode as air_mlgym's env leaves it on a trace, in vf-eval's traces.jsonl line format."""
    start, end = records[0], records[-1]
    replies = [r for r in records if r["type"] == "step" and r["reply"] is not None]
    messages = [{"role": "system", "content": start["system_prompt"]},
                {"role": "user", "content": start["prompt"]}]
    for i, step in enumerate(replies):
        messages.append({"role": "assistant", "content": step["reply"]})
        if i < len(replies) - 1:  # the env answers every turn but the one that ended the episode
            messages.append({"role": "user", "content": step["observation"]})
    nodes = [{"message": m, **({"parent": i - 1} if i else {}), "sampled": m["role"] == "assistant"}
             for i, m in enumerate(messages)]
    task = {"type": "AirTask", "data": {"idx": 0, "id": f"{start['task']}#0", "name": start["task"],
                                        "prompt": start["prompt"], "system_prompt": start["system_prompt"],
                                        "task_ref": start["task"]}}
    metrics = {k: float(end[k]) for k in ("best_score", "last_score", "validations", "failed_validations",
                                          "format_errors", "turns") if end[k] is not None}
    trace = {"id": f"trace-{start['episode']}", "task": task,
             "agent": {"config": {"harness": {"id": "air-mlgym"}, "runtime": {"type": "subprocess"},
                                  "model": "Qwen/Qwen3-4B-Instruct-2507"}, "name": "agent"},
             "nodes": nodes, "rewards": {"improvement": {"score": end["total_reward"], "weight": 1.0}},
             "metrics": metrics,
             "info": {"air_episode": start["episode"], "task": end["task"], "ended_by": end["ended_by"],
                      "step_rewards": end["step_rewards"], "baseline": end["baseline"],
                      "env_seconds": end["env_seconds"]},
             "is_completed": True, "ok": ok, "stop_condition": "user_closed" if ok else "sandbox_error",
             "errors": [] if ok else [{"type": "SandboxError", "message": "air: the container is gone"}]}
    episode = {"id": f"episode-{start['episode']}", "env": {"id": "air-mlgym"}, "task": task,
               "run": {"type": "eval", "id": "disabled-0", "name": "air-mlgym--qwen3--air-mlgym--0"},
               "ok": ok, "traces": [trace]}
    return vf.WireEpisode.model_validate(episode).model_dump_json(exclude_none=True)


@pytest.fixture
async def corpus(tmp_path: Path) -> dict[str, Path | list[dict]]:
    """A run's worth of episodes in both formats, one of each kind the filters tell apart."""
    air_dir = tmp_path / "trajectories"
    eps = {
        # regression-rmse is lower-is-better: 129.9 -> 86.8 is an improvement of +0.33
        "improved": await play(air_dir / "improved.jsonl", "regression-rmse",
                               [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8185831488935] * 2),
        # ... and 150 is worse than the baseline: a negative return
        "worse": await play(air_dir / "worse.jsonl", "regression-rmse", [WRITE_MODEL, VALIDATE, SUBMIT],
                            [150.0, 150.0]),
        # a real gain, but the final evaluation failed
        "failed_final": await play(air_dir / "failed_final.jsonl", "tabular-classification",
                                   [LOOK, VALIDATE, SUBMIT], [0.9, None]),
        # out of turns (the automatic final evaluation scores it), never submitted
        "out_of_turns": await play(air_dir / "out_of_turns.jsonl", "prisoners-dilemma", [LOOK, RUN, VALIDATE],
                                   [2.9, 2.9], max_turns=3),
        # the framework stopped it (a token limit): AirEnv's finish("stopped")
        "stopped": await play(air_dir / "stopped.jsonl", "prisoners-dilemma", [LOOK, VALIDATE], [2.8, 2.8],
                              stop_early=True),
        # a small gain over the baseline: +0.01
        "small": await play(air_dir / "small.jsonl", "tabular-classification", [RUN, SUBMIT],
                            [0.7365 * 1.01]),
    }
    # The same policy replaying itself: an identical conversation in another file.
    eps["replay"] = await play(air_dir / "replay.jsonl", "regression-rmse",
                               [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8185831488935] * 2)
    return {"air_dir": air_dir, "tmp": tmp_path, **eps}


def _by_source(rows: list[dict]) -> dict[str, dict]:
    return {Path(r["source"].split(":")[0]).stem: r for r in rows}


def _check_counts(result) -> None:
    assert result.read == result.kept + sum(result.filtered.values())


# ----- the fixtures are what the loop writes ----------------------------------------------------------------
def test_fixtures_are_real_trajectories(corpus):
    improved = corpus["improved"]
    assert [r["type"] for r in improved] == ["start"] + ["step"] * 5 + ["end"]
    assert improved[-1]["ended_by"] == "submitted"
    assert improved[-1]["total_reward"] == pytest.approx(0.3317, abs=1e-3)
    assert corpus["worse"][-1]["total_reward"] < 0
    assert corpus["failed_final"][-2]["eval_status"] == "invalid_submission"
    assert corpus["out_of_turns"][-1]["ended_by"] == "max_turns"
    assert corpus["stopped"][-2]["reply"] is None and corpus["stopped"][-1]["ended_by"] == "stopped"


# ----- air JSONL --------------------------------------------------------------------------------------------
async def test_air_trajectories_filters_and_conversation(corpus, tmp_path):
    out = tmp_path / "sft" / "train.jsonl"
    result = export_sft_files([corpus["air_dir"]], out)
    _check_counts(result)
    assert result.counts() == {"files": 7, "read": 7, "kept": 2, "malformed": 0,
                               "filtered": {"below_min_improvement": 1, "duplicate": 1, "not_submitted": 2,
                                            "submission_failed": 1}}
    rows = _by_source([json.loads(line) for line in out.read_text().splitlines()])
    assert set(rows) == {"improved", "small"}  # `replay` is the duplicate: files are read in sorted order
    row = rows["improved"]
    assert row["task"] == "regression-rmse" and row["ended_by"] == "submitted"
    assert row["improvement"] == pytest.approx(0.3317, abs=1e-3)
    # system, task prompt, then reply / observation pairs; the observation after `submit` was never shown.
    messages, steps = row["messages"], [r for r in corpus["improved"] if r["type"] == "step"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "user"] * 4 + ["assistant"]
    assert messages[0]["content"] == corpus["improved"][0]["system_prompt"]
    assert messages[1]["content"] == corpus["improved"][0]["prompt"]
    assert [m["content"] for m in messages[2::2]] == [s["reply"] for s in steps]
    assert [m["content"] for m in messages[3::2]] == [s["observation"] for s in steps[:-1]]
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in messages)


async def test_min_improvement_is_a_threshold_on_the_return(corpus):
    strict = export_sft_files([corpus["air_dir"]], corpus["tmp"] / "a" / "train.jsonl",
                              ExportOptions(min_improvement=0.05))
    assert set(_by_source(strict.rows)) == {"improved"}
    assert strict.filtered["below_min_improvement"] == 2  # `small` (+0.01) and `worse` (< 0)
    anything = export_sft_files([corpus["air_dir"]], corpus["tmp"] / "b" / "train.jsonl",
                                ExportOptions(min_improvement=None))
    assert set(_by_source(anything.rows)) == {"improved", "small", "worse"}


async def test_all_keeps_episodes_ended_by_a_limit(corpus):
    result = export_sft_files([corpus["air_dir"]], corpus["tmp"] / "c" / "train.jsonl",
                              ExportOptions(submitted_only=False))
    _check_counts(result)
    rows = _by_source(result.rows)
    assert set(rows) == {"improved", "small", "out_of_turns", "stopped", "failed_final"}
    assert rows["out_of_turns"]["ended_by"] == "max_turns" and rows["stopped"]["ended_by"] == "stopped"
    # The stopped episode's extra record (the driver's final evaluation, reply None) is not a turn.
    assert [m["role"] for m in rows["stopped"]["messages"]] == \
        ["system", "user", "assistant", "user", "assistant"]
    assert all(r["messages"][-1]["role"] == "assistant" for r in result.rows)


async def test_no_dedupe_keeps_the_replay(corpus):
    result = export_sft_files([corpus["air_dir"]], corpus["tmp"] / "d" / "train.jsonl",
                              ExportOptions(dedupe=False))
    assert {"improved", "replay"} <= set(_by_source(result.rows)) and "duplicate" not in result.filtered


async def test_a_torn_last_line_is_skipped_and_nothing_else_is_lost(corpus):
    path = corpus["air_dir"] / "improved.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "step", "turn": 6, "reply": "```bash\\nls\n')  # a crash mid-write
    result = export_sft_files([path], corpus["tmp"] / "e" / "train.jsonl")
    assert result.malformed == 1 and result.kept == 1 and result.read == 1
    assert len(result.warnings) == 1 and result.warnings[0].startswith(f"{path}:8: not JSON")
    assert result.warnings[0].endswith("line skipped")


async def test_a_lost_turn_makes_the_episode_incomplete_not_a_wrong_conversation(corpus):
    path = corpus["air_dir"] / "improved.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = lines[3][: len(lines[3]) // 2]  # turn 3's record torn in the middle of the file
    path.write_text("\n".join(lines) + "\n")
    result = export_sft_files([path, corpus["air_dir"] / "small.jsonl"], corpus["tmp"] / "f" / "train.jsonl")
    assert result.malformed == 1 and result.filtered == {"incomplete": 1}
    assert set(_by_source(result.rows)) == {"small"}


async def test_an_episode_without_end_is_incomplete(corpus):
    path = corpus["air_dir"] / "improved.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-1]))
    result = export_sft_files([path], corpus["tmp"] / "g" / "train.jsonl")
    assert result.filtered == {"incomplete": 1} and result.malformed == 0 and not result.rows


async def test_appended_episodes_in_one_file_are_told_apart(corpus, tmp_path):
    both = tmp_path / "both.jsonl"
    both.write_text((corpus["air_dir"] / "improved.jsonl").read_text()
                    + (corpus["air_dir"] / "small.jsonl").read_text())
    result = sft_rows([(str(both), both.read_text().splitlines())])
    assert result.read == 2 and result.kept == 2
    assert [r["task"] for r in result.rows] == ["regression-rmse", "tabular-classification"]


# ----- branches: episodes started from a snapshot -----------------------------------------------------------
def _tool_story() -> list[Reply]:
    bash = [ToolCall.of("bash", {"command": c}, id=f"call_{i}") for i, c in enumerate(["ls -la", "cat data.csv"])]
    return [Reply(content="First the files.", tool_calls=(bash[0],)), Reply(tool_calls=(bash[1],)),
            Reply(content="I train it.", tool_calls=(ToolCall.of("bash", {"command": "python train.py"}, id="c2"),)),
            Reply(tool_calls=(ToolCall.of("validate", id="c3"),)),
            Reply(content="Good enough.", tool_calls=(ToolCall.of("submit", id="c4"),))]


async def drive(path: Path, replies: list, scores: list[float], action_format: str, *, snapshot_after: int = 0,
                start: Snapshot | None = None) -> Snapshot | None:
    """One episode through the real loop as air's runner drives it (the conversation grows by each reply and
    what answered it), from the start or from `start`; returns its snapshot after turn `snapshot_after` (the
    episode's state and messages as air.episode.snapshot.take records them; no files: the shell is faked)."""
    task_env, config = FakeTaskEnv("regression-rmse", scores), EpisodeConfig(action_format=action_format)
    snap = None
    with TrajectoryWriter(path) as writer:
        if start is not None:
            episode = Episode.resume(task_env, FakeSandbox(), start, config=config, writer=writer)
            messages = [dict(m) for m in start.state.messages]
        else:
            episode = Episode(task_env, FakeSandbox(), config, writer)
            messages = [{"role": "system", "content": episode.system_prompt},
                        {"role": "user", "content": episode.prompt}]
        for reply in replies:
            step = await episode.step(reply)
            said = reply.message() if isinstance(reply, Reply) else {"role": "assistant", "content": reply}
            messages += [said, *step.answers]
            if episode.turns == snapshot_after:
                spec = task_env.spec
                snap = Snapshot(task=spec.id, task_version=spec.version, task_hash=spec.content_hash,
                                episode=episode.id, config=episode.config.model_dump(),
                                reward_baseline=episode.baseline.score, state=episode.state(messages),
                                cwd=base64.b64encode(b"/home/agent/workspace").decode(), env={})
            if step.done:
                break
    return snap


@pytest.mark.parametrize("action_format", ["text", "tools"])
async def test_a_branch_exports_the_whole_conversation_its_model_saw(tmp_path, action_format):
    """A branch's trajectory holds only its own turns (from the snapshot's turn + 1); its sample must hold the
    conversation it continued too: the parent's turns are the context its model saw. A branch that plays the
    parent's own replies after the snapshot is, as a sample, the parent's conversation exactly."""
    story = _tool_story() if action_format == "tools" else [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT]
    scores = [86.8185831488935] * 2
    snap = await drive(tmp_path / "parent.jsonl", story, scores, action_format, snapshot_after=2)
    await drive(tmp_path / "branch.jsonl", story[2:], scores, action_format, start=snap)
    branch = read_trajectory(tmp_path / "branch.jsonl")
    assert branch[0]["parent"]["turn"] == 2 and [r["turn"] for r in branch if r["type"] == "step"] == [3, 4, 5]
    result = export_sft_files([tmp_path], tmp_path / "sft" / "train.jsonl", ExportOptions(dedupe=False))
    assert result.kept == 2, result.counts()
    rows = _by_source(result.rows)
    assert rows["branch"]["messages"] == rows["parent"]["messages"]
    replies = [m for m in rows["branch"]["messages"] if m["role"] == "assistant"]
    assert len(replies) == 5 and rows["branch"]["messages"][0]["role"] == "system"
    if action_format == "tools":
        assert [m["tool_calls"][0]["id"] for m in replies] == ["call_0", "call_1", "c2", "c3", "c4"]
        assert json.loads(rows["branch"]["tools"]) == json.loads(rows["parent"]["tools"])
    # With dedupe (the default), the branch is the parent's sample again: one row.
    assert export_sft_files([tmp_path], tmp_path / "sft2" / "train.jsonl").filtered == {"duplicate": 1}


# ----- vf-eval traces.jsonl ---------------------------------------------------------------------------------
async def test_vf_eval_traces_filters_and_a_malformed_line(corpus, tmp_path):
    run = tmp_path / "outputs" / "evals" / "air-mlgym--qwen3--air-mlgym--0123abcd"
    run.mkdir(parents=True)
    lines = [vf_eval_line(corpus["improved"]), vf_eval_line(corpus["worse"]),
             "{this line was cut by a crash",
             vf_eval_line(corpus["failed_final"]), vf_eval_line(corpus["out_of_turns"]),
             vf_eval_line(corpus["small"], ok=False),  # a rollout whose sandbox failed
             "",  # a blank line is not malformed
             vf_eval_line(corpus["replay"]), vf_eval_line(corpus["small"])]
    (run / "traces.jsonl").write_text("\n".join(lines) + "\n")
    result = export_sft_files([tmp_path / "outputs"], tmp_path / "sft" / "train.jsonl")
    _check_counts(result)
    assert result.counts() == {"files": 1, "read": 7, "kept": 2, "malformed": 1,
                               "filtered": {"below_min_improvement": 1, "duplicate": 1, "errored": 1,
                                            "not_submitted": 1, "submission_failed": 1}}
    assert len(result.warnings) == 1 and "traces.jsonl:3: not JSON" in result.warnings[0]
    kept = {r["task"]: r for r in result.rows}
    assert set(kept) == {"regression-rmse", "tabular-classification"}
    assert kept["regression-rmse"]["source"].endswith("traces.jsonl:1")
    assert kept["tabular-classification"]["source"].endswith("traces.jsonl:9")  # after the malformed line
    assert [m["role"] for m in kept["regression-rmse"]["messages"]] == \
        ["system", "user"] + ["assistant", "user"] * 4 + ["assistant"]


async def test_the_same_episode_in_both_formats_is_one_sample(corpus, tmp_path):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(vf_eval_line(corpus["improved"]) + "\n")
    result = export_sft_files([traces, corpus["air_dir"] / "improved.jsonl"],
                              tmp_path / "sft" / "train.jsonl")
    assert result.read == 2 and result.kept == 1 and result.filtered == {"duplicate": 1}


async def test_a_trace_whose_last_validation_failed_is_not_a_successful_submission(corpus, tmp_path):
    line = json.loads(vf_eval_line(corpus["failed_final"]))
    trace = line["traces"][0]
    assert trace["metrics"]["last_score"] == 0.9 and trace["info"]["step_rewards"][-1] < 0
    result = sft_rows([("traces.jsonl", [json.dumps(line)])])
    assert result.filtered == {"submission_failed": 1}
    result = sft_rows([("traces.jsonl", [json.dumps(line)])], ExportOptions(submitted_only=False))
    assert result.kept == 1


def test_lines_of_neither_format_are_malformed():
    result = sft_rows([("x.jsonl", ['[1, 2]', '{"messages": []}', '{"type": "step", "turn": 1}',
                                    b'\xff\xfe not utf-8'])])
    assert result.read == 0 and result.malformed == 4 and len(result.warnings) == 4
    assert "before any 'start' record" in result.warnings[2] and "not UTF-8" in result.warnings[3]


# ----- the command ------------------------------------------------------------------------------------------
def _cli(*args: str):
    from air.cli.export import export_app

    return CliRunner().invoke(export_app, list(args))


async def test_cli_writes_the_dataset_and_reports_counts(corpus, tmp_path):
    out = tmp_path / "data" / "air-sft" / "train.jsonl"
    result = _cli("sft", str(corpus["air_dir"]), "--out", str(out), "--min-improvement", "0.05", "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert counts["kept"] == 1 and counts["read"] == 7 and counts["out"] == str(out)
    assert [json.loads(line)["task"] for line in out.read_text().splitlines()] == ["regression-rmse"]

    result = _cli("sft", str(corpus["air_dir"]), "--out", str(out), "--all", "--no-dedupe", "--json")
    counts = json.loads(result.stdout)
    assert counts["filtered"] == {"below_min_improvement": 1} and counts["kept"] == 6


async def test_cli_keeps_everything_scored_with_minus_inf(corpus, tmp_path):
    result = _cli("sft", str(corpus["air_dir"]), "--out", str(tmp_path / "o" / "train.jsonl"),
                  "--min-improvement", "-inf", "--all", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["filtered"] == {"duplicate": 1}


async def test_cli_nothing_kept_exits_1_and_writes_nothing(corpus, tmp_path):
    out = tmp_path / "o" / "train.jsonl"
    result = _cli("sft", str(corpus["air_dir"] / "worse.jsonl"), "--out", str(out))
    assert result.exit_code == 1 and not out.exists()


def test_cli_bad_input_is_a_usage_error(tmp_path):
    from air.cli.app import exit_code

    result = _cli("sft", str(tmp_path / "missing"), "--out", str(tmp_path / "train.jsonl"))
    assert isinstance(result.exception, UsageError) and exit_code(result.exception) == 2
    (tmp_path / "t.jsonl").write_text("")
    result = _cli("sft", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "train.txt"))
    assert isinstance(result.exception, UsageError) and ".jsonl" in str(result.exception)


def test_cli_help_has_an_example():
    result = _cli("sft", "--help")
    assert result.exit_code == 0 and "Example: air export sft" in result.output
