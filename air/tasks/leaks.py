"""Leaked answer keys: a task whose hidden answers are within reach scores whoever looks, not whoever learns.

Two signs, both said loudly (at load, in `air tasks list --mlgym-root`, in `air tasks check`), naming the files:
- static, at load: an evaluation-only file (a secret) byte-identical to a file the agent can read (its starter
  files and data) or to a public reference (the task's sample or baseline submission): MLGym's titanic ships
  `ground_truth.csv` identical to `sample_submission.csv`;
- dynamic, in the check: a reference or baseline submission that scores the primary metric's best possible value
  (accuracy 1, rmse 0): its answers are the hidden ones, whatever the files are called.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from air.tasks.spec import FileEntry, TaskSpec

LEAK = "LEAKED ANSWER KEY"


def _files(entries: Iterable[FileEntry]) -> Iterator[tuple[str, Path]]:
    """(name as staged, host path) of every regular file of the entries."""
    for entry in entries:
        if entry.source.is_dir():
            for path in sorted(entry.source.rglob("*")):
                if path.is_file():
                    yield f"{entry.dest}/{path.relative_to(entry.source)}", path
        elif entry.source.is_file():
            yield entry.dest, entry.source


def find_leaks(spec: TaskSpec, public: Iterable[tuple[str, Path]] = ()) -> list[str]:
    """Each secret file equal to a file the agent can read or to a public reference (`public`: (what, path), e.g.
    the sample submission, which is never staged but ships with the task). Sizes are compared first, so a large
    dataset costs a stat per file and a hash only where a size matches."""
    secrets: dict[int, list[tuple[str, Path]]] = {}
    for name, path in _files(spec.secret):
        size = path.stat().st_size
        if size:  # an empty file equals every empty file and holds no answers
            secrets.setdefault(size, []).append((name, path))
    if not secrets:
        return []
    readable = list(public)
    readable += [(f"the agent's workspace file {name}", path) for name, path in _files(spec.starter)]
    readable += [(f"the agent's data file data/{name}", path) for name, path in _files(spec.data)]
    readable += [(f"the reference submission {name}", path) for name, path in _files(spec.baseline_files)]
    digests: dict[Path, str] = {}
    seen: set[Path] = set()  # a sample submission that is also the reference submission is said once

    def digest(path: Path) -> str:
        if path not in digests:
            digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
        return digests[path]

    found = []
    for what, path in readable:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        for name, secret in secrets.get(path.stat().st_size, []):
            if path.resolve() != secret.resolve() and digest(path) == digest(secret):
                found.append(f"the evaluation-only file {name} ({secret}) is byte-identical to {what} ({path})")
    return found


def best_reached(spec: TaskSpec, metrics: dict[str, float], what: str) -> str | None:
    """A leak warning when `metrics` (of the submission `what`) reach the primary metric's best possible value."""
    metric = spec.primary
    value = metrics.get(metric.name)
    if metric.best is None or value is None or abs(value - metric.best) > 1e-9 * max(1.0, abs(metric.best)):
        return None
    return (f"{what} scores {metric.name} {value:.6g}, the best possible value: its answers are the hidden ones "
            "(a leaked answer key), or the task is solved by construction")


__all__ = ["LEAK", "find_leaks", "best_reached"]
