"""The request handling behind the HTTP app, over one `SandboxPool`: plan a request (paths, sizes, timeouts),
lease a sandbox, run the program as the warden's child, fetch files without following a symlink."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import logging
import posixpath
import re
import secrets
import shlex
import tarfile
from dataclasses import dataclass, field

from air.errors import InfraError
from air.sandbox import (
    AGENT_HOME,
    AGENT_UID,
    ArchiveTooLarge,
    ArchiveUnreadable,
    Resources,
    SandboxSpec,
    make_tar,
)
from air.services.sandbox_fusion.config import SandboxFusionConfig
from air.services.sandbox_fusion.recipes import (
    RECIPES,
    CompileRefused,
    Recipe,
    availability,
    probe_argv,
    script,
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

log = logging.getLogger("air.services.sandbox_fusion")


class _Rejected(Exception):
    """The request cannot run as asked (the caller's input, not the infrastructure): answered Failed."""


@dataclass
class _Plan:
    request: RunCodeRequest
    recipe: Recipe
    request_id: str
    files: dict[str, bytes]
    """Relative to the request's directory."""
    absolute: dict[str, bytes]
    """Absolute paths in the sandbox, written with the agent's rights."""
    stdin: bytes | None
    fetch: list[tuple[str, str]]
    """(as requested, normalised path: relative, or absolute)."""
    run_timeout: float
    compile_timeout: float
    compile: str | None
    run: str
    refused: str = ""
    """Why the code is not compiled (a compile error upstream reports without running a compiler)."""
    notes: list[str] = field(default_factory=list)

    @property
    def directory(self) -> str:
        return f"{AGENT_HOME}/sf/{self.request_id}"

    def tar(self) -> bytes:
        """The request's directory, to extract in the agent's home: every entry the agent's."""
        root = posixpath.relpath(self.directory, AGENT_HOME)
        return make_tar({f"{root}/{rel}": content for rel, content in self.files.items()}, owner=AGENT_UID)


_PSEUDO = ("/proc", "/sys", "/dev")
"""Kernel file systems: a path there is not a file (except /dev/shm, a temp dir that reset empties)."""


def _path(path: str, what: str) -> str:
    """A normalised path: relative ones stay inside the request's directory; absolute ones (which SandboxFusion
    documents) are places in the sandbox, written or read later with the agent's rights. _Rejected otherwise."""
    if not path or "\0" in path:
        raise _Rejected(f"{what} path {path!r} is empty or contains NUL")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):  # POSIX keeps a leading double slash
        norm = "/" + norm.lstrip("/")
    if len(norm.encode()) > 2048 or any(len(part.encode()) > 255 for part in norm.split("/")):
        raise _Rejected(f"{what} path {path[:80]!r}... is too long (255 bytes a name, 2048 in all)")
    if norm.startswith("/"):
        pseudo = any(norm == top or norm.startswith(top + "/") for top in _PSEUDO)
        if norm == "/" or (pseudo and not norm.startswith("/dev/shm/")):
            raise _Rejected(f"{what} path {path!r} is not a file in the sandbox")
        return norm
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise _Rejected(f"{what} path {path!r} must stay inside the working directory (an absolute path "
                        "names a place elsewhere in the sandbox)")
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


