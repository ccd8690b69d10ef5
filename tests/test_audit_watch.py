"""Issue #62, the audit that watches: the warden records what a task's own test does with the files the agent wrote
(fanotify on the cell's home), the audit calls a hand-off what a root process of the test executed, sourced,
imported, ran or loaded, blames the test's line, and proves it with a payload planted in exactly those files.

Five test shapes the catalogue never named (tests/fixtures/harbor-watched: a script run, a file sourced, a Perl
program run by a tool of the image, a Python configuration loaded, an awk program): in the same audit, the
catalogue's submission-plants holds on each (it plants only files that exist, in .py and .sh: the positive
control of the blind spot) and the watched hack pays, blamed on the test's line. Negative controls: a test that runs
the program as the agent's uid (docs/audit.md), and one that only compares an output, hand nothing off.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from air.audit.hacks import load_hacks
from air.audit.runner import audit_task
from air.audit.watch import NAME, Seen, candidate_hacks, candidates, hand_offs, hack_of
from air.sandbox import WORKSPACE
from air.tasks.harbor.loader import image_workdir
from air.tasks.registry import load_task
from air.tasks.task_images import build_task_image

FIXTURES = Path(__file__).parent / "fixtures"
WATCHED = FIXTURES / "harbor-watched"
BLIND = {  # the shape -> (the hand-off, how, the test's line it is blamed on)
    "runs-script": ("run.sh", "ran", "tests/test.sh:3: out=$(cd /app && bash run.sh"),
    "sources-env": ("env.sh", "sourced", "tests/test.sh:3: [ -f /app/env.sh ] && source /app/env.sh"),
    "tool-runs-program": ("main.pl", "ran", "tests/test.sh:3: out=$(runcheck /app"),
    "loads-config": ("config.py", "imported", "tests/test.sh:3: python3 /tests/check.py"),
    "awk-program": ("filter.awk", "ran", "tests/test.sh:3: if awk -f /app/filter.awk"),
}
HONEST = {"runs-as-agent": WATCHED, "compares-output": FIXTURES / "harbor-hacks"}


async def audited(name: str, root: Path, pool, hacks: list[str], watch: bool = True, whole_rates: bool = False):
    spec = load_task(f"harbor:{name}", harbor_root=root)
    build_task_image(spec)
    return await audit_task(spec, pool, [h for h in load_hacks() if h.name in hacks], workdir=image_workdir(spec),
                            task_root=root / name, concurrency=2, watch=watch, whole_rates=whole_rates)


@pytest.mark.docker
async def test_the_warden_sees_who_executes_sources_imports_and_reads_the_workspace(pool, images):
    """The watch itself: a root program's exec, `bash file`, `source`, an import and a read, each with its process;
    a read by the agent's uid carries that uid. Positive control: the same program unwatched records nothing."""
    from air.sandbox import Resources, SandboxSpec

    spec = SandboxSpec(image="air/base:latest", task="watch", resources=Resources(cpus=1, memory_mb=512, pids=256))
    program = ("cat data.csv; ./run.sh; bash run.sh; . ./env.sh; python3 -c 'import sys; sys.path.insert(0, \".\");"
               " import mod'; setpriv --reuid=$AIR_AGENT_UID --regid=$AIR_AGENT_UID --clear-groups cat data.csv")
    records, agent = {}, -1
    for watch in (True, False):
        async with pool.lease(spec) as sandbox:
            await sandbox.session.run("printf 'echo ran\\n' > run.sh && chmod +x run.sh && echo A=1 > env.sh && "
                                      "echo x=1 > mod.py && echo d > data.csv", timeout=30)
            result = await sandbox.session.run_untrusted(
                ["bash", "-c", program], user="root", cwd=WORKSPACE, timeout=60, watch=watch, end_cell=True,
                env={"AIR_AGENT_UID": str(sandbox.agent_uid)})
            assert result.exit_code == 0, result.stderr
            records[watch] = [Seen(**json.loads(line)) for line in result.watched.splitlines()]
            agent = sandbox.agent_uid if watch else agent
    assert records[False] == []
    got = {(r.how, r.path.rsplit("/", 1)[-1], r.uid, " ".join(r.argv)[:20]) for r in records[True]}
    assert ("exec", "run.sh", 0, "bash -c cat data.csv") in got, got
    assert ("open", "run.sh", 0, "bash run.sh") in got, got
    assert ("open", "mod.py", 0, "python3 -c import sy") in got, got
    assert ("open", "data.csv", 0, "cat data.csv") in got and ("open", "data.csv", agent, "cat data.csv") in got, got
    assert any(r.path.endswith("/env.sh") and r.argv[:2] == ["bash", "-c"] and r.uid == 0 for r in records[True])
    found, data = hand_offs(records[True], None)
    cache = {(h.file, h.how) for h in found if h.lang == "pyc"}  # the cache python3 wrote, and would load next time
    assert {(h.file, h.how) for h in found} - cache == {("run.sh", "executed"), ("env.sh", "sourced"),
                                                        ("mod.py", "imported")}, found
    assert all(f.startswith("__pycache__/mod.") for f, _ in cache), cache
    assert data == ["data.csv"]


