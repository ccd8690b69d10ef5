"""How a non-root user starts a container of a squashfs image on this machine: the launcher, a small interface, and
its one implementation that ran here, enroot (NVIDIA's runtime of Slurm clusters).

Every launcher runs its container inside one user namespace that the user makes with its subordinate uids
(`unshare --user --map-root-user --map-auto`, which runs the setuid `newuidmap` on /etc/subuid's range): uid 0 there is
the user, uids 1 to N its subordinate uids. The warden is root of that namespace (every capability, over it only) and
the agent gets a uid of its own there, which is a host uid no other process has: the warden's files and processes are
the user's, out of the agent's reach as on Docker. Without subordinate uids (`Userns.check` says so) there is no
second uid to give the agent, and the backend refuses to start (docs/hpc.md says why it does not fall back).

Enroot runs as that namespace's root (ENROOT_ALLOW_SUPERUSER: it then makes no user namespace of its own, which would
map a single uid) with a configuration of air's own (`sysconf`): a new pid namespace and its own procfs (not the
host's /proc, which enroot binds by default), no host home, no host passwd (enroot's shadow hook), no NVIDIA hook
(air binds a GPU's nodes itself: pool.py), a /dev of Docker's nodes alone (not the node's whole /dev).
Apptainer or Charliecloud would be another `Launcher`: none ships here that has not run here (docs/hpc.md).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from air.sandbox.layout import AIR_DIR

USERNS = ["unshare", "--user", "--map-root-user", "--map-auto", "--"]
"""The user namespace every launcher's commands run in (util-linux 2.38 and newer: `--map-auto`)."""
UID_SPAN_MIN = 65536
"""Subordinate uids a user needs: the images' own owners (up to 65534, nobody) keep their uids in the namespace."""


class Launcher(Protocol):
    """What the enroot backend's pool asks of a runtime: a container's root from an image, its start with the
    warden as its main process, its removal. Argv lists only: the pool runs them (asyncio subprocesses)."""

    name: str

    def version(self) -> str | None:
        """The runtime's version, or None where it is not installed."""
        ...

    def environ(self) -> dict[str, str]:
        """The variables its commands need (its folders), over the caller's environment."""
        ...

    def create(self, image: Path, name: str) -> list[str]:
        """A container root called `name` from the squashfs `image` (owners kept, in the user namespace)."""
        ...

    def start(self, name: str, argv: list[str], *, binds: list[tuple[str, str, bool]], env: dict[str, str],
              layers: tuple[str, str, str] | None = None, devices: tuple[str, ...] = ()) -> list[str]:
        """Run argv as the container's main process, with host folders bound (source, target, read-only) and env
        set. `layers` (a shared image root, this container's upper and work folders): its root is an overlay of them,
        mounted in the launcher's own mount namespace, instead of a root of its own. `devices`: the node's device
        nodes (a GPU's) to add to the container's /dev, under their names; it has no other but Docker's set."""
        ...

    def remove(self, name: str) -> list[str]: ...

    def names(self) -> list[str]:
        """The container roots this user has (for the sweep of dead runs' leftovers)."""
        ...


