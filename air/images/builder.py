"""Building task images offline from the recipes in `images/` (recipes.py reads them).

A recipe is a folder `images/<name>/` with a `recipe.toml` (description, parent recipe, Python requirements, Debian
packages) and optionally its own Dockerfile (else `images/Dockerfile.wheels`). Python packages are downloaded as
wheels, Debian packages as .debs, on the host (which may reach an index the containers cannot) and installed inside
a build that has no network.

Builds are idempotent: an image is tagged `air/<name>:<hash>` where the hash covers the Dockerfile, the recipe,
the parent image and the staged wheel and .deb lists; `air/<name>:latest` points at the newest build. Nothing is
rebuilt unless one of those changed. Without a registry, the base image is bootstrapped from Debian's packages.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from air import paths
from air.errors import ImageError
from air.images.debs import stage_debs
from air.images.recipes import REPO, Recipe, build_order, image_ref, load_recipes

PYTHON_VERSION = "3.11"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
DEFAULT_BASE = "python:3.11-slim"
DEBIAN_BASE = "air/debian-base:bookworm"
DEBIAN_SUITE = "bookworm"

Report = Callable[[str], None]


@dataclass(frozen=True)
class BuiltImage:
    recipe: str
    tag: str
    id: str
    size_mb: float
    reused: bool


class ImageBuilder:
    """Builds recipes into images; reports progress one human-readable line at a time: through `report` what
    it starts and finishes (a few lines per recipe), through `detail` (default: `report`) the repetitive lines
    in between (each wheel downloaded, each Dockerfile step)."""

    def __init__(self, client: docker.DockerClient, base: str = "auto", pip_args: list[str] | None = None,
                 report: Report | None = None, build_timeout: float = 3600, detail: Report | None = None):
        self.client = client
        # Builds stream for minutes with silent steps: a client with a long read timeout, separate from the one
        # the sandbox uses for short calls.
        self.build_api = docker.from_env(timeout=int(build_timeout)).api
        self.base = base
        self.pip_args = pip_args or []
        self.report = report or (lambda line: None)
        self.detail = detail or self.report

    # ----- base image -------------------------------------------------------------------------------------------
    def _has_image(self, ref: str) -> docker.models.images.Image | None:
        try:
            return self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None

    def resolve_base(self) -> str:
        """The image the root recipes build FROM, pulled or bootstrapped if needed."""
        wanted = DEFAULT_BASE if self.base == "auto" else self.base
        if self._has_image(wanted):
            return wanted
        if self.base == "auto" and self._has_image(DEBIAN_BASE):
            # Bootstrapped here before: keep building on it (no network attempt per run, and no rebuild of every
            # image the day a registry answers).
            return DEBIAN_BASE
        self.report(f"pulling {wanted}")
        try:
            self.client.images.pull(wanted)
            return wanted
        except docker.errors.APIError as exc:
            if self.base != "auto":
                raise ImageError(f"base image '{wanted}' is not present and cannot be pulled "
                                 f"({exc.explanation or exc}); load it with `docker load` or pick another "
                                 "--base") from None
            reason = (exc.explanation or str(exc)).splitlines()[0]
            reason = reason if len(reason) <= 100 else reason[:97] + "..."
        # Say which of the two happens: "bootstrapping" on every run that reuses the base would be wrong.
        if self._has_image(DEBIAN_BASE):
            self.report(f"no registry reachable ({reason}); using {DEBIAN_BASE}, bootstrapped offline earlier")
            return DEBIAN_BASE
        self.report(f"no registry reachable ({reason}); bootstrapping a Debian base offline")
        bootstrap_debian(self.client, self.report, self.detail)
        return DEBIAN_BASE

    # ----- wheels -----------------------------------------------------------------------------------------------
    def stage_wheels(self, recipe: Recipe) -> tuple[Path, list[str]]:
        """Download the recipe's wheels once into the cache; returns (folder, requirement lines installed)."""
        key = _digest([recipe.requirements, recipe.optional, PYTHON_VERSION, PLATFORMS, self.pip_args])
        folder = paths.cache_dir() / "wheels" / f"{recipe.name}-{key}"
        done = folder / "requirements.txt"
        if done.exists():
            return folder, done.read_text().split()
        tmp = folder.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._pip_download(recipe, recipe.requirements, tmp, required=True)
        installed = list(recipe.requirements)
        for extra in recipe.optional:
            if self._pip_download(recipe, [extra], tmp, required=False):
                installed.append(extra)
            else:
                self.report(f"warning: optional package '{extra}' of recipe '{recipe.name}' has no wheel here; "
                            "built without it")
        (tmp / "requirements.txt").write_text("\n".join(installed) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder, installed

    def _pip_download(self, recipe: Recipe, requirements: list[str], dest: Path, required: bool) -> bool:
        if not requirements:
            return True
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
               "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "--progress-bar", "off",
               "--disable-pip-version-check", "-d", str(dest), *self.pip_args, *requirements]
        self.report(f"[{recipe.name}] staging wheels: {' '.join(requirements)}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-30:]
            if line.startswith(("Collecting", "Saved", "Downloading", "File was already")):
                self.detail(f"[{recipe.name}] {line.strip()[:100]}")
        if proc.wait() == 0:
            return True
        if not required:
            return False
        reason = next((line for line in reversed(tail) if "ERROR" in line), tail[-1] if tail else "pip failed")
        raise ImageError(f"cannot stage wheels for recipe '{recipe.name}': {reason.replace('ERROR: ', '')}; "
                         f"fix requirements in {recipe.folder / 'recipe.toml'} or make the wheel reachable "
                         "(e.g. --pip-arg=--find-links=DIR)")

    # ----- Debian packages ---------------------------------------------------------------------------------------
    def stage_debs(self, recipe: Recipe, parent: docker.models.images.Image) -> tuple[Path, list[str]]:
        """Download once into the cache the .debs the recipe's packages need on top of `parent`; returns
        (folder, file names). Keyed by the parent's id: another parent may lack other packages."""
        mirror = debian_mirror()
        key = _digest([recipe.debs, parent.id, mirror, DEBIAN_SUITE])
        folder = paths.cache_dir() / "debs" / f"{recipe.name}-{key}"
        done = folder / "debs.txt"
        if done.exists():
            return folder, done.read_text().split()
        tmp = folder.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        names = stage_debs(recipe.debs, self._dpkg_status(parent), tmp, mirror=mirror, suite=DEBIAN_SUITE,
                           label=recipe.name, report=self.report, detail=self.detail)
        (tmp / "debs.txt").write_text("\n".join(names) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder, names

    def _dpkg_status(self, image: docker.models.images.Image) -> bytes:
        """The image's /var/lib/dpkg/status, read from a container that is created, never started."""
        container = self.client.containers.create(image.id, command=["true"], network_mode="none",
                                                  labels={"air.role": "image-probe"})
        try:
            stream, _ = container.get_archive("/var/lib/dpkg/status")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                data = tar.extractfile(member) if member is not None else None
                if data is None:
                    raise ImageError(f"image {image.short_id} has no dpkg status: not a Debian image")
                return data.read()
        except docker.errors.NotFound:
            raise ImageError(f"image {image.short_id} has no /var/lib/dpkg/status: not a Debian image") from None
        finally:
            container.remove(force=True)

    # ----- build ------------------------------------------------------------------------------------------------
    def ensure(self, names: Iterable[str], force: bool = False, also: Path | None = None) -> list[BuiltImage]:
        """The recipes `names` and their parents, built or reused; `also`: a folder of more recipes (load_recipes)."""
        recipes = load_recipes(also=also)
        order = build_order(recipes, names)
        built: dict[str, BuiltImage] = {}
        base_ref: str | None = None
        for recipe in order:
            if recipe.parent:
                parent_ref = built[recipe.parent].tag
            else:
                base_ref = base_ref or self.resolve_base()
                parent_ref = base_ref
            built[recipe.name] = self.build(recipe, parent_ref, force=force)
        return [built[r.name] for r in order]

    def build(self, recipe: Recipe, parent_ref: str, force: bool = False) -> BuiltImage:
        started = time.monotonic()
        parent = self._has_image(parent_ref)
        if parent is None:
            raise ImageError(f"parent image {parent_ref} of recipe '{recipe.name}' is missing")
        # What the build is made of, before anything is staged: an image built from the same inputs is used as it
        # is, with no wheel or .deb staged again (a new user's empty cache would download hundreds of MB for it).
        inputs = _digest([recipe.dockerfile.read_bytes().hex(), recipe.model_dump_json(), recipe.debs, parent.id,
                          self.pip_args, PYTHON_VERSION, PLATFORMS])
        built = None if force else self._built_from(recipe.name, inputs)
        if built is not None:
            built.tag(REPO + "/" + recipe.name, "latest")
            tag = next((t for t in built.tags if not t.endswith(":latest")), image_ref(recipe.name))
            self.report(f"[{recipe.name}] reused {tag} (recipe and parent unchanged)")
            return BuiltImage(recipe.name, tag, built.id, built.attrs["Size"] / 1e6, reused=True)
        wheels, installed = self.stage_wheels(recipe) if recipe.needs_wheels else (None, [])
        wheel_names = sorted(p.name for p in wheels.glob("*.whl")) if wheels else []
        debs, deb_names = self.stage_debs(recipe, parent) if recipe.debs else (None, [])
        digest = _digest([recipe.dockerfile.read_bytes().hex(), recipe.model_dump_json(), parent.id,
                          wheel_names, installed, *([recipe.debs, deb_names] if recipe.debs else [])])
        tag = f"{REPO}/{recipe.name}:{digest}"
        existing = self._has_image(tag)
        if existing is not None and not force:
            existing.tag(REPO + "/" + recipe.name, "latest")
            self.report(f"[{recipe.name}] reused {tag} (recipe, parent and wheels unchanged)")
            return BuiltImage(recipe.name, tag, existing.id, existing.attrs["Size"] / 1e6, reused=True)
        with tempfile.TemporaryDirectory(prefix=f"air-build-{recipe.name}-") as ctx:
            context = Path(ctx)
            for item in recipe.folder.iterdir():
                if item.name not in ("recipe.toml", "Dockerfile"):
                    _link_or_copy(item, context / item.name)
            shutil.copyfile(recipe.dockerfile, context / "Dockerfile")
            if wheels:
                (context / "wheels").mkdir()
                for whl in wheels.iterdir():
                    _link_or_copy(whl, context / "wheels" / whl.name)
            if debs:
                (context / "debs").mkdir()
                for name in deb_names:
                    _link_or_copy(debs / name, context / "debs" / name)
            image_id, steps = self._docker_build(recipe, context, tag, parent_ref, inputs)
        image = self.client.images.get(image_id)
        image.tag(REPO + "/" + recipe.name, "latest")
        self._drop_intermediates(steps)
        self.report(f"[{recipe.name}] built {tag} in {time.monotonic() - started:.0f} s")
        return BuiltImage(recipe.name, tag, image.id, image.attrs["Size"] / 1e6, reused=False)

    def _drop_intermediates(self, steps: set[str]) -> None:
        """The legacy builder keeps each multi-stage intermediate as a dangling image (the wheels' or .debs'
        install stage, GBs for torch): drop this build's own, never reused since the final image is tagged by
        content. Not a prune: another process's build may be running, and a prune would take its stages (the
        daemon also refuses two prunes at once)."""
        for step in steps:
            try:
                if not self.client.images.get(step).tags:
                    self.client.images.remove(step, noprune=False)
            # A parent of the final image, in use, or gone: kept as it is. A daemon busy committing another
            # build may not answer within the client's timeout: then it stays too (clean-up never fails a build).
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                continue

    def _built_from(self, name: str, inputs: str) -> docker.models.images.Image | None:
        """The newest image of recipe `name` built from `inputs` (its `air.inputs` label), if one is here."""
        found = self.client.images.list(filters={"label": [f"air.recipe={name}", f"air.inputs={inputs}"],
                                                 "dangling": False})
        # Any image built FROM this recipe's inherits these labels: a task's own (air.images.dockerfile), or one a
        # person builds on air/base by hand. Only a build of the recipe carries its content tag (`air/<name>:<digest>`),
        # so an image without one is never taken for it (one was, and became air/base:latest).
        found = [image for image in found if "air.task-image" not in (image.labels or {})
                 and any(t.startswith(f"{REPO}/{name}:") and not t.endswith(":latest") for t in image.tags)]
        return max(found, key=lambda image: image.attrs["Created"], default=None)

    def _docker_build(self, recipe: Recipe, context: Path, tag: str, parent_ref: str,
                      inputs: str) -> tuple[str, set[str]]:
        self.report(f"[{recipe.name}] building {tag} (network off)")
        build_args = {"PARENT_IMAGE": parent_ref, "BASE_IMAGE": parent_ref}
        # No run or owner: images outlive the process that built them, and containers inherit image labels.
        labels = {"air.role": "image", "air.recipe": recipe.name, "air.inputs": inputs}
        image_id = None
        log: list[str] = []
        steps: set[str] = set()
        try:
            for chunk in self.build_api.build(path=str(context), tag=tag, buildargs=build_args, network_mode="none",
                                              rm=True, forcerm=True, decode=True, labels=labels):
                if "error" in chunk:
                    raise ImageError(f"recipe '{recipe.name}' failed to build: {_one_line(chunk['error'])} "
                                     f"(see {recipe.dockerfile})")
                line = chunk.get("stream", "").strip()
                if line:
                    log = (log + [line])[-20:]
                    step = _STEP_IMAGE.match(line)
                    if step:
                        steps.add(step.group(1))
                    if line.startswith("Step ") or "Successfully" in line:
                        self.detail(f"[{recipe.name}] {line[:110]}")
                image_id = (chunk.get("aux") or {}).get("ID", image_id)
        except docker.errors.APIError as exc:
            self._drop_intermediates(steps)
            raise ImageError(f"recipe '{recipe.name}' failed to build: {_one_line(exc.explanation or str(exc))} "
                             f"(see {recipe.dockerfile})") from None
        except BaseException:  # Ctrl-C, a failed step: the stages it made are nobody's (hundreds of MB for torch)
            self._drop_intermediates(steps)
            raise
        if not image_id:
            m = re.search(r"Successfully built ([0-9a-f]+)", "\n".join(log))
            if not m:
                raise ImageError(f"recipe '{recipe.name}': the build ended without an image")
            image_id = m.group(1)
        return image_id, steps


_STEP_IMAGE = re.compile(r"^---> ([0-9a-f]{12})$")
"""The legacy builder's line naming the image a step produced."""


def list_images(client: docker.DockerClient) -> list[dict]:
    """Every air image: recipe, tags, id, size, creation time, and whether it is its recipe's current build (the
    one `air/<recipe>:latest` names, which tasks and services run)."""
    rows = []
    for image in client.images.list(filters={"label": "air.recipe", "dangling": False}):
        recipe = image.labels.get("air.recipe", "")
        rows.append({
            "recipe": recipe,
            "current": image_ref(recipe) in image.tags,
            "tags": sorted(image.tags),
            "id": image.short_id.split(":")[-1],
            "size_mb": round(image.attrs["Size"] / 1e6, 1),
            "created": image.attrs["Created"][:19],
        })
    return sorted(rows, key=lambda r: (r["recipe"], r["created"]))


# ----- offline Debian base ----------------------------------------------------------------------------------------
def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses (never a hard-coded host)."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        text = Path(path).read_text()
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and DEBIAN_SUITE in suites.group(1).split():
                return uris.group(1)
    if os.path.exists("/etc/apt/sources.list"):
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == DEBIAN_SUITE:
                return parts[1] if not parts[1].startswith("[") else parts[2]
    raise ImageError(f"no Debian {DEBIAN_SUITE} mirror in this machine's apt sources; pass --base IMAGE "
                     "with an image that has python3")


def bootstrap_debian(client: docker.DockerClient, report: Report, detail: Report | None = None) -> None:
    """debootstrap a minimal bookworm with python3 and import it as DEBIAN_BASE (about 40 s, 290 MB)."""
    detail = detail or report
    if os.geteuid() != 0:
        raise ImageError("bootstrapping a Debian base needs root (debootstrap); run as root or pass --base IMAGE")
    if shutil.which("debootstrap") is None:
        if shutil.which("apt-get") is None:
            raise ImageError("debootstrap is missing and apt-get is not available; pass --base IMAGE")
        report("installing debootstrap")
        # apt's output (debconf's and needrestart's notes on stderr too) is shown only if the install fails;
        # needrestart is suspended: installing debootstrap restarts nothing.
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "NEEDRESTART_SUSPEND": "1"}
        proc = subprocess.run(["apt-get", "install", "-y", "-q", "debootstrap"], capture_output=True,
                              text=True, check=False, env=env)
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            reason = next((line for line in reversed(lines) if line.startswith("E:")), lines[-1] if lines else "?")
            raise ImageError(f"installing debootstrap failed: {_one_line(reason)}; install it "
                             "(apt-get install debootstrap) or pass --base IMAGE")
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="air-debootstrap-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates",
               DEBIAN_SUITE, str(rootfs), mirror]
        report(f"debootstrap {DEBIAN_SUITE} from the machine's mirror (about a minute)")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-10:]
            if line.startswith("I: "):
                detail(f"[debootstrap] {line[3:].strip()[:100]}")
        if proc.wait() != 0:
            raise ImageError(f"debootstrap failed: {tail[-1] if tail else '?'}")
        # apt caches and lists only make the image bigger.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tarball = Path(tmp) / "rootfs.tar"
        report("importing the root filesystem into Docker")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        repo, tag = DEBIAN_BASE.split(":")
        with open(tarball, "rb") as f:
            client.api.import_image_from_data(f, repository=repo, tag=tag,
                                              changes=['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"])


# ----- helpers ----------------------------------------------------------------------------------------------------
def _digest(parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _link_or_copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
