"""Harbor task folders as air reads them, without Docker: what maps onto air's spec, what is said as a note, and what
stops a task in one line (never an exception out of `air tasks list`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from air.errors import TaskError, UsageError
from air.images.dockerfile import IMAGE_WORKSPACE, air_layer, workdir_problem
from air.sandbox.layout import BASE_PATH
from air.tasks.harbor.loader import survey, task_dirs
from air.tasks.registry import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"


def copy_task(tmp_path: Path, name: str = "hello-pass") -> Path:
    root = tmp_path / "dataset"
    shutil.copytree(FIXTURES / name, root / name)
    return root


def test_the_fixture_dataset_lists_every_task_and_why_one_cannot_load():
    rows = {r.name: r for r in survey(FIXTURES)}
    assert set(rows) == {"hello-pass", "hello-fail", "multi-metric", "broken-toml", "needs-network"}
    assert not rows["broken-toml"].loads and "TOML syntax error" in rows["broken-toml"].reason
    assert all(rows[n].loads for n in ("hello-pass", "hello-fail", "multi-metric", "needs-network"))
    assert rows["hello-fail"].notes == [
        "it asks for the network for its agent; air gives none",
        "its verifier asks for the network (public); air scores offline (what its test installs is put in its "
        "scoring image)",
        "its agent runs as 'root' in Harbor; in air, as air's unprivileged agent"]


def test_limits_timeouts_and_variables_map_onto_airs_spec():
    spec = load_task("harbor:multi-metric", harbor_root=FIXTURES)
    assert (spec.id, spec.source, spec.name) == ("multi-metric", "harbor:multi-metric", "fixtures/multi-metric")
    assert spec.evaluation.contract == "harbor" and spec.evaluation.timeout == 120
    assert spec.evaluation.env == {"POSITIVE_LABEL": "1"}
    assert (spec.timeouts.episode, spec.timeouts.training, spec.timeouts.command) == (900, 900, 60)
    assert (spec.resources.cpus, spec.resources.memory_mb, spec.resources.gpus) == (1.0, 1536, 0)
    # The Dockerfile's ENV, as the agent's shell needs it: PATH extended from air's own.
    assert spec.env == {"FIXTURE_MODE": "harbor", "PATH": f"/opt/fixture/bin:{BASE_PATH}"}
    assert spec.primary.name == "reward" and spec.baseline_score == 0.0 and spec.reward_scale == 1.0
    assert spec.image_workspace == IMAGE_WORKSPACE and spec.image.startswith("air/harbor-multi-metric:")
    # tests/ go to the scorer only; nothing of the task is a starter file.
    assert [e.dest for e in spec.evaluation_files] == ["tests"] and not spec.starter and not spec.data
    assert spec.description.startswith("`/app/features.csv`") and "/app is your workspace" in spec.description
    legacy = load_task("harbor:hello-fail", harbor_root=FIXTURES)
    assert legacy.resources.memory_mb == 1024  # Harbor's deprecated memory = "1G"
    assert load_task("harbor:hello-pass", harbor_root=FIXTURES).resources.workspace_mb == 512  # storage_mb


def test_the_image_tag_follows_the_environment_folder(tmp_path):
    root = copy_task(tmp_path)
    before = load_task("harbor:hello-pass", harbor_root=root)
    assert before.image == load_task("harbor:hello-pass", harbor_root=FIXTURES).image
    (root / "hello-pass" / "environment" / "greeting.txt").write_text("hi\n")
    after = load_task("harbor:hello-pass", harbor_root=root)
    assert after.image != before.image and after.content_hash != before.content_hash


def _task(root: Path, name: str, toml: str, *, dockerfile: str | None = "FROM air/cpu:latest\n",
          files: dict[str, str] | None = None) -> None:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if dockerfile is not None:
        (folder / "environment").mkdir()
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


CANNOT = {
    "multi-step": ('[[steps]]\nname = "one"\n', {}, "multi-step task"),
    "windows": ('[environment]\nos = "windows"\n', {}, "targets windows containers"),
    "tpu": ('[environment.tpu]\ntype = "v6e"\ntopology = "2x2"\n', {}, "asks for a TPU"),
    "compose": ("", {"environment/docker-compose.yaml": "services:\n  db:\n    image: x\n    volumes: [a:/b]\n"},
                # a key air does not take (tests/test_harbor_compose.py has the rest)
                "docker-compose.yaml: field 'services.db.volumes': Extra inputs are not permitted"),
    "compose-empty": ("", {"environment/docker-compose.yaml": "services: {}\n"}, "names no service besides main"),
    "mcp": ('[[environment.mcp_servers]]\nname = "s"\nurl = "http://x"\n', {}, "MCP servers"),
    "collect": ('[[verifier.collect]]\ncommand = "true"\nservice = "db"\n', {},
                "collects from services its compose file does not run (db)"),
    "artifact-relative": ('artifacts = [{ source = "rows.txt", service = "db" }]\n', {}, "is not an absolute path"),
    "artifact-escapes": ('artifacts = [{ source = "/x", destination = "../../tests/x" }]\n', {},
                         "is not a relative path inside /logs/artifacts"),
    "verifier-compose": ('[verifier]\nenvironment_mode = "separate"\n',
                         {"tests/docker-compose.yaml": "services:\n  main:\n    cap_add: [SYS_ADMIN]\n"},
                         "separate verifier has a compose environment of its own (tests/docker-compose.yaml)"),
    "system-workdir": ('[environment]\nworkdir = "/usr"\n', {}, "working directory /usr is a system directory"),
    "bad-type": ('[verifier]\ntimeout_sec = "soon"\n', {}, "timeout_sec"),
}


@pytest.mark.parametrize("name", sorted(CANNOT))
def test_what_air_cannot_honour_is_one_line_per_task(tmp_path, name):
    toml, files, said = CANNOT[name]
    root = tmp_path / "dataset"
    _task(root, name, toml, files=files)
    _task(root, "fine", "")  # beside it, a task that loads
    with pytest.raises(TaskError) as caught:
        load_task(f"harbor:{name}", harbor_root=root)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    rows = {r.name: r for r in survey(root)}
    assert rows[name].reason == str(caught.value) and rows["fine"].loads


def test_a_task_without_tests_instruction_or_environment_cannot_load(tmp_path):
    root = tmp_path / "dataset"
    _task(root, "bare", "", dockerfile=None)
    (root / "bare" / "tests" / "test.sh").unlink()
    (root / "bare" / "instruction.md").unlink()
    message = str(pytest.raises(TaskError, load_task, "harbor:bare", harbor_root=root).value)
    for part in ("neither environment/Dockerfile nor [environment].docker_image", "no instruction.md",
                 "no tests/test.sh"):
        assert part in message


def test_a_prebuilt_image_and_unknown_keys_load_with_notes(tmp_path, caplog):
    root = tmp_path / "dataset"
    _task(root, "prebuilt", '[environment]\ndocker_image = "air/cpu:latest"\nshiny = 1\n[frobnicate]\nx = 1\n',
          dockerfile=None)
    spec = load_task("harbor:prebuilt", harbor_root=root)
    assert spec.build.dockerfile is None and spec.build.base == "air/cpu:latest"
    notes = [r.getMessage() for r in caplog.records]
    assert any("unknown key frobnicate" in n for n in notes) and any("environment.shiny" in n for n in notes)


def test_names_refs_and_roots(tmp_path):
    with pytest.raises(UsageError, match="--harbor-root or \\$HARBOR_ROOT"):
        load_task("harbor:hello-pass")
    with pytest.raises(UsageError, match="is not a directory"):
        load_task("harbor:hello-pass", harbor_root=tmp_path / "nowhere")
    with pytest.raises(TaskError):
        load_task("harbor:../harbor/hello-pass", harbor_root=FIXTURES / "hello-pass")
    with pytest.raises(TaskError, match="no such file"):
        load_task("harbor:absent", harbor_root=FIXTURES)
    assert task_dirs(FIXTURES) == ["broken-toml", "hello-fail", "hello-pass", "multi-metric", "needs-network"]


def test_airs_layer_moves_the_workdir_into_the_workspace_and_refuses_system_dirs():
    layer = air_layer("sha256:x", "/app")
    assert f"cp -a /app/. {IMAGE_WORKSPACE}/" in layer and "ln -sfn /home/agent/workspace /app" in layer
    assert "ln -s /srv/air/harbor/tests /tests" in layer and "ln -s /srv/air/harbor/logs /logs" in layer
    assert workdir_problem("/app") is None and workdir_problem("/") is None
    for bad in ("/usr", "/srv/air/x", "/home/agent/elsewhere", "relative"):
        assert workdir_problem(bad)


def test_the_list_command_says_it_per_task():
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "list", "--harbor-root", str(FIXTURES),
                           "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["broken-toml"]["loads"] is False and rows["multi-metric"]["loads"] is True


OLD_FIELDS = {"id", "name", "version", "description", "image", "source", "starter", "data", "secret",
              "evaluation_files", "baseline_files", "evaluation", "baseline", "metrics", "timeouts", "resources",
              "needs", "reward_scale", "hidden", "leaks"}
"""TaskSpec's fields before Harbor's joined (action_format is left out at "text" since it joined)."""


def test_specs_of_airs_own_tasks_hash_what_they_hashed_before():
    """Fields that joined the spec for Harbor tasks are left out of the hash at their defaults: a recorded
    trajectory of a bundled or MLGym task replays without drift."""
    spec = load_task("regression-rmse", draw="reference")
    hashed = json.loads(spec.model_dump_json(exclude=spec._later_defaults()))
    assert set(hashed) == OLD_FIELDS
    assert set(hashed["timeouts"]) == {"command", "training"}
    assert set(hashed["resources"]) == {"cpus", "memory_mb", "gpus"}
    assert "env" not in hashed["evaluation"]
    harbor = load_task("harbor:multi-metric", harbor_root=FIXTURES)
    assert {"build", "image_workspace", "env"} <= set(json.loads(harbor.model_dump_json(
        exclude=harbor._later_defaults())))


def test_a_failed_oracle_is_refused_by_the_taskset_and_the_served_protocols(tmp_path, monkeypatch):
    """Only `air tasks check` writes the oracle's record; a failed one stops the task items every driver is made of
    (verifiers taskset, AgentGym, OpenEnv) in one line, unless the user opts in. A task never checked runs."""
    from air.episode.settings import task_items
    from air.services.episodes import ServiceConfig
    from air.tasks.harbor.oracle import keep, state

    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path / "cache"))
    root = copy_task(tmp_path)
    spec = load_task("harbor:hello-pass", harbor_root=root)
    assert state(spec) == "not checked" and task_items(["harbor:hello-pass"], 1, harbor_root=str(root))
    keep(spec, False, 0.0, "reward 0, not 1")
    assert state(spec) == "failed"
    with pytest.raises(TaskError, match=r"harbor:hello-pass: its oracle .* failed `air tasks check` \(reward 0"):
        task_items(["harbor:hello-pass"], 1, harbor_root=str(root))
    assert task_items(["harbor:hello-pass"], 2, harbor_root=str(root), allow_failed_oracle=True)[1].example == 1
    assert ServiceConfig(allow_failed_oracle=True).allow_failed_oracle
    keep(spec, True, 1.0, "reward 1")
    assert state(spec) == "passed" and task_items(["harbor:hello-pass"], 1, harbor_root=str(root))


def test_a_separate_verifier_gets_its_own_image_as_harbor_resolves_it(tmp_path):
    """Harbor 0.25: `environment_mode` when given, else separate exactly when [verifier.environment] is; the image
    is [verifier.environment].docker_image, else tests/Dockerfile's (tests/ its context), else a fresh copy of the
    agent's (tests/test_cli_round_six.py: the docker_image before a tests/Dockerfile). The agent's working
    directory is linked to the workspace in the verifier's image too."""
    root = tmp_path / "dataset"
    docker = "FROM air/cpu:latest\nWORKDIR /app\n"
    _task(root, "own-dockerfile", '[verifier]\nenvironment_mode = "separate"\n', dockerfile=docker,
          files={"tests/Dockerfile": "FROM air/cpu:latest\n"})
    _task(root, "prebuilt", '[verifier.environment]\ndocker_image = "judge:1"\n', dockerfile=docker)
    _task(root, "fresh-copy", '[verifier]\nenvironment_mode = "separate"\n', dockerfile=docker)
    _task(root, "shared", '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
          dockerfile=docker, files={"tests/Dockerfile": "FROM air/cpu:latest\n"})
    own = load_task("harbor:own-dockerfile", harbor_root=root)
    assert own.verifier_image.startswith("air/harbor-own-dockerfile-verifier:") and own.verifier_image != own.image
    assert own.verifier_build.context == root / "own-dockerfile" / "tests" and own.verifier_build.workdir == "/app"
    prebuilt = load_task("harbor:prebuilt", harbor_root=root)
    assert prebuilt.verifier_build.base == "judge:1" and prebuilt.verifier_build.dockerfile is None
    for name in ("fresh-copy", "shared"):
        spec = load_task(f"harbor:{name}", harbor_root=root)
        assert spec.verifier_image is None and spec.verifier_build is None
    notes = {r.name: r.notes for r in survey(root)}
    assert any("its verifier runs apart from the agent, in its own image" in n for n in notes["own-dockerfile"])
    assert not any("verifier runs apart" in n for n in notes["shared"])


