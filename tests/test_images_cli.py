"""`air images` and `air doctor` from the outside: builds are reused, bad input is one clear line, no traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker.errors
import pytest

from air import paths


def air(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    # Progress lines (plain when stderr is not a terminal) may come first; the error is one line, the last.
    errors = [line for line in lines if line.startswith("air: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    """A copy of the real recipes to break on purpose."""
    root = tmp_path / "images"
    shutil.copytree(paths.images_dir(), root)
    return root


def test_docker_unavailable_is_a_clear_error():
    env = {"DOCKER_HOST": "tcp://127.0.0.1:9"}
    proc = air("images", "ls", env=env)
    assert_one_line_error(proc, 3, "cannot reach the Docker daemon at tcp://127.0.0.1:9", "ensure-docker.sh")
    proc = air("doctor", "--json", env=env)
    assert proc.returncode == 3
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["docker daemon"]["ok"] is False and "ensure-docker.sh" in checks["docker daemon"]["fix"]


@pytest.mark.docker
def test_unknown_recipe_names_the_known_ones(images):
    assert_one_line_error(air("images", "build", "nope"), 2, "unknown image recipe 'nope'", "base", "cpu")


@pytest.mark.docker
def test_recipe_with_a_toml_syntax_error(recipes_dir, images):
    (recipes_dir / "cpu" / "recipe.toml").write_text('description = "x"\nrequirements = ["numpy",\n')
    proc = air("images", "build", "cpu", env={"AIR_IMAGES_DIR": str(recipes_dir)})
    assert_one_line_error(proc, 3, "cpu/recipe.toml", "TOML syntax error")


@pytest.mark.docker
def test_recipe_with_an_unknown_field(recipes_dir, images):
    (recipes_dir / "cpu" / "recipe.toml").write_text('parent = "base"\nrequirement = ["numpy"]\n')
    proc = air("images", "build", "cpu", env={"AIR_IMAGES_DIR": str(recipes_dir)})
    assert_one_line_error(proc, 3, "field 'requirement'", "Extra inputs are not permitted")


@pytest.mark.docker
def test_recipe_whose_dockerfile_does_not_parse(recipes_dir, images):
    bad = recipes_dir / "broken"
    bad.mkdir()
    (bad / "recipe.toml").write_text('parent = "base"\n')
    (bad / "Dockerfile").write_text("ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE}\nFORM nothing\n")
    proc = air("images", "build", "broken", env={"AIR_IMAGES_DIR": str(recipes_dir)})
    assert_one_line_error(proc, 3, "recipe 'broken' failed to build", "FORM")


@pytest.mark.docker
def test_missing_wheel_names_the_package(recipes_dir, images, tmp_path):
    bad = recipes_dir / "nowheel"
    bad.mkdir()
    (bad / "recipe.toml").write_text('parent = "base"\nrequirements = ["air-no-such-package-xyz==1.0"]\n')
    proc = air("images", "build", "nowheel",
               env={"AIR_IMAGES_DIR": str(recipes_dir), "AIR_CACHE_DIR": str(tmp_path / "cache")})
    assert_one_line_error(proc, 3, "cannot stage wheels for recipe 'nowheel'", "air-no-such-package-xyz")


@pytest.mark.docker
def test_second_build_reuses_images_and_ls_lists_them(images):
    proc = air("images", "build", "--json")
    assert proc.returncode == 0, proc.stderr
    built = {b["recipe"]: b for b in json.loads(proc.stdout)}
    assert built["cpu"]["reused"] and built["base"]["reused"]
    assert built["cpu"]["tag"] == images["cpu"].tag
    listed = json.loads(air("images", "ls", "--json").stdout)
    assert any("air/cpu:latest" in row["tags"] for row in listed)


@pytest.mark.docker
def test_cpu_image_has_the_ml_stack_and_runs_as_agent_without_network(images, docker_client):
    out = docker_client.containers.run(
        "air/cpu:latest", ["sh", "-c", "id -un; ls /sys/class/net; python -c 'import numpy, pandas, sklearn, "
                           "gymnasium; print(\"stack ok\")'"],
        user="agent", network_mode="none", init=True, remove=True)
    assert out.decode().split() == ["agent", "lo", "stack", "ok"]


@pytest.mark.docker
def test_images_ls_fits_80_columns_and_says_what_is_missing_and_what_each_image_serves(images):
    proc = air("images", "ls", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout
    rows = json.loads(air("images", "ls", "--json").stdout)
    for row in rows:
        if row.get("missing"):  # a stack built on demand (jax, hf, gpu ...): the command that builds it
            assert f"{row['recipe']} is not built: air images build {row['recipe']}" in proc.stdout
    cpu = next(r for r in rows if "air/cpu:latest" in r["tags"])
    assert "python" in cpu["sandbox_fusion_languages"]
    assert "SandboxFusion languages: air/cpu:latest serves python" in proc.stdout


def wait_until(done, what: str, proc: subprocess.Popen, patience: float = 600) -> None:
    """Poll for something observable (never a fixed sleep); fail saying what never happened."""
    deadline = time.monotonic() + patience
    while not done():
        assert proc.poll() is None, f"the build ended before {what}: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"no sign of {what} within {patience:g} s"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.docker
def test_two_builds_at_once_both_succeed_and_leave_no_dangling_stage(recipes_dir, images, docker_client):
    """Two `air images build` processes at once (two users on one daemon) while others prune: each build drops
    only its own multi-stage intermediates and never prunes (the daemon refuses a second prune at once: the build
    ended in `internal error ... 409`, exit 4)."""
    names = ["air-test-stage-slow", "air-test-stage-quick"]
    for name, pause in zip(names, (15, 0), strict=True):
        # The slow build's first stage is done (a dangling image) long before its second stage copies from it;
        # the quick build ends in between.
        (recipes_dir / name).mkdir()
        (recipes_dir / name / "recipe.toml").write_text('description = "two stages"\nparent = "base"\n'
                                                         'default = false\n')
        (recipes_dir / name / "Dockerfile").write_text(
            f"ARG PARENT_IMAGE\nFROM ${{PARENT_IMAGE}} AS stage\nRUN echo {name} > /stage.txt\n"
            f"FROM ${{PARENT_IMAGE}}\nRUN sleep {pause}\nCOPY --from=stage /stage.txt /stage.txt\n")
    env = {**os.environ, "AIR_IMAGES_DIR": str(recipes_dir)}
    # Someone else prunes images on this daemon all along (another air build used to, at its end).
    stop = threading.Event()

    def prune_all_along() -> None:
        while not stop.is_set():
            try:
                docker_client.images.prune(filters={"label": "air.test=prunes-nothing"})
            except docker.errors.APIError:
                pass

    pruner = threading.Thread(target=prune_all_along, daemon=True)
    pruner.start()
    try:
        procs = []
        for name in names:
            procs.append(subprocess.Popen([sys.executable, "-m", "air.cli.main", "images", "build", name],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
            if name == names[0]:  # the quick build starts once the slow one is in its second stage
                wait_until(lambda: any("sleep 15" in c["Command"] for c in docker_client.api.containers()),
                           "the slow build's second stage to run", procs[0])
        results = [(p.wait(600), p.stderr.read()) for p in procs]
        stop.set()
        assert all(code == 0 for code, _ in results), results
        for name in names:
            built = docker_client.images.get(f"air/{name}:latest")
            assert built.labels["air.recipe"] == name
        dangling = docker_client.images.list(filters={"dangling": True, "label": "air.recipe"})
        assert not [i.id for i in dangling if i.labels.get("air.recipe") in names]
    finally:
        stop.set()
        for image in docker_client.images.list(filters={"label": "air.recipe"}):
            if image.labels.get("air.recipe") in names:
                for tag in image.tags:
                    docker_client.images.remove(tag, force=True)


def test_a_suites_recipes_build_on_airs_and_may_not_shadow_them(tmp_path):
    """A test suite's fixture images (tests/fixtures/images) are recipes over air's own (load_recipes(also=...)): their
    parent is one of air's; a name of air's is refused, so a fixture can never take the place of air/base."""
    from air.errors import ImageError
    from air.images import build_order, load_recipes

    recipes = load_recipes(also=Path(__file__).parent / "fixtures" / "images")
    assert [r.name for r in build_order(recipes, ["harbor-tools"])] == ["base", "harbor-tools"]
    assert recipes["harbor-tools"].debs and not recipes["harbor-tools"].default
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "recipe.toml").write_text('description = "a fixture named as air\'s base"\n')
    with pytest.raises(ImageError, match="recipe 'base' is one of"):
        load_recipes(also=tmp_path)
