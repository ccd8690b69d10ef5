"""An image as a squashfs file for the enroot backend (`air images export-squashfs`; docs/hpc.md): the files of a
container of the image (`docker export`, no layers to merge) streamed into Debian's `sqfstar`, owners and modes kept.

Not `enroot import dockerd://`: enroot squashes every owner to root (`mksquashfs -all-root`), made for a runtime that
maps one uid; air's images have the agent's home owned by the agent (uid 1000), which the warden maps to each
sandbox's own uid. Cached by the image's content id: a second export of an unchanged image reads nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from air import squashfs
from air.errors import ImageError, UsageError


@dataclass(frozen=True)
class Exported:
    ref: str
    image_id: str
    path: Path
    size: int
    seconds: float
    reused: bool


def export(client, ref: str, base: Path | None = None) -> Exported:
    """The squashfs of image `ref` (a docker SDK client's daemon has it) in the squashfs folder, made unless one of
    the same content is there; `ref`'s link points at it either way."""
    import docker.errors

    if shutil.which("sqfstar") is None:
        raise UsageError("sqfstar is missing: `apt-get install squashfs-tools` (4.5 or newer)")
    base = base or squashfs.folder(create=True)
    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise ImageError.not_built(ref) from None
    target = squashfs.by_content(image.id, base)
    started = time.monotonic()
    reused = target.is_file() and squashfs.config_of(target).is_file()
    if not reused:
        _write(client, image.id, target)
        # What `docker export` leaves out: the image's environment (its PATH: /opt/venv/bin first) and workdir.
        config = image.attrs.get("Config") or {}
        squashfs.write_config(target, {"Env": config.get("Env") or [], "WorkingDir": config.get("WorkingDir") or ""})
    squashfs.link(ref, image.id, base)
    return Exported(ref, image.id, target, target.stat().st_size, time.monotonic() - started, reused)


def _write(client, image_id: str, target: Path) -> None:
    """docker export of a created (never started) container of the image, into sqfstar, then renamed in place."""
    container = client.containers.create(image_id, command=["true"], labels={"air.role": "export"},
                                         network_disabled=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        # The tar's owners and modes are the image's (no -all-root). /dev's entries stay out (`dev/*`): Docker's
        # device nodes, which a user namespace cannot make (`enroot create` would fail on them); every sandbox has
        # the node's /dev bound there anyway. lz4, not zstd: sqfstar 4.5 takes no -Xcompression-level, and zstd's
        # level 15 took 49.5 s of a busy machine for air/base's 222 MB (21 s of CPU; lz4 0.7 s), for a file of 74 MB
        # instead of 109 (experiments.md, session 70).
        sqfstar = subprocess.Popen(["sqfstar", "-quiet", "-no-progress", "-comp", "lz4", "-force", str(partial),
                                    "dev/*"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        try:
            for chunk in container.export(chunk_size=1 << 20):
                sqfstar.stdin.write(chunk)
        finally:
            sqfstar.stdin.close()
            err = sqfstar.stderr.read().decode(errors="replace")
            code = sqfstar.wait()
        if code != 0:
            raise ImageError(f"sqfstar failed (exit {code}) making {target.name}: {err.strip()[-300:]}")
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    finally:
        container.remove(force=True)
        if partial.exists():
            partial.unlink()

