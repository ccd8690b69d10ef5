"""A task's own Dockerfile (a Harbor task's `environment/`), built into an image air can run.

Two builds:
1. the task's Dockerfile in its context, as written (or `FROM <image>` for a task that names a prebuilt image),
   with the network where the host has one, as Harbor builds it: the Dockerfile is the task author's code, not the
   agent's (`build_network`: `AIR_OFFLINE=1` or `--offline`, or a host with no default route, builds it offline);
2. air's layer on top, with the network off (it downloads nothing), which makes that image a sandbox: it checks
   for what the warden needs (python3 >= 3.9, bash), moves the image's working directory (its WORKDIR, often /app)
   to /opt/air/workspace and links the directory to the agent's workspace, so that the agent works there in the
   home that every lease renews; and it links /tests, /logs and /solution into air's own directory
   (/srv/air/harbor), where only the scorer puts anything.

A step that fails is said in one line naming it (`step 3/3 RUN pip install ...`) and whether the network was on,
and why (offline: a step that downloads fails, and builds where the network is). A base image the daemon
does not have and cannot pull is said the same way. The result is tagged by the caller's tag, which names
everything that went into it (`dockerfile_digest`), so a second build of unchanged inputs is the image already
there.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
import docker.utils
import requests.exceptions

from air.errors import ImageError
from air.sandbox import make_tar
from air.sandbox.layout import AGENT_HOME, AIR_DIR, WORKSPACE

IMAGE_WORKSPACE = "/opt/air/workspace"
"""Where air's layer keeps the files of the image's working directory, which start every workspace."""
HARBOR_DIR = f"{AIR_DIR}/harbor"
"""/tests, /logs and /solution of a Harbor task link under here: root's, filled only in a scoring sandbox (and, under
Harbor's own runner on air's environment, by that runner: air.services.harbor)."""
HARBOR_PATHS = ("tests", "logs", "solution")
LAYER_VERSION = "3"
"""Changes whenever air's layer does: images built by an older layer are rebuilt."""
KEPT_AT_ROOT = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/run", "/sbin", "/srv",
                "/sys", "/tmp", "/usr", "/var", AIR_DIR, AGENT_HOME)
"""Working directories air will not move into the workspace (the system, air's own places)."""
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_IMAGE_OF_STEP = re.compile(r"^---> ([0-9a-f]{12})$")
_NOISE = re.compile(r"^---> (Running in |Using cache|Removed intermediate)|^Removing intermediate container")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

TASK_IMAGE_LABELS = {"air.role": "image", "air.recipe": "task-image", "air.inputs": ""}
"""Labels of every image built here, over those inherited from the base (see DockerfileBuilder._build)."""

Report = Callable[[str], None]
OFFLINE_VARIABLE = "AIR_OFFLINE"


def build_network(route_table: str = "/proc/net/route") -> tuple[bool, str]:
    """Whether a task's Dockerfile is built with the network, and why: never with AIR_OFFLINE set (`--offline`);
    otherwise where the host has a default route (a host without one reaches nothing a download needs)."""
    value = os.environ.get(OFFLINE_VARIABLE, "").strip().lower()
    if value not in ("", "0", "false", "no"):
        return False, f"{OFFLINE_VARIABLE}={value} (--offline)"
    try:
        with open(route_table) as table:
            routes = [line.split() for line in table.readlines()[1:]]
    except OSError:
        return False, "this host's routes could not be read"
    if any(len(fields) > 1 and fields[1] == "00000000" for fields in routes):
        return True, "the host has a default route"
    return False, "this host has no default route (no network detected)"


def workdir_problem(workdir: str) -> str | None:
    """Why air cannot make `workdir` the agent's workspace, or None (it can, or there is none)."""
    if not workdir.startswith("/"):
        return f"its working directory {workdir!r} is not absolute"
    path = workdir.rstrip("/") or "/"
    if path in ("", "/") or path == WORKSPACE:
        return None
    if path in KEPT_AT_ROOT or path.startswith(AIR_DIR + "/") or path.startswith(AGENT_HOME + "/"):
        return (f"its working directory {path} is a system directory or air's own, which air cannot move into the "
                "agent's workspace")
    return None