MOUNTS = """\
proc /proc proc x-create=dir,rw,nosuid,nodev,noexec 0 -1
/sys /sys none x-create=dir,rbind,ro,nosuid,nodev,noexec,rslave 0 -1
tmpfs /dev tmpfs x-create=dir,rw,nosuid,noexec,mode=755 0 -1
/dev/null /dev/null none x-create=file,bind,rw,nosuid,noexec 0 -1
/dev/zero /dev/zero none x-create=file,bind,rw,nosuid,noexec 0 -1
/dev/full /dev/full none x-create=file,bind,rw,nosuid,noexec 0 -1
/dev/random /dev/random none x-create=file,bind,rw,nosuid,noexec 0 -1
/dev/urandom /dev/urandom none x-create=file,bind,rw,nosuid,noexec 0 -1
/dev/tty /dev/tty none x-create=file,bind,rw,nosuid,noexec 0 -1
devpts /dev/pts devpts x-create=dir,rw,nosuid,noexec,newinstance,ptmxmode=0666,mode=620 0 -1
tmpfs /dev/shm tmpfs x-create=dir,rw,nosuid,nodev,mode=1777,size=64m 0 -1
tmpfs /tmp tmpfs x-create=dir,rw,nosuid,nodev,mode=1777 0 -1
tmpfs /var/tmp tmpfs x-create=dir,rw,nosuid,nodev,mode=1777 0 -1
"""
"""air's enroot mounts (its own, not enroot's mounts.d): a procfs of the container's own pid namespace, the host's
/sys read-only, a new /dev holding Docker's set of nodes (the node's own bound: a user namespace makes none) and no
other, so none of the node's GPUs but those `start` binds (`devices`), and new /tmp, /var/tmp and /dev/shm (Docker's
tmpfs mounts). No /etc/hosts, resolv.conf or home of the host's."""
DEV_LINKS = """\
#!/bin/sh
# air: /dev's links, as Docker makes them (an fstab makes no link)
set -e
ln -s /proc/self/fd "$ENROOT_ROOTFS/dev/fd"
ln -s /dev/pts/ptmx "$ENROOT_ROOTFS/dev/ptmx"
ln -s /proc/self/fd/0 "$ENROOT_ROOTFS/dev/stdin"
ln -s /proc/self/fd/1 "$ENROOT_ROOTFS/dev/stdout"
ln -s /proc/self/fd/2 "$ENROOT_ROOTFS/dev/stderr"
"""
"""air's one enroot hook (hooks.d; none of enroot's own, the NVIDIA one included: air binds a GPU's nodes itself)."""


