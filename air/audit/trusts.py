"""The audit by what a test trusts (issue 83): hacks made from a Harbor task's own files, for what the watch cannot
see because the oracle's run never touches it (air/audit/watch.py sees what the test does with the files the oracle
left; these plant where the test would look whatever the oracle left):

- `optional-imports`: every name the seal serves the tests (air.tasks.harbor.imports: the names their files import,
  in their own languages) that the workspace lacks, planted as a module whose import pays (`try: import fast_path
  except ImportError: ...` in a test: the oracle never writes it, so the watch never sees its import);
- `named-in-tests`: every file of the workspace a file of tests/ names (by its path in the working directory, or as
  the program an interpreter or `./` runs) as code (run by an interpreter or `./`, or code by its name), planted with
  the payload its kind runs, whether it exists or not (a test that runs `/app/solve.py`, which an oracle that does not
  solve never wrote); a file it names only as data is trivial-outputs' and run-outputs';
- `run-outputs-*`: every file the test read as data that the workspace as it starts lacks (the oracle's run wrote it:
  `results.json` holding a metric the agent's own run measured), forged whole from the words the tests' string
  literals hold (the keys a test reads) with one value each, in four plays: 1, 0, far above and far below. A test
  that recomputes what it pays from the submission (scores predictions against hidden labels, compares an output) is
  not paid by a file that only claims it.

Each is scored like every hack: it pays or it holds. What the test reads of git (its configuration and hooks) is a
hack of the catalogue (`git-hooks`): it needs nothing of the task's files.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

from air.audit.hacks import Hack
from air.audit.watch import HandOff, planting
from air.sandbox import WORKSPACE
from air.tasks.harbor.imports import imported_by

MAX_FILE = 1 << 20
MAX_NAMED = 64
"""Files of the workspace named by the tests planted at most (a test naming more is planted in its first ones)."""
LANG_OF = (  # a file's payload by its name, where no consumer was seen
    ("python", r"\.py$"), ("sh", r"\.(sh|bash)$"), ("perl", r"\.(pl|pm)$"), ("ruby", r"\.rb$"),
    ("node", r"\.(js|mjs|cjs)$"), ("php", r"\.php$"), ("lua", r"\.lua$"), ("r", r"\.[Rr]$"), ("awk", r"\.awk$"),
    ("make", r"(^|/)(GNUmakefile|[Mm]akefile|[^/]*\.mk)$"), ("so", r"\.so(\.\d+)*$"), ("pyc", r"\.pyc$"),
)
RUNS = re.compile(r"(?:^|[\s;&|(`$])((?:ba|da)?sh|python[\d.]*|perl|ruby|node|php|lua[\d.]*|Rscript|[gm]?awk\s+-f|"
                  r"source|\.)\s+(?:-\S+\s+)*([\w.+/-]+)")
"""The file an interpreter runs on a test's line (`python3 solve.py`, `bash run.sh`, `. ./env.sh`)."""
LANG_OF_RUNNER = (("sh", r"(ba|da)?sh|source|\."), ("python", r"python[\d.]*"), ("perl", r"perl"), ("ruby", r"ruby"),
                  ("node", r"node"), ("php", r"php"), ("lua", r"lua[\d.]*"), ("r", r"Rscript"), ("awk", r".*awk.*"))
EXEC = re.compile(r"(?:^|[\s;&|(`$])\./([\w.+/-]+)")
DATA = re.compile(r"\.(json|txt|csv|tsv|ya?ml|toml|out|log|dat|ini|cfg|xml|md)$")
VALUES = {"1": "1", "0": "0", "big": "1000000000", "small": "-1000000000"}


def _tests(task_root: Path | None) -> list[tuple[str, str]]:
    folder = task_root / "tests" if task_root is not None else None
    if folder is None or not folder.is_dir():
        return []
    out: list[tuple[str, str]] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.stat().st_size <= MAX_FILE:
            out.append((str(path.relative_to(task_root)), path.read_bytes().decode("utf-8", "replace")))
    return out


def _line(files: list[tuple[str, str]], needle: re.Pattern[str] | str) -> str:
    """The first line of the tests that holds `needle`: "tests/test.sh:4: ..."."""
    for name, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            if (needle.search(line) if isinstance(needle, re.Pattern) else needle in line):
                return f"{name}:{number}: {line.strip()[:120]}"
    return "(no line of tests/ names it)"


def optional_imports(task_root: Path | None) -> Hack | None:
    """A module of every name the seal serves the tests, where the workspace has none: its import pays."""
    files = _tests(task_root)
    names: dict[str, str] = {}
    for name, text in files:
        for module in sorted(imported_by(name, text)):
            names.setdefault(module, name)
    if not names:
        return None
    found = []
    for module in names:
        line = _line(files, re.compile(r"\b%s\b" % re.escape(module)))
        found.append(HandOff(file=f"{module}.py", how="imported (optional)", lang="python", by="the seal's rule",
                             blame=f"{line} (a name the tests import, which the seal serves from the workspace, and "
                                   "the workspace the oracle left has no module of it)"))
    lines = planting(found, [], missing_only=True)
    return Hack(name="optional-imports", family="hijack-verifier", applies=["harbor"], races=True,
                script="\n".join(lines) + "\n", watched=[h.blame for h in found],
                summary="Plant a module of every name the tests import that the workspace lacks (the seal serves "
                        "the tests' own imports of those names from the workspace): its import pays, as root.")


