"""Typed trajectory records (air/episode/records.py) and the one reader of both formats (recording.py).

Every record type round-trips through the real writer; the episode loop writes the keys air has always
written; an episode reads the same from air's file and from a vf-eval trace (the older trace shape
test_export_sft uses, and the one air's env records now through records.TraceRecord); a torn last line costs
only itself; a trace with branches is read along the branch the episode continued. Episodes come from the real
loop with a faked sandbox (test_export_sft's fixtures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import verifiers.v1 as vf
from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play, vf_eval_line

from air.episode.recording import Recording, load_recordings, read_lines
from air.episode.records import (
    RECORDS,
    RETURN_REWARD,
    CommandRun,
    EndRecord,
    Evaluation,
    FailedRecord,
    StartRecord,
    StepRecord,
    Summary,
    TraceRecord,
)
from air.episode.trajectory import TrajectoryWriter, read_trajectory
from air.errors import UsageError
from air.export.sft import sft_rows
from air.tasks.spec import Metric

TIMED_OUT = CommandRun(exit_code=None, timed_out=True, oom_killed=False, shell_restarted=False,
                       output_bytes_dropped=0, command_seconds=60.0, cwd="/home/agent")
COMMAND = StepRecord(turn=1, reply=LOOK, action={"kind": "command", "text": "ls -la"}, seconds=0.03,
                     **TIMED_OUT.model_dump(), observation="[command timed out after 60 s]", reward=0.0,
                     done=False, total_reward=0.0)
FAILED = Evaluation(eval_status="invalid_submission", metrics={}, eval_message="3 rows", eval_seconds=0.4,
                    score=None, normalized=None)
AT_LIMIT = Evaluation(eval_status="ok", metrics={"rmse": 86.8}, eval_message="", eval_seconds=0.4, score=86.8,
                      normalized=0.33)
EVALUATED = StepRecord(turn=2, reply=VALIDATE, action={"kind": "validate"}, seconds=0.5,
                       **FAILED.model_dump(), final_evaluation=AT_LIMIT,
                       observation="Evaluation failed ... Episode over", reward=0.23, done=True,
                       total_reward=0.23)
FINISH = StepRecord(turn=2, reply=None, action=None, observation="Episode over (stopped reached)", reward=0.1,
                    done=True, total_reward=0.33,
                    final_evaluation=Evaluation(eval_status="ok", metrics={"Score": 2.8}, score=2.8))
RECORD_CASES = {
    "start": StartRecord(episode="e1", task="regression-rmse", task_version="1", task_hash="abc",
                         task_source="tasks/regression-rmse", sandbox="4b1d2c3e5f60", image="air/cpu:latest",
                         image_id="sha256:9f", baseline={"rmse": 129.9}, primary=Metric(name="rmse",
                         direction="lower", primary=True), config={"max_turns": 30}, system_prompt="sys",
                         prompt="task", rollout=3),  # a driver's meta lands at the top level
    "command step": COMMAND,
    "evaluation step": EVALUATED,
    "driver's final step": FINISH,
    "end": EndRecord(episode="e1", task="regression-rmse", ended_by="closed", turns=2, total_reward=0.33,
                     step_rewards=[0.0, 0.33], step_scores=[None, 86.8], step_evaluated=[False, True],
                     best_score=86.8, last_score=86.8, baseline=129.9, validations=1, failed_validations=0,
                     format_errors=0, final_status="ok", seconds=3.2, env_seconds=1.1, closed_by="client"),
    "failed": FailedRecord(episode="e1", turns=2, kind="infrastructure", error="SandboxUnavailable: gone"),
}


# ----- records ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(RECORD_CASES))
def test_each_record_type_round_trips_through_the_writer(tmp_path, case):
    record = RECORD_CASES[case]
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(record)
    (raw,) = read_trajectory(tmp_path / "t.jsonl")
    assert isinstance(raw.pop("time"), float) and raw == record.dump() and raw["type"] == record.type
    assert RECORDS[raw["type"]].model_validate(raw) == record


def test_discarded_writers_leave_no_folder_whichever_made_it(tmp_path):
    """Two rollouts of a task share its folder; the one that made it is discarded first (it failed first)."""
    first = TrajectoryWriter(tmp_path / "run" / "task" / "rollout-000.jsonl")
    second = TrajectoryWriter(tmp_path / "run" / "task" / "rollout-001.jsonl")
    kept = TrajectoryWriter(tmp_path / "other" / "rollout-000.jsonl")
    for writer in (first, second):
        writer.write(RECORD_CASES["start"])
        writer.discard()
    kept.close()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == \
        ["other", "other/rollout-000.jsonl"]


def test_a_step_holds_the_fields_of_what_happened_in_it():
    """Absent, not null: the command step has no evaluation fields, the evaluation no command fields; set
    fields are written even when None (the timed-out command's exit code, the failed evaluation's score)."""
    command, evaluated, finish = COMMAND.dump(), EVALUATED.dump(), FINISH.dump()
    assert command["exit_code"] is None and "eval_status" not in command and "final_evaluation" not in command
    assert evaluated["score"] is None and "exit_code" not in evaluated
    assert finish["reply"] is None and "seconds" not in finish and "eval_status" not in finish
    # The step's score is its last evaluation's: the final one at a limit, else its own.
    assert EVALUATED.last_evaluation.score == 86.8 and COMMAND.last_evaluation is None
    assert StepRecord.model_validate({**evaluated, "final_evaluation": None}).last_evaluation.score is None


async def test_the_loop_writes_the_keys_air_always_wrote(tmp_path):
    records = await play(tmp_path / "e.jsonl", "prisoners-dilemma", [LOOK, "no action here", VALIDATE],
                         [2.9, 2.9], max_turns=3)
    start, command, format_error, limit, end = records
    common = {"time", "type", "turn", "reply", "action", "seconds", "observation", "reward", "done",
              "total_reward"}
    assert set(start) == {"time", "type", "episode", "task", "task_version", "task_hash", "task_source",
                          "sandbox", "image", "image_id", "baseline", "reward_baseline", "primary", "config",
                          "system_prompt", "prompt", "trace"}
    assert start["reward_baseline"] == {"score": 2.61222, "source": "record", "draw": None, "record": 2.61222}
    assert set(command) == common | {"exit_code", "timed_out", "oom_killed", "shell_restarted",
                                     "output_bytes_dropped", "command_seconds", "cwd"}
    assert set(format_error) == common
    assert set(limit) == common | {"eval_status", "metrics", "eval_message", "eval_seconds", "score",
                                   "normalized", "final_evaluation"}
    assert set(end) == {"time", "type", "episode"} | set(Summary.model_fields)
    assert end["step_scores"] == [None, None, 2.9] and end["step_evaluated"] == [False, False, True]


# ----- one reader, both formats -----------------------------------------------------------------------------
def read(name: str, text: str) -> tuple[list[Recording], list[str]]:
    warnings: list[str] = []
    recs = list(read_lines(name, text.splitlines(), lambda lineno, why: warnings.append(f"{lineno}: {why}")))
    return recs, warnings


def adapter_line(records: list[dict], **episode: object) -> str:
    """The episode as air's env records it now (records.TraceRecord, what the verifiers adapter's `_record`
    puts on the trace), in vf-eval's line format."""
    line = json.loads(vf_eval_line(records))
    air = TraceRecord.of(StartRecord.model_validate(records[0]), Summary.model_validate(records[-1]))
    trace = line["traces"][0]
    trace.update(rewards={RETURN_REWARD: {"score": air.improvement, "weight": 1.0}},
                 metrics=air.metrics.model_dump(exclude_none=True), info=air.info.model_dump())
    line.update(episode)
    return vf.WireEpisode.model_validate(line).model_dump_json(exclude_none=True)