@dataclass
class Enroot:
    """enroot 4.x (scripts/enroot-build.sh builds it), as the user namespace's root, with air's configuration."""

    root: Path
    """This user's enroot folders (data, cache, runtime, its configuration): under air's runtime folder."""
    name: str = "enroot"

    def version(self) -> str | None:
        path = shutil.which("enroot")
        if path is None:
            return None
        import subprocess

        try:
            out = subprocess.run([path, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None

    def sysconf(self) -> Path:
        """air's enroot configuration folder (written once, the same every time): its mounts and its one hook."""
        conf = self.root / "conf"
        for sub in ("mounts.d", "hooks.d", "environ.d", "enroot.conf.d"):
            (conf / sub).mkdir(parents=True, exist_ok=True)
        (conf / "enroot.conf").touch()
        for path, text in ((conf / "mounts.d" / "10-air.fstab", MOUNTS),
                           (conf / "hooks.d" / "10-air-dev.sh", DEV_LINKS)):
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            path.chmod(0o755 if path.suffix == ".sh" else 0o644)
        return conf

    def environ(self) -> dict[str, str]:
        folders = {"ENROOT_DATA_PATH": "data", "ENROOT_CACHE_PATH": "cache", "ENROOT_RUNTIME_PATH": "run",
                   "ENROOT_TEMP_PATH": "tmp"}
        env = {}
        for var, sub in folders.items():
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
            env[var] = str(self.root / sub)
        return {**env, "ENROOT_SYSCONF_PATH": str(self.sysconf()), "ENROOT_ALLOW_SUPERUSER": "y",
                "ENROOT_UNSHARE_PID": "y", "ENROOT_MOUNT_HOME": "n", "ENROOT_RESTRICT_DEV": "n",
                "ENROOT_MAX_PROCESSORS": "2"}

    def create(self, image: Path, name: str) -> list[str]:
        return [*USERNS, "enroot", "create", "--force", "--name", name, str(image)]

    def start(self, name: str, argv: list[str], *, binds: list[tuple[str, str, bool]], env: dict[str, str],
              layers: tuple[str, str, str] | None = None, devices: tuple[str, ...] = ()) -> list[str]:
        out = [*USERNS, "enroot", "start", "--rw"]
        if layers is not None:
            # The overlay on the container's (empty) root folder, then enroot in that namespace. The root is
            # read-only, as a Docker sandbox's (enroot remounts it so without --rw), but for air's own folder
            # (Docker's volume there): a new tmpfs of the sandbox's own, bound, which enroot's remount of the root
            # leaves writable. A tmpfs, not the overlay's folder: the pristine home lies there, under every cell's
            # home, and a name looked up in it would stay cached for the next rollout (the node's disk and the
            # overlay keep negative dentries, tmpfs none: 248 of 256 bits lease to lease through the home before).
            # (It is mounted beside the layers, not on the root's folder, where enroot's own bind of the root would
            # hide it.)
            root, air = self.root / "data" / name, Path(layers[1]).parent / "air"
            out = [*USERNS[:-1], "--mount", "--", "sh", "-c", 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,'
                   f'workdir=$3,userxattr" "$4" && mkdir -p "$4{AIR_DIR}" "$5" && mount -t tmpfs -o '
                   'mode=755,nosuid,nodev air "$5" && shift 5 && exec "$@"', "air-overlay",
                   *layers, str(root), str(air), "enroot", "start"]
            binds = [(str(air), AIR_DIR, False), *binds]
        for source, target, read_only in binds:
            kind = "file" if os.path.isfile(source) else "dir"  # a driver's library is bound alone (gpus.py)
            out += ["--mount", f"{source}:{target}:x-create={kind},bind,{'ro' if read_only else 'rw'},nosuid,nodev"]
        for node in devices:  # a node of the node's (a user namespace makes none), on the container's own /dev
            out += ["--mount", f"{node}:/dev/{Path(node).name}:x-create=file,bind,rw,nosuid,noexec"]
        for key, value in env.items():
            out += ["--env", f"{key}={value}"]
        return [*out, name, *argv]

    def remove(self, name: str) -> list[str]:
        return [*USERNS, "enroot", "remove", "--force", name]

    def names(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.root / "data") if e.is_dir())
        except FileNotFoundError:
            return []


@dataclass(frozen=True)
class Userns:
    """What this machine gives the user for a user namespace of several uids."""

    max_namespaces: int | None
    newuidmap: str | None
    subuids: int
    """Subordinate uids /etc/subuid gives the user (the first range's length; 0: none)."""

    @classmethod
    def probe(cls) -> Userns:
        try:
            with open("/proc/sys/user/max_user_namespaces") as f:
                most: int | None = int(f.read())
        except (OSError, ValueError):
            most = None
        return cls(most, shutil.which("newuidmap"), subordinate_uids())

    def check(self) -> str | None:
        """None when a launcher can run here; else what is missing, in one line with its fix."""
        if self.max_namespaces == 0:
            return "user namespaces are off (user.max_user_namespaces = 0): `sysctl -w user.max_user_namespaces=15000`"
        if self.newuidmap is None:
            return "newuidmap is missing: `apt-get install uidmap` (root)"
        if self.subuids < UID_SPAN_MIN:
            return (f"{_user()} has {self.subuids} subordinate uids in /etc/subuid, fewer than {UID_SPAN_MIN}: "
                    f"`usermod --add-subuids N-M --add-subgids N-M {_user()}` (root), a range of {UID_SPAN_MIN}")
        return None


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def subordinate_uids(path: str = "/etc/subuid") -> int:
    """The length of the user's first subordinate uid range (by name or uid), 0 when it has none."""
    names = {_user(), str(os.getuid())}
    try:
        with open(path) as f:
            for line in f:
                fields = line.strip().split(":")
                if len(fields) == 3 and fields[0] in names and fields[2].isdigit():
                    return int(fields[2])
    except OSError:
        pass
    return 0
