"""The warden's pure parts on the host, without Docker (issues #24, #32): the protocol's frames and types, the shell's
records (garbled, stale, forged), copying and removing trees, unpack and pack, and the shipped bundle loading with
nothing of air but itself. The copy test needs root (chown); it runs as root in CI."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import types
import tarfile
from pathlib import Path

import pytest

from air.sandbox.warden import MODULES, bundle
from air.sandbox.warden import protocol as p
from air.sandbox.warden.files import Refused, pack, unpack
from air.sandbox.warden.restore import copy_tree, remove_at
from air.sandbox.warden.server import Warden
from air.sandbox.warden.shell import Command

AGENT = 1000
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the copy sets owners: run as root (CI does)")


# ----- protocol -----------------------------------------------------------------------------------------------------
REPLIES = [
    p.Ran(out=b"caf\xe9 \xff\n", err=b"", cwd=b"/home/agent/workspace/\xff\xfe", dropped=3, exit_code=None,
          timed_out=True, restarted=False, duration=1.5),
    p.Exited(out=b"x" * 70000, err=b"\x00\x01", dropped=0, exit_code=-9, timed_out=False, duration=0.0),
    p.Packed(status="ok", tar=bytes(range(256)) * 100),
    p.Unpacked(problem=b""),
    p.WasReset(cell=True, end_ms=1.5, build_ms=3, ms=4.5),
    p.Ready(cells=False, why_not="the container lacks CAP_SYS_ADMIN"),
    p.Failed(error="RuntimeError: x"),
]


def test_frames_split_anywhere_decode_to_the_same_messages():
    stream = b"".join(p.encode(i, m) for i, m in enumerate(REPLIES))
    reader, got = p.FrameReader(), []
    for i in range(0, len(stream), 7):  # pieces of 7 bytes: every header and part boundary falls inside one
        got += [p.decode(head, body, p.REPLIES) for head, body in reader.feed(stream[i:i + 7])]
    assert [i for i, _ in got] == list(range(len(REPLIES)))
    ran = got[0][1]
    assert isinstance(ran, p.Ran) and ran.out == "caf\ufffd \ufffd\n" and ran.cwd.endswith("/\ufffd\ufffd")
    assert got[2][1].tar == REPLIES[2].tar and got[4][1] == REPLIES[4]
    request = p.Run(command=b"echo \xff", timeout=5, limit=10, merge_stderr=True)
    assert p.decode(*p.FrameReader().feed(p.encode(9, request))[0], p.REQUESTS) == (9, p.Run(
        command=b"echo \xff", timeout=5.0, limit=10, merge_stderr=True))


def test_agent_text_is_always_writable_text_within_its_bound():
    """What the agent controls arrives decoded once: no surrogate can reach a writer, and no field is longer than
    its declared bound however much the warden sent."""
    raw = bytes(range(256)) * 40  # every byte, 10 KB
    ran = p.Ran(out=raw, err=raw, cwd=raw, dropped=0, exit_code=0, timed_out=False, restarted=False, duration=0)
    _, got = p.decode(*p.FrameReader().feed(p.encode(1, ran))[0], p.REPLIES)
    for text in (got.out, got.cwd):
        assert isinstance(text, p.AgentText)
        text.encode("utf-8")
        json.dumps(text, ensure_ascii=False).encode("utf-8")
    assert len(got.cwd.encode("utf-8")) <= p.CWD_LIMIT * 3 and got.cwd.startswith("\ufffd" * 0 + "\x00\x01")


def _frame(header: dict, body: bytes = b"") -> tuple[bytes, bytes]:
    return json.dumps(header).encode(), body


@pytest.mark.parametrize("header,body,why", [
    ({"op": "ran", "id": 1, "parts": []}, b"", "missing"),
    ({"op": "nope", "id": 1, "parts": []}, b"", "unreadable"),
    ({"op": "done", "id": "1", "parts": []}, b"", "frame id"),
    ({"op": "done", "id": 1, "parts": [], "extra": 1}, b"", "unknown fields"),
    ({"op": "failed", "id": 1, "parts": [], "error": 3}, b"", "expected str"),
    ({"op": "shell-state", "id": 1, "parts": [], "alive": 1}, b"", "expected bool"),
    ({"op": "unpacked", "id": 1, "parts": [["problem", 5]]}, b"abc", "bad part"),
    ({"op": "unpacked", "id": 1, "parts": [["problem", 1]]}, b"abc", "outside its parts"),
    ({"op": "unpacked", "id": 1, "parts": [], "problem": "text"}, b"", "expected bytes"),
    ({"op": "packed", "id": 1, "parts": [["tar", 0], ["tar", 0]], "status": "ok"}, b"", "bad part"),
])
def test_a_frame_that_breaks_the_protocol_is_refused(header, body, why):
    with pytest.raises(p.ProtocolError, match=why):
        p.decode(*_frame(header, body), p.REPLIES)


def test_a_frame_header_past_its_bound_is_refused_before_it_is_read():
    with pytest.raises(p.ProtocolError):
        p.FrameReader().feed((p.MAX_HEADER + 1).to_bytes(4, "big") + b"\0\0\0\0")


# ----- the shell's records ------------------------------------------------------------------------------------------
class FakeShell:
    alive = True

    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, line: bytes) -> None:
        self.sent.append(line)

    def drain(self) -> None:
        pass


@pytest.fixture
def warden(monkeypatch):
    w = Warden()
    w.shell = FakeShell()
    w.replies = []
    monkeypatch.setattr(w, "send", lambda ident, message: w.replies.append((ident, message)))
    w.seq = 4
    w.job = Command(7, p.Run(command=b"sleep 3", timeout=60, limit=100), 5)
    return w


def test_a_report_counts_only_once_the_shell_answers_an_idle_probe(warden):
    """A forged R (a command's builtin writing to the shell's saved report fd) is followed by the real one; the
    command finishes when the shell, free again, answers the probe sent after the first R: with the real status
    and cwd."""
    warden.shell_record(b"S5")
    warden.shell_record(b"R5 0 /forged")
    [probe] = warden.shell.sent
    nonce = probe.split(b"'I%s\\0' ")[1].split(b" ")[0]
    assert len(nonce) == 16 and not warden.replies  # not finished on its word
    warden.shell_record(b"I" + b"0" * 16)  # a guess
    warden.shell_record(b"R4 0 /stale")
    assert not warden.replies and warden.job is not None
    warden.shell_record(b"R5 1 /home/agent/workspace")  # the real end of the command
    assert len(warden.shell.sent) == 1  # one probe is enough: it waits in the shell's input
    warden.shell_record(b"I" + nonce)
    [(ident, ran)] = warden.replies
    assert ident == 7 and ran.exit_code == 1 and ran.cwd == b"/home/agent/workspace" and warden.job is None


@pytest.mark.parametrize("record,rc", [(b"R5 abc /x", None), (b"R5 1234 /x", None), (b"R5 256 /x", None),
                                        (b"R5 -1 /x", None), (b"R5 137 /a b\xff", 137), (b"R5 0", 0)])
def test_garbled_reports_are_read_strictly(warden, record, rc):
    warden.shell_record(record)
    warden.shell_record(b"I" + warden.job.probe)
    [(_, ran)] = warden.replies
    assert ran.exit_code == rc and ran.cwd == record[5:].partition(b" ")[2]


@pytest.mark.parametrize("left", [2, 100])
def test_a_killed_command_ends_only_once_its_processes_are_gone(warden, monkeypatch, left):
    """A command's timeout kills its processes (procs.kill_marked); one that did not stop within the kill's own
    deadline (SCHED_IDLE on a loaded node) is left for the next pass. Its shell, interrupted, came back first, and
    the command ended with the process alive (`sleep 30x` seen after the timeout, on a busy machine). Now the command
    ends once a pass finds none left, or at its kill grace where one never stops (without that, both cases end at
    the shell's return: tried)."""
    from air.sandbox.warden import procs, server

    passes = []
    monkeypatch.setattr(procs, "kill_marked", lambda uid, marker, deadline=0.2, spare=(): (
        passes.append(marker), len(passes) > left)[1])
    warden.config = types.SimpleNamespace(uid=AGENT)
    warden.shell.pid, warden.shell.interrupt = 4242, lambda: None
    command = warden.job
    warden.shell_record(b"S5")
    command.deadline = time.monotonic() - 1
    warden.expire()  # the timeout: the first pass leaves one
    assert command.timed_out and len(passes) == 1
    warden.shell_record(b"R5 130 /home/agent/workspace")
    warden.shell_record(b"I" + command.probe)  # the shell is back
    assert not warden.replies and warden.job is command and len(passes) == 2  # still one left
    if left == 100:  # one that never stops: the command ends at its grace, the shell kept
        command.kill_deadline = time.monotonic() - 1
    warden.expire()
    [(ident, ran)] = warden.replies
    assert ident == 7 and ran.timed_out and ran.exit_code == 130 and not ran.restarted and warden.job is None
    assert len(passes) == (3 if left == 2 else 2) and set(passes) == {command.marker}
    assert server.KILL_GRACE > server.REKILL_EVERY


def test_records_of_no_pending_command_finish_nothing(warden):
    warden.job = None
    for record in (b"R5 0 /x", b"I0000000000000000", b"S5", b"\xff" * 100):
        warden.shell_record(record)
    assert not warden.replies and not warden.shell.sent


# ----- trees ---------------------------------------------------------------------------------------------------------
def make_pristine(root: Path) -> Path:
    """A pristine home: agent-owned code and data, a root-owned read-only file, a nested tree, a link, an xattr."""
    pristine = root / "pristine"
    (pristine / "workspace" / "src" / "deep").mkdir(parents=True)
    (pristine / "workspace" / "train.py").write_text("def strategy():\n    return 0\n")
    (pristine / "workspace" / "src" / "weights.bin").write_bytes(os.urandom(200_000))
    (pristine / "workspace" / "src" / "deep" / "n.txt").write_text("nested\n")
    (pristine / "workspace" / "link").symlink_to("src/weights.bin")
    try:
        os.setxattr(pristine / "workspace" / "train.py", "user.note", b"kept")
    except OSError:
        pass  # a filesystem without user xattrs: the rest is still compared
    for path in [pristine, *pristine.rglob("*")]:
        os.chown(path, AGENT, AGENT, follow_symlinks=False)
    sealed = pristine / "workspace" / "sealed.txt"
    sealed.write_text("read only\n")
    sealed.chmod(0o444)
    for path in [pristine, *pristine.rglob("*")]:
        os.utime(path, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9), follow_symlinks=False)
    return pristine