def test_builds_have_the_network_where_the_host_has_a_default_route(tmp_path, monkeypatch):
    from air.images.dockerfile import build_network

    header = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
    routed, local = tmp_path / "routed", tmp_path / "local"
    routed.write_text(header + "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
    local.write_text(header + "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")
    monkeypatch.delenv("AIR_OFFLINE", raising=False)
    assert build_network(str(routed)) == (True, "the host has a default route")
    assert build_network(str(local))[0] is False and "no default route" in build_network(str(local))[1]
    for off in ("1", "yes", "true"):
        monkeypatch.setenv("AIR_OFFLINE", off)
        assert build_network(str(routed)) == (False, f"AIR_OFFLINE={off} (--offline)")
    monkeypatch.setenv("AIR_OFFLINE", "0")
    assert build_network(str(routed))[0] is True


TB2_TEST_SH = """#!/bin/bash
# Install curl
apt-get update
apt-get install -y curl
# Install uv
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  -w pytest-json-ctrf==0.3.5 \\
  pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
"""


def test_what_a_test_installs_at_verify_time_is_read_from_its_script():
    from air.tasks.harbor.installs import read_installs

    tb2 = read_installs(TB2_TEST_SH)
    assert tb2.uv and tb2.python == "3.13" and tb2.apt_packages == ["curl"]
    assert tb2.uv_packages == ["pytest==8.4.1", "pytest-json-ctrf==0.3.5", "pytest"]
    old = read_installs("uv init\nuv add pytest==8.4.1\nuv add requests==2.32.4\nuv run pytest /tests/x.py -rA\n")
    assert old.uv and old.uv_packages == ["pytest==8.4.1", "requests==2.32.4"]
    pip = read_installs("pip3 install --break-system-packages \\\n  pytest==8.4.1 pandas==2.2.3\n"
                        "python3 -m pip install -q numpy\napt-get update && apt-get install -y python3-pip jq\n")
    assert pip.pip_packages == ["pytest==8.4.1", "pandas==2.2.3", "numpy"] and not pip.uv
    assert pip.apt_packages == ["python3-pip", "jq"]
    assert not read_installs("#!/bin/bash\n# uvx pytest would install\npython3 /tests/check.py\n").any
    assert read_installs("uvx --with=pytest==8.4.1 --from ruff==0.5.0 ruff check\n").uv_packages == [
        "pytest==8.4.1", "ruff==0.5.0"]



@pytest.mark.parametrize("line", [
    "pip install pytest 2>&1", "pip install pytest >/dev/null", "pip install pytest 2>/dev/null",
    "pip install pytest &> /dev/null", "pip install pytest | tee x", "pip install pytest > log 2>&1",
    "pip install pytest 2> err.txt", "pip install pytest |& tee log", "pip install pytest 2>&1|tee x",
    "(cd /app && pip install pytest)>log", "pip3 install -q pytest &>>log; apt-get install -y jq 2>&1 >/dev/null",
])
def test_a_redirection_names_no_package(line):
    """A redirection or a pipe after an install (`2>&1`, `> log`, `| tee x`) is the shell's, not a package: it was
    staged as one, and pip could not download a package named `2>&1` (the scoring image was not built)."""
    from air.tasks.harbor.installs import read_installs

    found = read_installs(line)
    assert found.pip_packages == ["pytest"], found
    assert found.apt_packages == (["jq"] if "jq" in line else []), found


def test_each_phases_network_policy_is_read(tmp_path):
    """Harbor 0.25's per-phase policies: [agent]/[verifier].network_mode over [environment]'s; air gives neither
    phase the network, and says so per phase."""
    root = tmp_path / "dataset"
    _task(root, "verifier-only", '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "allowlist"\n'
                                 'allowed_hosts = ["pypi.org", "files.pythonhosted.org"]\n')
    _task(root, "none", '[environment]\nnetwork_mode = "no-network"\n')
    notes = {r.name: r.notes for r in survey(root)}
    assert notes["verifier-only"] == ["its verifier asks for the network (allowlist: pypi.org, files.pythonhosted.org);"
                                      " air scores offline (what its test installs is put in its scoring image)"]
    assert notes["none"] == []


def test_a_copy_of_several_sources_into_the_working_directory_is_built_as_buildkit_reads_it(tmp_path):
    """`COPY a b .` (harbor-cookbook's simulated-user) is BuildKit's and the legacy builder refuses it: air's build
    gets `./`; nothing else of the file changes (a one-source copy, an exec form, a RUN)."""
    from air.images.dockerfile import _as_buildkit_reads

    path = tmp_path / "Dockerfile"
    path.write_text("FROM x\nCOPY server.py persona.md .\nADD --chown=1:1 a b ..\nCOPY a ./x\n"
                    'COPY ["a", "b", "."]\nRUN cp a b .\n')
    assert _as_buildkit_reads(path) == ("FROM x\nCOPY server.py persona.md ./\nADD --chown=1:1 a b ../\nCOPY a ./x\n"
                                        'COPY ["a", "b", "."]\nRUN cp a b .\n')
    path.write_text("FROM x\nCOPY a ./\nCOPY a b ./\n")
    assert _as_buildkit_reads(path) is None  # as written: built from the folder itself


def test_a_shared_verifier_ignores_a_compose_file_among_its_tests(tmp_path):
    """Control of the refusal above: in shared mode (the verifier runs where the agent did) Harbor builds no verifier
    environment, and a tests/docker-compose.yaml is only a file of the tests: the task loads."""
    root = tmp_path / "dataset"
    _task(root, "shared", "", files={"tests/docker-compose.yaml": "services:\n  main:\n    cap_add: [SYS_ADMIN]\n"})
    assert load_task("harbor:shared", harbor_root=root).source == "harbor:shared"
