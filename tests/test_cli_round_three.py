"""The CLI at 2 a.m., round three (issue 35), from the outside, a class per section, each case failing on 49fff14:
nothing air writes replaces what is not a regular file or one of its inputs, odd terminals and damaged or crafted
inputs get their class (one line, never "a bug in air"), and nothing false ends in exit 0.

The model endpoint's bounds are in tests/test_model_endpoints.py, the ways a run ends in tests/test_run_endings.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from progress_lines import without_progress

from test_cli_failures import air


def episodes(root: Path) -> Path:
    """Two finished regression-rmse episodes in root/runs (no Docker: the loop on a fake sandbox)."""
    from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play

    for name, last in (("a", 80.0), ("b", 85.0)):
        asyncio.run(play(root / "runs" / f"{name}.jsonl", "regression-rmse",
                         [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8, last]))
    return root / "runs"


def one_line(proc: subprocess.CompletedProcess, code: int, says: str) -> str:
    """The command failed with `code` and one line on stderr saying `says` (besides the progress lines of the work it
    did: tests/progress_lines.py), and no bug of air's."""
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = without_progress(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("air: error:") and says in lines[0], proc.stderr
    assert "a bug in air" not in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


# ----- 1. what air writes over -------------------------------------------------------------------------------------
def _device(path: Path) -> None:
    """A character device like /dev/null, made in the test's folder (a test never writes at /dev itself)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.mark.parametrize("make, kind", [
    (_device, "a character device"),
    (os.mkfifo, "a FIFO"),
])
@pytest.mark.parametrize("command", ["view", "export sft"])
def test_an_output_that_is_a_device_or_a_fifo_is_refused_and_left_as_it_was(tmp_path, make, kind, command):
    episodes(tmp_path)
    out = tmp_path / "out.jsonl"
    make(out)
    before = os.stat(out)
    args = ["view", "runs", "-o", "out.jsonl"] if command == "view" else ["export", "sft", "runs", "--out",
                                                                         "out.jsonl"]
    one_line(air(*args, cwd=tmp_path, timeout=120), 2, f"out.jsonl is {kind}")
    after = os.stat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)


@pytest.mark.parametrize("args", [
    ["export", "sft", "runs", "--out", "runs/a.jsonl"],
    ["view", "runs", "-o", "runs/b.jsonl"],
    ["view", "runs/a.jsonl", "-o", "alias.jsonl"],  # a symlink to an input is the input
])
def test_an_output_that_is_one_of_the_inputs_is_refused_and_the_input_kept(tmp_path, args):
    runs = episodes(tmp_path)
    (tmp_path / "alias.jsonl").symlink_to(runs / "a.jsonl")
    before = {p.name: p.read_bytes() for p in runs.iterdir()}
    one_line(air(*args, cwd=tmp_path, timeout=120), 2, "is one of the inputs")
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before


def test_an_output_symlink_is_written_through_and_stays_a_link(tmp_path):
    episodes(tmp_path)
    (tmp_path / "reports").mkdir()
    link = tmp_path / "report.html"
    link.symlink_to("reports/latest.html")  # dangling until written
    proc = air("view", "runs", "-o", "report.html", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == "reports/latest.html"
    assert (tmp_path / "reports" / "latest.html").read_text().startswith("<!doctype html>")


@pytest.mark.parametrize("command", ["view", "replay"])
def test_an_input_fifo_named_like_a_trajectory_is_refused_not_waited_on(tmp_path, command):
    os.mkfifo(tmp_path / "x.jsonl")
    args = ["view", "x.jsonl", "-o", "r.html"] if command == "view" else ["replay", "x.jsonl"]
    one_line(air(*args, cwd=tmp_path, timeout=60), 2, "x.jsonl is a FIFO")


def test_a_fifo_in_a_run_directory_is_passed_over(tmp_path):
    runs = episodes(tmp_path)
    os.mkfifo(runs / "x.jsonl")
    proc = air("view", "runs", "-o", "r.html", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "(2 rollouts)" in proc.stdout, proc.stderr


# ----- 4. odd terminals, damaged or crafted inputs, unusable caches: their class, never "a bug in air" -------------
def _crafted(root: Path, name: str, change) -> None:
    """runs/<name>.jsonl: episode a with `change(records)` applied, written as text."""
    runs = episodes(root)
    records = [json.loads(line) for line in (runs / "a.jsonl").read_text().splitlines()]
    (runs / "b.jsonl").unlink()
    (runs / "a.jsonl").unlink()
    (runs / f"{name}.jsonl").write_text("".join(line + "\n" for line in change(records)))


def _huge_number(records: list[dict]) -> list[str]:
    lines = [json.dumps(r) for r in records]
    lines[2] = lines[2][:-1] + ', "x": ' + "9" * 5000 + "}"
    return lines


def _deep_brackets(records: list[dict]) -> list[str]:
    return [json.dumps(r) for r in records[:2]] + ["[" * 100_000] + [json.dumps(r) for r in records[2:]]


def _nan_score(records: list[dict]) -> list[str]:
    for r in records:
        if r["type"] == "step" and r.get("score") is not None:
            r["score"] = float("nan")
    return [json.dumps(r) for r in records]


def _lone_surrogate(records: list[dict]) -> list[str]:
    records[1]["reply"] = "I look \ud800 first.\n\n```bash\nls\n```"
    return [json.dumps(r) for r in records]  # ensure_ascii: the file holds the escape "\ud800", as JSON may


@pytest.mark.parametrize("change, args, code, says", [
    (_huge_number, ["view", "runs", "-o", "r.html"], 2, "not JSON (an integer of 5000 digits (at most 4300)"),
    (_deep_brackets, ["view", "runs", "-o", "r.html"], 0, "not JSON (nested too deeply"),
    (_huge_number, ["replay", "runs", "--rescore", "best"], 2, "turn 2 is missing"),
    (_nan_score, ["replay", "runs", "--rescore", "best"], 2, "Input should be a finite number"),
    (_nan_score, ["view", "runs", "-o", "r.html"], 2, "is a damaged recording"),
    (_lone_surrogate, ["view", "runs", "-o", "r.html"], 0, ""),
    (_lone_surrogate, ["export", "sft", "runs", "--out", "sft/train.jsonl", "--all"], 0, ""),
], ids=["view a 5000-digit number", "view 100,000 brackets", "rescore a 5000-digit number", "rescore a NaN score",
        "view a NaN score", "view a lone surrogate", "export a lone surrogate"])
def test_a_crafted_trajectory_is_a_skipped_line_or_a_damaged_recording_never_a_bug(tmp_path, change, args, code,
                                                                                   says):
    _crafted(tmp_path, "crafted", change)
    proc = air(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "a bug in air" not in proc.stderr and "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr
    if code == 2:  # after the warnings about the lines skipped, one line says why
        assert proc.stderr.strip().splitlines()[-1].startswith("air: error: runs/crafted.jsonl is a damaged"), \
            proc.stderr
    if "surrogate" in str(change):  # the reply is kept, the surrogate shown as U+FFFD
        written = (tmp_path / args[-1] if args[0] == "view" else tmp_path / "sft" / "train.jsonl").read_text()
        assert "I look \ufffd first." in written


def test_stdin_closed_under_debug_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "debug", "prisoners-dilemma"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: os.close(0))
    one_line(proc, 2, "stdin is closed")


def test_an_ascii_terminal_gets_escapes_not_an_error(tmp_path):
    proc = air("tasks", "list", cwd=tmp_path, timeout=120, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and "prisoners-dilemma" in proc.stdout, proc.stderr
    proc = air("tasks", "show", "no-such-task", cwd=tmp_path, timeout=120, env={"PYTHONIOENCODING": "ascii"})
    one_line(proc, 2, "unknown task")


@pytest.mark.parametrize("secret, says", [
    ("not a secret\n", "does not hold a task secret"),
    ("", "does not hold a task secret"),
    (None, "is a directory"),
])
def test_an_unusable_task_secret_in_the_cache_is_bad_input_naming_it(tmp_path, secret, says):
    cache = tmp_path / "cache"
    cache.mkdir()
    if secret is None:
        (cache / "task-secret").mkdir()
    else:
        (cache / "task-secret").write_text(secret)
    proc = air("tasks", "show", "regression-rmse", cwd=tmp_path, timeout=120,
               env={"AIR_CACHE_DIR": str(cache), "AIR_HIDDEN_DRAW": "host"})
    assert str(cache / "task-secret") in one_line(proc, 2, says)


# ----- 3. a closed stdout or stderr never changes the exit class ---------------------------------------------------
@pytest.mark.parametrize("args, code", [
    (["tasks", "list"], 0),
    (["tasks", "list", "--json"], 0),
    (["tasks", "show", "no-such-task"], 2),
])
@pytest.mark.parametrize("gone", ["stdout", "stderr", "both", "stderr closed"])
def test_a_closed_stdout_or_stderr_keeps_the_exit_code(tmp_path, args, code, gone):
    """`| head -1` closes the pipe early (EPIPE on the next write; a hung-up terminal gives EIO alike), `2>&-`
    closes stderr before air starts."""
    reader, writer = os.pipe()
    os.close(reader)  # a reader that went away: every write to the pipe fails with EPIPE
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", *args], cwd=tmp_path, timeout=120,
                          stdin=subprocess.DEVNULL, stdout=writer if gone in ("stdout", "both") else subprocess.DEVNULL,
                          stderr=writer if gone in ("stderr", "both") else subprocess.DEVNULL,
                          preexec_fn=(lambda: os.close(2)) if gone == "stderr closed" else None)
    os.close(writer)
    assert proc.returncode == code


# ----- silent wrong results ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setup, says", [
    (lambda root: "/nowhere/tasks", "AIR_TASKS_DIR=/nowhere/tasks does not exist"),
    (lambda root: str(root), "no tasks in"),
])
def test_a_tasks_dir_holding_no_tasks_is_said_not_listed_as_nothing(tmp_path, setup, says):
    one_line(air("tasks", "list", cwd=tmp_path, timeout=120, env={"AIR_TASKS_DIR": setup(tmp_path)}), 2, says)


def test_a_nan_baseline_is_refused_at_load(tmp_path):
    from air import paths

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir() / "prisoners-dilemma", tasks / "prisoners-dilemma")
    toml = tasks / "prisoners-dilemma" / "task.toml"
    text = toml.read_text()
    assert "scores = { Score = 2.61222 }" in text
    toml.write_text(text.replace("scores = { Score = 2.61222 }", "scores = { Score = nan }"))
    one_line(air("tasks", "show", "prisoners-dilemma", cwd=tmp_path, timeout=120,
                 env={"AIR_TASKS_DIR": str(tasks)}), 2, "baseline.scores.Score': Input should be a finite number")


# ----- 5. replay and images, task ids ------------------------------------------------------------------------------
NO_DAEMON = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def test_two_mlgym_yamls_of_one_id_are_refused_before_anything_runs(tmp_path):
    from test_mlgym import variant, write_tree

    root = write_tree(tmp_path / "MLGym")
    copy = variant(root, "csvToyCopy", "csvToy")  # a second YAML declaring `id: csvToy`
    proc = air("eval", "mlgym:tasks/csvToy.yaml", f"mlgym:{copy}", "--mlgym-root", str(root), "--out", "run",
               cwd=tmp_path, timeout=120, env=NO_DAEMON)
    one_line(proc, 2, "task id 'csvToy' is the id of both mlgym:tasks/csvToy.yaml and mlgym:tasks/csvToyCopy.yaml")
    one_line(air("eval", "prisoners-dilemma", "prisoners-dilemma", "--out", "run", cwd=tmp_path, timeout=120,
                 env=NO_DAEMON), 2, "task id 'prisoners-dilemma' is named twice")
    assert not (tmp_path / "run").exists()


def _as_mlgym(records: list[dict]) -> list[str]:
    records[0]["task"], records[0]["task_source"] = "csvToy", "mlgym:tasks/csvToy.yaml"
    return [json.dumps(r) for r in records]


def test_replay_of_an_mlgym_episode_loads_its_recorded_source_and_needs_its_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("MLGYM_ROOT", raising=False)
    _crafted(tmp_path, "mlgym", _as_mlgym)
    one_line(air("replay", "runs/mlgym.jsonl", cwd=tmp_path, timeout=120, env=NO_DAEMON), 2,
             "mlgym:tasks/csvToy.yaml: an MLGym task needs the MLGym checkout (--mlgym-root or $MLGYM_ROOT)")


def test_replay_of_a_recording_without_a_turn_is_nothing_to_replay_not_no_drift(tmp_path):
    _crafted(tmp_path, "empty", lambda records: [json.dumps(records[0])])
    proc = air("replay", "runs/empty.jsonl", cwd=tmp_path, timeout=120, env=NO_DAEMON)
    assert "runs/empty.jsonl has no turn: nothing to replay" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "air: error: nothing to replay in runs/empty.jsonl: no recording has a turn", proc.stderr
    assert proc.returncode == 2 and "no drift" not in proc.stdout


def test_data_rm_has_json_like_every_command(tmp_path):
    proc = air("data", "rm", "org/none", "--store", str(tmp_path / "store"), "--json", cwd=tmp_path, timeout=120)
    one_line(proc, 2, "dataset 'org/none' is not in the store")  # not "No such option: --json"


@pytest.mark.docker
def test_eval_of_a_task_whose_image_is_missing_is_infrastructure_naming_its_build(images, tmp_path, run_id):
    from air import paths

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir() / "prisoners-dilemma", tasks / "prisoners-dilemma")
    toml = tasks / "prisoners-dilemma" / "task.toml"
    toml.write_text(toml.read_text().replace('image = "cpu"', 'image = "nostack"'))
    assert 'image = "nostack"' in toml.read_text()
    proc = air("eval", "prisoners-dilemma", "--out", "run", cwd=tmp_path, timeout=300,
               env={"AIR_TASKS_DIR": str(tasks), "AIR_RUN_ID": run_id})
    # No recipe of that name either: it is not told to build it (round seven), still one line, exit 3.
    one_line(proc, 3, "image air/nostack:latest is not built, and air has no recipe 'nostack' to build it from")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.docker
def test_run_on_an_empty_wheel_cache_stages_nothing_for_images_it_has(images, tmp_path, run_id):
    """A new user (a new HOME, an empty cache) with the images built: nothing is downloaded or staged."""
    cache = tmp_path / "cache"
    proc = air("run", "--max-turns", "2", "--out", "runs", cwd=tmp_path, timeout=600,
               env={"AIR_CACHE_DIR": str(cache), "AIR_RUN_ID": run_id})
    assert proc.returncode == 0, proc.stderr
    assert "staging" not in proc.stderr and not (cache / "wheels").exists(), proc.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_a_recipe_built_before_is_reused_on_an_empty_cache_with_nothing_staged(images, tmp_path, docker_client):
    from air import paths

    name = f"tiny-{tmp_path.name[-8:].lower().replace('_', '-')}"
    recipes = tmp_path / "images"
    shutil.copytree(paths.images_dir(), recipes)
    (recipes / name).mkdir()
    (recipes / name / "recipe.toml").write_text('parent = "base"\nrequirements = ["six"]\n')
    env = {"AIR_IMAGES_DIR": str(recipes)}
    try:
        first = air("images", "build", name, "--json", cwd=tmp_path, timeout=900,
                    env={**env, "AIR_CACHE_DIR": str(tmp_path / "cache-a")})
        assert first.returncode == 0, first.stderr
        again = air("images", "build", name, "--json", cwd=tmp_path, timeout=900,
                    env={**env, "AIR_CACHE_DIR": str(tmp_path / "cache-b")})
        assert again.returncode == 0, again.stderr
        built = {b["recipe"]: b for b in json.loads(again.stdout)}
        assert built[name]["reused"] and built[name]["id"] == json.loads(first.stdout)[-1]["id"]
        assert not (tmp_path / "cache-b" / "wheels").exists(), again.stderr
    finally:
        for image in docker_client.images.list(filters={"label": f"air.recipe={name}"}):
            docker_client.images.remove(image.id, force=True)


@pytest.mark.docker
@pytest.mark.skipif(bool(__import__("air.sandbox.gpus", fromlist=["detect_gpus"]).detect_gpus()),
                    reason="this host has GPUs")
def test_run_of_a_task_on_a_cuda_image_is_refused_on_a_cpu_host_with_its_build_command(images, tmp_path):
    from air import paths

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir() / "prisoners-dilemma", tasks / "prisoners-dilemma")
    toml = tasks / "prisoners-dilemma" / "task.toml"
    toml.write_text(toml.read_text().replace('image = "cpu"', 'image = "gpu"'))
    proc = air("run", "--out", "runs", cwd=tmp_path, timeout=300,
               env={"AIR_TASKS_DIR": str(tasks), "AIR_CACHE_DIR": str(tmp_path / "cache")})
    one_line(proc, 3, "image air/gpu:latest is a CUDA image and this host has no GPU (nvidia-smi); air builds it "
                      "only when asked: `air images build gpu`")
    assert not (tmp_path / "cache" / "wheels").exists()


@pytest.mark.slow
@pytest.mark.docker
def test_replay_of_an_mlgym_episode_with_its_checkout_runs_it_again(images, tmp_path, run_id, monkeypatch):
    from test_mlgym import write_tree

    monkeypatch.delenv("MLGYM_ROOT", raising=False)
    root = write_tree(tmp_path / "MLGym")
    env = {"AIR_RUN_ID": run_id}
    played = air("run", "--task", "mlgym:tasks/csvToy.yaml", "--mlgym-root", str(root), "--max-turns", "2",
                 "--out", "runs", cwd=tmp_path, timeout=600, env=env)
    assert played.returncode == 0, played.stderr
    (trajectory,) = (tmp_path / "runs").glob("*.jsonl")
    for how in (["--mlgym-root", str(root)], []):
        replayed = air("replay", str(trajectory), *how, cwd=tmp_path, timeout=600,
                       env={**env, **({} if how else {"MLGYM_ROOT": str(root)})})
        assert replayed.returncode == 0 and "no drift" in replayed.stdout, replayed.stdout + replayed.stderr


@pytest.mark.docker
def test_serve_on_port_0_names_the_port_it_listens_on(images, tmp_path, run_id):
    import signal
    import urllib.request

    from test_cli_failures import containers_of, outputs, remove_run, spawn, wait_for

    proc = spawn("serve", "agentgym", "--port", "0", "--json", "--task", "prisoners-dilemma", cwd=tmp_path,
                 env={"AIR_RUN_ID": run_id})
    try:
        line = wait_for(lambda: outputs(tmp_path)[0].strip(), "the ready line", proc=proc)
        url = json.loads(line.splitlines()[0])["url"]
        assert not url.endswith(":0"), url
        with urllib.request.urlopen(f"{url}/items", timeout=60) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)  # a service stops on it, as on Ctrl-C (uvicorn's own shutdown)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        left = containers_of(run_id)
        remove_run(run_id)
    assert not left


# ----- 6. the README -------------------------------------------------------------------------------------------------
def test_the_readme_test_command_uses_both_cores_and_ci_runs_it_alike():
    """The README's command runs in parallel, and CI's Docker lane (the long pole) with the README's workers; the
    Docker-free lane beside it, at nice 10, may take fewer."""
    import re

    root = Path(__file__).resolve().parents[1]
    command = re.search(r"scripts/setup\.sh --test && (python3 -m pytest[^#\n]*)", (root / "README.md").read_text())
    workers = re.search(r" -n (\d+) --dist loadfile", command[1]) if command else None
    assert workers and int(workers[1]) >= 2, "the README's test command runs serially"
    lanes = re.findall(r"python3 -m pytest ([^\n]*)", (root / ".ci" / "run").read_text())
    assert lanes and all(re.search(r"-n [2-9] --dist loadfile", lane) for lane in lanes), lanes
    docker_lane = [lane for lane in lanes if "(docker or slow)" in lane]
    assert len(docker_lane) == 1 and f"-n {workers[1]} --dist loadfile" in docker_lane[0], docker_lane