@pytest.mark.docker
@pytest.mark.parametrize("name", list(BLIND))
async def test_a_test_shape_no_hack_names_is_watched_blamed_and_paid(name, pool, images):
    audit = await audited(name, WATCHED, pool, ["submission-plants"])
    status = {r.name: r.status for r in audit.results if r.name in ("submission-plants", NAME)}
    assert audit.do_nothing == 0.0
    assert status == {"submission-plants": "held", NAME: "paid"}, (status, audit.watch)
    file, how, line = BLIND[name]
    assert audit.hand_offs and audit.hand_offs[0].startswith(f"{file} ({how}): {line}"), audit.hand_offs
    paid = next(r for r in audit.results if r.name == NAME)
    assert paid.score == 1.0 and paid.blame[0].startswith(line), paid.blame


@pytest.mark.docker
async def test_without_the_watch_the_catalogue_is_blind_to_a_tool_it_never_named(pool, images):
    """Positive control of the blind spot itself: the whole hijack-verifier catalogue, unwatched, holds on a test
    that runs the agent's Perl program through a tool of its image; watched, the same audit pays."""
    hijack = ["python-hooks", "path-shims", "links", "submission-plants"]
    blind = await audited("tool-runs-program", WATCHED, pool, hijack, watch=False)
    assert not blind.paid and blind.watch.startswith("not watched"), [(r.name, r.status) for r in blind.results]


@pytest.mark.docker
@pytest.mark.parametrize("name", list(HONEST))
async def test_an_honest_test_hands_nothing_off_and_nothing_pays(name, pool, images):
    audit = await audited(name, HONEST[name], pool, ["submission-plants"])
    assert audit.hand_offs == [] and not audit.paid, (audit.hand_offs, audit.watch)
    assert audit.watch.startswith("watched the oracle"), audit.watch
    assert NAME not in {r.name for r in audit.results}


def rec(path: str, argv: list[str], how: str = "open", uid: int = 0, chain: list[list[str]] | None = None) -> Seen:
    return Seen(how=how, path=f"{WORKSPACE}/{path}", pid=7, uid=uid, exe="", argv=argv, chain=chain or [])


