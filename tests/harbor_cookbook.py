"""harbor-cookbook's recipes (the public repository harbor-framework/harbor-cookbook), run by air's tests as they are
written, on a machine that cannot pull their base images.

The checkout is never part of air: a test finds it at $HARBOR_COOKBOOK (default /work/ext/harbor-cookbook) and
skips, saying so, where it is not there. What this machine cannot do, and what stands in for it, each said here:
- `ubuntu:24.04` and `python:3.12-slim` cannot be pulled (no registry): stand-ins under those names are built
  offline from air/base (Debian bookworm, Python 3.11, `python`, `pip` and its apt sources) with the Python
  packages the recipes' own download lines would fetch already installed, staged by the host's pip as air stages
  its images' wheels: `mcp<2` in ubuntu:24.04 (what mcp-tools' oracle gets from `uv run --with mcp`: the recipe
  was written against mcp 1, whose `streamablehttp_client` mcp 2 no longer has); flask, fastmcp and anthropic in
  python:3.12-slim, so the services' `RUN pip install ...` lines run unchanged and find them installed.
  A stand-in is made only where no image of that name is on the daemon, and carries the label STANDIN; a real
  image of that name is used as it is.
- The recipes' files are copied unchanged except EDITS (download lines alone); their compose files, task.toml,
  test.sh and test_outputs.py never: air's scoring image installs what test.sh installs at verify time
  (air/tasks/harbor/installs.py), and the main Dockerfiles' `apt-get install` runs with the build's network.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

COOKBOOK = Path(os.environ.get("HARBOR_COOKBOOK", "/work/ext/harbor-cookbook"))
RECIPES = COOKBOOK / "harbor_cookbook" / "recipes"
STANDIN = "air.test-standin"
"""Label on a stand-in base image (its value: what it stands in for)."""

STANDINS = {
    "ubuntu:24.04": ["mcp<2"],
    "python:3.12-slim": ["flask", "fastmcp", "anthropic"],
}

EDITS: dict[str, list[tuple[str, str, str]]] = {
    # (file, text as the recipe has it, as air's test runs it): uv's image and `uv run`'s resolution of the
    # script's inline dependencies download (fastmcp, and a Python >= 3.12 the stand-in has not).
    "mcp-tools": [
        ("environment/mcp-server/Dockerfile", "COPY --from=ghcr.io/astral-sh/uv:latest /uv /uvx /bin/\n", ""),
        ("environment/mcp-server/Dockerfile", 'CMD ["uv", "run", "server.py"]', 'CMD ["python", "server.py"]'),
        ("solution/solve.sh", "curl -LsSf https://astral.sh/uv/install.sh | sh\nsource $HOME/.local/bin/env\n", ""),
        ("solution/solve.sh", "uv run --with mcp python3 << 'EOF'", "python3 << 'EOF'"),
    ],
}


def recipes_or_skip() -> Path:
    if not (RECIPES / "multi-container" / "task.toml").is_file():
        pytest.skip(f"no harbor-cookbook checkout at {COOKBOOK} (set HARBOR_COOKBOOK to one: git clone "
                    "https://github.com/harbor-framework/harbor-cookbook)")
    return RECIPES


def copy_recipes(names: list[str], dest: Path) -> Path:
    """The recipes, as a dataset folder under `dest`, with EDITS applied (each must match: a recipe that changed
    upstream fails here, naming the line)."""
    root = recipes_or_skip()
    for name in names:
        shutil.copytree(root / name, dest / name)
        for file, old, new in EDITS.get(name, []):
            path = dest / name / file
            text = path.read_text()
            assert old in text, f"{name}/{file} no longer has {old!r}: update tests/harbor_cookbook.py EDITS"
            path.write_text(text.replace(old, new))
    return dest


def ensure_standins(client) -> None:
    """Make each stand-in base image that the daemon lacks."""
    import docker.errors

    from air.images import ImageBuilder
    from air.images.dockerfile import TASK_IMAGE_LABELS
    from air.images.recipes import Recipe

    builder = ImageBuilder(client)
    for name, packages in STANDINS.items():
        try:
            client.images.get(name)
            continue  # a real one, or a stand-in made before
        except docker.errors.ImageNotFound:
            pass
        slug = name.replace(":", "-")
        with tempfile.TemporaryDirectory(prefix=f"air-standin-{slug}-") as tmp:
            context = Path(tmp)
            recipe = Recipe(name=f"test-standin-{slug}", folder=context, requirements=packages)
            wheels, _ = builder.stage_wheels(recipe)
            shutil.copytree(wheels, context / "wheels")
            (context / "Dockerfile").write_text(
                "FROM air/base:latest\nCOPY wheels /tmp/wheels\n"
                "RUN pip install --no-index --no-cache-dir --find-links /tmp/wheels -r /tmp/wheels/requirements.txt"
                " && rm -rf /tmp/wheels\n")
            repository, tag = name.split(":")
            # Not air/base's recipe labels (which it would inherit): the recipe builder finds its builds by them.
            image, _ = client.images.build(path=str(context), tag=name, network_mode="none", rm=True,
                                           labels={**TASK_IMAGE_LABELS, STANDIN: name, "air.role": "test-standin"})
            assert image.tags and f"{repository}:{tag}" in image.tags
