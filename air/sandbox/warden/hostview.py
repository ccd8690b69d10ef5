"""What a cell shows of the host's kernel-wide counters: their files, with every counter at 0. Runs in the warden
(stdlib only): `snapshot` and `prepare` once when the warden starts, `install` in every new cell (cell.py).

Why: /proc and /sys show counters of the whole host (forks, context switches, free memory, page-cache size,
dentries, open files, pseudo-terminals, pressure), and code can move them: fork a thousand times, allocate a
gigabyte, open files. Any other sandbox that reads them, now or at its next lease, reads what was written (issue
#38). A cell's copies hold still: the same text in every cell of every sandbox of the host, in the kernel's own
fields (every number after a line's label zeroed, one space between fields: the kernel's padding would say how wide
the real numbers were), so programs that parse them still can. Memory is the exception that keeps a meaning:
MemTotal, MemFree and MemAvailable say the sandbox's memory limit, which is what a program sizing itself should go
by. Directories of settings with counters among them (/proc/sys/fs, /sys/devices/system/node) are shown as copies,
settings as they were and counters zeroed.

The disks' statistics (/proc/diskstats, and /sys/block/*/stat and inflight with their partitions') are copies too: a
cell has no disk to write and every page it can read is pinned, and the filter refuses O_DIRECT (seccomp.py), but
a read that reaches the host's disk from any other sandbox would show there (issue #75).

Left as they are, and measured in SECURITY.md: what says how busy the host's CPUs are (/proc/uptime's idle time,
cpuidle, cpufreq and per-interrupt statistics), which a program learns anyway by timing its own loops; /proc/net's
sockstat, sockstat6 and protocols, whose socket counts and memory are the host's (TCP's alloc, orphan and mem, UDP's
mem) though the files are each network namespace's: /proc/net is /proc/self/net, a directory of every process's own,
so no bind covers it (SECURITY.md). sysinfo(2), the system call, is answered from this view (sysinfo.py).

The copies are made once, in a small read-only tmpfs of the warden's; a cell binds them over the real files (about
20 binds) and then loses the tmpfs from its own mounts.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple, Union

PROC_FILES = ("stat", "meminfo", "vmstat", "loadavg", "buddyinfo", "zoneinfo", "diskstats", "interrupts", "softirqs",
              "schedstat", "swaps", "sys/kernel/pty/nr")
UNREAD = ("/proc/pagetypeinfo", "/proc/locks", "/proc/key-users")
"""Files shown empty, never read. Reading /proc/pagetypeinfo walks every page block of the host's memory with the
zone's lock held (65 ms of every warden's start on a 24 GB host, and more with more memory, while the host's
allocations wait: experiments.md, session 60); it is root's alone, and no program of a task reads it. /proc/locks
lists only the locks of processes a cell can see, but numbers its lines over every lock of the host: a cell's own lock
on line 8 says 7 others are held, which another sandbox moves by taking locks (issue #75); only `lslocks` reads it.
/proc/key-users lists every user of the host that holds keys, with live counts of its keys and their bytes (issue 86):
root's move with every container the host starts (runc gives each a session keyring); no program of a task reads
it, and a cell can make no key (the filter refuses the keyring calls)."""
TREES = ("/proc/sys/fs", "/proc/pressure", "/sys/devices/system/node", "/sys/devices/virtual/bdi",
         "/sys/kernel/mm/ksm", "/sys/kernel/mm/transparent_hugepage", "/sys/kernel/mm/hugepages")
"""Directories shown as copies (settings as they are, counters zeroed: COUNTER). The whole transparent-huge-page
tree: its per-size `stats/` count the host's huge-page faults, splits and swaps, which any cell moves with one
madvise(MADV_HUGEPAGE) and a write (issue #62: 244 of 256 bits between two sandboxes at once)."""
COUNTER = re.compile(r"/proc/pressure/|/bdi/|/ksm/|/khugepaged/|/quota/|/transparent_hugepage/[^/]+/stats/|"
                     r"/(aio-nr|dentry-state|file-nr|inode-nr|inode-state|meminfo|numastat|vmstat|"
                     r"(free|surplus|resv)_hugepages)$")
BLOCK_FILES = ("stat", "inflight")
"""Each disk's and partition's statistics in sysfs (a row of numbers, no label). Disks of size 0 (loop devices with
nothing attached) do no I/O and are left out: every copy is a bind in every cell."""
EMPTY = ("/proc/fs",)
"""Directories shown empty: per-filesystem statistics that no program of a task needs."""
KEEP = {"/proc/sys/fs/file-nr": {2}, "/proc/sys/fs/dentry-state": {2}}
"""Fields that are limits, not counters (the most open files; the age limit of dentries): kept."""
_NUMBER = re.compile(rb"(?<![\w.])\d+(\.\d+)?(?![\w.])")
_MEMORY = re.compile(rb"^((?:Node \d+ )?(MemTotal|MemFree|MemAvailable): )\d+", re.MULTILINE)
Entry = Union[bytes, None, Tuple[str, str]]
"""A file's text, a directory (None), or a link ("link", its target)."""


class HostView:
    """What a cell shows instead of the host's counters: {path in the cell: {relative path: Entry}}; a file's
    relative path is "" (the path itself)."""

    def __init__(self, entries: Dict[str, Dict[str, Entry]]):
        self.entries = entries


def zeroed(path: str, text: bytes, memory_kb: Optional[int] = None) -> bytes:
    """The counter file's text with every number after each line's first field at 0 (but its `KEEP` fields, the
    boot time of /proc/stat, and the memory lines, which say `memory_kb`)."""
    keep = KEEP.get(path, set())
    # A row of values, or labelled rows
    values = path == "/proc/loadavg" or path.startswith("/proc/sys/") or path.rsplit("/", 1)[-1] in BLOCK_FILES
    lines = []
    for line in text.split(b"\n"):
        if line.startswith(b"btime ") or line.startswith(b"Hugepagesize:"):
            lines.append(line)
            continue
        fields = line.split()
        first = 0 if values or len(fields) == 1 else 2 if line.startswith(b"Node ") else 1
        for i, part in enumerate(fields):
            if i >= first and i not in keep:
                fields[i] = _NUMBER.sub(lambda m: b"0.00" if m.group(1) else b"0", part)
        lines.append(b" ".join(fields))
    out = b"\n".join(lines)
    if memory_kb is not None and path.endswith("meminfo"):
        out = _MEMORY.sub(lambda m: m.group(1) + str(memory_kb).encode(), out)
    return out


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _copy(top: str, memory_kb: Optional[int]) -> Dict[str, Entry]:
    """A directory as its copy: directories, links, and every readable file's text (a counter's zeroed)."""
    out: Dict[str, Entry] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        try:
            names = sorted(os.listdir(os.path.join(top, rel)))
        except OSError:
            continue
        for name in names:
            sub = os.path.join(rel, name)
            path = os.path.join(top, sub)
            if os.path.islink(path):
                out[sub] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[sub] = None
                pending.append(sub)
            else:
                text = _read(path)
                if text is not None:
                    out[sub] = zeroed(path, text, memory_kb) if COUNTER.search(path) else text
    return out


def block_statistics() -> List[str]:
    """The real paths (what /sys/block/* links to) of every disk's and partition's statistics files."""
    out = set()
    for disk in glob.glob("/sys/block/*"):
        real = os.path.realpath(disk)
        if (_read(real + "/size") or b"0").strip() in (b"0", b""):
            continue
        for top in [real] + [os.path.dirname(p) for p in glob.glob(real + "/*/partition")]:
            out.update(p for p in (top + "/" + name for name in BLOCK_FILES) if os.path.isfile(p))
    return sorted(out)


def snapshot(memory_limit: Optional[int]) -> HostView:
    """The view, made once from the files' current text (their format and which of them exist); memory_limit: the
    sandbox's memory limit in bytes (None: the host's)."""
    real = _read("/proc/meminfo") or b""
    total = re.search(rb"MemTotal:\s+(\d+)", real)
    memory_kb = int(total.group(1)) if total else None
    if memory_limit and memory_kb:
        memory_kb = min(memory_kb, memory_limit // 1024)
    entries: Dict[str, Dict[str, Entry]] = {}
    for name in PROC_FILES:
        path = "/proc/" + name
        if os.path.isfile(path):  # an unreadable one (root's alone) is shown empty
            entries[path] = {"": zeroed(path, _read(path) or b"", memory_kb)}
    for path in block_statistics():
        entries[path] = {"": zeroed(path, _read(path) or b"")}
    for path in UNREAD:
        if os.path.isfile(path):
            entries[path] = {"": b""}
    for top in TREES:
        for path in sorted(glob.glob(top)):
            if os.path.isdir(path):
                entries[path] = _copy(path, memory_kb)
    for path in EMPTY:
        if os.path.isdir(path):
            entries[path] = {}
    return HostView(entries)


def prepare(view: HostView, root: str, mount, fill=None) -> List[Tuple[str, str]]:
    """In the warden, once: the copies in a small tmpfs at `root`, read-only once written (its superblock: every bind
    of it is too); the binds a cell makes of them, (source, target). `fill(root)`, if given, writes more of what
    every cell binds (cell.py's cgroup limits) before the tmpfs is made read-only, and returns those binds."""
    ms_rdonly, ms_nosuid, ms_nodev, ms_noexec, ms_remount = 0x1, 0x2, 0x4, 0x8, 0x20
    flags = ms_nosuid | ms_nodev | ms_noexec
    mount("air-hostview", root, "tmpfs", flags, "size=16m,mode=700")
    binds = []
    for i, (target, tree) in enumerate(sorted(view.entries.items())):
        source = "%s/%d" % (root, i)
        if "" in tree:
            _write(source, tree[""])
        else:
            os.mkdir(source, 0o555)
            for rel, entry in sorted(tree.items()):
                path = os.path.join(source, rel)
                if entry is None:
                    os.mkdir(path, 0o555)
                elif isinstance(entry, tuple):
                    os.symlink(entry[1], path)
                else:
                    _write(path, entry)
        binds.append((source, target))
    if fill is not None:
        binds.extend(fill(root))
    mount(None, root, None, ms_remount | ms_rdonly | flags)
    return binds


def _write(path: str, text: bytes) -> None:
    with open(path, "wb") as f:
        f.write(text)
    os.chmod(path, 0o444)


def install(binds: List[Tuple[str, str]], root: str, mount, detach) -> None:
    """In a new cell, with /proc mounted: the copies over the real files, then the copies' own tmpfs gone from the
    cell's mounts. `mount(source, target, fstype, flags, data)` and `detach(target)` are cell.py's."""
    ms_bind = 0x1000
    for source, target in binds:
        mount(source, target, None, ms_bind)
    detach(root)