def decode_files(request_files: dict[str, str | None]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """A request's `files`, decoded: (relative to its directory, absolute in the sandbox); _Rejected otherwise."""
    files: dict[str, bytes] = {}
    absolute: dict[str, bytes] = {}
    for path, content in request_files.items():
        if content is None or "IGNORE_THIS_FILE" in path:  # skipped, as upstream does
            continue
        norm = _path(path, "file")
        try:
            (absolute if norm.startswith("/") else files)[norm] = base64.b64decode(content)
        except (binascii.Error, ValueError):
            raise _Rejected(f"file {path!r} is not valid base64") from None
    return files, absolute


def no_file_is_a_directory(files: dict[str, bytes]) -> None:
    """_Rejected when one relative path is another's parent (it cannot be a file and a directory)."""
    for rel in files:
        parent = posixpath.dirname(rel)
        while parent:
            if parent in files:
                raise _Rejected(f"file {parent!r} is also used as a directory (by {rel!r})")
            parent = posixpath.dirname(parent)


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

    # ----- lifecycle ----------------------------------------------------------------------------------------
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
        async with self.pool.lease(self.spec) as sb:
            result = await sb.session.exec(probe_argv(), timeout=60)
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
        except _Rejected as exc:
            return RunCodeResponse(status=RunStatus.Failed, message=str(exc))
        return await self._leased(lambda sandbox: self._execute(sandbox, plan), RunCodeResponse)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        """The cells in one fresh kernel in a leased sandbox (jupyter.py)."""
        from air.services.sandbox_fusion import jupyter

        self.requests += 1
        try:
            plan = jupyter.plan(request, max_timeout=self.config.max_run_timeout,
                                max_input_bytes=self.config.max_input_bytes)
        except _Rejected as exc:
            return RunJupyterResponse(status=RunStatus.Failed, message=str(exc))
        return await self._leased(lambda sandbox: jupyter.execute(self, sandbox, plan), RunJupyterResponse)

    async def _leased(self, work, answer):
        """await work(sandbox) within a slot and a leased sandbox; a busy server or an infrastructure fault is
        `answer(status=SandboxError, message=...)`."""
        try:
            await asyncio.wait_for(self._slots.acquire(), self.config.queue_timeout)
        except TimeoutError:
            return answer(status=RunStatus.SandboxError,
                          message=f"server busy: no free slot within {self.config.queue_timeout:g}s")
        try:
            async with self.pool.lease(self.spec) as sandbox:
                return await work(sandbox)
        except InfraError as exc:
            log.warning("sandbox error: %s", exc)
            return answer(status=RunStatus.SandboxError, message=f"sandbox infrastructure error: {exc}")
        finally:
            self._slots.release()

    def _plan(self, request: RunCodeRequest) -> _Plan:
        why = self.available.get(request.language, "")
        if why:
            raise _Rejected(f"language {request.language!r} is not available: {why}; available here: "
                            f"{', '.join(self.languages())}")
        recipe = RECIPES[request.language]
        files, absolute = decode_files(request.files)
        names = [*files, *absolute]
        # Upstream writes the code after the files, to a fresh temporary name (never an upload's); a fixed name
        # (Java's Main.java) replaces an upload of that name there, and so here.
        source = recipe.source_name(request.code, taken=files)
        if source is not None:
            files[source] = (recipe.transform(request.code) if recipe.transform else request.code).encode()
        fields = {"src": shlex.quote(source or ""),
                  "cp": shlex.quote(recipe.class_path(names)) if recipe.class_path else ""}
        refused = ""
        try:
            fields["main"] = shlex.quote(recipe.main(request.code)) if recipe.main else ""
        except CompileRefused as exc:
            refused, fields["main"] = str(exc), ""
        no_file_is_a_directory(files)
        stdin = request.stdin.encode() if request.stdin is not None else None
        size = sum(map(len, files.values())) + sum(map(len, absolute.values())) + len(stdin or b"")
        if size > self.config.max_input_bytes:
            raise _Rejected(f"code, stdin and files are {size} bytes; this server takes at most "
                            f"{self.config.max_input_bytes}")
        fetch = [(path, _path(path, "fetch")) for path in request.fetch_files]
        notes = []
        limit = self.config.max_run_timeout

        def bounded(name: str, value: float) -> float:
            if value > limit:
                notes.append(f"{name} {value:g}s lowered to this server's maximum {limit:g}s")
            return min(max(value, 0.1), limit)

        compile_timeout = (bounded("compile_timeout", request.compile_timeout) if recipe.compile
                           else min(request.compile_timeout, limit))
        return _Plan(request, recipe, secrets.token_hex(8), files, absolute, stdin, fetch,
                     bounded("run_timeout", request.run_timeout), compile_timeout,
                     recipe.compile.format(**fields) if recipe.compile else None, recipe.run.format(**fields),
                     refused, notes)

    async def _execute(self, sandbox, plan: _Plan) -> RunCodeResponse:
        await sandbox.session.unpack(AGENT_HOME, plan.tar())
        if plan.absolute:
            problem = await self._place(sandbox, plan)
            if problem:
                return RunCodeResponse(status=RunStatus.Failed, message=problem, executor_pod_name=sandbox.name)
        compile_result = None
        if plan.refused:
            compile_result = CommandRunResult(status=CommandRunStatus.Error, return_code=1, stderr=plan.refused)
            return self._response(sandbox, plan, compile_result, None, {})
        # The program runs as the warden's own child (`exec` replaces the shell): its status is the kernel's,
        # so nothing it prints or forks can forge a finish or an exit code, and every process it left is
        # reaped.
        if plan.compile:
            result = await sandbox.session.exec(["sh", "-c", f"exec {plan.compile}"],
                                                cwd=plan.directory, timeout=plan.compile_timeout)
            compile_result = await self._command_result(sandbox, result)
            if compile_result.status != CommandRunStatus.Finished or compile_result.return_code != 0:
                return self._response(sandbox, plan, compile_result, None, {})
        limit = (f"ulimit -d {plan.request.memory_limit_MB * 1024} && "
                 if plan.request.memory_limit_MB > 0 else "")
        stdin = plan.stdin.decode("utf-8", "surrogateescape") if plan.stdin is not None else ""
        result = await sandbox.session.exec(["sh", "-c", f"{limit}exec {plan.run}"],
                                            cwd=plan.directory, stdin=stdin, timeout=plan.run_timeout)
        run_result = await self._command_result(sandbox, result)
        files = await self._fetch(sandbox, plan) if plan.fetch else {}
        return self._response(sandbox, plan, compile_result, run_result, files)

    def _response(self, sandbox, plan: _Plan, compile_result: CommandRunResult | None,
                  run_result: CommandRunResult | None, files: dict[str, str]) -> RunCodeResponse:
        failed = any(r is not None and (r.status != CommandRunStatus.Finished or r.return_code != 0)
                     for r in (compile_result, run_result))
        return RunCodeResponse(status=RunStatus.Failed if failed else RunStatus.Success,
                               message="; ".join(plan.notes), compile_result=compile_result,
                               run_result=run_result, executor_pod_name=sandbox.name, files=files)

    async def _command_result(self, sandbox, result) -> CommandRunResult:
        limit, captured = self.config.output_limit, self._captured
        stdout, stderr = _cap(result.stdout, limit, captured), _cap(result.stderr, limit, captured)
        if result.timed_out:
            return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=result.duration,
                                    return_code=None, stdout=stdout, stderr=stderr)
        code = result.exit_code  # negative: killed by that signal, as Python's subprocess and upstream report
        if code == -9 and await sandbox.new_oom_kill():
            stderr += (f"\n[air: the program was killed for using more than the sandbox's "
                       f"{self.config.memory_mb} MB of memory]\n")
        return CommandRunResult(status=CommandRunStatus.Finished, execution_time=result.duration,
                                return_code=code, stdout=stdout, stderr=stderr)

    # ----- files --------------------------------------------------------------------------------------------
    async def _place(self, sandbox, plan: _Plan) -> str:
        """Write the absolute-path files as the agent (a place it may not write is refused by the kernel, never
        written as root); '' when done, else why not (the caller's input: Failed)."""
        payload = json.dumps({path: base64.b64encode(data).decode() for path, data in plan.absolute.items()})
        result = await sandbox.session.exec(["python3", "-c", script("place_files.py")], stdin=payload,
                                            cwd=plan.directory, timeout=60)
        if result.timed_out:
            return "writing the files with absolute paths timed out"
        if result.exit_code != 0:
            return (result.stderr.strip().splitlines() or [f"writing the files failed ({result.exit_code})"])[-1]
        return ""

    async def _fetch(self, sandbox, plan: _Plan) -> dict[str, str]:
        """Each requested file, read with the agent's rights after every process of the program was reaped; a
        symlink is never followed."""
        budget = self.config.max_fetch_bytes
        past_budget = f"past this server's {self.config.max_fetch_bytes}-byte budget for fetched files"
        files: dict[str, str] = {}
        for asked, rel in plan.fetch:
            root, rel = ("/", rel[1:]) if rel.startswith("/") else (plan.directory, rel)
            try:
                data = await sandbox.session.pack([rel], root=root, max_bytes=budget + (1 << 20))
            except FileNotFoundError:
                plan.notes.append(f"fetch_files: {asked!r} left out: not found")
                continue
            except ArchiveUnreadable:
                plan.notes.append(f"fetch_files: {asked!r} left out: not readable")
                continue
            except ArchiveTooLarge:
                plan.notes.append(f"fetch_files: {asked!r} left out: {past_budget}")
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                problem = ("a symlink (never followed)" if member is not None and member.issym() else
                           "not a regular file" if member is None or not member.isfile() else
                           past_budget if member.size > budget else "")
                if problem:
                    plan.notes.append(f"fetch_files: {asked!r} left out: {problem}")
                    continue
                content = tar.extractfile(member).read()  # type: ignore[union-attr]
            files[asked] = base64.b64encode(content).decode()
            budget -= len(content)
        return files