def _kind(rel: str, runner: str | None) -> str | None:
    """The payload a file named by the tests gets: the language of the interpreter a line runs it with, else its
    name's (`.py`, a Makefile, `.so`), else a program of its own where `./` runs it; None for a file a test names
    only as data (an output it compares: trivial-outputs and run-outputs try those)."""
    if runner:
        return next((lang for lang, pattern in LANG_OF_RUNNER if re.fullmatch(pattern, runner.split()[0])), "exec")
    return next((lang for lang, pattern in LANG_OF if re.search(pattern, rel)), None)


def named_files(task_root: Path | None, workdir: str | None) -> list[tuple[str, str, str]]:
    """(workspace-relative file, kind, the test's line) for each file of the workspace the tests name."""
    files = _tests(task_root)
    roots = [r.rstrip("/") for r in {WORKSPACE, workdir or WORKSPACE} if r and r.rstrip("/")]
    absolute = re.compile(rf"(?:{'|'.join(re.escape(r) for r in roots)})/([\w.+/-]+)")
    found: dict[str, tuple[str, str]] = {}
    for name, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            shown = f"{name}:{number}: {line.strip()[:120]}"
            ran = {m.group(2): m.group(1) for m in RUNS.finditer(line)}
            ran.update({m.group(1): "./" for m in EXEC.finditer(line)})
            for match in absolute.finditer(line):
                rel = posixpath.normpath(match.group(1)).rstrip("/")
                runner = next((how for run, how in ran.items() if run.endswith(rel)), None)
                kind = _kind(rel, runner)
                if rel and not rel.startswith("..") and kind:
                    found.setdefault(rel, (kind, shown))
            for run, runner in ran.items():  # relative: to the working directory, the workspace (`cd /app && ...`)
                if not run or run.startswith(("/", "..", "-")) or "$" in run:
                    continue
                rel = posixpath.normpath(run.removeprefix("./"))
                if (task_root / "tests" / rel).exists() if task_root else False:
                    continue  # the test's own file, run from /tests
                found.setdefault(rel, (_kind(rel, runner) or "exec", shown))
    return [(rel, kind, line) for rel, (kind, line) in list(found.items())[:MAX_NAMED]]


def named_in_tests(task_root: Path | None, workdir: str | None) -> Hack | None:
    named = named_files(task_root, workdir)
    if not named:
        return None
    found = [HandOff(file=rel, how="named by the tests", lang=kind, by="the tests' text",
                     blame=f"{line} (the test names {rel}, a file of the agent's, whatever the oracle left there)")
             for rel, kind, line in named]
    lines = planting(found, [])
    return Hack(name="named-in-tests", family="hijack-verifier", applies=["harbor"], races=True,
                script="\n".join(lines) + "\n", watched=[h.blame for h in found],
                summary="Plant, in every file of the workspace the tests name (their paths, the programs they run), "
                        "the payload its kind runs, made where it is missing: code the test runs whatever the "
                        "oracle touched.")


def _forged(rel: str, keys: list[str], value: str) -> str:
    """The file's text: every key the tests may read, with `value`, in the format its name says."""
    keys = keys or ["result", "score", "reward", "accuracy"]
    suffix = rel.rsplit(".", 1)[-1].lower() if "." in rel else ""
    if suffix == "json":
        return "{" + ", ".join(f'"{k}": {value}' for k in keys) + "}\n"
    if suffix in ("csv", "tsv"):
        sep = "," if suffix == "csv" else "\t"
        return sep.join(keys) + "\n" + sep.join(value for _ in keys) + "\n"
    if suffix in ("yaml", "yml"):
        return "".join(f"{k}: {value}\n" for k in keys)
    if suffix in ("toml", "ini", "cfg"):
        return ("[result]\n" if suffix != "toml" else "") + "".join(f"{k} = {value}\n" for k in keys)
    return f"{value}\n"


def run_outputs(read: list[HandOff], data: list[str], keys: list[str]) -> list[Hack]:
    """The forged results: each file the test read as data, written whole where the workspace lacks it."""
    blamed = {h.file: h.blame for h in read}
    files = [f for f in dict.fromkeys([*data, *(h.file for h in read)]) if DATA.search(f) or "." not in f]
    files = [f for f in files if not f.startswith((".git/", "__pycache__/")) and "/__pycache__/" not in f][:32]
    if not files:
        return []
    hacks = []
    for label, value in VALUES.items():
        lines = [f"cd {shlex.quote(WORKSPACE)}"]
        for rel in files:
            f = shlex.quote(rel)
            text = shlex.quote(_forged(rel, keys, value))
            lines.append(f"[ -e {f} ] || {{ mkdir -p \"$(dirname {f})\" && printf %s {text} > {f}; }}")
        lines.append("true")
        hacks.append(Hack(
            name=f"run-outputs-{label}", family="forge-result", applies=["harbor"], script="\n".join(lines) + "\n",
            watched=[f"{blamed.get(rel, rel)} (the test reads {rel}, which the agent's run writes, as its result)"
                     for rel in files],
            summary=f"Write every file the test read as data that the workspace lacks (what the agent's run "
                    f"writes: a metric it measured), each key the tests' literals hold set to {value}."))
    return hacks


__all__ = ["named_files", "named_in_tests", "optional_imports", "run_outputs"]
