"""What a cell shows of the host's kernel-wide counters: their files, with every counter at 0. Runs in the warden
(stdlib only): `snapshot` once when the warden starts, `install` in every new cell (cell.py).

Why: /proc and /sys show counters of the whole host (CPU time, context switches, forks, free memory, page-cache
size, dentries, open files, interrupts, disk I/O, pressure), and code can move them: fork a thousand times, allocate
a gigabyte, send packets over loopback. Any other sandbox that reads them, now or at its next lease, reads what was
written (issue #38). A cell's copies hold still: the same text in every cell of every sandbox of the host, in the
kernel's own fields (every number after a line's label zeroed, one space between fields: the kernel's padding would
say how wide the real numbers were), so programs that parse them still can. Memory is the exception that keeps a
meaning: MemTotal, MemFree and MemAvailable say the sandbox's memory limit, which is what a
program sizing itself should go by. What is left readable and moving (sysinfo(2), /proc/uptime's idle time, the CPU
itself) is measured in SECURITY.md.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

PROC_FILES = ("stat", "meminfo", "vmstat", "loadavg", "buddyinfo", "zoneinfo", "pagetypeinfo", "diskstats",
              "interrupts", "softirqs", "schedstat", "swaps", "sys/fs/aio-nr", "sys/fs/dentry-state", "sys/fs/file-nr",
              "sys/fs/inode-nr", "sys/fs/inode-state")
PROC_DIRS = ("pressure", "sys/fs/quota")
"""Directories of counters: shown with each file zeroed."""
SYS_FILES = ("devices/system/node/node*/meminfo", "devices/system/node/node*/vmstat",
             "devices/system/node/node*/numastat", "block/*/stat", "block/*/inflight", "block/*/*/stat",
             "block/*/*/inflight")
SYS_DIRS = ("devices/virtual/bdi", "fs/ext4", "fs/xfs", "fs/btrfs", "kernel/irq", "devices/system/cpu/cpu*/cpuidle",
            "devices/system/cpu/cpu*/cpufreq", "kernel/mm/ksm", "kernel/mm/transparent_hugepage/khugepaged",
            "kernel/mm/hugepages", "devices/system/node/node*/hugepages")
EMPTY = ("/proc/fs", "/proc/irq")
"""Directories shown empty: per-filesystem and per-interrupt statistics that no program of a task needs."""
KEEP = {"/proc/sys/fs/file-nr": {2}, "/proc/sys/fs/dentry-state": {2}}
"""Fields that are limits, not counters (the most open files; the age limit of dentries): kept."""
_NUMBER = re.compile(rb"(?<![\w.])\d+(\.\d+)?(?![\w.])")
_MEMORY = re.compile(rb"^((?:Node \d+ )?(MemTotal|MemFree|MemAvailable):\s+)\d+", re.MULTILINE)


class HostView:
    """The counter files a cell shows: {path: text}, directories of them {path: {name: text}}, empty directories."""

    def __init__(self, files: Dict[str, bytes], dirs: Dict[str, Dict[str, bytes]], empty: List[str]):
        self.files, self.dirs, self.empty = files, dirs, empty


def zeroed(path: str, text: bytes, memory_kb: Optional[int] = None) -> bytes:
    """The counter file's text with every number after each line's first field at 0 (but its `KEEP` fields, the
    boot time of /proc/stat, and the memory lines, which say `memory_kb`)."""
    keep = KEEP.get(path, set())
    first = 0 if path == "/proc/loadavg" or path.startswith("/proc/sys/") else 1  # a value, or a labelled row
    lines = []
    for line in text.split(b"\n"):
        if line.startswith(b"btime ") or line.startswith(b"Hugepagesize:"):
            lines.append(line)
            continue
        fields = line.split()
        for i, part in enumerate(fields):
            if i >= first and i not in keep:
                fields[i] = _NUMBER.sub(lambda m: b"0.00" if m.group(1) else b"0", part)
        # One space between fields: the kernel pads columns to the width of the numbers it had, which would say them.
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


def snapshot(memory_limit: Optional[int]) -> HostView:
    """The view, made once from the files' current text (their format and which of them exist); memory_limit: the
    sandbox's memory limit in bytes (None: the host's)."""
    real = _read("/proc/meminfo") or b""
    total = re.search(rb"MemTotal:\s+(\d+)", real)
    memory_kb = int(total.group(1)) if total else None
    if memory_limit and memory_kb:
        memory_kb = min(memory_kb, memory_limit // 1024)
    files: Dict[str, bytes] = {}
    candidates = ["/proc/" + name for name in PROC_FILES]
    for pattern in SYS_FILES:
        candidates += sorted(glob.glob("/sys/" + pattern))
    for path in candidates:
        text = _read(path) if os.path.isfile(path) else None
        if text is not None or os.path.exists(path):  # an unreadable one (root's alone) is shown empty
            files[path] = zeroed(path, text or b"", memory_kb)
    dirs: Dict[str, Dict[str, bytes]] = {}
    for name in PROC_DIRS:
        path = "/proc/" + name
        if os.path.isdir(path):
            dirs[path] = {leaf: zeroed(path + "/" + leaf, _read(path + "/" + leaf) or b"")
                          for leaf in sorted(os.listdir(path)) if os.path.isfile(path + "/" + leaf)}
    empty = [path for path in EMPTY if os.path.isdir(path)]
    for pattern in SYS_DIRS:
        empty += [path for path in sorted(glob.glob("/sys/" + pattern)) if os.path.isdir(path)]
    return HostView(files, dirs, empty)


def install(view: HostView, staging: str, mount, umount) -> None:
    """In a new cell, with /proc mounted: put the view over the real files, from a small tmpfs at `staging` that is
    read-only (its superblock: every bind of it is) and detached once bound. `mount(source, target, fstype, flags,
    data)` and `umount(target)` are cell.py's."""
    ms_rdonly, ms_nosuid, ms_nodev, ms_noexec, ms_remount, ms_bind = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
    flags = ms_nosuid | ms_nodev | ms_noexec
    mount("air-hostview", staging, "tmpfs", flags, "size=4m,mode=755")
    sources: List[Tuple[str, str]] = []
    for i, (path, text) in enumerate(sorted(view.files.items())):
        source = "%s/f%d" % (staging, i)
        with open(source, "wb") as f:
            f.write(text)
        os.chmod(source, 0o444)
        sources.append((source, path))
    for i, (path, leaves) in enumerate(sorted(view.dirs.items())):
        source = "%s/d%d" % (staging, i)
        os.mkdir(source, 0o555)
        for leaf, text in leaves.items():
            with open(source + "/" + leaf, "wb") as f:
                f.write(text)
            os.chmod(source + "/" + leaf, 0o444)
        sources.append((source, path))
    os.mkdir(staging + "/empty", 0o555)
    sources += [(staging + "/empty", path) for path in view.empty]
    mount(None, staging, None, ms_remount | ms_rdonly | flags)
    for source, target in sources:
        mount(source, target, None, ms_bind)
    umount(staging)
