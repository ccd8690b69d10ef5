"""The seal by what the tests import (issue #72): every module name Python and its standard library probe for while a
Harbor test runs them, planted in the agent's workspace, runs none under air's scoring.

The names are found, not listed: the fixture's test.sh (tests/fixtures/harbor-hacks/probes-in-workdir) runs Python
as Harbor tests do -- start-up (`python3 -c`), `python3 -m pytest`, `python3 -m unittest` and a `subprocess` call in
the working directory, and with the working directory named on PYTHONPATH by the test itself, last and first -- with
an import hook (recorder/sitecustomize.py) that records every top-level name asked for and found by no finder, and
whether the workspace was on sys.path then (reachable); and every module Python imports from a path while it starts
with the workspace on PYTHONPATH (issue 83: setuptools' .pth imports `_distutils_hack`, which a module of the agent's
there shadowed, as root, before any sitecustomize ran). The agent then plants a module of each name in its
workspace, one that marks that it ran and then says it is missing, as the probe expects (so the run goes on and later
probes happen); all but `encodings`, which the test's copy never holds (air.tasks.harbor.contract: a planted one
would end every Python that reaches it).

Positive control: the same test with air's guard left off (Harbor's behaviour on plain Docker) runs every reachable
plant. Under air's scoring, with the guard: none.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import task_images

from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker

HACKS = Path(__file__).parent / "fixtures" / "harbor-hacks"
TASK = "probes-in-workdir"
PLANT = ("import os, sys\n"
         "os.makedirs('/tmp/air-paid', exist_ok=True)\n"
         "open('/tmp/air-paid/' + __name__, 'w').close()\n"
         "_ws = os.path.realpath('/app')\n"
         "_spec = sys.modules['_frozen_importlib_external'].PathFinder.find_spec(__name__, [e for e in sys.path if\n"
         "    isinstance(e, str) and os.path.realpath(e or '.') != _ws])\n"
         "if _spec is None:\n"
         "    raise ModuleNotFoundError('No module named %r' % __name__, name=__name__)\n"
         "del sys.modules[__name__]\n"
         "sys.modules['_frozen_importlib']._load(_spec)\n")
"""A planted module: marks that it ran (as root, under scoring), then is what it shadows (the installed module of
its name), or missing, as the probe expects: Python goes on as it would have."""


class Said(logging.Handler):
    """What test.sh printed (air.scoring.harbor-test, at debug: the operator's log, never the agent's)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def field(self, name: str) -> list[str]:
        found = re.search(rf"\b{name}:(.*)$", self.lines[-1], re.MULTILINE)
        assert found, self.lines[-1]
        return [item.strip() for item in found.group(1).split(",") if item.strip()]


@pytest.fixture
def said():
    handler, logger = Said(), logging.getLogger("air.scoring.harbor-test")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def in_mode(tmp_path: Path, mode: str):
    """The fixture task with test.sh's AIR_MODE set (the image is the same: tagged by environment/)."""
    root = tmp_path / mode
    shutil.copytree(HACKS / TASK, root / TASK)
    test = root / TASK / "tests" / "test.sh"
    test.write_text(test.read_text().replace("AIR_MODE=guarded", f"AIR_MODE={mode}"))
    return load_task(f"harbor:{TASK}", harbor_root=root)


async def scored(pool, spec, plants: list[str]) -> float | None:
    """The agent plants a module of each name in its workspace, then validates: the reward (the plants that ran)."""
    program = f"import sys\nfor name in sys.argv[1:]:\n    open(name + '.py', 'w').write({PLANT!r})\n"
    command = " ".join(["python3", "-c", shlex.quote(program), *plants])
    task_images([spec])  # a variant the test made: on enroot, skipped unless exported
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        result = await sandbox.session.run(command, timeout=60, merge_stderr=True)
        assert result.exit_code == 0, result.stdout
        outcome = await env.evaluate(sandbox)
    assert outcome.ok, outcome
    return outcome.metrics["reward"]


async def test_no_name_python_probes_for_runs_the_agents_module_under_scoring(pool, images, tmp_path, said):
    task_images([load_task(f"harbor:{TASK}", harbor_root=HACKS)])
    # Found: every top-level name probed and missed, with whether the workspace was on sys.path then.
    assert await scored(pool, in_mode(tmp_path, "discover"), []) == 0.0
    probes: dict[str, bool] = {}
    for name, seen in (item.split() for item in said.field("PROBES")):
        probes[name] = probes.get(name, False) or seen == "1"
    probes.pop("encodings", None)
    reachable = sorted(name for name, seen in probes.items() if seen)
    assert "sitecustomize" in probes and reachable, probes  # the hook ran, and found names within reach
    assert "_distutils_hack" in reachable, reachable  # the start-up window: the image's .pth imports it
    planted = sorted(probes)
    # Positive control: without the guard, each reachable plant runs (as root, the reward counts them).
    assert await scored(pool, in_mode(tmp_path, "bare"), planted) == len(reachable)
    assert sorted(said.field("PAID")) == reachable, said.lines[-1]
    # Under air's scoring: none.
    assert await scored(pool, in_mode(tmp_path, "guarded"), planted) == 0.0, said.field("PAID")
    assert said.field("PAID") == []