def tree(root: Path, owners: dict[int, int] | None = None) -> list:
    """Every entry's name, type, mode, owner (as `owners` maps it), mtime, link target, xattrs and content."""
    owners = owners or {}
    rows = []
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        row = [str(path.relative_to(root)), oct(st.st_mode), owners.get(st.st_uid, st.st_uid),
               owners.get(st.st_gid, st.st_gid), st.st_mtime_ns]
        if path.is_symlink():
            row.append(os.readlink(path))
        elif path.is_file():
            row.append(path.read_bytes())
        try:
            row.append({k: os.getxattr(path, k, follow_symlinks=False) for k in os.listxattr(path,
                                                                                          follow_symlinks=False)})
        except OSError:
            pass
        rows.append(row)
    return rows


@needs_root
def test_a_tree_is_copied_with_owners_mapped_and_everything_else_kept(tmp_path):
    """The image's home becomes the pristine one this way (the image's agent uid mapped to the sandbox's)."""
    pristine = make_pristine(tmp_path)
    (tmp_path / "copy").mkdir()
    copy_tree(str(pristine), str(tmp_path / "copy"), {AGENT: 1879048200})
    assert tree(tmp_path / "copy") == tree(pristine, {AGENT: 1879048200})


DEPTH = 1100  # past Python's recursion limit, and (5 bytes a level) past PATH_MAX


