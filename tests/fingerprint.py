"""Everything a sandbox shows the code that runs in it, as one JSON document: the oracle of the fresh-cells tests.

`PROBE` is a stdlib-only Python program run *as the agent* (or as code under evaluation) inside a sandbox. It
writes its fingerprint to the file named by its first argument (fp.json without one; a second argument `compact`
digests each read-only mount's records into one value):
- `files`: lstat of every path it can reach (every mount but /proc and /sys): type and mode, owner, size, blocks,
  links, inode, device, atime/mtime/ctime in ns, extended attributes with their values (ACLs among them), inode
  flags (`chattr`), link targets, and the content hash of readable files in writable mounts;
- `mounts`, `df`: the mount table (each mount named by its point and place in the stack there, devices by order
  of appearance) and statvfs of every mount;
- `net`: every file of /proc/net (sockets, TIME_WAIT included, SNMP and device counters);
- `ipc`: SysV objects; `pids`: the shell's `$$`, the probe's own pid and the pid namespace's last pid;
- `limits_in_use`: how many inotify instances the agent's uid can still open (a per-user kernel limit);
- `processes`, `status`, `env`, `uts`, `keys`, `rlimits`, `umask`, `cwd`;
- `host`: the host's kernel-wide counters as the sandbox reads them (/proc/stat, /proc/vmstat, /proc/meminfo,
  /proc/sys/fs/*, pressure, interrupts, disks, NUMA nodes): anything that moves there is a channel between sandboxes;
- `page_cache`: which pages of the image's 8 largest and 8 middling readable libraries the host has cached (read
  exactly, by major faults), 64 pages each;
- `dentries`: whether the kernel has cached the (missing) names `/usr/lib/air-fingerprint-dentry-0..63`, which an
  attack looks up (`DENTRY_NAMES`): their first lookups timed against names never looked up before and the same
  names looked up again (issue #47), or "none kept (tmpfs)" where the names' directory is a tmpfs, which keeps no
  negative dentry (timing one reads noise); `control`: the same judgement on names the probe itself has just looked
  up in the user's home, which keeps dentries while its cell lives (the image's copy keeps none, even within a cell),
  and must read "cached" (the probe sees dentries on this host, now).

Values that must differ between two sandboxes are normalised or named by the tests, never silently dropped here:
the agent's own uid reads "AGENT" (every sandbox has its own uid), device numbers and mount ids read as their
order of first appearance (the kernel hands out the lowest free ones, host-wide), mounts by where they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PROBE = r'''
DENTRY_TOP = "/usr/lib"
DENTRY_NAMES = ["%s/air-fingerprint-dentry-%d" % (DENTRY_TOP, i) for i in range(64)]  # what PLANT looks up
import array, ctypes, errno, fcntl, hashlib, json, os, pwd, resource, stat, sys
AGENT = os.getuid()
devs, mount_ids = {}, {}
def dev(d, name=None):  # a device is named by the first mount that has it, else by order of first appearance
    return devs.setdefault(d, name or "dev%d" % len(devs))
def who(u):
    return "AGENT" if u == AGENT else u
def read(path, limit=1 << 20):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError as exc:
        return "error %s" % errno.errorcode.get(exc.errno, exc.errno)

mounts, stacked = [], {}
rows = [line.split() for line in read("/proc/self/mountinfo").splitlines()]
for f in rows:  # a mount is named by its point and its place in the stack there (ids are the kernel's, host-wide)
    stacked[f[4]] = stacked.get(f[4], 0) + 1
    mount_ids[f[0]] = "%s#%d" % (f[4], stacked[f[4]])
for f in rows:
    dash = f.index("-")
    mounts.append({"name": mount_ids[f[0]], "parent": mount_ids.get(f[1], "outside"), "point": f[4],
                   "options": f[5], "fstype": f[dash + 1], "source": f[dash + 2],
                   "super": f[dash + 3].replace("id=%d" % AGENT, "id=AGENT"),
                   "root": f[3], "dev": dev(os.makedev(*map(int, f[2].split(":"))), mount_ids[f[0]])})
points = [m["point"] for m in mounts]
writable = {m["point"] for m in mounts if "rw" in m["options"].split(",")}
skip = ("/proc", "/sys")

def mount_of(path):
    return max((p for p in points if path == p or path.startswith(p.rstrip("/") + "/")), key=len)

FS_IOC_GETFLAGS = 0x80086601
def flags(path, st):
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return "error %s" % errno.errorcode.get(exc.errno, exc.errno)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        return int.from_bytes(buf[:4], "little")
    except OSError as exc:
        return "error %s" % errno.errorcode.get(exc.errno, exc.errno)
    finally:
        os.close(fd)

def xattrs(path):
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError as exc:
        return "error %s" % errno.errorcode.get(exc.errno, exc.errno)
    out = {}
    for name in names:
        try:
            out[name] = os.getxattr(path, name, follow_symlinks=False).hex()
        except OSError as exc:
            out[name] = "error %s" % errno.errorcode.get(exc.errno, exc.errno)
    return out

def digest(path, st):
    if not stat.S_ISREG(st.st_mode) or mount_of(path) not in writable or st.st_size > 16 << 20:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:20]
    except OSError as exc:
        return "error %s" % errno.errorcode.get(exc.errno, exc.errno)

files = {}
def record(path):
    try:
        st = os.lstat(path)
    except OSError as exc:
        files[path] = "error %s" % errno.errorcode.get(exc.errno, exc.errno)
        return None
    files[path] = [oct(st.st_mode), who(st.st_uid), who(st.st_gid), st.st_size, st.st_blocks, st.st_nlink,
                   st.st_ino, dev(st.st_dev), st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, xattrs(path),
                   flags(path, st), os.readlink(path) if stat.S_ISLNK(st.st_mode) else None, digest(path, st)]
    return st

pending = ["/"]
while pending:
    path = pending.pop()
    st = record(path)
    if st is None or not stat.S_ISDIR(st.st_mode):
        continue
    try:
        names = sorted(os.listdir(path), reverse=True)
    except OSError as exc:
        files[path].append("unlistable %s" % errno.errorcode.get(exc.errno, exc.errno))
        continue
    for name in names:
        child = os.path.join(path, name)
        if child not in skip:
            pending.append(child)

if len(sys.argv) > 2 and sys.argv[2] == "compact":  # big read-only mounts (the image) as one digest each
    by_mount = {}
    for path in sorted(files):
        by_mount.setdefault(mount_of(path), []).append(path)
    for point, paths in by_mount.items():
        if point not in writable and len(paths) > 1000:
            digests = {}  # one per directory two levels down (/usr/lib): small, and still says where it differs
            for path in paths:
                if path.count("/") > 2:
                    group = "/".join(path.split("/")[:3])
                    digests.setdefault(group, hashlib.sha256()).update(json.dumps([path, files.pop(path)]).encode())
            for group, digest in digests.items():
                files[group + "/*"] = digest.hexdigest()

df = {}
for p in points:
    try:
        v = os.statvfs(p)
        df[p] = [v.f_bsize, v.f_blocks, v.f_bfree, v.f_bavail, v.f_files, v.f_ffree, v.f_flag]
    except OSError as exc:
        df[p] = "error %s" % errno.errorcode.get(exc.errno, exc.errno)

net = {}
def net_files(d):
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if os.path.isdir(p):
            net_files(p)
        else:
            net[p] = read(p)
net_files("/proc/self/net")

libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        break
    held.append(fd)
for fd in held:
    os.close(fd)

processes = []
for p in sorted(os.listdir("/proc"), key=lambda s: (len(s), s)):
    if p.isdigit() and int(p) not in (os.getpid(), os.getppid()):
        try:
            processes.append([int(p), who(os.stat("/proc/" + p).st_uid), read("/proc/%s/cmdline" % p, 200)])
        except OSError:
            pass

status = {}
for line in read("/proc/self/status").splitlines():
    key, _, value = line.partition(":")
    if key in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
               "Seccomp_filters", "NSpid", "NSpgid", "NSsid"):
        status[key] = " ".join(str(who(int(v))) if v.isdigit() and key in ("Uid", "Gid", "Groups") else v
                               for v in value.split())
host = {}  # the host's kernel-wide counters, as the sandbox can read them
HOST_FILES = ["/proc/stat", "/proc/vmstat", "/proc/meminfo", "/proc/loadavg", "/proc/diskstats", "/proc/interrupts",
              "/proc/softirqs", "/proc/buddyinfo", "/proc/zoneinfo", "/proc/swaps"]
for d in ("/proc/sys/fs", "/proc/pressure", "/sys/devices/system/node"):
    for top, dirs, names in os.walk(d):
        dirs[:] = sorted(x for x in dirs if not x.startswith("memory"))  # memory blocks: hotplug state, not counters
        HOST_FILES += [os.path.join(top, n) for n in sorted(names)
                       if d != "/sys/devices/system/node" or n in ("meminfo", "vmstat", "numastat")]
for path in HOST_FILES:
    if os.path.isfile(path):
        host[path] = read(path)

def largest(n):  # the image's biggest readable libraries, and as many small ones: the same files in every sandbox
    found = []
    for top in ("/usr/lib", "/usr/local/lib", "/opt"):
        for d, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                p = os.path.join(d, name)
                try:
                    st = os.stat(p, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size and os.access(p, os.R_OK):
                    found.append((st.st_size, p))
    found.sort(key=lambda f: (-f[0], f[1]))
    return [p for _, p in found[:n] + found[len(found) // 2:len(found) // 2 + n]]

import mmap
def read_bytes():
    for line in read("/proc/self/io").splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0
page_cache = {}  # which pages of them the host has cached: touching an uncached page costs a major fault
for path in largest(8):
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)
    pages = size // mmap.PAGESIZE + 1
    bits = []
    for page in range(0, pages, max(1, pages // 64)):
        before, read_before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt, read_bytes()
        m[page * mmap.PAGESIZE]
        # A fault that waited for another's lock on the page counts as major too: a miss also reads the disk.
        missed = resource.getrusage(resource.RUSAGE_SELF).ru_majflt > before and read_bytes() > read_before
        bits.append("0" if missed else "1")
    m.close()
    os.close(fd)
    page_cache[path] = "".join(bits)

import time
def lookup_ns(path):
    t0 = time.perf_counter_ns()
    try:
        os.stat(path)
    except OSError:
        pass
    return time.perf_counter_ns() - t0
def median(xs):
    return sorted(xs)[len(xs) // 2]
token = os.urandom(6).hex()
def fstype(path):  # the filesystem of the mount on top at path's mount point
    point = mount_of(path)
    return [m["fstype"] for m in mounts if m["point"] == point][-1]
def looks_cached(names, kind, top=DENTRY_TOP, looked_up=False):  # first lookups of `names` against fresh names'
    if fstype(top) == "tmpfs":  # keeps no negative dentry (its d_delete drops each at once): timing it reads noise
        return "none kept (tmpfs)"  # as often as not, and a cell's root copy is one (warden/rootcopy.py)
    fresh = ["%s/airfp-cal-%s-%s-%d" % (top, kind, token, i) for i in range(len(names))]  # first and second lookups
    for i in range(200):
        lookup_ns("%s/airfp-warm-%s-%s-%d" % (top, kind, token, i))
    if looked_up:  # the control's own lookups, right before they are timed: the shortest window for another cell's
        for p in names:  # end (which forgets names host-wide) to fall between them
            lookup_ns(p)
    first = [lookup_ns(p) for p in names]
    uncached = [lookup_ns(p) for p in fresh]
    cached = [lookup_ns(p) for p in fresh]
    if median(uncached) - median(cached) < median(uncached) / 4:  # a directory that caches no lookup (another
        return "uncached"  # filesystem than tmpfs): every name is as new as the fresh ones, whatever the noise says
    return "cached" if median(first) < (median(uncached) + median(cached)) / 2 else "uncached"
try:  # the user's home (not $HOME: an evaluation's is its tmpfs work dir, which keeps no negative dentry): an
    CONTROL_TOP = pwd.getpwuid(os.getuid()).pw_dir  # overlay whose own dentries live as long as the cell
except KeyError:  # a uid the image does not name (enroot's node user)
    CONTROL_TOP = os.path.expanduser("~")
def control():  # names just looked up must look cached: up to five tries, new names each (a busy machine's noise can
    # hide them), where the planted names can be judged only once; no more, as noise alone can read "cached" on a
    # directory that keeps nothing (an evaluation's tmpfs $HOME did, until the control moved to the home)
    for attempt in range(5):
        names = ["%s/airfp-control-%s-%d-%d" % (CONTROL_TOP, token, attempt, i) for i in range(64)]
        if looks_cached(names, "control%d" % attempt, CONTROL_TOP, looked_up=True) == "cached":
            return "cached"
    return "uncached"
dentries = {DENTRY_TOP: looks_cached(DENTRY_NAMES, "planted"), "control": control()}

mask = os.umask(0)
os.umask(mask)
out = {"host": host, "page_cache": page_cache, "dentries": dentries,
    "pids": {"shell": os.getppid(), "probe": os.getpid(), "last": read("/proc/sys/kernel/ns_last_pid").strip(),
             "loadavg_last": read("/proc/loadavg").split()[-1]},
    "files": files, "mounts": mounts, "df": df, "net": net,
    "ipc": {k: read("/proc/sysvipc/" + k) for k in ("shm", "sem", "msg")},
    "limits_in_use": {"inotify_instances_left": len(held)},
    "processes": processes, "status": status,
    "env": {k: v for k, v in os.environ.items() if k != "AIR_COMMAND_ID"},
    "uts": list(os.uname()), "keys": read("/proc/key-users"),
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
    "umask": mask, "cwd": os.getcwd(),
}
with open(sys.argv[1] if len(sys.argv) > 1 else "fp.json", "w") as f:
    json.dump(out, f)
'''


def probe_command(out: str, compact: bool = False) -> str:
    """A shell command that runs the probe (as whoever runs the shell) and writes the fingerprint to `out`;
    `compact`: the files of each read-only mount as one digest (the fingerprint then fits a metrics file)."""
    return f"python3 - {out}{' compact' if compact else ''} <<'AIR_PROBE_EOF'\n{PROBE}\nAIR_PROBE_EOF"


# Socket tables of /proc/net: the columns that are kernel-wide numbers, not the socket's state (its inode, from
# the counter every pseudo-filesystem of the host shares; its kernel address), by table: token positions per row.
KERNEL_WIDE_COLUMNS = {"tcp": (9, 11), "tcp6": (9, 11), "udp": (9, 11), "udp6": (9, 11), "raw": (9, 11),
                       "raw6": (9, 11), "udplite": (9, 11), "udplite6": (9, 11), "unix": (0, 6), "netlink": (0, 9),
                       "packet": (0, 8), "protocols": (3,)}  # protocols: the memory each protocol holds, host-wide


def _sockets(name: str, text: str) -> str:
    """A socket table with its kernel-wide columns read as "*" (the rows and every other column stay); in
    sockstat, the counts of TCP sockets allocated and orphaned and of socket memory, which are the host's, not the
    namespace's (the kernel's tcp_orphan_count is one counter for the host)."""
    if name in ("sockstat", "sockstat6"):
        return re.sub(r"\b(alloc|orphan|mem) \d+", r"\1 *", text)
    columns = KERNEL_WIDE_COLUMNS.get(name)
    if columns is None:
        return text
    lines = text.splitlines()
    rows = []
    for row in lines[1:]:
        tokens = row.split()
        for i in columns:
            if i < len(tokens):
                tokens[i] = "*"
        rows.append(" ".join(tokens))
    return "\n".join(lines[:1] + rows)


def flatten(fp: dict) -> dict[str, object]:
    """The fingerprint as {key path: value}, so two can be compared field by field."""
    flat: dict[str, object] = {}
    for section, value in fp.items():
        if section == "net":
            for path, text in value.items():
                flat[f"net:{path}"] = _sockets(path.rsplit("/", 1)[-1], text)
            continue
        if section == "files":
            for path, rec in value.items():
                if isinstance(rec, str):
                    flat[f"files:{path}"] = rec
                    continue
                names = ("mode", "uid", "gid", "size", "blocks", "nlink", "ino", "dev", "atime", "mtime", "ctime",
                         "xattrs", "flags", "link", "content", "listing")
                for name, field in zip(names, rec):
                    flat[f"files:{path}:{name}"] = field
        elif section == "mounts":
            for m in value:
                for name, field in m.items():
                    flat[f"mounts:{m['name']}:{name}"] = field
        elif isinstance(value, dict):
            for key, field in value.items():
                flat[f"{section}:{key}"] = field
        else:
            flat[section] = value
    return flat


def differences(a: dict, b: dict, allowed: Iterable[str] = ()) -> list[str]:
    """Every field where fingerprints a and b differ, except those a pattern of `allowed` names (regexes matched
    against the whole key, e.g. `files:/tmp:(atime|mtime|ctime)`)."""
    patterns = [re.compile(p) for p in allowed]
    fa, fb = flatten(a), flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key, "<absent>") != fb.get(key, "<absent>") and not any(p.fullmatch(key) for p in patterns):
            out.append(f"{key}: {str(fa.get(key, '<absent>'))[:300]!s} != {str(fb.get(key, '<absent>'))[:300]!s}")
    return out


AGENT_STATE = [r"files:(/home/agent|/tmp|/var/tmp|/dev/shm)(/.*)?:.*", r"df:(/home/agent|/tmp|/var/tmp|/dev/shm)",
               r"env:.*", r"cwd"]
"""What the agent can change that a snapshot keeps (air/sandbox/warden/snapshot.py's places, the shell's exports and
cwd): a fork's branch must equal its parent there, and a never-used sandbox everywhere else."""
