"""air as a Harbor environment: `harbor run -p TASK -a AGENT --env air.services.harbor.environment:AirEnvironment`.

Harbor's runner (harbor 0.25 and 0.26, `harbor run` and `harbor serve`'s jobs) drives environment backends through
`harbor.environments.base.BaseEnvironment`; this one is air's pool: the task folder is read by air's own Harbor
loader (air.tasks.harbor.loader), its image built offline by air's builder with air's layer, and a trial is one lease
of a warm sandbox (a new cell: namespaces, home, temp dirs), with the task's limits, its exclusive GPUs, and no network
whatever the task asks (air gives none).

How Harbor's calls map:
- `exec(command, user=...)`: bash in the lease's cell, as the warden's child. Root (Harbor's harness steps: chmod,
  rm of stale rewards; and the verifier's test.sh, which runs as "the container's default user") runs as root of
  the cell, which keeps only what air's scoring keeps (no mount, network or namespace capability, seccomp); every
  other user, and the agent phase's default, is air's unprivileged agent (Harbor's agents run as root in Docker:
  here they cannot, and need not).
- /tests, /logs and /solution link into air's directory (/srv/air/harbor), read-only in the cell; /logs links on
  to the cell's own tmpfs (/srv/air/out): /logs/agent and /logs/artifacts are the agent's, /logs/verifier root's
  (readable), so no agent process can write a reward.
- Before the tests are uploaded (the verifier's first upload), every process the agent left is killed: nothing of
  the agent runs while the tests do.
- The verifier runs in the agent's cell, as Harbor's runner does by default (shared mode); a task that asks for a
  separate verifier gets a second lease from Harbor's runner itself: a fresh sandbox of the same image, or of the
  verifier's own image (tests/Dockerfile, built by air's builder) with tests/ at /tests, as that image holds them.
  A test that installs its tools at verify time (`apt-get install`, uv's installer, `uvx --with pytest`) finds them
  as under `air eval`: the sandbox is of air's scoring image (the task's, with those put in it when built:
  air.tasks.harbor.installs) and the verifier's commands read its BASH_ENV (offline uv and pip).
- A compose task (environment/docker-compose.yaml: Harbor's `docker_compose` capability): its services are air's, as
  under `air eval` (air.sandbox.docker.services): made for the lease's sandbox on a private network of its own (no route
  out, no other sandbox's services), the agent's cell reaching them by name. Harbor's per-service operations
  (`service_exec`, `service_download_*` for `[[verifier.collect]]` hooks and artifacts of a service) run in this
  rollout's service containers; `stop_service("main")` ends every process the agent left (the cell is main's
  container here), a service's stops its container.

Harbor is not a dependency of air: this module is imported by Harbor's runner, in an environment holding harbor
(Python >= 3.12) and air (`pip install harbor air-mlgym`; docs/harbor.md).
"""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult, ServiceOperationsUnsupportedError
from harbor.environments.capabilities import EnvironmentCapabilities

from air.images.dockerfile import HARBOR_DIR, HARBOR_PATHS
from air.sandbox import WORKSPACE, PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.harbor.collect import FROM_SERVICES_LIMIT
from air.tasks.harbor.contract import LOGS, harbor_dirs_sh
from air.tasks.harbor.installs import BASH_ENV
from air.tasks.harbor.loader import load_harbor_task
from air.tasks.task_images import ensure_task_image

VERIFIER_HOME = "/tmp/air-verifier-home"
"""HOME of the verifier's commands (root's, made when the agent's phase ends): never the agent's home."""
DEFAULT_TIMEOUT = 24 * 3600.0
"""A command without a timeout of Harbor's: bounded all the same (the trial's own timeouts cut it sooner)."""