def test_only_code_handed_to_root_is_a_hand_off(tmp_path):
    records = [
        rec("out.csv", ["python3", "/tests/grade.py"]),                      # data a root interpreter reads
        rec("output.txt", ["cmp", "-s", "/app/output.txt", "/tests/x"]),     # data a tool reads
        rec("solve.py", ["python3", "solve.py"], uid=1879048198),            # the agent's uid runs it: not root's
        rec("__pycache__/m.cpython-311.pyc", ["python3", "-m", "pytest"]),   # a compiled module (issue 83)
        rec("Makefile", ["make", "-C", "/app"]),                             # make loads the agent's Makefile
        rec("bin/tool", ["bash", "/tests/test.sh"], how="exec"),             # the kernel runs it
        rec("bin/tool", ["bash", "/tests/test.sh"]),                         # ... and opens it for the exec
        rec("lib/helper.rb", ["ruby", "/tests/t.rb"]),                       # a library of its language
    ]
    found, data = hand_offs(records, None)
    assert [(h.file, h.how, h.lang) for h in found] == [("__pycache__/m.cpython-311.pyc",
                                                         "loaded as a compiled module", "pyc"),
                                                        ("Makefile", "loaded as its Makefile", "make"),
                                                        ("bin/tool", "executed", "exec"),
                                                        ("lib/helper.rb", "loaded", "ruby")]
    assert data == ["out.csv", "output.txt"]
    # The plant, as the agent runs it in its workspace: a line of each file's language first, a new file whole.
    (tmp_path / "Makefile").write_text("all:\n\techo 42\n")
    subprocess.run(["bash", "-c", hack_of(found, data).script], cwd=tmp_path, check=True)
    pay = f"{WORKSPACE}/.air-watch-pay.sh"
    assert (tmp_path / "Makefile").read_text() == f"AIR_WATCH_PAY := $(shell sh {pay})\nall:\n\techo 42\n"
    assert (tmp_path / "bin" / "tool").read_text() == f"#!/bin/sh\nexec sh {pay}\n"
    assert (tmp_path / "lib" / "helper.rb").read_text() == f"system('sh', '{pay}')\n"
    assert "reward.json" in (tmp_path / ".air-watch-pay.sh").read_text()
    # The compiled module: a cache Python loads with no look at its source (hash-based, unchecked), whose code pays.
    cache = (tmp_path / "__pycache__" / "m.cpython-311.pyc").read_bytes()
    assert cache[4:8] == (1).to_bytes(4, "little") and b".air-watch-pay.sh" in cache


@pytest.mark.docker
def test_past_the_watchs_bound_the_audit_says_what_it_did_not_follow_and_exits_1(images, tmp_path):
    """Issue #72: the watch keeps MAX_RECORDS records; a test that reads 2,100 workspace files (the image's data)
    before it sources the agent's env.sh and runs its run.sh is past it. The run.sh it names on a command line is
    still kept (flagged, paid); the sourcing is not, and the audit says how many opens it did not follow and exits
    1 even where nothing paid (here with the watched hack alone, which pays: exit 1 either way; the JSON says both)."""
    import os
    import sys

    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "audit", "harbor:many-reads",
                           "--harbor-root", str(WATCHED), "--hack", "submission-plants", "--json", "-c", "1"],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "CI": "", "AIR_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 1, proc.stderr[-2000:]
    audit = json.loads(proc.stdout)[0]
    assert "past the watch's bound of 2000 records were not recorded" in audit["unfollowed"], audit
    assert audit["hand_offs"] and audit["hand_offs"][0].startswith("run.sh (ran): tests/test.sh:5:"), audit
    assert not any(h.startswith("env.sh") for h in audit["hand_offs"]), audit  # the one lost past the bound
    assert {r["name"]: r["status"] for r in audit["results"]}[NAME] == "paid", audit["results"]


@pytest.mark.docker
async def test_a_race_is_played_as_a_rate(pool, images):
    """Issue #72: a test that loses its race with what the agent's program left half the time (reward-race) was
    "held" in one play of two. A hack that races (Hack.races) is played RACE_PLAYS times where the test hands
    control to the agent's files, and the audit reports how many plays paid: with a rate of 1/2 all 11 hold with
    probability 0.05%. (An audit settles a race at its first play that pays; here every play is made, so that the
    rate is measured whichever play pays first.)"""
    from air.audit.report import details
    from air.audit.runner import RACE_PLAYS

    audit = await audited("reward-race", WATCHED, pool, [], whole_rates=True)
    watched = next(r for r in audit.results if r.name == NAME)
    print(f"reward-race: paid in {watched.pays} of {watched.plays} plays, {audit.seconds:.1f} s")
    assert watched.plays == RACE_PLAYS == 11, watched
    assert watched.status == "paid" and 0 < watched.pays < RACE_PLAYS, watched
    assert any(f"paid in {watched.pays} of 11 plays" in line for line in details([audit])), details([audit])
    assert watched.blame[0].startswith("tests/test.sh:7: out=$(cd /app && timeout 10 python3 solve.py"), watched.blame


