"""air's own SandboxFusion-compatible code runner: `GET /v1/ping` and `POST /run_code`, on air's sandbox pool.

    air serve sandbox-fusion --port 8080 --image air/cpu:latest --concurrency 8
    curl -s localhost:8080/run_code -H 'Content-Type: application/json' -d '{"code": "print(1)", "language": "python"}'

The request and response use SandboxFusion's field names and statuses, so its official client (`sandbox-fusion`
on PyPI) and code written against it work unchanged. What differs is underneath:

- Every request runs in a container leased from one `SandboxPool`: no network, CPU, memory and pid limits, a
  non-root user, and a pool reset between requests (no process, file or temp dir of one request is seen by the
  next). The program runs in a fresh directory under the agent's home, as the agent, in the sandbox's
  persistent shell (a round trip costs well under a millisecond, where a `docker exec` costs tens).
- A timeout kills every process the program started (children, background jobs, double-forked daemons), not
  just its process group.
- Output streams are drained while the program runs, so any amount of output finishes (SandboxFusion's server
  stalls past ~128 KiB); each stream keeps its head and tail within `output_limit` and says how much it dropped.
- `fetch_files` never follows a symlink: a path is returned only if it is a regular file inside the request's
  directory with no symlink anywhere on the way.
- `SandboxError` means an infrastructure fault only (Docker, the pool, a dead container). A program that fails,
  a language the image lacks, or a bad file path is `Failed` with a message: the official client retries
  `SandboxError` up to 5 times, and a deterministic failure must not run 5 times.
- Requests beyond `concurrency` queue (up to `queue_timeout`) instead of piling onto the host.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import logging
import posixpath
import re
import secrets
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from air.errors import InfraError
from air.sandbox import (
    AGENT_HOME,
    AGENT_UID,
    AGENT_USER,
    ArchiveTooLarge,
    ArchiveUnreadable,
    Resources,
    SandboxSpec,
)

log = logging.getLogger("air.services.sandbox_fusion")

# ----- the wire schema (SandboxFusion's field names and values) -----------------------------------------------------

Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
    "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
    "verilog", "python_gpu", "lean", "swift", "racket", "python2", "gtest", "react",
]


class RunCodeRequest(BaseModel):
    """SandboxFusion's `/run_code` request. Unknown fields are ignored, as upstream does."""

    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    """> 0: the program's data segment limit (RLIMIT_DATA); the sandbox's memory limit always applies."""
    code: str
    stdin: str | None = None
    language: Language
    files: dict[str, str | None] = {}
    """Relative path -> base64 content, written into the request's directory; None values are skipped."""
    fetch_files: list[str] = []
    """Relative paths returned base64 in `files` of the response."""


