"""Issue 83, the audit by what a test trusts: six task flaws `air tasks audit` exited 0 on while the hack paid, each a
fixture of tests/fixtures/harbor-trusts whose hack pays on plain Docker (the task's image, the hack's script as root,
the test as root: Harbor's verifier, no air), which the audit now flags, naming the hack that paid, and each with a
control, the same task made safe, that the same audit does not flag (the flag is no false alarm):

- a compiled cache the test loads after it put the module's source back (`restores-source`: the watch's proof wrote
  the payload where the test overwrites it; now the cache beside it is the agent's payload too) -- control: the test
  keeps its caches under a prefix of its own;
- a file the agent's run wrote that the test reads as its result (`trusts-run-output`: results.json's accuracy) --
  control: a test that scores the predictions the agent's run wrote against hidden labels;
- an optional import (`optional-import`: `try: import fast_check`, which the seal serves and the oracle never writes)
  -- control: the same test run from /tests, where the workspace is on no path;
- a shared library loaded through ctypes in an image without a C compiler (`loads-library`: the watch saw it, and its
  library was never built) -- control: the library loaded as the agent's uid;
- code the test runs that the oracle never writes (`runs-unwritten`: an oracle that does not solve) -- control: a
  test that runs the program as the agent's uid (harbor-watched/runs-as-agent);
- git's configuration and hooks a test's git runs (`git-status`) -- control: git run as the agent's uid.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from air.audit.hacks import BUNDLED, Hack, load_hacks
from air.audit.runner import _command, _variables, audit_task
from air.audit.trusts import named_files, named_in_tests, optional_imports, run_outputs
from air.audit.watch import NAME, HandOff, candidate_hacks, hack_of
from air.images.dockerfile import IMAGE_WORKSPACE
from air.sandbox import WORKSPACE
from air.tasks.harbor.loader import image_workdir
from air.tasks.registry import load_task
from air.tasks.task_images import build_task_image

FIXTURES = Path(__file__).parent / "fixtures"
TRUSTS = FIXTURES / "harbor-trusts"
AS_AGENT = 'setpriv --reuid="$AIR_AGENT_UID" --regid="$AIR_AGENT_UID" --clear-groups --no-new-privs'


def _agent_loads_library(root: Path) -> Path:
    """loads-library, its library loaded as the agent's uid (a copy of it, where the agent can read it)."""
    shutil.copytree(TRUSTS / "loads-library", root / "loads-library-safe")
    test = root / "loads-library-safe" / "tests" / "test.sh"
    test.write_text("#!/bin/bash\nmkdir -p /logs/verifier\n"
                    f"cp /tests/check.py /tmp/check.py && chmod 644 /tmp/check.py\n"
                    f"{AS_AGENT} python3 /tmp/check.py > /tmp/out 2>/dev/null\n"
                    f"{AS_AGENT} bash -c 'kill -9 -1' 2>/dev/null\n"
                    "cat /tmp/out > /logs/verifier/reward.txt\n")
    toml = root / "loads-library-safe" / "task.toml"
    toml.write_text(toml.read_text().replace("trusts/loads-library", "trusts/loads-library-safe"))
    return root / "loads-library-safe"


CASES = {  # the weak fixture -> (what pays, the hacks of the catalogue played, the control)
    "restores-source": (NAME, [], lambda root: TRUSTS / "restores-source-safe"),
    "trusts-run-output": ("run-outputs-1", [], lambda root: TRUSTS / "scores-predictions"),
    "optional-import": ("optional-imports", [], lambda root: TRUSTS / "optional-import-safe"),
    "loads-library": (f"{NAME}-read-1", [], _agent_loads_library),
    "runs-unwritten": ("named-in-tests", ["submission-plants"], lambda root: FIXTURES / "harbor-watched" /
                       "runs-as-agent"),
    "git-status": ("git-hooks", ["git-hooks"], lambda root: TRUSTS / "git-status-safe"),
}


def spec_at(folder: Path):
    return load_task(f"harbor:{folder.name}", harbor_root=folder.parent)


async def audited(folder: Path, pool, catalogue: list[str]):
    spec = spec_at(folder)
    build_task_image(spec)
    hacks = [h for h in load_hacks() if h.name in catalogue]
    return await audit_task(spec, pool, hacks, workdir=image_workdir(spec), task_root=folder, concurrency=2)


