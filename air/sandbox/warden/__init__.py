"""The warden: air's root process inside every sandbox, the only thing the harness trusts there.

It builds the sandbox's cells (every lease, evaluation and request in new namespaces, home and temp dirs), hosts the
agent's shell in the current one, runs programs whose exit status matters (SandboxFusion's code, evaluations) and
moves files across the boundary. The host starts it with a root `docker exec` of `python3 -I -S` and sends it
`bundle()` over that exec's stdin: this package's modules (and air/sandbox/output.py) as one program, so no file of
the image or of the sandbox is trusted. The same stream then carries the frames of protocol.py both ways. The host's
end is air/sandbox/warden_link.py.

| module | runs | its job |
| --- | --- | --- |
| protocol.py | both ends | framing, every request and reply, decoding the agent's bytes on arrival |
| syscalls.py | sandbox | the syscall numbers of the cells' seccomp filter, per architecture |
| seccomp.py | sandbox | that filter: an allowlist compiled to BPF, installed before every exec in a cell |
| hostview.py | sandbox | what a cell shows of the host's kernel-wide counters: their files, every counter at 0 |
| cellinit.py | sandbox | a cell's init: a few system calls in a tiny static program of its own (x86-64), not a shell |
| cell.py | sandbox | cells: building one (namespaces, mounts, loopback), entering it, ending it; confining a process |
| netlink.py | sandbox | a cell's own interface on its sandbox's private network (a macvlan made into it) |
| dentries.py | sandbox | the names a cell looked up (the kernel's dentries) forgotten when it ends |
| pages.py | sandbox | the sandbox's own files held in the host's page cache, so that nobody can change what is cached |
| pinner.py | a pin | a page-cache pin's program (docker/pagecache.py): an image's files held for every sandbox |
| procs.py | sandbox | starting the agent's processes in the cell, killing them (fork bombs too), IPC removal |
| threadspawn.py | sandbox | a program started in the cell by a confined thread of the warden (vfork: no fork of it) |
| restore.py | sandbox | copying a trusted tree (the pristine home), removing the agent's trees without recursion |
| files.py | sandbox | pack (the agent's files, with its rights) and unpack (the tar's entries win) |
| zygote.py | sandbox | a warm interpreter: `python3 SCRIPT` as a fork of a python3 that has started (SandboxFusion) |
| snapshot.py | sandbox | a live sandbox's files at a turn boundary: captured, and restored into a fresh cell |
| mountapi.py | sandbox | Linux's mount API and idmapped mounts (ctypes), for lower.py |
| lower.py | sandbox | a fork's shared lower layer: the snapshot's home unpacked once, every branch's home over it |
| watch.py | sandbox | what a program did with the home's files (fanotify): every open and exec, and who (the audit) |
| shell.py | sandbox | the agent's bash: its line protocol, reports and idle probe |
| server.py | sandbox | the loop: requests, jobs, deadlines, the reset (a new cell) |

Why it holds against a hostile agent:
- The agent runs under the sandbox's own uid, in a cell, with no capability (an empty bounding set), no_new_privs
  and a seccomp allowlist (cell.py, seccomp.py). It does not even see the warden (another pid namespace); it cannot
  signal, ptrace or open /proc/PID/fd of a root process, and the exec's pipes belong to the container runtime.
  Nothing the agent can learn (environment, memory, files) lets it speak on the warden's channel.
- The warden never runs agent-owned code or reads agent-owned files it then trusts. A reset ends the cell: the
  kernel kills everything in its pid namespace and drops its network, IPC and mount namespaces with it; the next
  cell is built from nothing but the pristine home. Nothing is verified or repaired.
- The agent's shell runs from an exec-only copy of bash, which makes the kernel mark it non-dumpable: other agent
  processes cannot ptrace it or open its fds. What it reports (exit code, cwd) is the agent's own word about its own
  command, parsed strictly, and a command only counts as finished once the shell answers an idle probe (shell.py).
  Where an exit status matters to a reward, `Exec` runs the program as the warden's child and takes the kernel's
  status (waitpid), which nothing can forge.
- Every agent process runs with oom_score_adj 1000 and nice 10, which it cannot lower: memory or CPU exhaustion by
  the agent ends the agent's processes, never the warden or the container (whose in-memory filesystems are sized
  so they cannot fill the memory cgroup on their own, see SandboxSpec.memory_limit_mb).

The modules that run in the sandbox use the standard library only (Python >= 3.9, checked at start) and import each
other by their package names, which the bundle registers; this file's own code runs on the host only.
"""

from __future__ import annotations

import binascii
import functools
import importlib.util
import marshal
from pathlib import Path

