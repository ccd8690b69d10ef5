"""The CLI as a demanding user found it in round five (issue 49), from the outside: Harbor datasets at their edges,
exit codes and the words that go with them, and what was still wrong from round four. Each case failed on f481c6f
(or on the tree this file was written against, for the cases a round-five branch had not reached).

Docker-free unless marked: the episodes are played on a fake sandbox (tests/test_export_sft.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from served import ChatDouble
from test_cli_failures import air
from test_cli_round_three import one_line
from test_harbor_tasks import _task


def _dataset(tmp_path, **tasks: str):
    """A Harbor dataset under tmp_path/dataset: one task per keyword (its task.toml), and `fine` beside them."""
    root = tmp_path / "dataset"
    for name, toml in {**tasks, "fine": ""}.items():
        _task(root, name, toml)
    return root


# ----- Harbor edges -------------------------------------------------------------------------------------------------
def test_tasks_check_with_a_harbor_root_checks_that_dataset_not_the_bundled_tasks(tmp_path):
    root = tmp_path / "dataset"
    _task(root, "steps", '[[steps]]\nname = "a"\n')  # the dataset's one task cannot load
    proc = air("tasks", "check", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    one_line(proc, 2, f"no task of {root} loads")


def test_a_huge_instruction_is_refused_at_once_naming_it(tmp_path):
    root = _dataset(tmp_path)
    (root / "fine" / "instruction.md").write_bytes(b"Do it. " * (8 << 20))  # 56 MB
    started = time.monotonic()
    proc = air("tasks", "show", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    one_line(proc, 2, "its instruction.md is 56.0 MB; air takes one of at most 1 MB")
    assert len(proc.stdout) < 1000


def test_an_instruction_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    root = _dataset(tmp_path)
    (root / "fine" / "instruction.md").write_bytes("Make a caf\u00e9.\n".encode("latin-1"))
    proc = air("tasks", "show", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    one_line(proc, 2, "its instruction.md is not UTF-8 (byte 0xe9 at line 1)")
    assert "\ufffd" not in proc.stdout


def test_a_memory_past_any_host_is_refused_and_a_gpu_task_cannot_run_on_a_host_without_one(tmp_path):
    root = _dataset(tmp_path, huge="[environment]\nmemory_mb = 99999999999\n", gpu="[environment]\ngpus = 4096\n")
    one_line(air("tasks", "show", "harbor:huge", "--harbor-root", str(root), cwd=tmp_path, timeout=120), 2,
             "field 'environment.memory_mb': Input should be less than or equal to 4194304 (got 99999999999)")
    proc = air("tasks", "list", "--harbor-root", str(root), "--json", cwd=tmp_path, timeout=120)
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert not rows["huge"]["loads"] and "memory_mb" in rows["huge"]["reason"]
    assert rows["gpu"]["loads"] and rows["gpu"]["runs_here"] is False
    assert rows["gpu"]["why_not_here"].startswith("needs 4096 GPU(s); this host has")
    assert rows["fine"]["runs_here"] is True
    shown = " ".join(air("tasks", "list", "--harbor-root", str(root), cwd=tmp_path, timeout=120).stdout.split())
    assert "gpu cannot run here: needs 4096 GPU(s)" in shown and "1 can run on this host" in shown


@pytest.mark.parametrize("args", [
    ["export", "harbor", "prisoners-dilemma", "--out", ""],
    ["export", "mlgym-results", "runs", "--out", ""],
    ["export", "sft", "runs", "--out", ""],
    ["view", "runs", "-o", ""],
    ["view", ""],
    ["run", "--out", ""],
], ids=["export-harbor", "export-mlgym", "export-sft", "view-o", "view-source", "run"])
def test_an_empty_path_is_bad_input_and_nothing_is_written_here(tmp_path, args):
    (tmp_path / "runs").mkdir()
    proc = air(*args, cwd=tmp_path, timeout=120)
    one_line(proc, 2, "an empty path names nothing")
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and not any((tmp_path / "runs").iterdir())


def test_a_task_name_with_markup_is_printed_as_written(tmp_path):
    root = _dataset(tmp_path, marked='[task]\nname = "x[/]y :ok: [bold]z"\n')
    proc = air("tasks", "show", "harbor:marked", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "x[/]y :ok: [bold]z" in proc.stdout and "\U0001f197" not in proc.stdout


def test_airs_own_harbor_export_reads_back_without_a_note(tmp_path):
    assert air("export", "harbor", "prisoners-dilemma", "--out", "ds", cwd=tmp_path, timeout=120).returncode == 0
    proc = air("tasks", "show", "harbor:prisoners-dilemma", "--harbor-root", "ds", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "unknown key" not in proc.stderr, proc.stderr


# ----- exit codes and words -----------------------------------------------------------------------------------------
class ModelServer(ChatDouble):
    """A TEST DOUBLE of an OpenAI-compatible endpoint: `answers` are the chat completions' (status, body) in turn
    (the last one repeats); `requests` what it was asked."""

    def __init__(self, *answers: tuple[int, dict]):
        self.answers, self.requests = list(answers), []

    def answer(self, body: dict) -> tuple[int, dict]:
        self.requests.append(body)
        return self.answers[min(len(self.requests), len(self.answers)) - 1]


def _completion(message: dict, finish: str = "stop") -> tuple[int, dict]:
    return 200, {"choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}]}


@pytest.mark.docker
def test_eval_against_an_endpoint_answering_500_is_exit_3_and_one_line_as_run_is(images, tmp_path, run_id):
    with ModelServer((500, {"error": "the model crashed"})) as url:
        proc = air("eval", "prisoners-dilemma", "-n", "2", "-c", "2", "--base-url", url, "--model", "double",
                   "--out", "run", "--json", cwd=tmp_path, timeout=600, env={"AIR_RUN_ID": run_id})
        ran = air("run", "--base-url", url, "--model", "double", cwd=tmp_path, timeout=600,
                  env={"AIR_RUN_ID": run_id})
    line = one_line(proc, 3, "every rollout failed as infrastructure (2 of 2 rollout(s) failed; the first")
    assert "answered HTTP 500" in line
    assert [r["ok"] for r in json.loads(proc.stdout)["rollouts"]] == [False, False]
    one_line(ran, 3, "answered HTTP 500")


def test_a_run_whose_rollouts_failed_in_part_is_exit_1_with_one_line():
    from air.cli.research import rollouts_failed
    from air.episode.batch import RolloutResult
    from air.errors import InfraError

    http = "ModelUnavailable: model endpoint http://x/v1 answered HTTP 500: boom"
    every = rollouts_failed([RolloutResult("t", 0, False, None, error=http)] * 2)
    assert isinstance(every, InfraError) and "2 of 2 rollout(s) failed; the first, t #0: ModelUnavailable" in str(every)
    part = rollouts_failed([RolloutResult("t", 0, True, "a.jsonl"), RolloutResult("t", 1, False, None, error=http)])
    bug = rollouts_failed([RolloutResult("t", 0, False, None, error="internal error, ValueError: x")])
    assert not isinstance(part, InfraError) and not isinstance(bug, InfraError)
    assert str(part).startswith("1 of 2 rollout(s) failed; the first, t #1: ModelUnavailable")


class _Leasing:
    """The fake task environment of tests/test_export_sft.py, leasing its fake sandbox as run_episode asks."""

    def __init__(self, scores):
        from test_export_sft import FakeTaskEnv

        self.env = FakeTaskEnv("regression-rmse", scores)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def lease(self):
        import contextlib

        from test_export_sft import FakeSandbox

        @contextlib.asynccontextmanager
        async def leased():
            yield FakeSandbox()

        return leased()


async def test_a_reply_cut_at_the_token_limit_or_calling_tools_in_the_text_format_is_told_which(tmp_path):
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.episode.trajectory import read_trajectory
    from air.policies.openai_compat import OpenAIPolicy

    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    with ModelServer(_completion({"content": ""}, "length"),
                     _completion({"content": "I will write a long plan first, then ```bash\nls -"}, "length"),
                     _completion({"content": None, "tool_calls": [call]}, "tool_calls"),
                     _completion({"content": "```\nsubmit\n```"})) as url:
        policy = OpenAIPolicy(url, "double", timeout=30)
        try:
            await run_episode(_Leasing([80.0]), policy, EpisodeConfig(), tmp_path / "t.jsonl")
        finally:
            await policy.aclose()
    steps = [r for r in read_trajectory(tmp_path / "t.jsonl") if r["type"] == "step"]
    cut = "Your reply was cut off at the token limit before it held a complete action"
    assert steps[0]["observation"].startswith(cut) and "was empty" not in steps[0]["observation"]
    assert steps[1]["observation"].startswith(cut)
    assert steps[2]["observation"].startswith("Your reply called tools and wrote no text, but this episode is in "
                                              "the text format")
    assert steps[3]["action"]["kind"] == "submit"


async def test_the_text_formats_history_never_holds_tool_calls(tmp_path):
    """An endpoint refuses an assistant message with tool calls that no tool message answers."""
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.policies.openai_compat import OpenAIPolicy

    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    server = ModelServer(_completion({"content": None, "tool_calls": [call]}, "tool_calls"),
                         _completion({"content": "```\nsubmit\n```"}))
    with server as url:
        policy = OpenAIPolicy(url, "double", timeout=30)
        try:
            await run_episode(_Leasing([80.0]), policy, EpisodeConfig(), None)
        finally:
            await policy.aclose()
    said = server.requests[1]["messages"][2]
    assert said == {"role": "assistant", "content": ""}


def _edited(runs, line_type: str, field: str, value: float) -> None:
    path = runs / "a.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    record = next(r for r in lines if r["type"] == line_type and (line_type != "step" or r["turn"] == 2))
    record[field] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("line_type, says", [
    ("step", "turn 2's reward +891 is not the end record's +0"),
    ("end", "the end record's return +891 is not the sum of its step rewards"),
])
def test_a_trajectory_whose_step_rewards_disagree_with_its_end_record_is_said(tmp_path, line_type, says):
    from test_cli_round_three import episodes

    runs = episodes(tmp_path)
    _edited(runs, line_type, "reward" if line_type == "step" else "total_reward", 891.0)
    one_line(air("view", "runs", "-o", "r.html", cwd=tmp_path, timeout=120), 2, says)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("encoding, bom", [("utf-8", "\ufeff"), ("utf-16", ""), ("utf-16-be", "\ufeff"),
                                           ("utf-32", "")], ids=["utf-8-bom", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_trajectory_with_a_byte_order_mark_reads_as_what_it_is(tmp_path, encoding, bom):
    from test_cli_round_three import episodes

    runs = episodes(tmp_path)
    for name in ("a.jsonl", "b.jsonl"):
        path = runs / name
        path.write_bytes((bom + path.read_text(encoding="utf-8")).encode(encoding))
    assert path.read_bytes()[:2] in (b"\xef\xbb", b"\xff\xfe", b"\xfe\xff")
    proc = air("view", "runs", "-o", "r.html", "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rollouts"] == 2 and not proc.stderr
    proc = air("export", "sft", "runs", "--out", "sft/train.jsonl", "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["read"] == 2 and json.loads(proc.stdout)["malformed"] == 0


def test_wide_text_that_stops_decoding_is_one_line_naming_the_file(tmp_path):
    from test_cli_round_three import episodes

    runs = episodes(tmp_path)
    path = runs / "a.jsonl"
    path.write_bytes(path.read_text().encode("utf-16") + b"\x00\xd8")  # a lone high surrogate at the end
    one_line(air("view", "runs/a.jsonl", cwd=tmp_path, timeout=120), 2, "runs/a.jsonl: its UTF-16 stops decoding")


@pytest.mark.parametrize("make, says", [
    (lambda runs: (runs / "a.jsonl").write_text(""), "runs/a.jsonl is empty: no episode to export; nothing written"),
    (lambda runs: (runs / "a.jsonl").write_text("".join(
        line for line in (runs / "a.jsonl").read_text().splitlines(keepends=True) if '"type": "end"' not in line)),
     "no finished episode: the one read has no end record (cut off, or still running); nothing written"),
], ids=["empty", "no-end-record"])
def test_export_sft_of_an_empty_or_unfinished_file_says_so(tmp_path, make, says):
    from test_cli_round_three import episodes

    runs = episodes(tmp_path)
    make(runs)
    proc = air("export", "sft", "runs/a.jsonl", "--out", "sft/train.jsonl", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"air: {says}", proc.stderr


def _unwritable(tmp_path):
    """A folder this process cannot write in, even as root (sysfs refuses root too)."""
    import os

    if os.geteuid() == 0:
        return "/sys/fs"
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    return str(folder)


@pytest.mark.parametrize("variable", ["XDG_CACHE_HOME", "AIR_CACHE_DIR"])
def test_doctor_checks_that_the_cache_folder_can_be_written(tmp_path, variable):
    folder = _unwritable(tmp_path)
    env = {"AIR_CACHE_DIR": "", "XDG_CACHE_HOME": "", variable: folder,
           "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}  # the Docker rows fail at once
    proc = air("doctor", "--json", cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 3
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert not rows["cache folder"]["ok"] and rows["cache folder"]["required"]
    assert f"cannot use {variable}={folder} as air's cache" in rows["cache folder"]["detail"]
    fine = air("doctor", "--json", cwd=tmp_path, timeout=120, env={**env, variable: str(tmp_path / "cache")})
    assert {row["name"]: row for row in json.loads(fine.stdout)}["cache folder"]["ok"]


# ----- still wrong from round four ------------------------------------------------------------------------------------
@pytest.mark.docker
def test_containers_ls_through_a_pipe_shows_ids_and_names_whole(images, docker_client, run_id):
    from air.sandbox import make_labels

    name = f"air-{run_id}-a-long-name-that-an-80-column-table-would-cut-short"
    container = docker_client.containers.run("air/base:latest", ["sleep", "infinity"], detach=True, name=name,
                                             labels=make_labels("agent", "a-task-with-a-long-name", run_id),
                                             network_mode="none", init=True)
    try:
        proc = air("containers", "ls", "--run", run_id, cwd=Path.cwd(), timeout=120)  # stdout: a pipe
    finally:
        container.remove(force=True)
    assert proc.returncode == 0, proc.stderr
    assert container.id[:12] in proc.stdout and name in proc.stdout and "…" not in proc.stdout, proc.stdout


def test_one_broken_task_toml_is_its_own_line_and_the_others_are_listed(tmp_path):
    import shutil

    from air import paths

    tasks = tmp_path / "tasks"
    for name in ("prisoners-dilemma", "regression-rmse"):
        shutil.copytree(paths.tasks_dir() / name, tasks / name)
    with (tasks / "regression-rmse" / "task.toml").open("a") as toml:
        toml.write("x = [\n")
    env = {"AIR_TASKS_DIR": str(tasks)}
    proc = air("tasks", "list", cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stdout.split())
    assert "prisoners-dilemma" in shown and "regression-rmse cannot load: " in shown and "TOML syntax error" in shown
    rows = {r["id"]: r for r in json.loads(air("tasks", "list", "--json", cwd=tmp_path, timeout=120, env=env).stdout)}
    assert rows["prisoners-dilemma"]["error"] is None and rows["prisoners-dilemma"]["metric"] == "Score"
    assert "TOML syntax error" in rows["regression-rmse"]["error"]


def test_a_turn_of_many_calls_is_counted_on_its_line():
    from air.cli.run import _kinds_shown

    assert _kinds_shown(["command", "validate"]) == "command+validate"
    assert _kinds_shown(["command"] * 3 + ["submit"]) == "command x3+submit"
    many = _kinds_shown(["command"] * 298 + ["format_error", "submit"])
    assert many == "300 calls: 298 command, 1 format_error, 1 submit"


@pytest.mark.docker
def test_air_run_prints_a_300_call_reply_on_a_short_line(images, tmp_path, run_id):
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "true"}'}}
             for i in range(299)]
    calls.append({"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}})
    with ModelServer(_completion({"content": None, "tool_calls": calls}, "tool_calls")) as url:
        proc = air("run", "--action-format", "tools", "--base-url", url, "--model", "double", "--out", "runs",
                   cwd=tmp_path, timeout=900, env={"AIR_RUN_ID": run_id})
    assert proc.returncode == 0, proc.stderr
    (turn,) = [line for line in proc.stdout.splitlines() if line.startswith("turn  1")]
    # The episode's action limit (30) leaves the rest of the calls not run: each run of them is counted.
    assert "command x30+not_run x270" in turn and len(turn) < 200, turn


@pytest.mark.parametrize("model", ["a__b", "", "_a", "b_", "Qwen/x_"])
def test_mlgym_results_refuse_a_model_name_mlgym_would_read_as_other_parts(tmp_path, model):
    from test_cli_round_three import episodes

    episodes(tmp_path)
    proc = air("export", "mlgym-results", "runs", "--out", "mlg", "--model", model, cwd=tmp_path, timeout=120)
    one_line(proc, 2, f"--model {model!r} cannot name MLGym runs")
    assert not (tmp_path / "mlg").exists()


def test_view_of_huge_replies_bounds_each_and_says_how_much_was_cut(tmp_path):
    import asyncio

    from test_export_sft import SUBMIT, VALIDATE, WRITE_MODEL, play

    huge = "x" * (5 << 20) + "\n\n" + WRITE_MODEL
    asyncio.run(play(tmp_path / "runs" / "a.jsonl", "regression-rmse", [huge, huge, huge, VALIDATE, SUBMIT],
                     [86.8, 80.0]))
    proc = air("view", "runs", "-o", "r.html", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "r.html").read_text()
    assert len(page) < 200_000
    assert page.count(f"[... {(5 << 20) + 2 + len(WRITE_MODEL) - 20_000:,} of") == 3
    assert "cat &gt; train.py" in page  # the tail, where the action was, is shown