@pytest.mark.docker
@pytest.mark.parametrize("name", list(CASES))
async def test_the_audit_flags_what_the_test_trusts_and_not_its_safe_twin(name, pool, images, tmp_path):
    pays, catalogue, control = CASES[name]
    audit = await audited(TRUSTS / name, pool, catalogue)
    status = {r.name: r.status for r in audit.results}
    assert audit.do_nothing == 0.0, audit.do_nothing
    assert status.get(pays) == "paid", (status, audit.watch, audit.hand_offs)
    paid = next(r for r in audit.results if r.name == pays)
    assert paid.score == 1.0 and paid.blame and not any("air's own scoring" in b for b in paid.blame), paid.blame
    # The control: the same test made safe pays nothing, whatever hack of these is played.
    twin = await audited(control(tmp_path), pool, catalogue)
    assert not twin.paid, [(r.name, r.status, r.score) for r in twin.results if r.status == "paid"]
    assert twin.do_nothing == 0.0


def _trust_hack(name: str, folder: Path) -> Hack:
    """The hack that pays on `name`, made as the audit makes it (from what the watch would see, where it is the
    watch's), to play on plain Docker."""
    if name == "restores-source":
        return hack_of([HandOff(file="helper.py", how="imported", lang="python", by="python3 -c", blame="")], [])
    if name == "trusts-run-output":
        return run_outputs([HandOff(file="results.json", how="read", lang="python", by="python3 -c", blame="")], [],
                           ["app/results.json", "accuracy"])[0]
    if name == "optional-import":
        return optional_imports(folder)
    if name == "loads-library":
        return candidate_hacks([HandOff(file="libanswer.so", how="read", lang="so", by="python3", blame="")], [])[0][0]
    if name == "runs-unwritten":
        return named_in_tests(folder, "/app")
    return next(h for h in load_hacks() if h.name == "git-hooks")


@pytest.mark.docker
@pytest.mark.parametrize("name", list(CASES))
def test_each_hack_pays_on_plain_docker(name, images, docker_client):
    """The channel is real outside air: the task's image in a plain container, its workspace as it starts, the
    hack's script as root (Harbor's agent), then the task's test as root: the reward Harbor reads is 1. Without the
    hack, 0."""
    folder = TRUSTS / name
    spec = spec_at(folder)
    build_task_image(spec, docker_client)
    variables = _variables(spec, image_workdir(spec), folder)
    script = _trust_hack(name, folder).script
    assert played_on_plain_docker(docker_client, spec, folder, script, variables) == "1"
    assert played_on_plain_docker(docker_client, spec, folder, "true", variables) == "0"


def played_on_plain_docker(docker_client, spec, folder: Path, script: str, variables: dict[str, str]) -> str:
    workdir = image_workdir(spec) or WORKSPACE
    program = (f"mkdir -p {WORKSPACE} && cp -a {IMAGE_WORKSPACE}/. {WORKSPACE}/\n"
               "rm -rf /tests /logs && ln -s /mnt/tests /tests && mkdir -p /logs/verifier\n"
               f"(cd {WORKSPACE} && bash -c {shlex.quote(_command(script, variables))}) > /dev/null 2>&1\n"
               f"cd {workdir} && bash /tests/test.sh > /dev/null 2>&1\n"
               "sleep 0.2\n"
               # as Harbor reads it, reward.json first; a racing payload may be rewriting it: read until whole
               "for _ in 1 2 3 4 5 6 7 8 9 10; do\n"
               "  if [ -f /logs/verifier/reward.json ]; then\n"
               "    python3 -c 'import json; print(json.load(open(\"/logs/verifier/reward.json\"))[\"reward\"])' "
               "2>/dev/null && break\n"
               "  else cat /logs/verifier/reward.txt; break; fi\n"
               "done\n")
    tests = {str(folder / "tests"): {"bind": "/mnt/tests", "mode": "ro"}}
    out = docker_client.containers.run(spec.verifier_image or spec.image, ["bash", "-c", program], remove=True,
                                       network_mode="none", user="root", volumes=tests,
                                       labels={"air.role": "test-control"}).decode()
    return out.strip().splitlines()[-1].strip() if out.strip() else ""


def test_the_files_a_test_names_are_found_in_its_lines():
    named = {rel: kind for rel, kind, _ in named_files(TRUSTS / "runs-unwritten", "/app")}
    assert named == {"solve.py": "python"}, named
    named = {rel: kind for rel, kind, _ in named_files(TRUSTS / "trusts-run-output", "/app")}
    assert named == {}, named  # results.json is data: run-outputs forges it
    named = {rel: kind for rel, kind, _ in named_files(FIXTURES / "harbor-watched" / "runs-script", "/app")}
    assert named == {"run.sh": "sh"}, named
    optional = optional_imports(TRUSTS / "optional-import")
    assert "if [ ! -e fast_check.py ] && [ ! -e fast_check ]; then" in optional.script
    assert any(b.startswith("tests/test_outputs.py:2:") for b in optional.watched), optional.watched
    assert optional_imports(TRUSTS / "runs-unwritten") is None
    assert (BUNDLED / "git-hooks.toml").is_file()
