"""A task's own image (a Harbor task's Dockerfile), built when it is first needed: before a run's first rollout
(`air eval`, `air run`), or by the first lease of the task in a process that runs tasks (verifiers' env, the served
protocols). Tasks whose image is one of air's recipes need nothing here (`air images build`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable

from air.tasks.spec import TaskSpec

_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()
_present: set[str] = set()
"""Images this process found or built: a lease asks the daemon once per image, not every time."""


def build_task_image(spec: TaskSpec, client=None, report: Callable[[str], None] | None = None) -> None:
    """Build `spec.image` from the task's Dockerfile, and its verifier's image where it has one of its own, unless
    they are on the daemon (ImageError naming the failed step); one build per image at a time in this process."""
    _build(spec.source, spec.image, spec.build, client, report)
    _services(spec, client, report)
    if spec.verifier_installs:
        _build_installs(spec, client, report)
    elif spec.verifier_image is not None:
        _build(f"{spec.source} (verifier)", spec.verifier_image, spec.verifier_build, client, report)


def _services(spec: TaskSpec, client, report) -> None:
    """The images of the task's services: built from the task's folder, or named, and then on the daemon already
    (air pulls nothing: a registry is not assumed); ImageError in one line for one that is not."""
    if not spec.services:
        return
    from air.errors import ImageError
    from air.images.dockerfile import DockerfileBuilder
    from air.sandbox import connect

    for service in spec.services:
        tag, build = service.image, spec.service_builds.get(service.image)
        if tag in _present:
            continue
        with _guard:
            lock = _locks.setdefault(tag, threading.Lock())
        with lock:
            builder = DockerfileBuilder(client or connect(), report, timeout=build.timeout if build else 600)
            if build is not None:
                from air.tasks.hostenv import build_args_filled

                builder.ensure_plain(label=f"{spec.source} (service {service.name})", tag=tag, context=build.context,
                                     dockerfile=build.dockerfile or "Dockerfile", args=build_args_filled(build.args))
            elif not builder.exists(tag):
                raise ImageError(f"{spec.source}: service {service.name}'s image {tag} is not on the Docker daemon, "
                                 "and air pulls none (no registry is assumed): `docker pull` or `docker load` it "
                                 "there first")
            _present.add(tag)


def _build_installs(spec: TaskSpec, client, report) -> None:
    """The scoring image: the task's image with what its test installs at verify time (air.tasks.harbor.installs)."""
    tag, build = spec.verifier_image, spec.verifier_build
    if tag in _present:
        return
    from air.images.dockerfile import DockerfileBuilder
    from air.sandbox import connect
    from air.tasks.harbor.installs import warm_context

    with _guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        builder = DockerfileBuilder(client or connect(), report, timeout=build.timeout)
        builder.ensure_layer(label=f"{spec.source} (scoring)", tag=tag, context=lambda: warm_context(
            spec.image, build.context, builder.python_version(spec.image)))
        _present.add(tag)


def _build(label: str, tag: str, build, client, report) -> None:
    if build is None or tag in _present:
        return
    from air.images.dockerfile import DockerfileBuilder
    from air.sandbox import connect

    with _guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        builder = DockerfileBuilder(client or connect(), report, timeout=build.timeout)
        builder.ensure(label=label, tag=tag, context=build.context, dockerfile=build.dockerfile, base=build.base,
                       workdir=build.workdir)
        _present.add(tag)


def build_task_images(specs: Iterable[TaskSpec], report: Callable[[str], None] | None = None) -> None:
    for spec in specs:
        build_task_image(spec, report=report)


async def ensure_task_image(spec: TaskSpec, client=None, backend: str = "docker") -> None:
    """The task's images built unless present; on the enroot backend nothing (no daemon: its images are squashfs
    files exported where Docker built them, which its pool resolves, a missing one in one line naming the export)."""
    if backend == "enroot":
        return
    if spec.build is not None or spec.verifier_build is not None or spec.services:
        await asyncio.to_thread(build_task_image, spec, client)


__all__ = ["build_task_image", "build_task_images", "ensure_task_image"]