class AirEnvironment(BaseEnvironment):
    """One Harbor trial on one lease of air's pool."""

    @staticmethod
    def type() -> str:
        return "air"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(gpus=True, disable_internet=True, docker_compose=True)

    @classmethod
    def preflight(cls, kwargs: dict | None = None) -> None:
        """Before any trial is queued: harbor 0.26 passes the job's environment options (`--ek`, by keyword
        `kwargs`), 0.25 none. air's environment takes none but Harbor's own `auto_mounting` (false: air binds nothing
        of the host into a sandbox), so an option it would otherwise ignore, a typo's among them, is refused here,
        naming it, before anything starts."""
        given = dict(kwargs or {})
        unknown = sorted(k for k in given if k not in ("auto_mounting", "suppress_override_warnings"))
        if unknown:
            raise ValueError(f"the air environment takes no options: {', '.join(map(repr, unknown))}")
        if given.get("auto_mounting") not in (None, False):
            raise ValueError("the air environment mounts nothing of the host (auto_mounting must be false)")

    @property
    def _uses_compose(self) -> bool:
        return (self.environment_dir / "docker-compose.yaml").is_file()

    def _validate_extra_docker_compose_support(self) -> None:
        # Harbor's base allows them with the capability; air's loader reads the task's own compose file alone.
        if self.extra_docker_compose_paths:
            raise ValueError("the air environment does not read --extra-docker-compose files (only the task's own "
                             "environment/docker-compose.yaml)")

    def _validate_definition(self) -> None:
        if not (self.environment_dir / "Dockerfile").is_file() and not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{self.environment_dir}: no Dockerfile and no [environment].docker_image")

    # ----- life ------------------------------------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        env_dir = self.environment_dir.resolve()
        task_dir = env_dir.parent
        spec = load_harbor_task(task_dir.parent, task_dir.name)
        # Harbor starts a separate verifier that has an image of its own (tests/Dockerfile, or [verifier.environment]
        # docker_image) from tests/, and uploads no tests to it: the image holds them (`COPY . /tests/`). Here that
        # image is air's build of it, whose /tests links into air's directory: tests/ is laid there instead.
        bundled = env_dir.name == "tests" and spec.verifier_image is not None and not spec.verifier_installs
        if bundled:
            spec = spec.replace(image=spec.verifier_image, build=spec.verifier_build)
        resources = spec.resources.model_copy(update={
            "cpus": float(self.task_env_config.cpus or spec.resources.cpus),
            "memory_mb": self.task_env_config.memory_mb or spec.resources.memory_mb,
            "gpus": self.task_env_config.gpus or 0})
        spec = spec.replace(resources=resources, env={**spec.env, **self._persistent_env})
        self._bash_env = spec.verifier_installs
        if spec.verifier_installs:  # the sandbox is of the scoring image (built here, over the task's, first)
            await ensure_task_image(spec)
            spec = spec.replace(image=spec.verifier_image, build=None, verifier_image=None, verifier_build=None,
                                verifier_installs=False)
        self.spec = spec
        self.pool = SandboxPool(PoolConfig(max_sandboxes=2, gpu_ids=None if resources.gpus else []))
        await self.pool.start()
        self._lease = TaskEnvironment(self.spec, self.pool).lease()
        self.sandbox = await self._lease.__aenter__()
        self._reaped = False
        await self.sandbox.harness_sh(harbor_dirs_sh(self.sandbox.agent_uid))
        if bundled:  # no agent ever works here: Harbor's default user is the verifier's, root
            await self._unpack("/tests", _tar({p.name: p for p in sorted(env_dir.iterdir())}))
            await self._end_agent()

    async def stop(self, delete: bool) -> None:
        lease, self._lease = getattr(self, "_lease", None), None
        try:
            if lease is not None:
                await lease.__aexit__(None, None, None)
        finally:
            if getattr(self, "pool", None) is not None:
                await self.pool.close()

    # ----- commands --------------------------------------------------------------------------------------------
    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        user = self._resolve_user(user)
        # No user is Harbor's "the container's default" (root in Docker): air's agent while the agent works, root
        # once the verifier has begun (its tests uploaded), as Harbor's verifier runs by default.
        as_root = user in ("root", 0, "0") or (user is None and self._reaped)
        env = self._merge_env(env) or {}
        if self._reaped and as_root:  # the verifier's commands: a home of their own; the test's installs, offline
            env = {"HOME": VERIFIER_HOME, **({"BASH_ENV": BASH_ENV} if self._bash_env else {}), **env}
        result = await self.sandbox.session.run_untrusted(
            ["bash", "-c", command], cwd=cwd or WORKSPACE, env=env,
            timeout=float(timeout_sec or DEFAULT_TIMEOUT), user="root" if as_root else "agent", reap=False)
        code = 124 if result.timed_out else result.exit_code
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=code)

    async def _end_agent(self) -> None:
        """The agent's phase is over: every process it left ends (reap kills them all as it returns), and the
        verifier's commands get a home of root's own, made now: the cell's HOME is the agent's, where it could leave
        what test.sh runs as root (uv's installer's `~/.local/bin/env`, which test.sh sources; a `uvx` there)."""
        if self._reaped:
            return
        await self.sandbox.session.run_untrusted(["true"], user="agent", reap=True)
        made = await self.sandbox.session.run_untrusted(
            ["sh", "-c", f"rm -rf {VERIFIER_HOME} && mkdir -m 700 {VERIFIER_HOME}"], user="root", cwd="/",
            timeout=60, reap=False)
        if made.exit_code != 0:
            raise RuntimeError(f"the verifier's home {VERIFIER_HOME} could not be made: {made.stderr.strip()}")
        self._reaped = True

    # ----- a compose task's services (Harbor's per-service operations) -----------------------------------------
    def _service(self, service: str) -> str:
        """The container of this rollout's service `service`."""
        services = getattr(self.sandbox, "services", None)
        if services is None or service not in services.ids:
            known = ", ".join(sorted(services.ids)) if services is not None else "none"
            raise ServiceOperationsUnsupportedError(f"this task has no service {service!r} (its services: {known})")
        return services.ids[service]

    async def service_exec(self, command: str, *, service: str | None = None, cwd: str | None = None,
                           env: dict[str, str] | None = None, timeout_sec: int | None = None,
                           user: str | int | None = None) -> ExecResult:
        if self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        self._service(service)
        # As Harbor's docker does: the service's own workdir, user and environment unless given.
        prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        prefix += f"cd {shlex.quote(cwd)} && " if cwd else ""
        code, output = await self.sandbox.services.exec(service, prefix + command, user=None if user is None else
                                                        str(user), timeout=float(timeout_sec or DEFAULT_TIMEOUT))
        return ExecResult(stdout=output, stderr="", return_code=124 if code is None else code)

    async def _service_tar(self, service: str, path: str) -> bytes:
        self._service(service)
        got = await self.sandbox.services.archive(service, path, FROM_SERVICES_LIMIT)
        if got is None:
            raise FileNotFoundError(f"service {service}: no {path}, or over {FROM_SERVICES_LIMIT >> 20} MB")
        return got

    async def service_download_file(self, source_path: str, target_path: Path | str, *,
                                    service: str | None = None) -> None:
        if self.is_main_service(service):
            return await self.download_file(source_path, target_path)
        with tarfile.open(fileobj=io.BytesIO(await self._service_tar(service, source_path))) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            if member is None:
                raise IsADirectoryError(f"service {service}: {source_path} is not a regular file")
            Path(target_path).parent.mkdir(parents=True, exist_ok=True)
            Path(target_path).write_bytes(tar.extractfile(member).read())

    async def service_download_dir(self, source_dir: str, target_dir: Path | str, *,
                                   service: str | None = None) -> None:
        if self.is_main_service(service):
            return await self.download_dir(source_dir, target_dir)
        # Docker's tar names the folder itself first: its contents go under target_dir, as Harbor's copy puts them.
        _extract(await self._service_tar(service, source_dir), Path(target_dir),
                 posixpath.basename(posixpath.normpath(source_dir)) + "/")

    async def stop_service(self, service: str) -> None:
        if self.is_main_service(service):  # main is the agent's cell: every process it left ends
            await self._end_agent()
            return
        services = self.sandbox.services
        await services.docker.call(services.docker.api.stop, self._service(service), timeout=60)

    # ----- files -----------------------------------------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        await self._unpack(posixpath.dirname(target_path), _tar({posixpath.basename(target_path): source}))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        if _real(target_dir).startswith(f"{HARBOR_DIR}/tests") and not self._reaped:
            await self._end_agent()  # the verifier begins
        source = Path(source_dir)
        await self._unpack(target_dir, _tar({p.name: p for p in sorted(source.iterdir())}))

    async def _unpack(self, target_dir: str, tar: bytes) -> None:
        real = _real(target_dir)
        if real.startswith((HARBOR_DIR, LOGS)):  # air's directory: the harness's own copy (root's, outside any cell)
            await self.sandbox.harness_sh(f"mkdir -p {shlex.quote(real)}")
            await self.sandbox.put_archive(real, tar)
            # Harbor's runner then makes its scripts executable from inside, where /srv/air is read-only: done here.
            await self.sandbox.harness_sh(f"find {shlex.quote(real)} -type f -name '*.sh' -exec chmod a+x {{}} +")
        else:
            await self.sandbox.session.unpack(await self._linked(real), tar, user="root")

    async def _linked(self, path: str) -> str:
        """Where a path of the image leads: its working directory (`/app`) is a link air's layer made to the
        workspace, and unpacking and packing never go through a link. Only the path's own leading links are
        followed (readlink in the cell, as the agent)."""
        result = await self.sandbox.session.run_untrusted(["readlink", "-m", path], user="agent", cwd="/",
                                                          timeout=30)
        found = result.stdout.strip()
        return found if result.exit_code == 0 and found.startswith("/") else path

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.sandbox.read_file(_real(source_path))
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        real = _real(source_dir)
        if real.startswith((HARBOR_DIR, LOGS)):  # air's directory: the harness's read, root's
            raw = await self.sandbox.get_archive(real)
        else:
            real = await self._linked(real)
            raw = await self.sandbox.session.pack(["."], root=real)
        # either way, the folder comes under its own name
        _extract(raw, Path(target_dir), posixpath.basename(real.rstrip("/")) + "/")


def _extract(raw: bytes, target: Path, strip: str) -> None:
    """A tar of a folder, its contents (without the folder's own name, `strip`) into `target`; only what stays in
    `target` (tarfile's data filter)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = []
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            name = name.removeprefix(strip) if strip and name.startswith(strip) else name
            if not name or name in (".", strip.rstrip("/")):
                continue
            member.name = name
            members.append(member)
        tar.extractall(target, members=members, filter="data")


def _real(path: str) -> str:
    """Where a path of Harbor's is in the sandbox: /tests and /solution are air's directory's, /logs the cell's own
    tmpfs under it (named directly: the harness's reads and copies follow no link)."""
    path = posixpath.normpath(str(path))
    for name in HARBOR_PATHS:
        if path == f"/{name}" or path.startswith(f"/{name}/"):
            return (LOGS + path[len("/logs"):]) if name == "logs" else HARBOR_DIR + path
    return path


def _tar(files: dict[str, Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, path in files.items():
            tar.add(path, arcname=name)
    return buf.getvalue()


__all__ = ["AirEnvironment"]