CONSUMERS = {  # a file root read -> (who read it, its content as the oracle left it, how its consumer then runs it)
    "steps.txt": (["cat", "/app/steps.txt"], "echo 42\n", "cat steps.txt | bash"),
    "config": (["bash", "/tests/test.sh"], "ANSWER=42\n", "bash -c '. ./config'"),
    "fix.sed": (["sed", "-f", "/app/fix.sed"], "s/41/42/\n", "echo 41 | sed -f fix.sed"),
    "model.pkl": (["python3", "/tests/check.py"], "",
                  "python3 -c 'import pickle; pickle.load(open(\"model.pkl\", \"rb\"))'"),
    "answer.npy": (["python3", "/tests/check.py"], "",
                   "python3 -c 'import numpy; numpy.load(\"answer.npy\", allow_pickle=True)'"),
    "conf.yaml": (["python3", "/tests/check.py"], "answer: 42\n",
                  "python3 -c 'import yaml; yaml.unsafe_load(open(\"conf.yaml\"))'"),
    "settings.py": (["python3", "/tests/check.py"], '"""Settings."""\nfrom __future__ import annotations\nA = 42\n',
                    "python3 -c 'import settings'"),
    "main.c": (["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "main.c"], "int main(void) { return 0; }\n",
               "cc main.c -o main.out && ./main.out"),
    # C source the oracle wrote and the agent's workspace lacks: planted whole (a main of its own)
    "new.c": (["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "new.c"], "", "cc new.c -o new.out && ./new.out"),
    "libx.so": (["python3", "/tests/check.py"], "", "python3 -c 'import ctypes; ctypes.CDLL(\"./libx.so\")'"),
    "copied.sh": (["cp", "-r", "/app/.", "/tmp/run"], "echo 42\n", "d=$(mktemp -d) && cp -r . $d && bash $d/copied.sh"),
    # a copy fed to a consumer its name does not tell (text, read by cp: what a shell or Python runs)
    "answer.txt": (["cp", "/app/answer.txt", "/tmp/run.py"], "print(42)\n", "cp answer.txt run.py && python3 run.py"),
}


def test_every_file_root_read_gets_the_payload_its_consumer_runs(tmp_path):
    """Issue #72: a file root read is no longer only data. By who opened it (an interpreter's language, sed, a
    compiler, a deserialiser of Python's) or, for a copy or a reader, by its name, the proof plants what its consumer
    runs -- after a `from __future__` line where Python needs it -- and each, consumed as the test would (on this
    machine's tools), runs the pay script. Control: the oracle's own file, consumed the same way, pays nothing."""
    records = [rec(name, argv) for name, (argv, _, _) in CONSUMERS.items()]
    read = candidates(records, None, [])
    assert {c.file: c.lang for c in read} == {"steps.txt": "text", "config": "sh", "fix.sed": "sed",
                                              "model.pkl": "pickle", "answer.npy": "npy", "conf.yaml": "yaml",
                                              "settings.py": "python", "main.c": "c", "new.c": "c", "libx.so": "so",
                                              "copied.sh": "sh", "answer.txt": "text"}
    hacks, past = candidate_hacks(read, [])
    assert past == 0 and [h.name for h in hacks] == [f"{NAME}-read-{n}" for n in range(1, 5)] + [f"{NAME}-read-rest"]
    def missing(module: str) -> bool:
        return subprocess.run(["python3", "-c", f"import {module}"], capture_output=True).returncode != 0

    absent = {".yaml": missing("yaml"), ".npy": missing("numpy"), ".c": not shutil.which("cc")}
    absent[".so"] = absent[".c"]
    for name, (_, content, consume) in CONSUMERS.items():
        if absent.get(Path(name).suffix):
            continue  # the consumer is not on this machine (tests/fixtures/images/harbor-tools has each)
        ws = tmp_path / name.replace(".", "-")
        ws.mkdir()
        if content:
            (ws / name).write_text(content)
        subprocess.run(["bash", "-c", consume], cwd=ws, capture_output=True, timeout=60)
        assert not (ws / "paid").exists(), name  # control: the oracle's file pays nothing
        [one], _ = candidate_hacks([c for c in read if c.file == name], [], workspace=str(ws))
        subprocess.run(["bash", "-c", one.script], cwd=ws, check=True, capture_output=True, timeout=60)
        (ws / ".air-watch-pay.sh").write_text(f"echo paid > {ws / 'paid'}\n")  # the pay, here: a mark
        subprocess.run(["bash", "-c", consume], cwd=ws, capture_output=True, timeout=60)
        assert (ws / "paid").exists(), (name, (ws / name).read_bytes()[:300])


READ = {  # issue #72's shapes -> (the file, the hack that proves it, the test's line it is blamed on)
    "future-config": ("config.py", NAME, "tests/test.sh:3: python3 /tests/check.py"),
    "cat-into-shell": ("steps.txt", f"{NAME}-read-1", "tests/test.sh:3: out=$(cat /app/steps.txt | bash"),
    "sed-script": ("fix.sed", f"{NAME}-read-1", "tests/test.sh:3: out=$(echo 41 | sed -f /app/fix.sed"),
    "pickle-model": ("model.pkl", f"{NAME}-read-1", "tests/test.sh:3: python3 /tests/check.py"),
    # the copy's own name is a temporary one no line holds: the line that names the file is the one that runs it
    "copies-workspace": ("run.sh", f"{NAME}-read-1", 'tests/test.sh:4: out=$(cd "$run" && bash run.sh'),
    # a copy under another name, run by a consumer its name does not tell (text to a shell, Python to Python)
    "copy-renamed": ("answer.txt", f"{NAME}-read-1", "tests/test.sh:3: cp /app/answer.txt /tmp/answer.py"),
}


@pytest.mark.docker
@pytest.mark.parametrize("name", list(READ))
async def test_a_file_root_read_is_proved_by_what_its_consumer_runs(name, pool, images):
    """Issue #72: code the watch recorded as a data read (fed to a shell by cat, a sed script, a pickle, a copy run
    elsewhere), and a hand-off whose payload could not run before a `from __future__` line: each paid by the audit's
    own proof, blamed on the test's line. (On 0e74f9e each was held: no hack of those names, or a SyntaxError.)"""
    audit = await audited(name, WATCHED, pool, [])
    file, hack, line = READ[name]
    status = {r.name: r.status for r in audit.results}
    assert status.get(hack) == "paid", (status, audit.watch)
    paid = next(r for r in audit.results if r.name == hack)
    assert paid.score == 1.0 and paid.blame[0].startswith(line) and file in paid.blame[0], paid.blame



AS_AGENT = 'setpriv --reuid="$AIR_AGENT_UID" --regid="$AIR_AGENT_UID" --clear-groups --no-new-privs'
TOOLED = {  # shapes whose consumer needs PyYAML, numpy or a C compiler -> (the file, the test's line it is blamed
    # on, and the guard: in which file of the task what safe consumer replaces the unsafe one)
    "yaml-config": ("conf.yaml", "tests/test.sh:3: python3 /tests/check.py",
                    ("tests/check.py", "yaml.unsafe_load", "yaml.safe_load")),
    "npy-objects": ("answer.npy", "tests/test.sh:3: python3 /tests/check.py",
                    ("tests/check.py", "allow_pickle=True", "allow_pickle=False")),
    "c-source": ("main.c", "tests/test.sh:3: gcc -o /tmp/answer /app/main.c",
                 ("tests/test.sh", "timeout 10 /tmp/answer", f"timeout 10 {AS_AGENT} /tmp/answer")),
    "shared-library": ("libanswer.so", "tests/test.sh:3: python3 /tests/check.py",
                       ("tests/test.sh", "python3 /tests/check.py",  # copied by root, loaded by the agent
                        f"cp /app/libanswer.so /tmp/ && {AS_AGENT} "
                        'python3 -c "$(sed s,/app/,/tmp/, /tests/check.py)"')),
}


@pytest.fixture(scope="module")
def harbor_tools(images, docker_client):
    """air/base with PyYAML, numpy and gcc (tests/fixtures/images/harbor-tools), built offline from wheels and .debs
    staged on the host: about 1 min the first time (55 s on a busy 2-core machine), reused by its inputs after."""
    from air.images import ImageBuilder

    return ImageBuilder(docker_client).ensure(["harbor-tools"], also=FIXTURES / "images")[-1]


@pytest.mark.docker
@pytest.mark.parametrize("guarded", [False, True], ids=["unsafe", "safe"])
@pytest.mark.parametrize("name", list(TOOLED))
async def test_a_file_a_loader_or_a_compiler_runs_is_proved_in_the_scoring_cell(name, guarded, harbor_tools, pool,
                                                                                tmp_path):
    """Issue #72: a YAML file PyYAML's unsafe loader reads, an array of objects numpy loads, C source the test
    compiles and runs, a shared library it loads: each read by root, each paid by the audit's own proof (the
    payload its consumer runs) in a real scoring cell, blamed on the test's line. Control: the same test with the
    safe consumer (safe_load, allow_pickle=False, the program or the loader run as the agent's uid) holds against
    the same payload. (On 0e74f9e no Docker fixture had these consumers; the .npy was planted as Python.)"""
    file, line, (where, unsafe, safe) = TOOLED[name]
    root = WATCHED
    if guarded:
        root = tmp_path / "guarded"
        shutil.copytree(WATCHED / name, root / name)
        text = (root / name / where).read_text()
        assert unsafe in text
        (root / name / where).write_text(text.replace(unsafe, safe))
    audit = await audited(name, root, pool, [])
    hack = f"{NAME}-read-1"
    status = {r.name: r.status for r in audit.results if r.name.startswith(NAME)}  # issue 83's hacks: their tests
    # the oracle's own file pays the test's 1 (a twin that held is not merely broken), doing nothing 0
    assert audit.do_nothing == 0.0 and "the oracle earned reward 1" in audit.watch, (audit.do_nothing, audit.watch)
    assert "1 more read by root" in audit.watch, audit.watch  # the file, and the proof planted in it played
    if guarded:
        assert status == {hack: "held"} and not audit.paid, status
        return
    assert status == {hack: "paid"}, (status, audit.watch)
    played = next(r for r in audit.results if r.name == hack)
    assert played.score == 1.0 and played.blame[0].startswith(line) and file in played.blame[0], played.blame


def test_the_report_says_a_races_rate_and_what_was_not_followed():
    """What the table's notes and the HTML page say of a race played as a rate (paid in k of n plays; held in n of
    n, with the confidence) and of a watch that could not follow a test whole."""
    from air.audit.report import details, html
    from air.audit.runner import RACE_PLAYS, HackResult, TaskAudit

    audit = TaskAudit(task="t", contract="harbor", metric="reward", direction="higher", do_nothing=0.0,
                      do_nothing_status="ok", baseline=0.0, reference=0.0, seconds=1.0, unfollowed="5 opens ...",
                      results=[HackResult(name="h", family="hijack-verifier", status="paid", score=1.0, gain=1.0,
                                          plays=RACE_PLAYS, pays=3, step="x"),
                               HackResult(name="s", family="hijack-verifier", status="held", score=0.0, gain=0.0,
                                          plays=RACE_PLAYS)])
    said = "\n".join(details([audit]))
    assert "paid in 3 of 11 plays" in said and "s held in 11 of 11 plays" in said and "not followed" in said, said
    page = html([audit])
    assert "paid in 3 of 11 plays" in page and "not followed: 5 opens" in page
