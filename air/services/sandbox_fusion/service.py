"""The request handling behind the HTTP app, over one `SandboxPool`: plan a request (paths, sizes, timeouts),
lease a sandbox, run the program as the warden's child; /run_jupyter's own work is in jupyter.py, the files'
in files.py."""

from __future__ import annotations

import asyncio
import logging
import posixpath
import re
import shlex
from dataclasses import dataclass

from air import progress
from air.errors import InfraError
from air.sandbox import (
    AGENT_HOME,
    ArchiveTooLarge,
    ArchiveUnreadable,
    ArchiveUnwritable,
    Resources,
    SandboxSpec,
)
from air.services.running import InFlight, Interrupted
from air.services.sandbox_fusion import jupyter
from air.services.sandbox_fusion.compiled import CompileCache, Compiled, compile_key, keepable
from air.services.sandbox_fusion.config import SandboxFusionConfig
from air.services.sandbox_fusion.files import (
    Rejected,
    RequestFiles,
    UpstreamSandboxError,
    checked_path,
    decode_files,
    fetch_files,
    no_file_is_a_directory,
    place_absolute,
)
from air.services.sandbox_fusion.output import cap_stream
from air.services.sandbox_fusion.recipes import (
    RECIPES,
    CompileRefused,
    Recipe,
    availability,
    probe_argv,
)
from air.services.sandbox_fusion.schema import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)

AIR_DIR_MB = 64
"""The size of a sandbox's /srv/air, in memory: the warden's files and the image's home, copied (a few MB)."""
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
"""A UTF-16 half alone: JSON's `\\ud800` escape decodes to one, and no UTF-8 text holds it."""
log = logging.getLogger("air.services.sandbox_fusion")


@dataclass(kw_only=True)
class _Plan(RequestFiles):
    request: RunCodeRequest
    recipe: Recipe
    stdin: str
    run_timeout: float
    compile_timeout: float
    compile: str | None
    """The compile step as a shell script: the request's memory limits when they apply to it, then `exec` of the
    recipe's command (so the status is the command's own)."""
    run: str
    """The run step, likewise."""
    compile_key: str | None = None
    """The program's key in the compile cache (None: not kept, or nothing to compile)."""
    start_from: Compiled | None = None
    """A compile of the same program to start from instead of compiling."""
    warm: tuple[str, str, str] | None = None
    """The run step as (shell steps, interpreter, script), which a warm interpreter may run (its recipe's `warm`)."""

    @property
    def sf_dir(self) -> str:
        return posixpath.dirname(self.directory)


def memory_limits(mode: str, limit_mb: int) -> tuple[str, str]:
    """Shell prefixes (compile's, run's) that apply a request's memory_limit_MB as `mode` says (see
    SandboxFusionConfig.memory_limit_mode); empty when the request sets none."""
    if limit_mb <= 0:
        return "", ""
    kb = limit_mb * 1024
    if mode == "sandbox-fusion":  # upstream's preexec_fn: soft RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK, both steps
        prefix = f"ulimit -S -v {kb} && ulimit -S -d {kb} && ulimit -S -s {kb} && "
        return prefix, prefix
    return "", f"ulimit -d {kb} && "


