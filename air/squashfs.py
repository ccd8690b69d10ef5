"""The folder of squashfs images that the enroot backend runs (docs/hpc.md): one file per image content, and one link
per image reference to it. Written by `air images export-squashfs` (air/images/squashfs.py, on a machine with Docker),
read by air/sandbox/enroot/ (on a node without): this module is where both agree on names.

    $AIR_SQUASHFS_DIR/air1-sha256-<image id>.sqsh   the image's files, owners kept (cached by content and FORMAT)
    $AIR_SQUASHFS_DIR/air1-sha256-<image id>.json   what the file cannot hold: the image's Env and WorkingDir
    $AIR_SQUASHFS_DIR/refs/<reference, quoted>      a link to the file the reference named when it was exported
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path

from air import variables
from air.errors import ImageError, UsageError

DEFAULT = Path("/var/cache/air/squashfs")
FORMAT = "air1"
"""What the export leaves out or changes (air/images/squashfs.py: nothing under /dev): a change gives new names."""


def folder(create: bool = False) -> Path:
    """The folder (AIR_SQUASHFS_DIR, else DEFAULT); made, readable by every user, when `create`."""
    chosen = variables.value("AIR_SQUASHFS_DIR")
    path = Path(chosen) if chosen else DEFAULT
    if create:
        try:
            (path / "refs").mkdir(parents=True, exist_ok=True)
            for p in (path, path / "refs"):
                os.chmod(p, 0o755)
        except OSError as exc:
            raise UsageError(f"cannot make the squashfs folder {path} ({exc.strerror or exc}): run as a user who "
                             "can, or set AIR_SQUASHFS_DIR to a folder you can write") from None
    return path


def by_content(image_id: str, base: Path | None = None) -> Path:
    """Where the image of content id `image_id` (sha256:...) is kept."""
    return (base or folder()) / f"{FORMAT}-{image_id.replace(':', '-')}.sqsh"


def config_of(image: Path) -> Path:
    """The image's configuration beside its file (what `docker export` leaves out: Env, WorkingDir), as JSON."""
    return image.with_suffix(".json")


def write_config(image: Path, config: dict) -> None:
    tmp = config_of(image).with_name(f".{image.stem}.{os.getpid()}.json")
    tmp.write_text(json.dumps(config, indent=1))
    os.chmod(tmp, 0o644)
    os.replace(tmp, config_of(image))


def image_env(image: Path) -> dict[str, str]:
    """The image's own environment variables (empty when its configuration is missing or unreadable)."""
    try:
        env = json.loads(config_of(image).read_text()).get("Env") or []
    except (OSError, ValueError, AttributeError):
        return {}
    return dict(item.partition("=")[::2] for item in env if isinstance(item, str) and "=" in item)


def ref_link(ref: str, base: Path | None = None) -> Path:
    return (base or folder()) / "refs" / urllib.parse.quote(ref, safe="")


def link(ref: str, image_id: str, base: Path) -> None:
    """Point `ref` at the image's file, atomically (readers see the old link or the new one)."""
    target = ref_link(ref, base)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.join("..", by_content(image_id, base).name), tmp)
    os.replace(tmp, target)


def resolve(ref: str) -> tuple[Path, str]:
    """The squashfs file of image `ref`, and its content id; ImageError (with the command that makes it) when none
    was exported."""
    link_path = ref_link(ref)
    try:
        target = link_path.parent / os.readlink(link_path)
    except OSError:
        raise ImageError(f"no squashfs of {ref} in {link_path.parent.parent}: on a machine with Docker and the image, "
                         f"`air images export-squashfs {ref}` makes one (docs/hpc.md), or set AIR_SQUASHFS_DIR") \
            from None
    if not target.is_file():
        raise ImageError(f"{link_path} names {target.name}, which is missing: export {ref} again")
    return target, target.name.removesuffix(".sqsh").removeprefix(f"{FORMAT}-").replace("-", ":", 1)
