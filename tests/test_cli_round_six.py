"""The CLI as a demanding user found it in round six (issue 65), from the outside: the audit's and the snapshot's
command lines as careful as the rest. Each case failed on 43ebb60 (said per test where it is not plain).

Docker-free unless marked: most cases are refused before any Docker work, and DOCKER_HOST names no daemon to show
it (the old code got as far as Docker and ended exit 3)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from test_cli_failures import air
from test_cli_round_five import ModelServer, _dataset, _unwritable
from test_cli_round_three import episodes, one_line

NO_DAEMON = {"DOCKER_HOST": "unix:///nonexistent/air-round-six.sock"}
"""No Docker here: a command that reaches Docker ends exit 3, so exit 2 shows the case was said before it."""


def _harbor(tmp_path) -> Path:
    return _dataset(tmp_path)  # one task, `fine`


# ----- outputs that are inputs, outputs checked before the work ----------------------------------------------------
@pytest.mark.parametrize("target", ["hack", "instruction"])
def test_audit_html_over_one_of_its_inputs_is_refused_before_any_work(tmp_path, target):
    root = _harbor(tmp_path)
    hacks = tmp_path / "hacks"
    hacks.mkdir()
    hack = hacks / "mine.toml"
    hack.write_text('name = "mine"\nfamily = "trivial-outputs"\nsummary = "s"\nscript = "true"\n')
    page = {"hack": hack, "instruction": root / "fine" / "instruction.md"}[target]
    before = page.read_bytes()
    proc = air("tasks", "audit", "harbor:fine", "--harbor-root", str(root), "--hacks", str(hacks), "--html",
               str(page), cwd=tmp_path, timeout=120, env=NO_DAEMON)
    one_line(proc, 2, "one of the inputs")
    assert page.read_bytes() == before


@pytest.mark.parametrize("where", ["proc", "read-only", "dev-full"])
def test_audit_html_that_cannot_be_written_is_said_before_the_audit(tmp_path, where):
    page = {"proc": "/proc/air-audit.html", "read-only": f"{_unwritable(tmp_path)}/audit.html",
            "dev-full": "/dev/full"}[where]
    proc = air("tasks", "audit", "prisoners-dilemma", "--html", page, cwd=tmp_path, timeout=120, env=NO_DAEMON)
    one_line(proc, 2, page)


def test_view_to_a_folder_that_cannot_be_written_is_said_before_reading(tmp_path):
    episodes(tmp_path)
    proc = air("view", "runs", "-o", "/proc/air-view.html", cwd=tmp_path, timeout=120)
    one_line(proc, 2, "cannot write /proc/air-view.html")


# ----- secrets -----------------------------------------------------------------------------------------------------
SECRET = "s3cr3t-Pa55word"


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_doctor_never_prints_the_docker_host_password(tmp_path, as_json):
    env = {"DOCKER_HOST": f"tcp://admin:{SECRET}@127.0.0.1:1"}
    proc = air("doctor", *(["--json"] if as_json else []), cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 3, proc.stderr
    assert "tcp://admin:***@127.0.0.1:1" in proc.stdout, proc.stdout
    assert SECRET not in proc.stdout + proc.stderr


def test_a_malformed_snapshot_key_is_refused_without_echoing_it(tmp_path):
    proc = air("tasks", "list", cwd=tmp_path, timeout=120, env={"AIR_SNAPSHOT_KEY": SECRET})
    one_line(proc, 2, "AIR_SNAPSHOT_KEY")
    assert SECRET not in proc.stdout + proc.stderr


def test_known_secrets_are_hidden_outside_urls_too(monkeypatch):
    from air.secrets import redact_text

    monkeypatch.setenv("DOCKER_HOST", f"tcp://admin:{SECRET}@10.0.0.1:2376")
    monkeypatch.setenv("AIR_OPENENV_TOKEN", "tok-0123456789")
    said = redact_text(f"Invalid bind address format: admin:{SECRET}@10.0.0.1 (token tok-0123456789)")
    assert SECRET not in said and "tok-0123456789" not in said and "admin:***@10.0.0.1" in said


# ----- inputs read bounded -----------------------------------------------------------------------------------------
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    path.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")


@pytest.mark.parametrize("make, says", [(_fifo, "is a FIFO"), (_zero, "is a character device"),
                                        (_huge, "is larger than 1024 KB")], ids=["fifo", "dev-zero", "huge"])
def test_a_hack_file_that_is_not_a_small_regular_file_is_refused_at_once(tmp_path, make, says):
    hacks = tmp_path / "hacks"
    hacks.mkdir()
    make(hacks / "x.toml")
    proc = air("tasks", "audit", "prisoners-dilemma", "--hacks", str(hacks), cwd=tmp_path, timeout=60, env=NO_DAEMON)
    one_line(proc, 2, f"x.toml {says}")


def test_an_empty_hacks_folder_is_said(tmp_path):
    (tmp_path / "hacks").mkdir()
    proc = air("tasks", "audit", "prisoners-dilemma", "--hacks", "hacks", cwd=tmp_path, timeout=60, env=NO_DAEMON)
    one_line(proc, 2, "--hacks hacks: no hack files (*.toml) in it")


# ----- names bounded -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["run", "--task", "{id}"], ["tasks", "show", "{id}"], ["tasks", "check", "{id}"], ["eval", "{id}"],
    ["tasks", "audit", "{id}"], ["tasks", "show", "harbor:{id}", "--harbor-root", "."],
], ids=["run", "show", "check", "eval", "audit", "harbor"])
def test_a_task_id_longer_than_a_file_name_is_bad_input(tmp_path, args):
    long_id = "t" * 300
    proc = air(*(a.format(id=long_id) for a in args), cwd=tmp_path, timeout=120, env=NO_DAEMON)
    line = one_line(proc, 2, "a name is at most 255 bytes")
    assert len(line) < 300


def test_a_path_too_long_is_one_line_wherever_it_surfaces():
    import errno

    from air.errors import UsageError
    from air.failures import translate

    said = translate(OSError(errno.ENAMETOOLONG, "File name too long", "/x/" + "y" * 5000))
    assert isinstance(said, UsageError) and "too long a name" in str(said) and len(str(said)) < 300


# ----- each silent case says what it did ---------------------------------------------------------------------------
KEY = "00112233445566778899aabbccddeeff"


def _snapshot_after_turn(tmp_path, turn: int) -> Path:
    from air.episode.snapshot import EpisodeState, Snapshot, save
    from air.tasks.registry import load_task

    spec = load_task("prisoners-dilemma")
    state = EpisodeState(turn=turn, actions=turn, format_errors=0, validations=0, failed_validations=0,
                         step_rewards=[0.0] * turn, step_scores=[None] * turn, step_evaluated=[False] * turn,
                         scores=[], score_baselines=[], best_score=None, paid=0.0, env_seconds=0.0, seconds=1.0,
                         messages=[])
    snap = Snapshot(task=spec.id, task_version=spec.version, task_hash=spec.content_hash, episode="e",
                    config={"max_turns": 30}, reward_baseline=None, state=state, cwd="", env={},
                    files_sha256=hashlib.sha256(b"").hexdigest())
    path = tmp_path / f"turn-{turn:03d}.airsnap"
    save(snap, path, key=bytes.fromhex(KEY))
    return path


def test_eval_from_a_snapshot_past_the_turn_limit_is_refused(tmp_path):
    snap = _snapshot_after_turn(tmp_path, 4)
    env = {**NO_DAEMON, "AIR_SNAPSHOT_KEY": KEY}
    proc = air("eval", "--from", str(snap), "--max-turns", "2", "--out", "run", cwd=tmp_path, timeout=120, env=env)
    one_line(proc, 2, "--max-turns 2: --from")
    assert "after turn 4" in proc.stderr and "above 4" in proc.stderr


def test_replay_from_turn_with_rescore_is_refused_not_ignored(tmp_path):
    episodes(tmp_path)
    proc = air("replay", "runs", "--rescore", "best", "--from-turn", "3", cwd=tmp_path, timeout=120)
    one_line(proc, 2, "--from-turn 3 with --rescore")


@pytest.mark.parametrize("command", [["tasks", "list"], ["tasks", "show", "harbor:fine"], ["run"]])
def test_an_empty_harbor_root_is_refused_like_an_empty_out(tmp_path, command):
    proc = air(*command, "--harbor-root", "", cwd=tmp_path, timeout=120, env=NO_DAEMON)
    one_line(proc, 2, "an empty path names nothing")


def test_a_root_variable_naming_a_file_is_said_naming_the_variable(tmp_path):
    (tmp_path / "afile").write_text("")
    for variable in ("MLGYM_ROOT", "HARBOR_ROOT"):
        proc = air("tasks", "list", cwd=tmp_path, timeout=120, env={variable: str(tmp_path / "afile")})
        one_line(proc, 2, f"{variable}={tmp_path / 'afile'} is not a directory")


def _oracle_task(tmp_path) -> Path:
    root = _harbor(tmp_path)
    (root / "fine" / "solution").mkdir()
    (root / "fine" / "solution" / "solve.sh").write_text("true\n")
    return root


def test_run_on_a_task_whose_oracle_failed_is_refused_as_eval_refuses(tmp_path, monkeypatch):
    from air.tasks.harbor.loader import load_harbor_task
    from air.tasks.harbor.oracle import keep

    root = _oracle_task(tmp_path)
    env = {**NO_DAEMON, "AIR_CACHE_DIR": str(tmp_path / "cache")}
    monkeypatch.setenv("AIR_CACHE_DIR", env["AIR_CACHE_DIR"])  # the check's record, where the command reads it
    keep(load_harbor_task(root, "fine"), False, 0.0, "reward 0, not 1")
    proc = air("run", "--task", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=120, env=env)
    one_line(proc, 2, "its oracle (solution/solve.sh) failed `air tasks check`")


def test_run_on_a_task_whose_oracle_was_never_checked_says_so(tmp_path):
    root = _oracle_task(tmp_path)
    env = {**NO_DAEMON, "AIR_CACHE_DIR": str(tmp_path / "cache")}
    proc = air("run", "--task", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=120, env=env)
    assert "its oracle (solution/solve.sh) was never checked" in proc.stderr, proc.stderr


@pytest.mark.docker
def test_an_apparmor_profile_on_a_host_without_apparmor_is_said(images, docker_client, tmp_path, run_id):
    if any("apparmor" in option for option in docker_client.info().get("SecurityOptions") or []):
        pytest.skip("this Docker host has AppArmor (the profile would be applied, or refused by Docker)")
    proc = air("run", "--max-turns", "1", "--out", "runs", cwd=tmp_path, timeout=600,
               env={"AIR_APPARMOR": "no-such-profile", "AIR_RUN_ID": run_id})
    assert "AIR_APPARMOR=no-such-profile names an AppArmor profile, but the Docker host" in proc.stderr, proc.stderr


# ----- unhelpful ----------------------------------------------------------------------------------------------------
def test_a_harbor_root_of_empty_folders_says_why_no_task_is_listed(tmp_path):
    root = tmp_path / "dataset"
    for i in range(5):
        (root / f"folder-{i}").mkdir(parents=True)
    proc = air("tasks", "list", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stdout.split())
    assert "a task is a folder holding a task.toml, and none of its 5 folder(s)" in shown, shown


def test_the_missing_image_hint_of_a_harbor_task_names_no_recipe_that_does_not_exist():
    from air.errors import ImageError

    said = str(ImageError.not_built("air/harbor-fine:0123abcd"))
    assert "air images build harbor-fine" not in said and "air tasks check harbor:" in said
    assert str(ImageError.not_built("air/cpu:latest")).endswith("run `air images build cpu`")


def test_stdout_on_a_full_device_is_said_naming_it(tmp_path):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "list"], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "writing standard output" in line, line


def test_the_audit_table_in_a_pipe_shows_family_names_whole(monkeypatch):
    from rich.console import Console

    import air.cli.app as app_module
    import air.cli.tasks as tasks_module
    from air.audit.hacks import FAMILIES
    from air.audit.runner import HackResult, TaskAudit
    from air.cli.app import app, run_cli

    audit = TaskAudit(task="prisoners-dilemma", contract="air", metric="Score", direction="higher", do_nothing=1.0,
                      do_nothing_status="ok", baseline=1.0, reference=None, seconds=1.0,
                      results=[HackResult(name=f"h-{f}", family=f, status="held", score=0.5) for f in FAMILIES])
    piped = Console(file=io.StringIO(), width=80, highlight=False, emoji=False)
    monkeypatch.setattr(app_module, "out", piped)
    monkeypatch.setattr(tasks_module, "out", piped)

    def ran(coro):
        coro.close()
        return [audit]

    monkeypatch.setattr(tasks_module, "run_async", ran)
    import air.cli.main  # noqa: F401 - registers the command groups

    assert run_cli(app, ["tasks", "audit", "prisoners-dilemma"]) == 0
    shown = piped.file.getvalue()
    assert all(family in shown for family in FAMILIES) and "…" not in shown, shown


def test_a_dead_kubernetes_api_is_one_line_and_no_unclosed_session(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        'apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: "https://127.0.0.1:1"}\n  name: dead\n'
        "contexts:\n- context: {cluster: dead, user: u}\n  name: dead\ncurrent-context: dead\n"
        "users:\n- name: u\n  user: {token: abc}\n")
    proc = air("run", "--out", "runs", cwd=tmp_path, timeout=300,
               env={"AIR_BACKEND": "kubernetes", "KUBECONFIG": str(kubeconfig)})
    assert proc.returncode == 3, proc.stderr
    assert "Unclosed client session" not in proc.stderr and "client_session" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("air: error: Kubernetes API"), proc.stderr


# ----- daily use ---------------------------------------------------------------------------------------------------
def test_run_takes_offline_as_eval_does(tmp_path):
    proc = air("run", "--offline", "--out", "runs", cwd=tmp_path, timeout=120, env=NO_DAEMON)
    assert proc.returncode == 3 and "No such option" not in proc.stderr, proc.stderr


def test_the_model_defaults_to_the_one_the_endpoint_serves():
    from air.cli.app import make_policy

    with ModelServer((200, {})) as url:
        policy, record = make_policy(url, None)
    assert policy.model == "double" and record["model"] == "double"


class _NoModels(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_without_a_model_an_endpoint_that_lists_none_is_told_to_name_one():
    from air.cli.app import make_policy
    from air.errors import UsageError

    server = HTTPServer(("127.0.0.1", 0), _NoModels)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UsageError, match="--model: name the model at"):
            make_policy(f"http://127.0.0.1:{server.server_port}/v1", None)
    finally:
        server.shutdown()


def test_modes_of_the_regular_file_checks():
    """read_bounded decides on the open descriptor: a FIFO opened without a writer does not wait."""
    import tempfile

    from air.errors import UsageError
    from air.files import read_bounded

    with tempfile.TemporaryDirectory() as folder:
        fifo = Path(folder) / "f"
        os.mkfifo(fifo)
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        with pytest.raises(UsageError, match="is a FIFO"):
            read_bounded(fifo, 10)
        (Path(folder) / "small").write_bytes(b"12345")
        assert read_bounded(Path(folder) / "small", 5) == b"12345"
        with pytest.raises(UsageError, match="larger than"):
            read_bounded(Path(folder) / "small", 4)


# ----- Harbor's rules exactly (harbor 0.25's own code: environments/definition.py, verifier/verifier.py) -----------
def test_a_named_docker_image_is_the_image_and_its_dockerfile_is_not_built(tmp_path):
    from test_harbor_tasks import _task

    from air.tasks.harbor.loader import load_harbor_task

    root = tmp_path / "dataset"
    _task(root, "both", '[environment]\ndocker_image = "air/cpu:latest"\n', dockerfile="FROM scratch\nRUN false\n")
    _task(root, "dockerfile", "", dockerfile="FROM air/cpu:latest\n")
    both, built = load_harbor_task(root, "both"), load_harbor_task(root, "dockerfile")
    assert both.build.dockerfile is None and both.build.base == "air/cpu:latest"
    assert built.build.dockerfile == "Dockerfile" and built.build.base is None


def test_a_verifiers_docker_image_comes_before_its_tests_dockerfile(tmp_path):
    from test_harbor_tasks import _task

    from air.tasks.harbor.loader import load_harbor_task

    root = tmp_path / "dataset"
    _task(root, "v", '[verifier.environment]\ndocker_image = "air/cpu:latest"\n',
          files={"tests/Dockerfile": "FROM scratch\nRUN false\n"})
    spec = load_harbor_task(root, "v")
    assert spec.verifier_build.dockerfile is None and spec.verifier_build.base == "air/cpu:latest"


@pytest.mark.docker
def test_a_task_with_both_runs_from_the_image_without_building_its_dockerfile(images, tmp_path):
    """The Dockerfile cannot build (`RUN false`, and FROM an image nobody has): building it would fail the task."""
    from test_harbor_tasks import _task

    from air.tasks.harbor.loader import load_harbor_task
    from air.tasks.task_images import build_task_image

    root = tmp_path / "dataset"
    _task(root, "both", '[environment]\ndocker_image = "air/cpu:latest"\n',
          dockerfile="FROM example.invalid/never:1\nRUN false\n")
    spec = load_harbor_task(root, "both")
    build_task_image(spec)
    import docker

    assert docker.from_env().images.get(spec.image).id


# The reward files as Harbor 0.25's verifier reads them: (reward.json's text or None, reward.txt's or None) ->
# the reward, or None where Harbor's trial fails to parse them (no reward).
REWARD_CASES = {
    "json": ('{"reward": 1}', None, 1.0),
    "json-metrics": ('{"reward": 0.5, "acc": 0.9}', None, 0.5),
    "json-without-reward-txt-ignored": ('{"acc": 0.9}', "1", None),
    "json-string-value": ('{"reward": "1"}', None, None),
    "json-other-string": ('{"reward": 1, "note": "fine"}', None, None),
    "json-null": ('{"reward": null}', None, None),
    "json-nested": ('{"reward": 1, "per": {"a": 1}}', None, None),
    "json-empty": ("", "1", None),
    "json-not-json-txt-ignored": ("{", "1", None),
    "json-list": ("[1]", None, None),
    "json-number": ("0.5", None, None),
    "json-nan": ('{"reward": NaN}', None, None),
    "json-true": ('{"reward": true}', None, 1.0),
    "json-overflow": ('{"reward": 1e309}', None, None),
    "txt": (None, "0.75\n", 0.75),
    "txt-spaces": (None, "  1  ", 1.0),
    "txt-empty": (None, "", None),
    "txt-words": (None, "passed", None),
    "txt-inf": (None, "inf", None),
}


@pytest.mark.parametrize("case", list(REWARD_CASES))
def test_reward_files_are_read_as_harbor_reads_them(case):
    from air.tasks.harbor.contract import reward_metrics

    reward_json, reward_txt, expected = REWARD_CASES[case]
    found = {name: text for name, text in (("reward.json", reward_json), ("reward.txt", reward_txt))
             if text is not None}
    metrics, why = reward_metrics(found)
    assert metrics.get("reward") == expected, (metrics, why)
    assert (why is None) == (expected is not None)


_HARBOR_PARSE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.verifier import Verifier
out = {}
for folder in sys.argv[1:]:
    paths = SimpleNamespace(reward_json_path=Path(folder, "reward.json"), reward_text_path=Path(folder, "reward.txt"))
    me = SimpleNamespace(trial_paths=paths)
    try:  # Verifier.verify's last lines, on these files
        if paths.reward_json_path.exists():
            rewards = Verifier._parse_reward_json(me)
        elif paths.reward_text_path.exists():
            rewards = Verifier._parse_reward_text(me)
        else:
            raise FileNotFoundError
        out[folder] = VerifierResult(rewards=rewards).rewards.get("reward")
    except Exception:
        out[folder] = None
print(json.dumps(out))
"""