def _deep(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY)
    os.mkdir(path.name, dir_fd=fd)
    for name in [path.name] + ["dddd"] * DEPTH:
        if name == "dddd":
            os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


# ----- unpack and pack ----------------------------------------------------------------------------------------------
def _tar(*members: tuple[str, bytes | str | None]) -> bytes:
    """name -> bytes (a file), None (a directory) or str (a symlink's target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                tar.addfile(info)
            else:
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
    return buf.getvalue()


def test_unpacked_entries_win_over_whatever_stands_at_their_paths(tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    (dest / "evaluate.py" / "deep").mkdir(parents=True)
    (dest / "evaluate.py" / "deep" / "f").write_text("agent")
    outside.mkdir()
    (dest / "lib").symlink_to(outside)
    (dest / "data").write_text("a file where a directory goes")
    unpack(str(dest), _tar(("evaluate.py", b"task"), ("lib/x.py", b"task lib"), ("data", None),
                           ("data/t.csv", b"1")), as_root=os.geteuid() == 0)
    assert (dest / "evaluate.py").read_bytes() == b"task"
    assert not (dest / "lib").is_symlink() and (dest / "lib" / "x.py").read_bytes() == b"task lib"
    assert list(outside.iterdir()) == []  # nothing written through the agent's link
    assert (dest / "data" / "t.csv").read_bytes() == b"1"


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
def test_a_plain_tar_is_read_as_one_and_compressed_ones_still_unpack(tmp_path, monkeypatch, compression):
    """Issue 49.9: tarfile's "r:*" tries gzip, bzip2 and xz before it reads a plain tar as one (a third of a small
    request's unpack): the host's tars, all plain, are read without those tries; a compressed one still unpacks."""
    plain = _tar(("f.txt", b"one"))
    data = plain
    if compression:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:" + compression) as tar:
            info = tarfile.TarInfo("f.txt")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"one"))
        data = buf.getvalue()
    tried = []
    for opener in ("gzopen", "bz2open", "xzopen"):
        original = getattr(tarfile.TarFile, opener)
        monkeypatch.setattr(tarfile.TarFile, opener, classmethod(
            lambda cls, *a, _o=original, _n=opener, **k: tried.append(_n) or _o.__func__(cls, *a, **k)))
    unpack(str(tmp_path), data, as_root=False)
    assert (tmp_path / "f.txt").read_bytes() == b"one"
    assert (tried == []) == (not compression), tried


@pytest.mark.parametrize("name", ["/etc/x", "../x", "a/../../x"])
def test_unpack_refuses_names_outside_its_directory(tmp_path, name):
    with pytest.raises(Refused):
        unpack(str(tmp_path), _tar((name, b"x")), as_root=False)


def _tree(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.is_dir(), p.stat().st_mode, p.stat().st_uid, p.stat().st_mtime_ns,
                   None if p.is_dir() else p.read_bytes()) for p in root.rglob("*"))


def test_a_plain_tar_is_read_without_tarfile_and_lands_as_tarfile_lays_it_down(tmp_path, monkeypatch):
    """Issue 74: a SandboxFusion request's files (container.make_tar: directories, files, float times in pax headers)
    are read without tarfile's machinery, and the tree is the one tarfile's extraction leaves: names, contents,
    modes, owners and times; over what stood there too. Anything else is tarfile's, as before."""
    from air.sandbox.base_sandbox import make_tar
    from air.sandbox.warden import files

    data = make_tar({"sf/r1/main.py": b"print(1)\n", "sf/r1/in/data.txt": b"x" * 1000, "sf/r1/empty": b""},
                    owner=os.getuid(), mode=0o640, dir_mode=0o750)
    assert [(m.parts, m.is_dir) for m in files.plain_members(data)] == [
        (["sf"], True), (["sf", "r1"], True), (["sf", "r1", "in"], True), (["sf", "r1", "main.py"], False),
        (["sf", "r1", "in", "data.txt"], False), (["sf", "r1", "empty"], False)]
    trees = []
    for way in ("plain", "tarfile"):
        if way == "tarfile":
            monkeypatch.setattr(files, "plain_members", lambda data: None)
        dest = tmp_path / way
        (dest / "sf" / "r1" / "main.py").mkdir(parents=True)  # a directory where a file goes
        unpack(str(dest), data, as_root=os.geteuid() == 0)
        trees.append(_tree(dest))
    assert trees[0] == trees[1] and len(trees[0]) == 6
    monkeypatch.undo()
    assert files.plain_members(_tar(("f", b"1"), ("d", None))) is not None
    long_name = "d/" + "n" * 120
    bad = bytearray(_tar(("f", b"1")))
    bad[0] ^= 1  # its checksum no longer matches
    for other in (_tar(("link", "target")), _tar((long_name, b"1")), _tar(("é", b"1")), bytes(bad), b"",
                  _tar(("./f", b"1")), _tar(("../f", b"1")), _tar(("/f", b"1"))):
        assert files.plain_members(other) is None
    unpack(str(tmp_path / "long"), _tar((long_name, b"1")), as_root=False)  # tarfile's, as before
    assert (tmp_path / "long" / long_name).read_bytes() == b"1"