class RunStatus(str, Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


# ----- configuration --------------------------------------------------------------------------------------------


class SandboxFusionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    image: str = "air/cpu:latest"
    concurrency: int = Field(8, ge=1)
    """Requests executing at once; more wait in a queue."""
    pool_size: int | None = Field(None, ge=1)
    """Sandbox containers kept (all warm); default: `concurrency`."""
    queue_timeout: float = Field(600, gt=0)
    """How long a request may wait for a slot and a sandbox before it is answered SandboxError."""
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(1024, ge=64)
    pids: int = Field(256, ge=16)
    max_run_timeout: float = Field(300, gt=0)
    """Upper bound of a request's run_timeout (and compile_timeout)."""
    output_limit: int = Field(1 << 20, ge=1024, le=1 << 20)
    """Bytes kept per stream (head and tail, with a note counting what was dropped); at most what the sandbox's
    shell captures (1 MiB)."""
    max_input_bytes: int = Field(64 << 20, ge=1024)
    """Code, stdin and files of one request together, decoded."""
    max_fetch_bytes: int = Field(16 << 20, ge=1024)
    """Fetched files of one request together; a file past the budget is left out, and the message says so."""
    max_leases: int = Field(200, ge=1)
    """Recycle a sandbox container after this many requests, however healthy it looks."""
    run_id: str | None = None
    """Label of the service's containers (default: one id per process, or AIR_RUN_ID)."""

    @property
    def sandboxes(self) -> int:
        return self.pool_size or self.concurrency


# ----- languages ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    source: str
    """File the code is written to, in the request's directory (it wins over a request file of the same name)."""
    run: str
    compile: str | None = None
    needs: tuple[str, ...] = ()
    """Commands that must be on the sandbox's PATH (probed once); `py:<module>` is a python3 module."""


RECIPES: dict[str, Recipe] = {
    "python": Recipe("main.py", "python3 main.py", needs=("python3",)),
    "pytest": Recipe("test_main.py", "python3 -m pytest -q -p no:cacheprovider test_main.py",
                     needs=("python3", "py:pytest")),
    "bash": Recipe("main.sh", "bash main.sh", needs=("bash",)),
    "perl": Recipe("main.pl", "perl main.pl", needs=("perl",)),
    "ruby": Recipe("main.rb", "ruby main.rb", needs=("ruby",)),
    "php": Recipe("main.php", "php main.php", needs=("php",)),
    "lua": Recipe("main.lua", "lua main.lua", needs=("lua",)),
    "R": Recipe("main.R", "Rscript main.R", needs=("Rscript",)),
    "julia": Recipe("main.jl", "julia main.jl", needs=("julia",)),
    "racket": Recipe("main.rkt", "racket main.rkt", needs=("racket",)),
    "nodejs": Recipe("main.js", "node main.js", needs=("node",)),
    "typescript": Recipe("main.ts", "tsx main.ts", needs=("tsx",)),
    "sql": Recipe("main.sql", "sqlite3 -bail :memory: '.read main.sql'", needs=("sqlite3",)),
    "cpp": Recipe("main.cpp", "./main", compile="g++ -std=c++17 -O2 -o main main.cpp", needs=("g++",)),
    "go": Recipe("main.go", "./main", compile="go build -o main main.go", needs=("go",)),
    "rust": Recipe("main.rs", "./main", compile="rustc -O -o main main.rs", needs=("rustc",)),
    "java": Recipe("Main.java", "java -cp . Main", compile="javac Main.java", needs=("javac", "java")),
    "swift": Recipe("main.swift", "./main", compile="swiftc -O -o main main.swift", needs=("swiftc",)),
    "verilog": Recipe("main.v", "vvp main", compile="iverilog -o main main.v", needs=("iverilog", "vvp")),
}
"""What air runs per language. The other SandboxFusion languages (test harnesses such as junit or jest, GPU
runners) are answered Failed with a message that says so."""

_PROBE = """for t in {tools}; do command -v "$t" >/dev/null 2>&1 && echo "$t"; done
for m in {modules}; do python3 -c "import $m" >/dev/null 2>&1 && echo "py:$m"; done; true"""



class _Rejected(Exception):
    """The request cannot run as asked (the caller's input, not the infrastructure): answered Failed."""


@dataclass
class _Plan:
    request: RunCodeRequest
    recipe: Recipe
    request_id: str
    files: dict[str, bytes]
    stdin: bytes | None
    fetch: list[tuple[str, str]]
    """(as requested, normalised relative path)."""
    run_timeout: float
    compile_timeout: float
    notes: list[str] = field(default_factory=list)

    @property
    def directory(self) -> str:
        return f"{AGENT_HOME}/sf/{self.request_id}"



def _relative(path: str, what: str) -> str:
    """A safe relative path inside the request's directory, normalised; _Rejected otherwise."""
    if not path or "\0" in path:
        raise _Rejected(f"{what} path {path!r} is empty or contains NUL")
    norm = posixpath.normpath(path)
    if path.startswith("/") or norm == "." or norm == ".." or norm.startswith("../"):
        raise _Rejected(f"{what} path {path!r} must be relative and stay inside the working directory")
    if len(norm.encode()) > 2048 or any(len(part.encode()) > 255 for part in norm.split("/")):
        raise _Rejected(f"{what} path {path[:80]!r}... is too long (255 bytes a name, 2048 in all)")
    return norm


_CUT_NOTE = re.compile(r"\n\[\.\.\. (\d+) bytes of output dropped \.\.\.\]\n")


def _cap(text: str, limit: int, captured: int) -> str:
    """Cut a stream the shell captured (head and tail within `captured` bytes, with its note when it dropped
    some) down to `limit` bytes, head and tail again, with one note counting every byte dropped."""
    if limit >= captured or len(text) <= limit // 4:
        return text
    head, tail, dropped = text, "", 0
    if len(text.encode("utf-8", errors="replace")) > captured:  # the shell cut it: split at its note
        notes = list(_CUT_NOTE.finditer(text))
        if notes:
            note = min(notes, key=lambda m: abs(m.start() - len(text) // 2))
            head, tail, dropped = text[:note.start()], text[note.end():], int(note.group(1))
    head_b, tail_b = head.encode("utf-8", errors="replace"), tail.encode("utf-8", errors="replace")
    if not dropped and len(head_b) + len(tail_b) <= limit:
        return text
    joined = head_b + tail_b
    keep_head, keep_tail = limit // 2, limit - limit // 2
    dropped += len(joined) - keep_head - keep_tail
    return (joined[:keep_head].decode("utf-8", errors="replace")
            + f"\n[... {dropped} bytes of output dropped ...]\n"
            + joined[-keep_tail:].decode("utf-8", errors="replace"))


class SandboxFusionService:
    """The request handling behind the HTTP app (usable in-process too: tests, benchmarks)."""

    def __init__(self, config: SandboxFusionConfig | None = None, pool=None):
        self.config = config or SandboxFusionConfig()
        self.spec = SandboxSpec(image=self.config.image, task="sandbox-fusion", network=False,
                                resources=Resources(cpus=self.config.cpus, memory_mb=self.config.memory_mb,
                                                    pids=self.config.pids))
        self.pool = pool
        self._own_pool = pool is None
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self.available: dict[str, str] = {}
        """Language -> '' when it runs here, else why not."""
        self.requests = 0
        self._captured = 1 << 20  # bytes per stream the sandbox's shell keeps; read from it at start

    # ----- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        from air.sandbox import PoolConfig, SandboxPool

        if self.pool is None:
            n = self.config.sandboxes
            self.pool = SandboxPool(PoolConfig(warm=n, max_sandboxes=n, max_leases=self.config.max_leases,
                                               lease_timeout=self.config.queue_timeout, gpu_ids=[],
                                               run_id=self.config.run_id))
        try:
            await self.pool.start(warm_specs=[self.spec] if self._own_pool else [])
            await self._probe_languages()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self.pool is not None and self._own_pool:
            await self.pool.close()

    async def _probe_languages(self) -> None:
        tools = sorted({t for r in RECIPES.values() for t in r.needs if not t.startswith("py:")})
        modules = sorted({t[3:] for r in RECIPES.values() for t in r.needs if t.startswith("py:")})
        async with self.pool.lease(self.spec) as sb:
            result = await sb.session.run(_PROBE.format(tools=" ".join(tools), modules=" ".join(modules)),
                                          timeout=60)
            self._captured = getattr(sb.session, "output_limit", self._captured)
        found = set(result.stdout.split())
        for lang in Language.__args__:
            recipe = RECIPES.get(lang)
            if recipe is None:
                self.available[lang] = "air's SandboxFusion service does not run this language"
                continue
            missing = [t.removeprefix("py:") for t in recipe.needs if t not in found]
            self.available[lang] = (f"needs {', '.join(missing)}, which image {self.config.image} does not have"
                                    if missing else "")
        log.info("languages available in %s: %s", self.config.image, ", ".join(self.languages()))

    def languages(self) -> list[str]:
        return [lang for lang, why in self.available.items() if not why]

    # ----- one request ------------------------------------------------------------------------------------------
    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        self.requests += 1
        try:
            plan = self._plan(request)
        except _Rejected as exc:
            return RunCodeResponse(status=RunStatus.Failed, message=str(exc))
        try:
            await asyncio.wait_for(self._slots.acquire(), self.config.queue_timeout)
        except asyncio.TimeoutError:
            return RunCodeResponse(status=RunStatus.SandboxError,
                                   message=f"server busy: no free slot within {self.config.queue_timeout:g}s")
        try:
            async with self.pool.lease(self.spec) as sandbox:
                return await self._execute(sandbox, plan)
        except InfraError as exc:
            log.warning("sandbox error: %s", exc)
            return RunCodeResponse(status=RunStatus.SandboxError, message=f"sandbox infrastructure error: {exc}")
        finally:
            self._slots.release()

    def _plan(self, request: RunCodeRequest) -> _Plan:
        why = self.available.get(request.language, "")
        if why:
            raise _Rejected(f"language {request.language!r} is not available: {why}; available here: "
                            f"{', '.join(self.languages())}")
        recipe = RECIPES[request.language]
        files: dict[str, bytes] = {}
        for path, content in request.files.items():
            if content is None or "IGNORE_THIS_FILE" in path:  # skipped, as upstream does
                continue
            rel = _relative(path, "file")
            try:
                files[rel] = base64.b64decode(content)
            except (binascii.Error, ValueError):
                raise _Rejected(f"file {path!r} is not valid base64") from None
        files[recipe.source] = request.code.encode()
        paths = set(files)
        for rel in paths:  # a file cannot also be a directory
            parent = posixpath.dirname(rel)
            while parent:
                if parent in paths:
                    raise _Rejected(f"file {parent!r} is also used as a directory (by {rel!r})")
                parent = posixpath.dirname(parent)
        stdin = request.stdin.encode() if request.stdin is not None else None
        size = sum(map(len, files.values())) + len(stdin or b"")
        if size > self.config.max_input_bytes:
            raise _Rejected(f"code, stdin and files are {size} bytes; this server takes at most "
                            f"{self.config.max_input_bytes}")
        fetch = [(path, _relative(path, "fetch")) for path in request.fetch_files]
        notes = []
        limit = self.config.max_run_timeout

        def bounded(name: str, value: float) -> float:
            if value > limit:
                notes.append(f"{name} {value:g}s lowered to this server's maximum {limit:g}s")
            return min(max(value, 0.1), limit)

        compile_timeout = (bounded("compile_timeout", request.compile_timeout) if recipe.compile
                           else min(request.compile_timeout, limit))
        return _Plan(request, recipe, secrets.token_hex(8), files, stdin, fetch,
                     bounded("run_timeout", request.run_timeout), compile_timeout, notes)

    async def _execute(self, sandbox, plan: _Plan) -> RunCodeResponse:
        await sandbox.session.unpack(AGENT_HOME, _request_tar(plan))
        compile_result = None
        # The program runs as the warden's own child (`exec` replaces the shell): its status is the kernel's, so
        # nothing it prints or forks can forge a finish or an exit code, and every process it left is reaped.
        if plan.recipe.compile:
            result = await sandbox.session.exec(["sh", "-c", f"exec {plan.recipe.compile}"], cwd=plan.directory,
                                                timeout=plan.compile_timeout)
            compile_result = await self._command_result(sandbox, result)
            if compile_result.status != CommandRunStatus.Finished or compile_result.return_code != 0:
                return self._response(sandbox, plan, compile_result, None, {})
        limit = (f"ulimit -d {plan.request.memory_limit_MB * 1024} && "
                 if plan.request.memory_limit_MB > 0 else "")
        stdin = plan.stdin.decode("utf-8", "surrogateescape") if plan.stdin is not None else ""
        result = await sandbox.session.exec(["sh", "-c", f"{limit}exec {plan.recipe.run}"], cwd=plan.directory,
                                            stdin=stdin, timeout=plan.run_timeout)
        run_result = await self._command_result(sandbox, result)
        files = await self._fetch(sandbox, plan) if plan.fetch else {}
        return self._response(sandbox, plan, compile_result, run_result, files)

    def _response(self, sandbox, plan: _Plan, compile_result: CommandRunResult | None,
                  run_result: CommandRunResult | None, files: dict[str, str]) -> RunCodeResponse:
        failed = any(r is not None and (r.status != CommandRunStatus.Finished or r.return_code != 0)
                     for r in (compile_result, run_result))
        return RunCodeResponse(status=RunStatus.Failed if failed else RunStatus.Success, message="; ".join(plan.notes),
                               compile_result=compile_result, run_result=run_result,
                               executor_pod_name=sandbox.name, files=files)

    async def _command_result(self, sandbox, result) -> CommandRunResult:
        limit, captured = self.config.output_limit, self._captured
        stdout, stderr = _cap(result.stdout, limit, captured), _cap(result.stderr, limit, captured)
        if result.timed_out:
            return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=result.duration,
                                    return_code=None, stdout=stdout, stderr=stderr)
        code = result.exit_code  # negative: killed by that signal, as Python's subprocess (and upstream) reports
        if code == -9 and await sandbox.new_oom_kill():
            stderr += (f"\n[air: the program was killed for using more than the sandbox's "
                       f"{self.config.memory_mb} MB of memory]\n")
        return CommandRunResult(status=CommandRunStatus.Finished, execution_time=result.duration,
                                return_code=code, stdout=stdout, stderr=stderr)

    # ----- files ------------------------------------------------------------------------------------------------
    async def _fetch(self, sandbox, plan: _Plan) -> dict[str, str]:
        """Each requested file, read with the agent's rights after every process of the program was reaped; a
        symlink is never followed."""
        budget = self.config.max_fetch_bytes
        files: dict[str, str] = {}
        for asked, rel in plan.fetch:
            try:
                data = await sandbox.session.pack([rel], root=plan.directory, max_bytes=budget + (1 << 20))
            except FileNotFoundError:
                plan.notes.append(f"fetch_files: {asked!r} left out: not found")
                continue
            except ArchiveUnreadable:
                plan.notes.append(f"fetch_files: {asked!r} left out: not readable")
                continue
            except ArchiveTooLarge:
                plan.notes.append(f"fetch_files: {asked!r} left out: past this server's "
                                  f"{self.config.max_fetch_bytes}-byte budget for fetched files")
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                problem = ("a symlink (never followed)" if member is not None and member.issym() else
                           "not a regular file" if member is None or not member.isfile() else
                           f"past this server's {self.config.max_fetch_bytes}-byte budget for fetched files"
                           if member.size > budget else "")
                if problem:
                    plan.notes.append(f"fetch_files: {asked!r} left out: {problem}")
                    continue
                content = tar.extractfile(member).read()  # type: ignore[union-attr]
            files[asked] = base64.b64encode(content).decode()
            budget -= len(content)
        return files


def _request_tar(plan: _Plan) -> bytes:
    """The request's directory as a tar to extract in the agent's home: every entry owned by the agent."""
    buf = io.BytesIO()
    now = time.time()
    root = f"sf/{plan.request_id}"
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, content: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = AGENT_UID
            info.uname = info.gname = AGENT_USER
            info.mtime = now
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o644
                tar.addfile(info, io.BytesIO(content))

        dirs = {"sf", root}
        for rel in plan.files:
            parent = posixpath.dirname(rel)
            while parent:
                dirs.add(f"{root}/{parent}")
                parent = posixpath.dirname(parent)
        for d in sorted(dirs, key=lambda d: (d.count("/"), d)):
            add(d, None)
        for rel, content in plan.files.items():
            add(f"{root}/{rel}", content)
    return buf.getvalue()


# ----- the HTTP app -------------------------------------------------------------------------------------------------


def create_app(config: SandboxFusionConfig | None = None, service: SandboxFusionService | None = None,
               on_ready: Callable[[], None] | None = None):
    """The FastAPI app; its lifespan starts the service's sandbox pool (then calls on_ready) and removes every
    container at shutdown."""
    from fastapi import FastAPI

    service = service or SandboxFusionService(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await service.close()

    options = dict(title="air: SandboxFusion-compatible code runner", lifespan=lifespan,
                   description="POST /run_code runs code in one of air's Docker sandboxes.")
    try:  # a body without Content-Type is read as JSON, as older FastAPI (and so upstream) did
        app = FastAPI(**options, strict_content_type=False)
    except TypeError:  # FastAPI before the option existed never checked the type
        app = FastAPI(**options)
    app.state.service = service

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> RunCodeResponse:
        return await service.run_code(request)

    return app


def serve(config: SandboxFusionConfig, log_level: str = "info", on_ready: Callable[[], None] | None = None) -> None:
    """Run the app with uvicorn until SIGINT or SIGTERM (which shut down the pool and its containers)."""
    import uvicorn

    uvicorn.run(create_app(config, on_ready=on_ready), host=config.host, port=config.port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=30)
