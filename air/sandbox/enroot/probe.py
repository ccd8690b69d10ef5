"""What `air doctor` says about this node for the enroot backend: enroot itself, user namespaces (with subordinate uids:
the agent's own uid), network namespaces, cgroup delegation (which limits hold, which are missing, one line each),
and the squashfs images. Everything is read from files or with one short command: nothing starts a container."""

from __future__ import annotations

import subprocess

from air import squashfs
from air.checks import Check
from air.errors import ImageError, UsageError
from air.sandbox.enroot import cgroups
from air.sandbox.enroot.launcher import USERNS, Enroot, Userns

BUILD = "ENROOT_SRC=... MAKESELF_SRC=... scripts/enroot-build.sh deps build (docs/hpc.md), then put its bin/ on PATH"
MISSING_GUARANTEES = (
    "page cache: no pin of the image's files (a pin is a Docker container); a cell's reads can evict what the next "
    "one reads, a timing channel (SECURITY.md)",
    "atimes: the container's root keeps the node's relatime (a user namespace cannot make it noatime); a cell's read "
    "can set an atime a later cell sees, once a day at most",
    "fanotify audit: `run_untrusted(watch=True)` needs CAP_SYS_ADMIN of the node, which a user namespace lacks",
)
"""What a sandbox on enroot lacks against one on Docker, besides the limits cgroups.missing() names (docs/hpc.md)."""


def probe(images: tuple[str, ...] = ("air/base:latest", "air/cpu:latest")) -> list[Check]:
    rows = [Check("sandbox backend", True, "enroot (PoolConfig.backend; AIR_BACKEND)", required=False)]
    launcher = Enroot(root=_scratch())
    version = launcher.version()
    rows.append(Check("enroot", version is not None, f"enroot {version}" if version else "not on PATH", "" if version
                      else BUILD))
    userns = Userns.probe()
    why = userns.check()
    rows.append(Check("user namespaces", why is None,
                      f"{userns.subuids} subordinate uids, newuidmap at {userns.newuidmap}: the agent gets a uid of "
                      "its own" if why is None else why.split(": `")[0],
                      "" if why is None else why.split(": `", 1)[-1].rstrip("`")))
    if why is None:
        rows.append(_netns())
    folders = cgroups.delegated()
    lines = cgroups.missing(folders)
    rows.append(Check("cgroup delegation", not lines, ", ".join(f"{c} at {p}" for c, p in folders.items()) or
                      "none (cgroup v1 folders air-<user>)", "" if not lines else
                      f"as root, once: {cgroups.delegate_command()}", required=False))
    for line in lines:
        rows.append(Check("limit missing", False, line, f"as root, once: {cgroups.delegate_command()}",
                          required=False))
    rows.append(_gpus())
    rows.append(_image_roots())
    for line in MISSING_GUARANTEES:
        rows.append(Check("not on enroot", False, line, "docs/hpc.md", required=False))
    for ref in images:
        try:
            path, _ = squashfs.resolve(ref)
            rows.append(Check(f"image {ref}", True, f"{path.resolve()} ({path.stat().st_size / 1e6:.0f} MB)",
                              required=False))
        except (ImageError, UsageError) as exc:
            rows.append(Check(f"image {ref}", False, str(exc).split(": on a machine")[0],
                              f"on a machine with Docker: air images export-squashfs {ref}", required=False))
    return rows


def _scratch():
    from air.sandbox.enroot.pool import enroot_root

    return enroot_root()


def _netns() -> Check:
    """A network namespace in the user namespace, with only `lo`: what every cell gets."""
    argv = [*USERNS[:-1], "--net", "--", "sh", "-c", "tail -n +3 /proc/self/net/dev | cut -d: -f1"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("network namespaces", False, f"could not try one: {exc}")
    names = out.stdout.split()
    ok = out.returncode == 0 and names == ["lo"]
    return Check("network namespaces", ok, "a new one has only lo" if ok else
                 f"unshare --net failed: {(out.stderr or out.stdout).strip()[-200:]}",
                 "" if ok else "the node forbids network namespaces to users: cells cannot be built")


def _image_roots() -> Check:
    """Where the images' roots are unpacked, every cell's root made of one (pool.py): the node's /dev/shm, a tmpfs,
    whose free memory bounds them (air/cpu's is 1.8 GB)."""
    import os
    from pathlib import Path

    from air.sandbox.enroot.copies import fstype

    shm = Path("/dev/shm")
    if fstype(shm) != "tmpfs":
        return Check("image roots", False, f"{shm} is not a tmpfs: the backend refuses to start (names looked up "
                     "would stay cached)", 'a node with a tmpfs at /dev/shm, or PoolConfig(page_cache="shared")')
    from air.sandbox.enroot import copies

    v = os.statvfs(shm)
    roots = copies.survey(copies.present())
    return Check("image roots", True, f"{shm} (tmpfs, {v.f_bavail * v.f_frsize / 1e9:.1f} GB free): each image's "
                 f"root once per user, every cell's root a new overlay of it; {roots.line()}", required=False)


def _gpus() -> Check:
    """The node's GPUs (nvidia-smi's; on Slurm, the job's) and whether their device nodes and the driver's files are
    there to bind (gpus.py's "devices" way: the only one on enroot)."""
    from air.sandbox import gpus
    from air.sandbox.gpus import detect_gpus

    found = tuple(detect_gpus())
    if not found:
        return Check("GPUs", True, "none visible (nvidia-smi): GPU tasks need a GPU node", required=False)
    why = gpus.read_host(found).missing(found)
    return Check("GPUs", why is None, f"{len(found)} ({', '.join(found)}): each sandbox's own nodes bound"
                 if why is None else why, "" if why is None else "docs/hpc.md (GPUs)", required=False)