@pytest.fixture
async def improved(tmp_path) -> tuple[Path, list[dict]]:
    path = tmp_path / "improved.jsonl"
    replies = [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT]
    return path, await play(path, "regression-rmse", replies, [86.8185] * 2)


@pytest.mark.parametrize("shape", ["older trace", "adapter's trace"])
async def test_an_episode_reads_the_same_from_both_formats(improved, shape):
    path, records = improved
    (air,), warnings = read(str(path), path.read_text())
    line = vf_eval_line(records) if shape == "older trace" else adapter_line(records)
    (trace,), more = read("traces.jsonl", line)
    assert warnings == more == [] and air.format == "air" and trace.format == "vf-eval"
    assert air.ok and trace.ok and air.damage is None and trace.damage is None
    assert air.messages() == trace.messages() and air.messages()[-1]["role"] == "assistant"
    for field in ("task", "ended_by", "improvement", "final_ok", "baseline"):
        assert getattr(air, field) == getattr(trace, field), field
    assert [s.reward for s in air.steps] == [s.reward for s in trace.steps] == records[-1]["step_rewards"]
    assert air.total_reward == pytest.approx(records[-1]["total_reward"])
    assert air.scores == [(4, 86.8185), (5, 86.8185)] and air.metric == "rmse" and air.direction == "lower"
    assert air.source == str(path) and air.location == f"{path}:1"
    assert air.sandbox == "4b1d2c3e5f60" and air.steps[0].action == "command" and air.steps[0].exit_code == 0
    if shape == "adapter's trace":  # what `air replay` needs of a trace: scores, config, task hash
        assert trace.scores == air.scores and (trace.metric, trace.direction) == ("rmse", "lower")
        assert trace.config == air.config and trace.task_hash == air.task_hash