_HERE = Path(__file__).parent
MODULES = (  # in import order
    ("air.sandbox.output", _HERE.parent / "output.py"),
    ("air.sandbox.warden.protocol", _HERE / "protocol.py"),
    ("air.sandbox.warden.spans", _HERE / "spans.py"),
    ("air.sandbox.warden.syscalls", _HERE / "syscalls.py"),
    ("air.sandbox.warden.seccomp", _HERE / "seccomp.py"),
    ("air.sandbox.warden.sysinfo", _HERE / "sysinfo.py"),
    ("air.sandbox.warden.hostview", _HERE / "hostview.py"),
    ("air.sandbox.warden.locks", _HERE / "locks.py"),
    ("air.sandbox.warden.mountapi", _HERE / "mountapi.py"),
    ("air.sandbox.warden.rootcopy", _HERE / "rootcopy.py"),
    ("air.sandbox.warden.netlink", _HERE / "netlink.py"),
    ("air.sandbox.warden.cellinit", _HERE / "cellinit.py"),
    ("air.sandbox.warden.cell", _HERE / "cell.py"),
    ("air.sandbox.warden.atimes", _HERE / "atimes.py"),
    ("air.sandbox.warden.dentries", _HERE / "dentries.py"),
    ("air.sandbox.warden.pages", _HERE / "pages.py"),
    ("air.sandbox.warden.procs", _HERE / "procs.py"),
    ("air.sandbox.warden.threadspawn", _HERE / "threadspawn.py"),
    ("air.sandbox.warden.restore", _HERE / "restore.py"),
    ("air.sandbox.warden.files", _HERE / "files.py"),
    ("air.sandbox.warden.zygote", _HERE / "zygote.py"),
    ("air.sandbox.warden.watch", _HERE / "watch.py"),
    ("air.sandbox.warden.snapshot", _HERE / "snapshot.py"),
    ("air.sandbox.warden.lower", _HERE / "lower.py"),
    ("air.sandbox.warden.shell", _HERE / "shell.py"),
    ("air.sandbox.warden.server", _HERE / "server.py"),
)
_LOADER = '''
import sys, types
for _name in ("air", "air.sandbox", "air.sandbox.warden"):
    _package = sys.modules[_name] = types.ModuleType(_name)
    _package.__path__ = []
class _OnlyTheBundle:  # the warden imports nothing of air that the bundle does not carry
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "air" or name.startswith("air."):
            raise ImportError("%s is not part of the warden's bundle" % name)
sys.meta_path.insert(0, _OnlyTheBundle)
_CODE = {}
def _load(name, source):
    module = sys.modules[name] = types.ModuleType(name)
    module.__file__ = "<air-warden:%s>" % name
    code = _CODE.get(name)
    exec(code if code is not None else compile(source, module.__file__, "exec"), module.__dict__)
    parent, _, leaf = name.rpartition(".")
    setattr(sys.modules[parent], leaf, module)
'''


ZYGOTE_MODULES = tuple(module for module in MODULES if module[0] in {
    "air.sandbox.warden.spans", "air.sandbox.warden.syscalls", "air.sandbox.warden.seccomp",
    "air.sandbox.warden.sysinfo", "air.sandbox.warden.hostview", "air.sandbox.warden.mountapi",
    "air.sandbox.warden.rootcopy", "air.sandbox.warden.netlink", "air.sandbox.warden.cellinit",
    "air.sandbox.warden.cell", "air.sandbox.warden.procs", "air.sandbox.warden.restore", "air.sandbox.warden.files",
    "air.sandbox.warden.zygote"})
"""A warm interpreter's program (zygote.py): what it needs to confine its children and lay down their files."""
_ZYGOTE = "sys.modules['air.sandbox.warden.zygote']"


PIN_MODULES = (("air.sandbox.warden.locks", _HERE / "locks.py"), ("air.sandbox.warden.pages", _HERE / "pages.py"),
               ("air.sandbox.warden.rootcopy", _HERE / "rootcopy.py"),
               ("air.sandbox.warden.pinner", _HERE / "pinner.py"))
"""A page-cache pin's program (pinner.py): small enough to travel as its container's command line."""


@functools.cache
def warden_program(precompiled: bool = False) -> bytes:
    """The warden's bundle (read once per process), carrying its zygotes' program; `precompiled` for one written to
    a file on this machine (see `bundle`)."""
    zygote = bundle(f"{_ZYGOTE}.run(*{_ZYGOTE}.serve(4, _air))", ZYGOTE_MODULES, precompiled=precompiled)
    return bundle(f"{_ZYGOTE}.PROGRAM = {zygote!r}\nsys.modules['air.sandbox.warden.server'].main()",
                  precompiled=precompiled)


def bundle(run: str = "sys.modules['air.sandbox.warden.server'].main()", modules=MODULES,
           precompiled: bool = False) -> bytes:
    """The warden (or another program of these modules) as one program for `python3 -I -S`: the loader, the
    modules, then `run`. `precompiled` adds the modules as this interpreter compiled them, which an interpreter
    whose bytecode is this one's (the same magic number: the images air builds) runs instead of compiling them
    again: 62 ms of CPU to load the warden instead of 81 (experiments.md, session 59). It more than doubles the
    program's size, so it is for a local file, not for a stream or a Kubernetes ConfigMap."""
    sources = [(name, path.read_text()) for name, path in modules]
    parts = [_LOADER]
    if precompiled:
        codes = {name: compile(source, f"<air-warden:{name}>", "exec", dont_inherit=True) for name, source in sources}
        parts.append(f"if getattr(sys.modules.get('_frozen_importlib_external'), 'MAGIC_NUMBER', None) == "
                     f"{importlib.util.MAGIC_NUMBER!r}:\n"
                     f"    import binascii, marshal\n"
                     f"    _CODE = marshal.loads(binascii.a2b_base64("
                     f"{binascii.b2a_base64(marshal.dumps(codes), newline=False)!r}))\n")
    parts += [f"_load({name!r}, {source!r})\n" for name, source in sources] + [run + "\n"]
    return "".join(parts).encode()