def test_the_sandbox_fusion_servers_own_tar_is_make_tars_archive(tmp_path):
    """Issue 74: the server writes a request's tar without tarfile (plain_tar): tarfile reads it as make_tar's
    archive, member for member (the time aside: each takes its own now), and the warden reads it as a plain one."""
    from air.sandbox.base_sandbox import make_tar
    from air.sandbox.warden import files
    from air.services.sandbox_fusion.files import plain_tar

    content = {"sf/r1/main.py": b"print(1)\n", "sf/r1/in/data.bin": bytes(range(256)) * 5, "sf/r1/empty": b""}
    ours, theirs = (tarfile.open(fileobj=io.BytesIO(data)).getmembers()
                    for data in (plain_tar(content, owner=1234), make_tar(content, owner=1234)))
    fields = ("name", "type", "mode", "uid", "gid", "size", "uname", "gname", "linkname", "devmajor", "devminor")
    assert [[getattr(m, f) for f in fields] for m in ours] == [[getattr(m, f) for f in fields] for m in theirs]
    assert all(isinstance(m.mtime, float) and abs(m.mtime - n.mtime) < 60 for m, n in zip(ours, theirs))
    assert len(files.plain_members(plain_tar(content, owner=1234))) == 6  # sf, sf/r1, sf/r1/in and the files
    assert plain_tar({"d/" + "n" * 120: b"1"}, owner=1) is None and plain_tar({"é": b"1"}, owner=1) is None


