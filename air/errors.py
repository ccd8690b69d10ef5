"""One small error taxonomy, so callers can tell whose fault a failure is.

- InfraError: the machinery failed (daemon unreachable, container gone, image missing, pool exhausted).
  A rollout that hits one is marked failed and excluded from training, never scored 0.
- TaskError: the task itself is broken (bad spec, evaluation crashed on a valid submission).
- The agent's own mistakes (format errors, failing commands, timeouts) are not exceptions: they are
  observations the agent sees, recorded on results (e.g. `CommandResult.timed_out`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


class AirError(Exception):
    """Base of every error air raises on purpose; `str(err)` is a one-line message for humans."""


class InfraError(AirError):
    """Infrastructure failed; the rollout must be excluded, not scored."""


class DockerUnavailable(InfraError):
    """The Docker daemon cannot be reached."""


class DaemonStalled(DockerUnavailable):
    """The Docker daemon takes calls but answers none within their bound (stopped, wedged, overloaded): named with
    what was waited for and its fix. Nothing is known to have happened, nor not to: a removal may be pending."""


TASK_IMAGE_PREFIX = "harbor-"
"""air/harbor-<task>: images built from a Harbor task's own Dockerfile (air.tasks.harbor), not from a recipe."""


class ImageError(InfraError):
    """An image is missing or cannot be built."""

    @classmethod
    def not_built(cls, image: str) -> ImageError:
        """`image` is not on the daemon: name the command that builds it (air's images are air/<recipe>:<tag>;
        air builds no other image, so for those the way to get one)."""
        if not image.startswith("air/"):
            return cls(f"image {image} is not on the Docker daemon; air builds only its own air/<recipe> images "
                       f"(`air images ls`): `docker pull {image}` or `docker load` it")
        recipe = image.removeprefix("air/").split(":")[0]
        if recipe.startswith(TASK_IMAGE_PREFIX):  # no recipe of that name: `air images build` would refuse it
            return cls(f"image {image} is not built; it is a Harbor task's own image, built from the task's "
                       "environment/ when the task is first run or checked (`air tasks check harbor:<task> "
                       "--harbor-root <dataset>`)")
        if not _has_recipe(recipe):  # `air images build` would refuse it too: never told to run it
            return cls(f"image {image} is not built, and air has no recipe '{recipe}' to build it from (`air images "
                       "ls` lists them): the task names an image that does not exist; fix its image")
        return cls(f"image {image} is not built; run `air images build {recipe}`")


recipes_dir: Callable[[], Path] | None = None
"""Where air's image recipes are (air.paths.images_dir: AIR_IMAGES_DIR's folder, else the checkout's or the wheel's),
set by air.paths when it is imported: this module is below it (air.paths imports it)."""


def _has_recipe(name: str) -> bool:
    """Whether air's image recipes hold `name` (before air.paths is imported: the checkout's or the wheel's)."""
    package = Path(__file__).resolve().parent
    roots = [recipes_dir()] if recipes_dir else [package.parent / "images", package / "_bundled" / "images"]
    return any((root / name / "recipe.toml").is_file() for root in roots)


class SandboxUnavailable(InfraError):
    """The sandbox is gone or unusable: container removed, PID 1 killed, daemon error."""


class PoolExhausted(InfraError):
    """No sandbox (or no GPU) became free within the lease timeout."""


class DataUnavailable(InfraError):
    """A dataset a task needs is not in air's local data store (`air data add` stages it)."""


class DiskFull(InfraError):
    """A file air writes found no space (or no quota) left on its device; the message names the file."""


class ModelUnavailable(InfraError):
    """The model endpoint cannot be reached or answered something that is not a completion."""


class TaskError(AirError):
    """The task definition or its evaluation is broken."""


class UsageError(AirError):
    """The user asked for something that cannot be done as asked (unknown name, bad flag value)."""


class SnapshotError(UsageError):
    """A snapshot cannot be taken, loaded or restored as asked (damaged, tampered with, of another task, hostile, too
    large): the message names what. Never an infrastructure failure: a snapshot is the agent's files."""


class SnapshotBusy(SnapshotError):
    """Processes besides the agent's shell run (a training job in the background): their state cannot be kept."""


class Stopped(KeyboardInterrupt):
    """A long-running service stopped by a signal, raised once its graceful shutdown is over: the command ends as
    that signal ends any air command (128 + its number), even where Ctrl-C is ignored (a background job)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