def dockerfile_digest(context: Path, dockerfile: str | None, base: str | None, workdir: str | None) -> str:
    """Everything a build is made of: the context's files (content; by size and time past 8 MB, so that a
    competition's data is not read at every load), the Dockerfile's name, the base image, the workdir, air's layer."""
    h = hashlib.sha256(repr((dockerfile, base, workdir, LAYER_VERSION)).encode())
    if context.is_dir():
        for path in sorted(p for p in context.rglob("*") if p.is_file()):
            st = path.stat()
            h.update(str(path.relative_to(context)).encode() + b"\0")
            h.update(path.read_bytes() if st.st_size <= 8 << 20 else f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


class DockerfileBuilder:
    """Builds a task's Dockerfile and air's layer; `report` hears each step (one line)."""

    def __init__(self, client: docker.DockerClient, report: Report | None = None, timeout: float = 600,
                 network: tuple[bool, str] | None = None):
        self.client = client
        self.api = docker.from_env(timeout=int(max(timeout, 60))).api
        self.report = report or (lambda line: None)
        self.network, self.network_why = network or build_network()

    def exists(self, tag: str) -> bool:
        try:
            self.client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    def ensure(self, *, label: str, tag: str, context: Path, dockerfile: str | None, base: str | None,
               workdir: str | None) -> str:
        """The image `tag`, built unless it is there; ImageError (one line naming the failed step) otherwise."""
        if self.exists(tag):
            return tag
        started = time.monotonic()
        if dockerfile is None:
            if base is None:
                raise ImageError(f"{label}: neither a Dockerfile nor an image to build from")
            task_image = self._build(label, make_tar({"Dockerfile": f"FROM {base}\n".encode()}), None)
            if context.is_dir() and any(context.iterdir()):
                # A prebuilt image's task folder holds files Harbor uploads into the working directory at start:
                # air puts them there once, in the image.
                into = workdir or (self.client.images.get(task_image).attrs.get("Config") or {}).get("WorkingDir")
                task_image = self._build(label, _context_of(context, f"FROM {task_image}\nCOPY . {into or '/'}\n"),
                                         None, "Dockerfile.air")
        else:
            path = context / dockerfile
            if not path.is_file():
                raise ImageError(f"{label}: {path} does not exist")
            task_image = self._build(label, None, context, dockerfile, network=self.network)
        config = self.client.images.get(task_image).attrs.get("Config") or {}
        where = workdir or config.get("WorkingDir") or "/"
        problem = workdir_problem(where)
        if problem:
            raise ImageError(f"{label}: {problem}")
        layer = air_layer(task_image, where)
        final = self._build(label, make_tar({"Dockerfile": layer.encode()}), None, tag=tag,
                            labels={"air.task-image": label})
        self.report(f"[{label}] built {tag} in {time.monotonic() - started:.0f} s")
        return final

    def ensure_plain(self, *, label: str, tag: str, context: Path, dockerfile: str,
                     args: dict[str, str] | None = None) -> str:
        """The image `tag` built from `context` as it is, without air's layer (a task's service: air runs nothing
        in it), under the same rules for the network as a task's Dockerfile; `args`: its build args (compose's
        `build.args`)."""
        if self.exists(tag):
            return tag
        started = time.monotonic()
        self._build(label, None, context, dockerfile, tag=tag, labels={"air.task-image": label}, network=self.network,
                    args=args)
        self.report(f"[{label}] built {tag} in {time.monotonic() - started:.0f} s")
        return tag

    def ensure_layer(self, *, label: str, tag: str, context: Callable[[], bytes]) -> str:
        """The image `tag` built from the tar `context()` makes (asked only when the image is not there), with the
        network where builds have it (its steps tolerate having none)."""
        if self.exists(tag):
            return tag
        started = time.monotonic()
        self._build(label, context(), None, tag=tag, labels={"air.task-image": label}, network=self.network)
        self.report(f"[{label}] built {tag} in {time.monotonic() - started:.0f} s")
        return tag

    def python_version(self, image: str) -> str:
        """The image's python3, as X.Y (3.11 when it cannot be asked)."""
        try:
            asked = "import sys; print('%d.%d' % sys.version_info[:2])"
            out = self.client.containers.run(image, ["python3", "-c", asked], remove=True, network_mode="none",
                                             user="root", entrypoint=["/usr/bin/env"],
                                             labels={"air.role": "image-probe"})
            return out.decode().strip() or "3.11"
        except docker.errors.DockerException:
            return "3.11"

    def _build(self, label: str, fileobj: bytes | None, context: Path | None, dockerfile: str = "Dockerfile", *,
               tag: str | None = None, labels: dict[str, str] | None = None, network: bool = False,
               args: dict[str, str] | None = None) -> str:
        """One build, with the daemon's default network or none; the image id, or ImageError naming the step that
        failed."""
        if fileobj is None and context is not None and (text := _as_buildkit_reads(context / dockerfile)):
            fileobj, dockerfile = _rewritten_context(context, text), REWRITTEN
        kwargs = dict(fileobj=io.BytesIO(fileobj), custom_context=True, dockerfile=dockerfile) \
            if fileobj is not None else dict(path=str(context), dockerfile=dockerfile)
        # An image inherits its parent's labels: one built on air/cpu would carry `air.recipe=cpu` and the cpu
        # recipe's `air.inputs`, and the recipe builder, which finds its builds by those labels, would take it for
        # a build of the cpu recipe and point air/cpu:latest at it. Every build here says what it is instead.
        labels = {**TASK_IMAGE_LABELS, **(labels or {})}
        step, total, instruction = 0, 0, ""
        tail: list[str] = []
        image_id = None
        try:
            for chunk in self.api.build(tag=tag, network_mode=None if network else "none", rm=True, forcerm=True,
                                        decode=True, labels=labels, buildargs=args or None, **kwargs):
                if "error" in chunk:
                    raise ImageError(_failed(label, step, total, instruction, chunk["error"], tail,
                                             (network, self.network_why)))
                for line in _ANSI.sub("", chunk.get("stream", "")).splitlines():
                    line = line.strip()
                    if not line or _NOISE.match(line):
                        continue
                    found = _STEP.match(line)
                    if found:  # the builder counts each label given as a step of its own, after the file's
                        step, total, instruction = (int(found.group(1)), int(found.group(2)) - len(labels),
                                                    found.group(3))
                        self.report(f"[{label}] {line[:110]}")
                        tail = []
                    elif not _IMAGE_OF_STEP.match(line):
                        tail = (tail + [line])[-6:]
                image_id = (chunk.get("aux") or {}).get("ID", image_id)
        except docker.errors.APIError as exc:
            raise ImageError(_failed(label, step, total, instruction, exc.explanation or str(exc), tail,
                                     (network, self.network_why))) from None
        except requests.exceptions.RequestException as exc:
            raise ImageError(f"{label}: the Docker daemon did not answer the build ({exc})") from None
        if image_id is None:
            raise ImageError(f"{label}: the build ended without an image")
        return image_id


_COPY_INTO_DOT = re.compile(r"^(\s*(?:COPY|ADD)\s(?:[^\[\n].*?)\s)(\.{1,2})[ \t]*$", re.IGNORECASE | re.MULTILINE)
REWRITTEN = ".air.Dockerfile"


def _as_buildkit_reads(path: Path) -> str | None:
    """The Dockerfile with what BuildKit takes and the legacy builder refuses made explicit; None when nothing is.
    Harbor builds with compose, so with BuildKit; air builds with the daemon's legacy builder (docker-py has no
    BuildKit session). One difference is in real tasks (harbor-cookbook's simulated-user): `COPY a b .`, several
    sources into the working directory, which the legacy builder refuses ("the destination must be a directory and
    end with a /"); BuildKit reads `.` as the directory it is. Such a line gets the slash."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the build says what is wrong with it
    rewritten = _COPY_INTO_DOT.sub(lambda m: f"{m.group(1)}{m.group(2)}/", text)
    return rewritten if rewritten != text else None


def _rewritten_context(context: Path, dockerfile: str) -> bytes:
    """The context as docker-py sends a folder (its .dockerignore honoured), with `dockerfile` beside it as
    REWRITTEN, which COPY leaves out (docker-py's own way for a Dockerfile given as text)."""
    ignore = context / ".dockerignore"
    exclude = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and
               not line.strip().startswith("#")] if ignore.is_file() else None
    return docker.utils.tar(str(context), exclude=exclude, dockerfile=(REWRITTEN, dockerfile)).read()


def air_layer(image: str, workdir: str) -> str:
    """The Dockerfile of air's layer over the task's `image`, whose working directory is `workdir`."""
    path = workdir.rstrip("/") or "/"
    moved = ""
    if path not in ("/", WORKSPACE):
        # The directory's files start every workspace; the directory itself becomes a link to the workspace.
        q = shlex.quote(path)
        moved = (f" && if [ -d {q} ] && [ ! -L {q} ]; then cp -a {q}/. {IMAGE_WORKSPACE}/ && rm -rf {q}; fi"
                 f" && mkdir -p \"$(dirname {q})\" && ln -sfn {WORKSPACE} {q}")
    elif path == WORKSPACE:  # under the home, which is a new in-memory directory in a sandbox: keep its files
        moved = f" && if [ -d {WORKSPACE} ]; then cp -a {WORKSPACE}/. {IMAGE_WORKSPACE}/; fi"
    checks = ("command -v python3 >/dev/null || { echo 'air: the image has no python3, which runs air warden; "
              "install python3 >= 3.9 in the Dockerfile' >&2; exit 97; }"
              " && python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' || { echo 'air: the python3 of "
              "the image is older than 3.9, which air warden needs' >&2; exit 97; }"
              " && command -v bash >/dev/null || { echo 'air: the image has no bash' >&2; exit 97; }")
    links = " && ".join(f"rm -rf /{name} && ln -s {HARBOR_DIR}/{name} /{name}" for name in HARBOR_PATHS)
    return (f"FROM {image}\nUSER root\n"
            f"RUN {checks}"
            f" && mkdir -p {IMAGE_WORKSPACE} {AIR_DIR}/etc{moved} && {links}\n"
            f"WORKDIR {WORKSPACE}\n")


def _context_of(folder: Path, dockerfile: str) -> bytes:
    """A build context: the folder's files and a Dockerfile of air's beside them (named Dockerfile.air)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
        # COPY leaves out what .dockerignore names: air's own two files stay out of the image.
        ignore = b"Dockerfile.air\n.dockerignore\n"
        for name, data in (("Dockerfile.air", dockerfile.encode()), (".dockerignore", ignore)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _failed(label: str, step: int, total: int, instruction: str, error: str, tail: list[str],
            network: tuple[bool, str] = (False, "")) -> str:
    """One line: which step failed, and why as the build said it, with whether the network was on and why."""
    error = " ".join(error.split())
    said = " ".join(" ".join(tail).split())
    where = f"step {step}/{total} `{_short(instruction)}`" if step else "the build"
    if instruction.upper().startswith("FROM"):
        return (f"{label}: {where}: the base image is not on this Docker daemon and cannot be pulled here "
                f"({_short(error, 160)}); `docker load` it, or build where a registry is reachable")
    if "exit 97" in said or "air: " in said:
        return f"{label}: {_short(next((p for p in tail if p.startswith('air: ')), said), 200)}"
    on, why = network
    # What a step printed last says why it failed (a traceback's cause is its last line): its end is kept.
    if on:
        return f"{label}: {where} failed (built with the network: {why}): {_end(said or error, 200)}"
    return (f"{label}: {where} failed with the network off ({why or 'offline'}; a step that downloads needs a "
            f"machine with the network): {_end(said or error, 200)}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _end(text: str, limit: int) -> str:
    """`text`'s last `limit` characters: a build's output ends with its error (a Python traceback with its cause)."""
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


__all__ = ["DockerfileBuilder", "HARBOR_DIR", "IMAGE_WORKSPACE", "OFFLINE_VARIABLE", "air_layer", "build_network",
           "dockerfile_digest", "workdir_problem"]
