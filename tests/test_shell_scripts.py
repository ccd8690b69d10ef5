"""Every shell script air ships or runs (`*.sh` under air/ and scripts/) passes shellcheck with no finding at
all, and the ones that ship as package data load through importlib.resources and do what their callers expect.

Shell kept in Python strings is out of shellcheck's reach; that is why scripts are files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for folder in ("air", "scripts") for p in (ROOT / folder).rglob("*.sh"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def test_there_are_scripts_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"scripts/setup.sh", "air/services/sandbox_fusion/scripts/probe.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shellcheck_finds_nothing(script: Path):
    if shutil.which("shellcheck") is None:
        message = "shellcheck is missing: `apt-get install -y shellcheck` (scripts/setup.sh --test does it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # -x follows `source`d files; the script's own folder is where they are looked for.
    result = subprocess.run(["shellcheck", "-x", "--format=gcc", script.name], cwd=script.parent,
                            capture_output=True, text=True)
    where = script.relative_to(ROOT)
    assert result.returncode == 0, f"shellcheck on {where}:\n{result.stdout}{result.stderr}"


def test_the_language_probe_ships_as_package_data_and_prints_what_is_there():
    from air.services.sandbox_fusion.recipes import RECIPES, probe_argv, script

    assert script("probe.sh").startswith("#!/bin/sh")
    argv = probe_argv()
    assert argv[:2] == ["sh", "-c"] and set(argv[4:]) == {n for r in RECIPES.values() for n in r.needs}
    # The same command on the host, with needs this machine has and has not.
    probe = [*argv[:4], "python3", "py:json", "no-such-tool-air", "py:no_such_module_air", "sh"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.split() == ["python3", "py:json", "sh"]