def test_reward_cases_are_what_harbors_own_parser_makes_of_the_same_files(tmp_path):
    """harbor 0.25.0 itself, in the tests' own environment of it (tests/harbor_venvs.py; skipped only where PyPI
    cannot be reached to make it)."""
    from harbor_venvs import run, venv

    harbor_env = venv("harbor-0.25.0")
    folders = {}
    for case, (reward_json, reward_txt, _) in REWARD_CASES.items():
        folder = tmp_path / case
        folder.mkdir()
        for name, text in (("reward.json", reward_json), ("reward.txt", reward_txt)):
            if text is not None:
                (folder / name).write_text(text)
        folders[str(folder)] = case
    proc = run(harbor_env, _HARBOR_PARSE, *folders, timeout=300)
    assert proc.returncode == 0, proc.stderr
    harbor = {folders[f]: value for f, value in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    assert harbor == {case: expected for case, (_, _, expected) in REWARD_CASES.items()}


def test_harbor_made_tasks_get_no_false_note_and_every_task_shows_its_verifier_mode():
    """tests/fixtures/harbor-templates: what harbor 0.25's `harbor init --task` writes ([task] version = "1.0.0")."""
    templates = Path(__file__).parent / "fixtures" / "harbor-templates"
    proc = air("tasks", "list", "--harbor-root", str(templates), "--json", cwd=templates, timeout=120)
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert {name: r["verifier"] for name, r in rows.items()} == {"separate-checker": "separate",
                                                                "shared-pytest": "shared"}
    assert not any("unknown key" in note for r in rows.values() for note in r["notes"]), rows


def test_a_separate_verifier_given_no_artifacts_is_not_said_to_score_a_copy_of_the_workspace(tmp_path):
    from test_harbor_tasks import _task

    from air.tasks.harbor.loader import survey

    root = tmp_path / "dataset"
    toml = '[environment]\nworkdir = "/app"\n[verifier]\nenvironment_mode = "separate"\n'
    _task(root, "none", "artifacts = []\n" + toml)
    _task(root, "app", 'artifacts = ["/app"]\n' + toml)
    notes = {r.name: " ".join(r.notes) for r in survey(root)}
    assert "a copy of /app" not in notes["none"] and "on none of the agent's files" in notes["none"], notes
    assert "on a copy of /app" in notes["app"], notes


def test_a_failed_builds_line_keeps_the_cause_at_the_end_of_its_output():
    from air.images.dockerfile import _failed

    cause = "urllib.error.URLError: <urlopen error [Errno 101] Network is unreachable>"
    tail = ["Traceback (most recent call last):"] + [f'  File "/usr/lib/python3.11/urllib/request.py", line {n}, '
                                                      "in do_open" for n in range(1300, 1310)] + [cause]
    line = _failed("harbor:t", 2, 3, "RUN python3 fetch.py", "exit code 1", tail, (False, "--offline"))
    assert cause in line and "\n" not in line and len(line) < 400, line


# ----- what is printed means what is paid ------------------------------------------------------------------------
@pytest.mark.docker
def test_air_run_shows_each_validate_as_paid_and_a_curve_the_rewards_telescope(images, tmp_path, run_id):
    """prisoners-dilemma is drawn per evaluation: a raw score is paid against its own draw's baseline, so the raw
    curve (2.61 -> 1.93 -> 2.68 -> 2.73) does not say what was paid; the normalised one does."""
    import re

    proc = air("run", "--out", "runs", cwd=tmp_path, timeout=900, env={"AIR_RUN_ID": run_id})
    assert proc.returncode == 0, proc.stderr
    turns = [line for line in proc.stdout.splitlines() if line.startswith("turn ")]
    validated = [line for line in turns if " validate " in line or " submit " in line]
    assert validated and all("against its draw's baseline" in line for line in validated), proc.stdout
    (curve,) = [line for line in proc.stdout.splitlines() if line.startswith("normalised score curve")]
    points = [float(x) for x in re.findall(r"[+-]\d+\.\d{4}", curve.split(":", 1)[1])]
    shown = [float(re.search(r", ([+-]\d+\.\d{4}) against", line).group(1)) for line in validated]
    assert points == shown
    rewards = [float(re.search(r"reward ([+-]\d+\.\d{4})", line).group(1)) for line in turns]
    assert sum(rewards) == pytest.approx(points[-1], abs=1e-3)  # delta rewards telescope to the last point


# ----- progress a log can read ---------------------------------------------------------------------------------------
@pytest.mark.docker
def test_eval_in_a_log_says_each_finished_rollout(images, tmp_path, run_id):
    proc = air("eval", "prisoners-dilemma", "-n", "2", "-c", "2", "--out", "run", cwd=tmp_path, timeout=900,
               env={"AIR_RUN_ID": run_id})  # stdout: a pipe
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "played by the scripted policy" in lines[0]
    done = [line for line in lines if line.startswith("rollout ") and " done: prisoners-dilemma #" in line]
    assert [line.split(" done")[0] for line in done] == ["rollout 1/2", "rollout 2/2"], proc.stdout
    assert all(" ok, return " in line for line in done), done


@pytest.mark.docker
def test_audit_in_a_log_says_each_stage_and_each_finished_hack(images, tmp_path, run_id):
    proc = air("tasks", "audit", "prisoners-dilemma", "--hack", "read-answers", "--hack", "trivial-outputs",
               cwd=tmp_path, timeout=900, env={"AIR_RUN_ID": run_id})
    assert proc.returncode in (0, 1), proc.stderr
    assert "prisoners-dilemma: 2 hacks: playing" in proc.stdout, proc.stdout
    import re

    heard = [re.match(r"prisoners-dilemma: hack (\d)/2 ([a-z-]+) \(", line) for line in proc.stdout.splitlines()]
    heard = [m.groups() for m in heard if m]
    assert sorted(n for n, _ in heard) == ["1", "2"], proc.stdout
    assert {name for _, name in heard} == {"read-answers", "trivial-outputs"}, proc.stdout


@pytest.mark.docker
def test_tasks_check_in_a_log_says_each_step_as_it_starts(images, tmp_path, run_id):
    proc = air("tasks", "check", "prisoners-dilemma", "--runs", "1", cwd=tmp_path, timeout=900,
               env={"AIR_RUN_ID": run_id})
    steps = [line for line in proc.stdout.splitlines() if line.startswith("prisoners-dilemma: ")]
    assert steps, proc.stdout + proc.stderr


# ----- tests that hold on a busy machine -----------------------------------------------------------------------------
def test_every_container_listing_of_the_tests_tolerates_a_container_removed_meanwhile():
    """docker-py's containers.list inspects each container it listed: one removed in between (another run's, or this
    run's pool ending it) was a 404 that failed the test (test_env_server on a loaded machine). Every listing in the
    tests passes ignore_removed=True (or sparse=True, which inspects nothing)."""
    import ast

    bare = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "list" \
                    and ast.unparse(node.func.value).endswith("containers"):
                given = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if given.get("ignore_removed") != "True" and given.get("sparse") != "True":
                    bare.append(f"{path.name}:{node.lineno}")
    assert not bare, bare


@pytest.mark.parametrize("make, says", [(_fifo, "is a FIFO"), (_zero, "/dev/zero")], ids=["fifo", "dev-zero"])
def test_a_harbor_task_toml_that_is_not_a_regular_file_is_listed_as_not_loading_at_once(tmp_path, make, says):
    root = _harbor(tmp_path)
    (root / "odd").mkdir()
    make(root / "odd" / "task.toml")
    proc = air("tasks", "list", "--harbor-root", str(root), "--json", cwd=tmp_path, timeout=60)
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert not rows["odd"]["loads"] and says in rows["odd"]["reason"] and rows["fine"]["loads"], rows