class SandboxFusionService:
    """The request handling behind the HTTP app (usable in-process too: tests, benchmarks)."""

    def __init__(self, config: SandboxFusionConfig | None = None, pool=None):
        self.config = config or SandboxFusionConfig()
        # /srv/air in memory: a request's files and programs live in its cell's home, so air's own directory holds
        # only the warden's few files, and where nothing a cell reaches keeps a name, no host-wide drop of the
        # kernel's dentries follows each request (SandboxSpec.air_dir_mb).
        self.spec = SandboxSpec(image=self.config.image, task="sandbox-fusion", network=False, air_dir_mb=AIR_DIR_MB,
                                resources=Resources(cpus=self.config.cpus, memory_mb=self.config.memory_mb,
                                                    pids=self.config.pids))
        self.pool = pool
        self._own_pool = pool is None
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self.available: dict[str, str] = {}
        """Language -> '' when it runs here, else why not."""
        self.requests = 0
        self.warm_runs = 0
        """Programs a warm interpreter ran (SandboxFusionConfig.warm_python)."""
        self._captured = 1 << 20  # bytes per stream the sandbox's shell keeps; read from it at start
        self.compiled = CompileCache(self.config.compile_cache_mb << 20) if self.config.compile_cache_mb else None
        self.ops = InFlight()
        """The requests' runs: a stop (the server's signal) ends them at once, as the episode servers' steps."""

    # ----- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        from air.sandbox import PoolConfig, SandboxPool

        if self.pool is None:
            n = self.config.sandboxes
            self.pool = SandboxPool(PoolConfig(warm=n, max_sandboxes=n, max_leases=self.config.max_leases,
                                               lease_timeout=self.config.queue_timeout, gpu_ids=[],
                                               run_id=self.config.run_id, scoring_room=False))  # never nested
        try:
            await self.pool.start(warm_specs=[self.spec] if self._own_pool else [])
            await self._probe_languages()
        except BaseException:
            await self.close()
            raise

    async def stop(self) -> None:
        """At the signal, before uvicorn closes the connections: every run in flight ends now (its program killed
        with its sandbox) and is answered SandboxError, not waited for up to its run timeout."""
        await self.ops.stop()

    async def close(self) -> None:
        await self.ops.stop()
        if self.pool is not None and self._own_pool:
            await self.pool.close()

    async def _probe_languages(self) -> None:
        progress.stage(f"sandbox-fusion: finding the languages {self.config.image} has")
        async with self.pool.lease(self.spec) as sb:
            result = await sb.session.run_untrusted(probe_argv(), timeout=60)
            self._captured = getattr(sb.session, "output_limit", self._captured)
        self.available = availability(set(result.stdout.split()), self.config.image)
        log.info("languages available in %s: %s", self.config.image, ", ".join(self.languages()))

    def languages(self) -> list[str]:
        return [lang for lang, why in self.available.items() if not why]

    # ----- one request --------------------------------------------------------------------------------------
    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        self.requests += 1
        try:
            plan = self._plan(request)
        except Rejected as exc:
            return RunCodeResponse(status=RunStatus.Failed, message=str(exc))
        except UpstreamSandboxError as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=str(exc))
        except CompileRefused as exc:  # upstream's answer, word for word: its runner's "compile error" is an Error
            why = str(exc)
            return RunCodeResponse(status=RunStatus.SandboxError, message=why, compile_result=CommandRunResult(
                status=CommandRunStatus.Error, return_code=1, stderr=why))
        if plan.compile_key is None:
            return await self._leased(lambda sandbox: self._execute(sandbox, plan), RunCodeResponse)
        # The first request of a program compiles it; the same program's others wait here, without a slot or a
        # sandbox, and start from its outcome (compiled.py).
        plan.start_from, lead = await self.compiled.lookup(plan.compile_key, plan.compile_timeout)
        if not lead:
            plan.compile_key = None
        if plan.start_from is not None and plan.start_from.tar is None and not plan.fetch:
            return self._response(None, plan, plan.start_from.result, None, {})  # its compile error, again
        if plan.start_from is not None:
            plan.request_id = plan.start_from.request_id  # the directory its tar holds
        try:
            return await self._leased(lambda sandbox: self._execute(sandbox, plan), RunCodeResponse)
        finally:
            if lead:  # whatever happened before the compile settled it: the waiting requests compile on their own
                self.compiled.settle(plan.compile_key, None)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        """The cells in one fresh kernel in a leased sandbox (jupyter.py)."""

        self.requests += 1
        try:
            plan = jupyter.plan(request, max_timeout=self.config.max_run_timeout,
                                max_input_bytes=self.config.max_input_bytes)
        except Rejected as exc:
            return RunJupyterResponse(status=RunStatus.Failed, message=str(exc))
        except UpstreamSandboxError as exc:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=str(exc))
        return await self._leased(lambda sandbox: jupyter.execute(self, sandbox, plan), RunJupyterResponse)

    async def _leased(self, work, answer):
        """await work(sandbox) within a slot and a leased sandbox; a busy server or an infrastructure fault is
        `answer(status=SandboxError, message=...)`."""
        try:
            if self._slots.locked():  # else a slot is taken at once, and no timer is set for it
                async with asyncio.timeout(self.config.queue_timeout):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()
        except TimeoutError:
            return answer(status=RunStatus.SandboxError,
                          message=f"server busy: no free slot within {self.config.queue_timeout:g}s")
        async def run():
            async with self.pool.lease(self.spec) as sandbox:
                return await work(sandbox)

        try:
            return await self.ops.result(self.ops.start(run()))
        except Interrupted as exc:
            return answer(status=RunStatus.SandboxError, message=f"{exc}; nothing of it was kept")
        except InfraError as exc:
            log.warning("sandbox error: %s", exc)
            return answer(status=RunStatus.SandboxError, message=f"sandbox infrastructure error: {exc}")
        finally:
            self._slots.release()

    def _plan(self, request: RunCodeRequest) -> _Plan:
        why = self.available.get(request.language, "")
        if why:
            raise Rejected(f"language {request.language!r} is not available: {why}; available here: "
                           f"{', '.join(self.languages())}")
        recipe = RECIPES[request.language]
        lone = _LONE_SURROGATE.search(request.code)
        if lone:  # upstream's write of the source raises on it (HTTP 500 there): said here, nothing run
            raise Rejected(f"code holds a lone surrogate (U+{ord(lone.group()):04X} at character {lone.start()}), "
                           "which no source file can hold: send the code as valid Unicode")
        main = shlex.quote(recipe.main(request.code)) if recipe.main else ""  # CompileRefused first, as upstream
        files, absolute = decode_files(request.files)
        names = [*files, *absolute]
        # Upstream writes the code after the files, to a fresh temporary name (never an upload's); a fixed name
        # (Java's Main.java) replaces an upload of that name there, and so here.
        source = recipe.source_name(request.code, taken=files)
        if source is not None:
            files[source] = (recipe.transform(request.code) if recipe.transform else request.code).encode()
        fields = {"src": shlex.quote(source or ""), "main": main,
                  "cp": shlex.quote(recipe.class_path(names)) if recipe.class_path else ""}
        no_file_is_a_directory(files)
        notes = []
        try:
            stdin = request.stdin.encode() if request.stdin is not None else b""
        except UnicodeEncodeError:  # upstream's write of it raises, is logged, and the program runs without it
            stdin = b""
            notes.append("stdin holds a lone surrogate, which cannot be encoded: the program ran with empty stdin, "
                         "as SandboxFusion's does")
        size = sum(map(len, files.values())) + sum(map(len, absolute.values())) + len(stdin)
        if size > self.config.max_input_bytes:
            raise Rejected(f"code, stdin and files are {size} bytes; this server takes at most "
                           f"{self.config.max_input_bytes}")
        fetch = [(path, checked_path(path, "fetch")) for path in request.fetch_files]
        limit = self.config.max_run_timeout

        def bounded(name: str, value: float) -> float:
            """Past the server's maximum: lowered, and the message says so. 0 or less stays, and NaN is 0: the step
            then times out at once without running, as upstream's does (its asyncio timer for NaN fires at once)."""
            if value != value:
                return 0.0
            if value > limit:
                notes.append(f"{name} {value:g}s lowered to this server's maximum {limit:g}s")
            return min(value, limit)

        compile_limits, run_limits = memory_limits(self.config.memory_limit_mode, request.memory_limit_MB)
        # Kept when the run never names the source file (whose temporary name differs between requests).
        key = (compile_key(request, compile_limits) if recipe.compile and self.compiled is not None
               and "{src}" not in recipe.run else None)
        return _Plan(request=request, recipe=recipe, files=files, absolute=absolute, fetch=fetch, notes=notes,
                     compile_key=key, stdin=stdin.decode("utf-8", "surrogateescape"),
                     run_timeout=bounded("run_timeout", request.run_timeout),
                     compile_timeout=bounded("compile_timeout", request.compile_timeout) if recipe.compile else 0,
                     compile=f"{compile_limits}exec {recipe.compile.format(**fields)}" if recipe.compile else None,
                     run=f"{run_limits}exec {recipe.run.format(**fields)}",
                     # Not when files go outside the request's directory: one could be a start-up file of python3's
                     # (a usercustomize), which a warm interpreter read before the request came.
                     warm=(run_limits, "python3", source) if recipe.warm and source and not absolute
                     and self.config.warm_python else None)

    async def _execute(self, sandbox, plan: _Plan) -> RunCodeResponse:
        # The request's files are laid down by the first program's own process (one step, not two), or on their
        # own when something must happen between (absolute paths) or no program runs and files are fetched.
        files: tuple[str, bytes] | None = (
            (plan.sf_dir, plan.start_from.tar) if plan.start_from is not None and plan.start_from.tar is not None
            else (AGENT_HOME, plan.tar()))
        try:
            if plan.absolute:
                await sandbox.session.unpack(*files)
                files = None
                problem = await place_absolute(sandbox, plan.directory, plan.absolute)
                if problem:
                    return RunCodeResponse(status=RunStatus.Failed, message=problem, executor_pod_name=sandbox.name)
            compile_result = plan.start_from.result if plan.start_from is not None else None
            if plan.compile and compile_result is None:
                compile_result = await self._program(sandbox, plan.compile, cwd=plan.directory,
                                                     timeout=plan.compile_timeout, files=files)
                files = None
                if plan.compile_key is not None:
                    self.compiled.settle(plan.compile_key, await self._keep(sandbox, plan, compile_result))
            run_result = None
            if compile_result is None or (compile_result.status == CommandRunStatus.Finished
                                          and compile_result.return_code == 0):
                # What the program leaves running is killed by the reset after the lease, unless its files are
                # fetched: then first, so that nothing changes them while they are read.
                run_result = await self._program(sandbox, plan.run, cwd=plan.directory, stdin=plan.stdin,
                                                 timeout=plan.run_timeout, reap=bool(plan.fetch), files=files,
                                                 warm=plan.warm)
                files = None
            if files is not None and plan.fetch:
                await sandbox.session.unpack(*files)
        except ArchiveUnwritable as exc:  # the request's files do not fit the home: upstream's answer to files it
            return RunCodeResponse(status=RunStatus.SandboxError, message=str(exc),  # cannot write
                                   executor_pod_name=sandbox.name)
        # Fetched after a failed compile too, as upstream does.
        files = (await fetch_files(sandbox, plan.directory, plan.fetch, plan.notes, self.config.max_fetch_bytes)
                 if plan.fetch else {})
        return self._response(sandbox, plan, compile_result, run_result, files)

    async def _keep(self, sandbox, plan: _Plan, result: CommandRunResult) -> Compiled | None:
        """What the compile cache keeps of this compile: its result and, when it succeeded, the request's directory
        as the compiler left it (read with the agent's rights; every process of the compile was reaped)."""
        if not keepable(result):
            return None
        tar = None
        if result.return_code == 0:
            try:
                tar = await sandbox.session.pack([posixpath.basename(plan.directory)], root=plan.sf_dir,
                                                 max_bytes=self.compiled.max_bytes)
            except (FileNotFoundError, ArchiveTooLarge, ArchiveUnreadable):
                return None
        return Compiled(result=result, request_id=plan.request_id, tar=tar)

    def _response(self, sandbox, plan: _Plan, compile_result: CommandRunResult | None,
                  run_result: CommandRunResult | None, files: dict[str, str]) -> RunCodeResponse:
        failed = any(r is not None and (r.status != CommandRunStatus.Finished or r.return_code != 0)
                     for r in (compile_result, run_result))
        return RunCodeResponse(status=RunStatus.Failed if failed else RunStatus.Success,
                               message="; ".join(plan.notes), compile_result=compile_result,
                               run_result=run_result, executor_pod_name=sandbox.name if sandbox else None,
                               files=files)

    async def _program(self, sandbox, script: str, *, cwd: str, timeout: float, stdin: str = "",
                       reap: bool = True, files: tuple[str, bytes] | None = None,
                       warm: tuple[str, str, str] | None = None) -> CommandRunResult:
        """One step (a compile or a run) as the warden's own child: its script ends in `exec`, so the status is
        the kernel's and nothing the program prints or forks can forge a finish or an exit code. A timeout of 0
        or less (or NaN) times out at once without running, as upstream's does. `files` (dest, tar) are laid down first
        whatever happens (ArchiveUnwritable). `warm`: the step as a warm interpreter may run it (run_untrusted)."""
        if not timeout > 0:  # NaN too: upstream's asyncio timer for it fires at once
            if files is not None:
                await sandbox.session.unpack(*files)
            return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=0.0, stdout="",
                                    stderr="")
        # The OOM counter before and after this program: a kill counted in between is this program's (an
        # earlier request's, or its own child's while it went on to exit normally, is not).
        oom_before = await sandbox.oom_kills()
        # /bin/sh by its path: the warden's fork then skips a PATH search (about a millisecond).
        result = await sandbox.session.run_untrusted(["/bin/sh", "-c", script], cwd=cwd, stdin=stdin,
                                                     timeout=timeout, reap=reap, files=files, warm=warm)
        self.warm_runs += result.warm
        limit, captured = self.config.output_limit, self._captured
        stdout, stderr = cap_stream(result.stdout, limit, captured), cap_stream(result.stderr, limit, captured)
        if result.timed_out:
            return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=result.duration,
                                    return_code=None, stdout=stdout, stderr=stderr)
        code = result.exit_code  # negative: killed by that signal, as Python's subprocess and upstream report
        if code == -9 and await sandbox.oom_kills() > oom_before:
            sandbox.mark_broken("a program was OOM-killed")
            # The cgroup's limit, which is what was hit: the programs' memory_mb plus the in-memory filesystems.
            stderr += (f"\n[air: the program was killed for using more than the sandbox's "
                       f"{self.spec.memory_limit_mb} MB of memory ({self.config.memory_mb} MB for programs, the "
                       "rest for its in-memory /tmp, /var/tmp and home while they are empty)]\n")
        return CommandRunResult(status=CommandRunStatus.Finished, execution_time=result.duration,
                                return_code=code, stdout=stdout, stderr=stderr)
