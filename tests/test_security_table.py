"""SECURITY.md cannot drift: every function it names as the enforcer of a boundary, and every test it names as the
attack on one, exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = (ROOT / "SECURITY.md").read_text()


def defined(path: Path) -> set[str]:
    """Names a module defines: functions, classes and Class.method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def test_every_named_enforcer_and_attack_exists():
    cited = re.findall(r"`((?:air_mlgym|air|tests)/[\w/]+\.py|warden/\w+\.py): ([^`]+)`", TABLE)
    assert len(cited) > 30
    missing = []
    for rel, names in cited:
        path = ROOT / (rel if not rel.startswith("warden/") else f"air/sandbox/{rel}")
        have = defined(path)
        owner = None
        for name in (n.strip() for n in names.split(",")):
            name = name.split(" (")[0]
            if "." in name:
                owner = name.split(".")[0]
            elif owner and f"{owner}.{name}" in have:
                name = f"{owner}.{name}"
            if name not in have:
                missing.append(f"{rel}: {name}")
    for name in re.findall(r"`(test_\w+)`", TABLE):  # further tests of a cell, after its first `file: test`
        if not any(name in defined(p) for p in (ROOT / "tests").glob("test_*.py")):
            missing.append(name)
    assert not missing, missing