async def test_a_driver_stopping_the_episode_leaves_a_final_evaluation_in_both_formats(tmp_path):
    path = tmp_path / "stopped.jsonl"
    records = await play(path, "prisoners-dilemma", [LOOK, VALIDATE], [2.8, 2.75], stop_early=True)
    (air,), _ = read(str(path), path.read_text())
    (trace,), _ = read("traces.jsonl", adapter_line(records))
    for rec in (air, trace):
        assert [s.turn for s in rec.steps] == [1, 2] and rec.ended_by == "stopped" and rec.final_ok
        assert rec.final.reply is None and rec.final.turn == 2 and rec.final.score == 2.75
        assert rec.total_reward == pytest.approx(records[-1]["total_reward"])
        assert rec.scores == [(2, 2.8), (2, 2.75)]


async def test_a_torn_last_line_costs_only_itself(improved):
    path, _ = improved
    text = path.read_text()
    (rec,), warnings = read(str(path), text + '{"type": "step", "turn": 6, "reply": "```bash\\nls\n')
    assert rec.ok and len(rec.steps) == 5 and len(warnings) == 1 and warnings[0].startswith("8: not JSON")
    # A crash while writing the end record: unfinished, not damaged, and every turn still there.
    path.write_text(text.rstrip("\n").rsplit("\n", 1)[0] + '\n{"time": 1.0, "type": "e')
    (rec,) = load_recordings(path)
    assert not rec.ok and rec.damage is None and len(rec.steps) == 5
    assert rec.error.startswith("no end record")


async def test_a_failed_rollout_is_errored_not_incomplete(tmp_path):
    path = tmp_path / "failed.jsonl"
    records = await play(path, "regression-rmse", [LOOK, WRITE_MODEL], [], max_turns=30)
    with open(path, "a", encoding="utf-8") as f:  # as the writer would have ended it
        f.write(json.dumps(FailedRecord(episode=records[0]["episode"], turns=2, kind="infrastructure",
                                        error="SandboxUnavailable: the container is gone").dump()) + "\n")
    (rec,) = load_recordings(path)
    assert rec.failure == "infrastructure failure: SandboxUnavailable: the container is gone" == rec.error
    assert sft_rows([(str(path), path.read_text().splitlines())]).filtered == {"errored": 1}


async def test_a_lost_turn_damages_the_recording(improved):
    path, _ = improved
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # turn 3's record lost
    (rec,), _ = read(str(path), path.read_text())
    assert rec.damage == "turn 3 is missing; the end record counts 5 turns, 4 were read"
    with pytest.raises(UsageError, match=r"improved.jsonl is a damaged recording \(turn 3 is missing"):
        load_recordings(path)


# ----- vf-eval traces with branches -------------------------------------------------------------------------
def with_nodes(line: str, nodes: list[dict], *, wire: bool = True) -> str:
    """The line with other nodes; through verifiers' own model unless `wire` is False (it cannot serialise a
    broken graph, so such a line is a damaged file, not something vf-eval wrote)."""
    episode = json.loads(line)
    episode["traces"][0]["nodes"] = nodes
    if not wire:
        return json.dumps(episode)
    return vf.WireEpisode.model_validate(episode).model_dump_json(exclude_none=True)