# ----- the cell's init -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (shutil.which("as") and shutil.which("objcopy")), reason="no GNU as and objcopy here")
def test_the_cells_init_is_its_documented_source_assembled(tmp_path):
    """cellinit.py's bytes are what GNU as makes of the source its docstring shows."""
    from air.sandbox.warden import cellinit

    source = cellinit.__doc__.split("the bytes below are its output:")[1].split("Other machines")[0]
    (tmp_path / "init.s").write_text(".intel_syntax noprefix\n.globl _start\n"
                                     + "\n".join(line[4:] for line in source.splitlines()) + "\n")
    subprocess.run(["as", "--64", "-o", "init.o", "init.s"], cwd=tmp_path, check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", "init.o", "init.bin"], cwd=tmp_path, check=True)
    assert (tmp_path / "init.bin").read_bytes() == cellinit.X86_64


@pytest.mark.skipif(os.uname().machine != "x86_64" or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="runs the x86-64 init as pid 1 of a new pid namespace (root)")
def test_the_cells_init_says_ready_with_a_stopped_pid_2_and_ignores_the_shells_signals(tmp_path):
    """What cell.INIT_SCRIPT's shell did, as pid 1 of a pid namespace: `ready` once its stopped child is there, the
    trap's signals ignored (SigIgn as the shell's: 0x7a07), its own name; SIGKILL from outside ends it."""
    from air.sandbox.warden import cellinit

    init = tmp_path / "init"
    init.write_bytes(cellinit.program())
    init.chmod(0o755)
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "setsid", str(init)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{children[0]}/status").read_text().splitlines())
        assert status["Name"] == "air-cell-init" and int(status["SigIgn"], 16) == 0x7A07
        assert status["NSpid"].split()[-1] == "1"
        stopped = Path(f"/proc/{children[0]}/task/{children[0]}/children").read_text().split()
        assert len(stopped) == 1
        for _ in range(200):  # it stops itself after the fork, as the shell's subshell did: maybe after `ready`
            if "T (stopped)" in Path(f"/proc/{stopped[0]}/status").read_text():
                break
            time.sleep(0.05)
        assert "T (stopped)" in Path(f"/proc/{stopped[0]}/status").read_text()
        os.kill(int(children[0]), 9)
        proc.wait(10)  # unshare returns once its child, the init, is gone
    finally:
        proc.kill()
        proc.wait(10)


def test_pack_walks_a_deep_tree_without_recursion(tmp_path):
    path = tmp_path / "sub"
    path.mkdir()
    here = path
    for _ in range(1100):  # past Python's recursion limit, within PATH_MAX
        here = here / "d"
        here.mkdir()
    (here / "leaf").write_text("x")
    out = io.BytesIO()
    assert pack(str(tmp_path), ["sub"], out) == 0
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    remove_at(os.open(tmp_path, os.O_RDONLY), "sub")  # pytest's own clean-up recurses
    assert len(names) == 1102 and names[-1].endswith("/d/leaf")


# ----- the bundle ---------------------------------------------------------------------------------------------------
def test_the_bundle_loads_alone_with_nothing_of_air_but_itself(tmp_path):
    """The warden runs in the image's python3 with -I -S, no air installed: every module comes from the bundle,
    and an import of anything else of air fails loudly instead of finding a file of the image."""
    probe = ("import air.sandbox.warden.server as s; print(s.__file__, len(sys.modules['air.sandbox'].__path__));"
             "\ntry:\n    import air.errors\nexcept ImportError as e:\n    print('refused:', e)")
    program = tmp_path / "warden.py"  # longer than one argument may be: the host sends it on a stream
    program.write_bytes(bundle(run=probe))
    out = subprocess.run([sys.executable, "-I", "-S", str(program)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["<air-warden:air.sandbox.warden.server> 0",
                                       "refused: air.errors is not part of the warden's bundle"]


def test_bundled_modules_import_only_the_standard_library_and_each_other():
    import ast

    bundled = {name for name, _ in MODULES}
    for name, path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("air"):
                assert node.module in bundled or node.module == "air.sandbox.warden", (name, node.module)
                if node.module == "air.sandbox.warden":
                    assert all(f"air.sandbox.warden.{a.name}" in bundled for a in node.names), (name, node.names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("air") for a in node.names), (name, node.names)


def test_a_tree_deeper_than_the_recursion_limit_is_removed_without_recursion(tmp_path):
    """What a reset without cells, and unpack, remove of the agent's trees: any depth, never a path past PATH_MAX."""
    _deep(tmp_path / "deep")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        remove_at(fd, "deep")
    finally:
        os.close(fd)
    assert not (tmp_path / "deep").exists()


def test_ctrl_c_that_meets_a_reply_still_cancels_the_caller():
    """A reply and a cancellation (Ctrl-C) landing in the same loop iteration: the caller must be cancelled.
    Python 3.11's asyncio.wait_for returned the reply instead, so `air eval -n <many>` ran on after Ctrl-C."""
    import asyncio
    from types import SimpleNamespace

    from air.sandbox.warden_link import WardenLink

    class Sink:
        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            pass

    async def scenario() -> None:
        link = WardenLink(SimpleNamespace(short_id="test", name="test"))
        link._writer = Sink()
        caller = asyncio.create_task(link.call(p.Ping(), wait=60))
        while not link._waiting:
            await asyncio.sleep(0)
        (reply,) = link._waiting.values()
        reply.set_result(p.ShellState(alive=True))
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(scenario())


@pytest.mark.parametrize("demux", [False, True], ids=["its socket", "docker exec's attach stream"])
def test_replies_are_handed_over_however_the_stream_cuts_them(demux):
    """The link decodes replies where their bytes arrive (warden_link._Channel): frames cut anywhere, two in one
    read, and on a `docker exec`'s stream Docker's 8-byte headers (stdout's kept, stderr's logged) in between."""
    import asyncio
    import random
    from types import SimpleNamespace

    from air.sandbox.warden_link import _Channel, WardenLink

    replies = [p.ShellState(alive=True), p.Done(), p.Failed(error="x" * 3000), p.ShellState(alive=False)]
    stream = b""
    for ident, reply in enumerate(replies, 1):
        frame = p.encode(ident, reply)
        if demux:  # the frame in two stdout chunks, a line of stderr between them
            half = len(frame) // 2
            for kind, chunk in ((1, frame[:half]), (2, b"a warning\n"), (1, frame[half:])):
                stream += bytes([kind, 0, 0, 0]) + len(chunk).to_bytes(4, "big") + chunk
        else:
            stream += frame

    async def scenario(cuts: list[int]) -> list:
        link = WardenLink(SimpleNamespace(short_id="test", name="test", channel=None))
        futures = {ident: asyncio.get_running_loop().create_future() for ident in range(1, len(replies) + 1)}
        link._waiting.update(futures)
        channel = _Channel(link, demux=demux)
        at = 0
        for cut in [*cuts, len(stream)]:
            channel.data_received(stream[at:cut])
            at = cut
        assert link._stderr == (b"a warning\n" * len(replies) if demux else b"")
        return [f.result() for f in futures.values()]

    rng = random.Random(74)
    for cuts in ([], list(range(1, len(stream))), *(sorted(rng.sample(range(1, len(stream)), 5)) for _ in range(20))):
        assert asyncio.run(scenario(cuts)) == replies


def test_air_never_uses_asyncio_wait_for():
    """asyncio.wait_for swallows a cancellation that meets its awaitable's completion on Python 3.11 (and leaks
    an acquired semaphore slot that way): air uses `async with asyncio.timeout(...)`, which does not."""
    import ast

    root = Path(__file__).resolve().parents[1]
    users = []
    for path in [*root.glob("air/**/*.py"), *root.glob("air_mlgym/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            called = isinstance(node, ast.Attribute) and node.attr == "wait_for"
            if called and isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                users.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not users, users


# ----- the warden's own channel (issue #39) ---------------------------------------------------------------------------
def test_the_warden_takes_only_its_hosts_connection_and_then_no_other(tmp_path):
    """A warden that is its container's main process reads and removes its secret before anything else, refuses a
    connection that does not prove it, serves the one that does, and then listens no more: its socket is gone."""
    import secrets
    import socket
    import time

    secret = secrets.token_bytes(32)
    (tmp_path / "secret").write_bytes(secret)
    program = tmp_path / "warden.py"
    program.write_bytes(bundle())
    warden = subprocess.Popen([sys.executable, "-I", "-S", str(program), "--listen", str(tmp_path)])
    try:
        sock_path = tmp_path / "warden.sock"
        for _ in range(500):
            if sock_path.exists():
                break
            time.sleep(0.01)
        assert not (tmp_path / "secret").exists(), "the secret is read and removed before anything else"
        forger = socket.socket(socket.AF_UNIX)
        forger.connect(str(sock_path))
        forger.sendall(b"\0" * 32 + p.encode(1, p.Ping()))
        forger.settimeout(10)
        try:
            answer = forger.recv(100)
        except ConnectionResetError:  # closed with what it sent unread
            answer = b""
        assert answer == b"", "a connection without the secret is closed unanswered"
        host = socket.socket(socket.AF_UNIX)
        host.connect(str(sock_path))
        host.sendall(secret + p.encode(7, p.Ping()))
        host.settimeout(10)
        frames, replies = p.FrameReader(), []
        while not replies:
            replies = list(frames.feed(host.recv(1 << 16)))
        ident, reply = p.decode(*replies[0], p.REPLIES)
        assert (ident, reply) == (7, p.ShellState(alive=True))
        assert not sock_path.exists(), "once its host is connected, nobody else can connect"
        host.close()
        assert warden.wait(timeout=30) == 0, "the host went away: the warden ends"
    finally:
        warden.kill()


def test_the_warden_holds_its_own_mounts_files_and_leaves_the_images_and_the_renewed_ones():
    """The warden holds the pages of the files its container has of its own (Docker's per-container files and init,
    a GPU runtime's driver libraries), never the image's (the page-cache pin's), the renewed mounts, the data store
    (the pin's too) or its host directory."""
    from air.sandbox.warden.server import _own_mounts

    hello = p.Hello(uid=1879048193, image_uid=1000, home="/home/agent", workspace="/home/agent/workspace",
                    air="/srv/air", pristine_home="/srv/air/pristine/home", shell="/srv/air/bin/bash", keep=[],
                    scratch=[], epoch=0, cells=True, home_mb=16, tmp_mb=16, shm_mb=16, pin_pages=True,
                    pinned_elsewhere=["/srv/air/hf-store"], hidden=["/run/air-warden"])
    inherited = [("/", "rw", "overlay", "/"), ("/proc", "rw", "proc", "/"), ("/dev", "rw", "tmpfs", "/"),
                 ("/sys", "ro", "sysfs", "/"), ("/sys/fs/cgroup", "ro", "tmpfs", "/"),
                 ("/etc/hosts", "rw", "ext4", "/var/lib/docker/containers/x/hosts"),
                 ("/usr/sbin/docker-init", "ro", "ext4", "/usr/bin/docker-init"),
                 ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "ro", "ext4", "/usr/lib/libcuda.so"),
                 ("/srv/air", "rw", "ext4", "/var/lib/docker/volumes/v/_data"),
                 ("/srv/air/hf-store", "ro", "ext4", "/root/.cache/air/datasets"),
                 ("/home/agent", "rw", "tmpfs", "/"), ("/tmp", "rw", "tmpfs", "/"),
                 ("/run/air-warden", "rw", "tmpfs", "/run/air/sandboxes/x")]
    assert _own_mounts(inherited, hello) == ["/etc/hosts", "/usr/sbin/docker-init",
                                             "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"]


def test_a_precompiled_warden_runs_the_hosts_bytecode_where_it_is_this_interpreters(tmp_path):
    """The warden's file on this machine carries its modules as the host compiled them: an interpreter of the same
    bytecode (magic number) runs those; one of other bytecode compiles the sources, to the same module."""
    import importlib.util

    probe = "print(len(_CODE), sys.modules['air.sandbox.warden.protocol'].HOST_LOCK)"
    modules = MODULES[:2]
    assert [name for name, _ in modules] == ["air.sandbox.output", "air.sandbox.warden.protocol"]
    precompiled = bundle(probe, modules, precompiled=True)
    magic = repr(importlib.util.MAGIC_NUMBER).encode()
    assert precompiled.count(magic) == 1
    programs = {"precompiled": precompiled, "plain": bundle(probe, modules),
                "another interpreter's": precompiled.replace(magic, repr(b"\x00\x00\r\n").encode())}
    said = {}
    for name, program in programs.items():
        (tmp_path / "warden.py").write_bytes(program)
        said[name] = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "warden.py")], capture_output=True,
                                    text=True, check=True).stdout
    assert said == {"precompiled": "2 host.lock\n", "plain": "0 host.lock\n", "another interpreter's": "0 host.lock\n"}
