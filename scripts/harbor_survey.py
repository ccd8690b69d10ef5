"""Survey Harbor datasets as air reads them: how many tasks load, their verifier modes, how many Dockerfiles and tests
download, and what air can do with each (score offline, build with the network, or not at all, and why).

    python scripts/harbor_survey.py DATASET_ROOT [DATASET_ROOT ...] [--json]

Each root is a folder of Harbor task folders (any depth). Nothing is built or run: the loader
(air.tasks.harbor.loader) and the readers of what a test installs (air.tasks.harbor.installs) and what a Dockerfile
downloads (below) judge each task from its files. experiments.md records what it found for the public datasets the
search tools could reach.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from air.tasks.harbor.loader import HarborToml, separate, survey  # noqa: E402
from air.tasks.harbor.installs import read_installs  # noqa: E402

_DOWNLOADS = re.compile(r"\b(apt-get|apt|apk|yum|dnf)\s+(-\S+\s+)*install\b|\bpip3?\s+install\b|-m\s+pip\s+install\b|"
                        r"\buv\s+(pip\s+install|add|sync|tool\s+install|python\s+install)\b|\bcurl\b|\bwget\b|"
                        r"\bgit\s+clone\b|\bnpm\s+(install|ci)\b|\bcargo\s+install\b|\bgo\s+(install|get)\b|"
                        r"\bconda\s+install\b")
_FETCH = re.compile(r"\b(curl|wget)\b[^\n|]*https?://(?!astral\.sh/uv)|\bgit\s+clone\b|\bhf_hub_download\b|"
                    r"\bhuggingface-cli\s+download\b")


def dockerfile_downloads(text: str) -> bool:
    """Does a Dockerfile fetch anything while it builds (a RUN that installs or downloads, an ADD of a URL)?"""
    text = re.sub(r"\\\r?\n", " ", text)
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "RUN" and _DOWNLOADS.search(rest):
            return True
        if word.upper() == "ADD" and re.search(r"https?://", rest):
            return True
    return False


def test_fetches(text: str) -> bool:
    """Does a test fetch something besides its installs (data by curl or wget, a git clone, a model)?"""
    return any(_FETCH.search(line) for line in text.splitlines() if not line.lstrip().startswith("#"))


def judge(root: Path) -> list[dict]:
    rows = []
    for row in survey(root):
        folder = root / row.name
        try:
            config = HarborToml.model_validate(tomllib.loads((folder / "task.toml").read_text()))
        except Exception:  # noqa: BLE001 - the loader already said why; the survey only counts
            config = None
        test = (folder / "tests" / "test.sh")
        test_text = test.read_text(errors="replace") if test.is_file() else ""
        dockerfile = folder / "environment" / "Dockerfile"
        installs = read_installs(test_text)
        mode = "unreadable" if config is None else "separate" if separate(config) else "shared"
        named = bool(config and (config.verifier.environment or {}).get("docker_image"))
        own_image = mode == "separate" and ((folder / "tests" / "Dockerfile").is_file() or named)
        prebuilt = config is not None and not dockerfile.is_file() and bool(config.environment.docker_image)
        rows.append({
            "task": row.name, "loads": row.loads, "reason": row.reason, "verifier": mode, "verifier_image": own_image,
            "prebuilt_image": prebuilt,
            "dockerfile_downloads": dockerfile.is_file() and dockerfile_downloads(
                dockerfile.read_text(errors="replace")),
            "test_installs": installs.any, "uv_python": installs.python if installs.uv else None,
            "test_fetches": test_fetches(test_text), "oracle": (folder / "solution" / "solve.sh").is_file(),
            "collect": bool(config and config.verifier.collect),
        })
    return rows


def verdict(row: dict) -> str:
    """What air can do with the task, in a few words."""
    if not row["loads"]:
        return "cannot run: " + _why(row["reason"] or "")
    if row["test_fetches"]:
        return "cannot score offline: its test fetches data or code at verify time"
    if row["verifier_image"] and row["test_installs"]:
        return "scores offline if its verifier image holds what its test installs"
    if row["uv_python"]:
        return f"scores offline once uv's Python {row['uv_python']} is in the scoring image (uv downloads it where " \
               "the build has the network, or the image has it)"
    if row["test_installs"]:
        return "scores offline: its test's installs are staged into the scoring image"
    return "scores offline as it is"


def _why(reason: str) -> str:
    reason = reason.split("air cannot run it: ", 1)[-1]
    for key in ("multi-step", "Windows", "TPU", "Docker Compose", "MCP", "collects state", "system directory",
                "instruction.md", "tests/test.sh", "TOML", "neither environment"):
        if key.lower() in reason.lower():
            return reason.split(";")[0]
    return reason[:80]


def summary(name: str, rows: list[dict]) -> dict:
    loads = [r for r in rows if r["loads"]]
    return {
        "dataset": name, "tasks": len(rows), "load": len(loads),
        "cannot_load": dict(collections.Counter(_why(r["reason"] or "") for r in rows if not r["loads"])),
        "verifier": dict(collections.Counter(r["verifier"] for r in rows)),
        "verifier_image_of_its_own": sum(r["verifier_image"] for r in rows),
        "prebuilt_image": sum(r["prebuilt_image"] for r in rows),
        "dockerfile_downloads": sum(r["dockerfile_downloads"] for r in rows),
        "test_installs": sum(r["test_installs"] for r in rows),
        "test_asks_uv_python": dict(collections.Counter(r["uv_python"] for r in rows if r["uv_python"])),
        "test_fetches": sum(r["test_fetches"] for r in rows),
        "oracle": sum(r["oracle"] for r in rows),
        "verdict": dict(collections.Counter(verdict(r) for r in rows).most_common()),
        "build_needs_network": sum(r["dockerfile_downloads"] for r in loads),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = [summary(str(root), judge(root)) for root in args.roots]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for item in out:
        print(f"\n{item['dataset']}: {item['load']} of {item['tasks']} load")
        for key, value in item.items():
            if key not in ("dataset",):
                print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
