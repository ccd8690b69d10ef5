"""The CLI as a demanding user found it in round four (issue 42), from the outside, each case failing on 6f640f6:
bad input is exit 2 and one line (never "a bug in air"), a full stderr keeps the exit code, and nothing is silently
wrong (a report that counts a rollout twice, an export that loses the commands).

The ways services end are in tests/test_serve_exits.py, a reply's bounds in tests/test_reply_bounds.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from served import ChatDouble
from test_cli_failures import air
from test_cli_round_three import episodes, one_line
from test_tool_calls import call, play

from air.actions import Reply


def test_view_to_dev_stdout_through_a_pipe_is_bad_input_naming_it(tmp_path):
    episodes(tmp_path)
    proc = air("view", "runs", "-o", "/dev/stdout", cwd=tmp_path, timeout=120)  # stdout is a pipe here
    one_line(proc, 2, "/dev/stdout is a FIFO")


def test_an_unusable_cache_folder_is_bad_input_naming_its_variable(tmp_path):
    proc = air("run", "--task", "prisoners-dilemma", cwd=tmp_path, timeout=120,
               env={"XDG_CACHE_HOME": "/proc/self/nope", "AIR_CACHE_DIR": "", "AIR_HIDDEN_DRAW": "host"})
    one_line(proc, 2, "XDG_CACHE_HOME=/proc/self/nope")


def test_rescore_with_an_empty_mode_is_bad_input_not_a_replay(tmp_path):
    episodes(tmp_path)
    one_line(air("replay", "runs/a.jsonl", "--rescore", "", cwd=tmp_path, timeout=120), 2, "--rescore takes")


def test_stderr_on_a_full_device_keeps_the_exit_code(tmp_path):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "air.cli.main", "view", "nope"], cwd=tmp_path, stderr=full,
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 2


@pytest.mark.parametrize("sources", [["runs", "runs"], ["runs", "runs/a.jsonl"], ["runs", "./runs/"]])
def test_view_counts_each_rollout_once_however_often_it_is_named(tmp_path, sources):
    episodes(tmp_path)
    proc = air("view", *sources, "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rollouts"] == 2


def test_mlgym_results_of_a_tools_episode_keep_every_command(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    asyncio.run(play(runs / "t.jsonl", [
        Reply(content="Look, then score.", tool_calls=(call("bash", {"command": "ls -la"}, id="a"),
                                                        call("validate", id="b"))),
        Reply(tool_calls=(call("bash", {"command": "cat train.py"}, id="c"), call("submit", id="d")))],
        [90.0, 91.0]))
    proc = air("export", "mlgym-results", "runs", "--out", "mlg", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (traj,) = (tmp_path / "mlg").glob("*/*.traj")
    data = json.loads(traj.read_text())
    assert [t["action"] for t in data["trajectory"]] == ["ls -la", "validate", "cat train.py", "submit"]
    assert data["trajectory"][0]["response"] == "Look, then score."
    assert "Evaluation Score" in data["trajectory"][1]["observation"]
    assert [h["action"] for h in data["history"] if h["role"] == "assistant"] == \
        ["ls -la", "validate", "cat train.py", "submit"]


def test_mlgym_results_of_a_text_episode_hold_the_commands_not_their_kind(tmp_path):
    episodes(tmp_path)
    proc = air("export", "mlgym-results", "runs", "--out", "mlg", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    traj = sorted((tmp_path / "mlg").glob("*/*.traj"))[0]
    actions = [t["action"] for t in json.loads(traj.read_text())["trajectory"]]
    assert actions[0] == "ls -la" and actions[2] == "python train.py" and actions[-2:] == ["validate", "submit"]


def test_mlgym_results_say_how_a_model_name_with_a_slash_is_written(tmp_path):
    episodes(tmp_path)
    proc = air("export", "mlgym-results", "runs", "--out", "mlg", "--model", "Qwen/Qwen3-4B", cwd=tmp_path,
               timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "'Qwen/Qwen3-4B' is written 'Qwen-Qwen3-4B'" in " ".join(proc.stderr.split())
    assert all(d.name.startswith("Qwen-Qwen3-4B__") for d in (tmp_path / "mlg").iterdir())


# ----- tasks that must not load ---------------------------------------------------------------------------------
@pytest.mark.parametrize("before, after, says", [
    ('submission = ["strategy.py"]', 'submission = ["/etc/passwd"]', "'/etc/passwd' must be relative"),
    ('submission = ["strategy.py"]', 'submission = ["../../etc/passwd"]', "must be relative"),
    ("training = 600", "training = true", "timeouts.training"),
    ("command = 60", "command = true", "timeouts.command"),
], ids=["absolute-submission", "escaping-submission", "training-true", "command-true"])
def test_a_task_toml_with_a_submission_outside_the_workspace_or_a_boolean_timeout_is_refused(tmp_path, before,
                                                                                           after, says):
    import shutil

    from air import paths

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir() / "prisoners-dilemma", tasks / "prisoners-dilemma")
    toml = tasks / "prisoners-dilemma" / "task.toml"
    text = toml.read_text()
    assert before in text
    toml.write_text(text.replace(before, after, 1))
    one_line(air("tasks", "show", "prisoners-dilemma", cwd=tmp_path, timeout=120,
                 env={"AIR_TASKS_DIR": str(tasks)}), 2, says)


def test_an_mlgym_task_with_a_boolean_training_timeout_is_refused(tmp_path):
    from test_mlgym import variant, write_tree

    root = write_tree(tmp_path / "MLGym")
    ref = variant(root, "boolTimeout", "csvToy", training_timeout=True)
    one_line(air("tasks", "show", f"mlgym:{ref}", "--mlgym-root", str(root), cwd=tmp_path, timeout=120), 2,
             "training_timeout")


# ----- messages that say what is wrong ------------------------------------------------------------------------------
def test_a_damaged_tools_trajectory_is_named_with_its_damage_in_an_sft_export(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    asyncio.run(play(runs / "t.jsonl", [
        Reply(tool_calls=(call("bash", {"command": "ls"}, id="a"),)),
        Reply(tool_calls=(call("validate", id="b"),)),
        Reply(tool_calls=(call("submit", id="c"),))], [90.0, 91.0]))
    lines = (runs / "t.jsonl").read_text().splitlines(keepends=True)
    (runs / "t.jsonl").write_text("".join(lines[:2] + lines[3:]))  # turn 2's line lost
    proc = air("export", "sft", "runs", "--out", "sft.jsonl", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "runs/t.jsonl:1: left out (incomplete): a damaged recording, turn 2 is missing" in said, said


def test_an_ssh_docker_host_without_its_transport_says_what_it_needs(tmp_path):
    pytest.importorskip("docker")
    import importlib.util

    if importlib.util.find_spec("paramiko") is not None:
        pytest.skip("paramiko is installed: the SDK's ssh transport loads")
    proc = air("containers", "ls", cwd=tmp_path, timeout=120, env={"DOCKER_HOST": "ssh://air@nowhere.invalid"})
    line = one_line(proc, 3, "reached over ssh, which needs the `paramiko` package")
    assert "NameError" not in line and "is not defined" not in line


@pytest.mark.docker
def test_a_baseline_that_hangs_is_said_not_shown_by_its_kill_text(images, tmp_path):
    import shutil

    from air import paths

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir() / "prisoners-dilemma", tasks / "prisoners-dilemma")
    toml = tasks / "prisoners-dilemma" / "task.toml"
    text = toml.read_text()
    assert '[baseline]\ncommand = ""' in text
    toml.write_text(text.replace('[baseline]\ncommand = ""', '[baseline]\ncommand = "echo started; sleep 600"', 1))
    proc = air("tasks", "check", "prisoners-dilemma", "--budget", "3s", "--json", cwd=tmp_path, timeout=300,
               env={"AIR_TASKS_DIR": str(tasks), "AIR_HIDDEN_DRAW": "reference"})
    assert proc.returncode == 1, proc.stderr
    (result,) = json.loads(proc.stdout)
    assert "did not finish within 3s and was stopped" in result["message"], result
    assert "timed out: True" not in result["message"] and "Killed" not in result["message"]


class HugeIntegerModel(ChatDouble):
    """A TEST DOUBLE of an LLM endpoint in the tools format: its first reply calls `bash` with a 5,000-digit
    integer for `timeout` (valid JSON a policy can write to fail its own rollout, were it decoded unbounded), its
    second calls `submit`."""

    def answer(self, body: dict) -> tuple[int, dict]:
        turn = sum(m.get("role") == "assistant" for m in body["messages"])
        name, arguments = ("bash", '{"command": "ls", "timeout": ' + "9" * 5000 + "}") if turn == 0 else \
            ("submit", "{}")
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return 200, {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [call]}}]}


@pytest.mark.docker
def test_air_run_in_the_tools_format_records_a_huge_integer_as_one_format_error_and_goes_on(images, tmp_path):
    with HugeIntegerModel() as url:
        proc = air("run", "--action-format", "tools", "--base-url", url, "--model", "double", "--out", "runs",
                   "--json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    assert summary["format_errors"] == 1 and summary["ended_by"] == "submitted", summary
