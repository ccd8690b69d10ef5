"""air's local data store: Hugging Face datasets that task containers read with no network.

`air data add ID --from DIR` converts a dataset the user saved (`save_to_disk`) or downloaded (a hub snapshot)
into `<store>/hf/`, in the layout of `datasets`' own cache (hf_store_convert.py, run inside a task image so the
layout is the one its `datasets` reads). Task containers mount the store read-only at MOUNT and get, in a
writable place, a view of it: the cache's folders with a symlink per file (`datasets` takes a lock file at the
cache root and writes `.map()` results beside the Arrow files, so neither may be the read-only mount itself).
With HF_DATASETS_OFFLINE=1 the task's own `load_dataset(ID)` resolves there, unpatched.

The store is `$AIR_DATA_DIR`, else `~/.cache/air/data`.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from air import variables
from air.errors import DataUnavailable, ImageError, UsageError

MOUNT = "/opt/air/datasets"
"""Where task containers see the store (read-only)."""
HF_OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def store_dir() -> Path:
    return Path(variables.raw("AIR_DATA_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                        os.path.expanduser("~/.cache")) / "air" / "data")


def local_data_dir() -> Path:
    """Prepared local datasets, one folder each, by the last name of the path a task's YAML gives (an AIRS-Bench
    task's data_path, `/checkpoint/.../airs_text_only_prepared/<Task>`, is found at `<store>/local/<Task>`): air
    never reads the path itself, which a downloaded YAML could point anywhere."""
    return store_dir() / "local"


def cache_folder(hub_id: str) -> str:
    """The folder `datasets` looks for: `org/CamelName` -> `org___camel_name` (its camelcase_to_snakecase)."""
    parts = hub_id.split("/")
    last = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", parts[-1])
    last = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", last).lower()
    return "___".join(parts[:-1] + [last])


def check_id(hub_id: str) -> str:
    if not _ID.match(hub_id):
        raise UsageError(f"'{hub_id}' is not a Hugging Face dataset id (NAME or ORG/NAME)")
    return hub_id


@dataclass(frozen=True)
class StoredDataset:
    id: str
    splits: dict[str, int]
    size_mb: float
    source: str
    added: str


class DataStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root or store_dir())

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    def _manifest(self, hub_id: str) -> Path:
        return self.root / "manifest" / f"{cache_folder(hub_id)}.json"

    def has(self, hub_id: str) -> bool:
        return self._manifest(hub_id).is_file() and (self.hf / cache_folder(hub_id)).is_dir()

    def ls(self) -> list[StoredDataset]:
        rows = []
        for path in sorted((self.root / "manifest").glob("*.json")):
            meta = json.loads(path.read_text())
            folder = self.hf / cache_folder(meta["id"])
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            rows.append(StoredDataset(meta["id"], meta["splits"], round(size / 1e6, 2), meta["source"],
                                      meta["added"]))
        return rows

    def missing_message(self, hub_id: str) -> str:
        return (f"dataset '{hub_id}' is not in air's data store ({self.root}); stage it with "
                f"`air data add {hub_id} --from DIR` (DIR: its save_to_disk folder or hub snapshot)")

    def require(self, hub_ids: list[str]) -> None:
        for hub_id in hub_ids:
            if not self.has(hub_id):
                raise DataUnavailable(self.missing_message(hub_id))

    def add(self, hub_id: str, source: Path, image: str = "air/cpu:latest", replace: bool = False) -> StoredDataset:
        """Convert `source` into the store inside `image` (network off, the caller's uid), then publish it
        atomically and read-only."""
        import docker.errors

        from air.sandbox import connect

        check_id(hub_id)
        source = Path(source).resolve()
        if not source.is_dir():
            raise UsageError(f"--from {source}: not a directory")
        if self.has(hub_id) and not replace:
            raise UsageError(f"dataset '{hub_id}' is already in the store; `air data rm {hub_id}` first")
        self.hf.mkdir(parents=True, exist_ok=True)
        (self.root / "manifest").mkdir(exist_ok=True)
        staging = self.root / f".staging-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        script = Path(__file__).with_name("hf_store_convert.py")
        client = connect()
        try:
            out = client.containers.run(
                image, ["python", "/opt/air-convert.py", "/in", "/out", hub_id], remove=True,
                network_mode="none", user=f"{os.getuid()}:{os.getgid()}", working_dir="/tmp",
                environment={"HOME": "/tmp", "HF_HOME": "/tmp/hf", **HF_OFFLINE_ENV},
                volumes={str(source): {"bind": "/in", "mode": "ro"}, str(staging): {"bind": "/out", "mode": "rw"},
                         str(script): {"bind": "/opt/air-convert.py", "mode": "ro"}},
                labels={"air.role": "data-convert"}, stdout=True, stderr=False)
            result = json.loads(out.decode().strip().splitlines()[-1])
        except docker.errors.ImageNotFound:
            shutil.rmtree(staging, ignore_errors=True)
            raise ImageError.not_built(image) from None
        except docker.errors.ContainerError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            lines = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
            reason = lines[-1] if lines else str(exc)
            raise UsageError(f"cannot read {source} as a dataset in {image}: {reason[:300]}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        folder = cache_folder(hub_id)
        final = self.hf / folder
        if final.exists():
            _make_writable(final)
            shutil.rmtree(final)
        (staging / folder).rename(final)
        shutil.rmtree(staging, ignore_errors=True)
        for path in [final, *final.rglob("*")]:  # the host's copy is read-only too; containers mount it so
            path.chmod(0o555 if path.is_dir() else 0o444)
        meta = {"id": hub_id, "splits": result["splits"], "source": str(source),
                "added": time.strftime("%Y-%m-%dT%H:%M:%S"), "datasets": result.get("datasets", "")}
        self._manifest(hub_id).write_text(json.dumps(meta, indent=1) + "\n")
        return next(d for d in self.ls() if d.id == hub_id)

    def rm(self, hub_id: str) -> None:
        if not self.has(hub_id):
            raise UsageError(f"dataset '{hub_id}' is not in the store ({self.root})")
        folder = self.hf / cache_folder(hub_id)
        _make_writable(folder)
        shutil.rmtree(folder)
        self._manifest(hub_id).unlink()

    # ----- what a task container gets -------------------------------------------------------------------------
    def mount(self) -> tuple[str, str]:
        """(host path, container path) of the read-only bind mount."""
        return str(self.hf.resolve()), MOUNT

    def view_tar(self, hub_ids: list[str], uid: int) -> bytes:
        """A `datasets` cache root holding, for each dataset, its folders (owned by `uid`, writable) and a
        symlink per file into the read-only mount."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            self.add_view(tar, hub_ids, uid)
        return buf.getvalue()

    def add_view(self, tar: tarfile.TarFile, hub_ids: list[str], uid: int, prefix: str = "") -> None:
        made: set[str] = set()

        def add_dir(name: str) -> None:
            parent = os.path.dirname(name)
            if parent and parent not in made:
                add_dir(parent)
            if name not in made:
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, uid
                tar.addfile(info)
                made.add(name)

        if prefix:
            add_dir(prefix.rstrip("/"))
        for hub_id in hub_ids:
            for path in sorted((self.hf / cache_folder(hub_id)).rglob("*")):
                rel = path.relative_to(self.hf).as_posix()
                if path.is_dir():
                    add_dir(prefix + rel)
                    continue
                add_dir(os.path.dirname(prefix + rel))
                link = tarfile.TarInfo(prefix + rel)
                link.type, link.linkname, link.uid, link.gid = tarfile.SYMTYPE, f"{MOUNT}/{rel}", uid, uid
                link.mode = 0o777
                tar.addfile(link)


def _make_writable(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