def node(role: str, content: str, parent: int | None) -> dict:
    return {"message": {"role": role, "content": content}, "parent": parent, "sampled": role == "assistant"}


@pytest.mark.parametrize("branching", ["a retried reply", "a re-rooted conversation"])
async def test_a_trace_with_branches_is_read_along_the_branch_the_episode_continued(improved, branching):
    path, records = improved
    (air,), _ = read(str(path), path.read_text())
    line = adapter_line(records)
    nodes = json.loads(line)["traces"][0]["nodes"]
    dead = "A reply the episode never stepped.\n\n```bash\nrm -rf data\n```"
    if branching == "a retried reply":  # a dead end after turn 2's observation; the live reply follows it
        at = 6
        live = [{**n, "parent": n["parent"] + 1 if n.get("parent", -1) >= at else n.get("parent")}
                for n in nodes]
        nodes = live[:at] + [node("assistant", dead, at - 1)] + live[at:]
    else:  # verifiers could not match a request to the one before: the whole history again from a new root
        first = [node(m["message"]["role"], m["message"]["content"], i - 1 if i else None)
                 for i, m in enumerate(nodes[:5])] + [node("assistant", dead, 4)]
        nodes = first + [{**n, "parent": n["parent"] + len(first) if n.get("parent") is not None else None}
                         for n in nodes]
    (trace,), warnings = read("traces.jsonl", with_nodes(line, nodes))
    assert warnings == [] and trace.damage is None
    assert trace.messages() == air.messages() and dead not in json.dumps(trace.messages())
    assert [s.reply for s in trace.steps] == [s.reply for s in air.steps]
    # Aligned with info's per-step lists.
    assert [s.reward for s in trace.steps] == [s.reward for s in air.steps]


@pytest.mark.parametrize(("damage", "expected"), [
    ("parent out of range", "its node chain leaves the trace at node 99"),
    ("parent loop", "its node chain loops at node 4"),
    ("image content", "message 3 holds content that is not text"),
    ("tool message", "message 3 is a 'tool' message where air's conversation has a 'user' one"),
])
async def test_a_broken_trace_is_damaged_incomplete_for_export_refused_by_view(improved, tmp_path, damage,
                                                                               expected):
    _, records = improved
    line = adapter_line(records)
    nodes = json.loads(line)["traces"][0]["nodes"]
    if damage == "parent out of range":
        nodes[5]["parent"] = 99
    elif damage == "parent loop":
        nodes[3]["parent"] = 4
    elif damage == "image content":
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
        nodes[3]["message"]["content"] = [image]
    else:
        nodes[3]["message"] = {"role": "tool", "content": "42", "tool_call_id": "c1"}
    traces = tmp_path / "traces.jsonl"
    wire = damage not in ("parent out of range", "parent loop")
    traces.write_text(with_nodes(line, nodes, wire=wire) + "\n")
    (rec,), _ = read(str(traces), traces.read_text())
    assert rec.damage == expected and not rec.ok
    assert sft_rows([(str(traces), traces.read_text().splitlines())]).filtered == {"incomplete": 1}
    with pytest.raises(UsageError, match="is a damaged recording"):
        load_recordings(traces)


async def test_view_and_replay_skip_other_envs_traces_and_keep_failed_ones(improved, tmp_path):
    _, records = improved
    other = json.loads(vf_eval_line(records))
    other["traces"][0]["info"] = {"answer": 42}
    other["traces"][0]["task"]["data"].pop("task_ref")
    failed = json.loads(vf_eval_line(records, ok=False))
    failed["traces"][0].update(nodes=[], info={})  # its sandbox failed before the first turn
    run = tmp_path / "outputs" / "evals" / "run"
    run.mkdir(parents=True)
    (run / "traces.jsonl").write_text(json.dumps(other) + "\n" + json.dumps(failed) + "\n")
    (rec,) = load_recordings(tmp_path / "outputs")
    assert rec.task == "regression-rmse" and not rec.ok and rec.steps == []
    assert rec.error == "air: the container is gone"
