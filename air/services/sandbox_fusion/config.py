"""What `air serve sandbox-fusion` is configured with: where it listens, its image, pool and limits."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SandboxFusionConfig(BaseModel):
    # The docstrings are the fields' descriptions, and `air serve sandbox-fusion --help` shows them.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; the loopback by default (0.0.0.0 exposes the code runner to the network)."""
    port: int = Field(8080, ge=0, le=65535)
    """TCP port to listen on."""
    image: str = "air/cpu:latest"
    """Sandbox image; its toolchains decide the languages (air/cpu: python, bash, perl)."""
    concurrency: int = Field(8, ge=1)
    """Requests running at once; more wait in a queue."""
    pool_size: int | None = Field(None, ge=1)
    """Sandbox containers kept warm (default: `concurrency`)."""
    queue_timeout: float = Field(600, gt=0)
    """Longest wait for a slot and a free sandbox, seconds, before a request is answered SandboxError."""
    cpus: float = Field(1.0, gt=0)
    """CPUs per sandbox."""
    memory_mb: int = Field(1024, ge=64)
    """Memory limit per sandbox, MB."""
    memory_limit_mode: Literal["sandbox-fusion", "data"] = "sandbox-fusion"
    """What a request's memory_limit_MB limits. sandbox-fusion: as upstream, the address space, data and stack
    (soft limits) of the compiler and the program, so rewards match (with 1024 MB the JVM, Go's toolchain, Node and
    Python threads cannot start, as there); data: the program's data segment only, so they run. The sandbox's
    memory limit (`memory_mb`) holds either way."""
    pids: int = Field(1024, ge=16)
    """Processes per sandbox at once (upstream sets none of its own: a program that keeps a few hundred children
    alive passes there, and here)."""
    max_run_timeout: float = Field(300, gt=0)
    """Upper bound of a request's run_timeout (and compile_timeout), seconds."""
    output_limit: int = Field(1 << 20, ge=1024, le=1 << 20)
    """Bytes of stdout and of stderr kept per request (head and tail, with a note counting what was dropped);
    at most what the sandbox's shell captures (1 MiB)."""
    max_input_bytes: int = Field(64 << 20, ge=1024)
    """Code, stdin and files of one request together, decoded."""
    max_fetch_bytes: int = Field(16 << 20, ge=1024)
    """Fetched files of one request together; a file past the budget is left out, and the message says so."""
    compile_cache_mb: int = Field(256, ge=0)
    """Compiled programs kept in memory, MB: the same program (code, files, limits) is compiled once, as verl
    sends it once per test case; 0 compiles every request."""
    warm_python: bool = True
    """Run python requests in a fork of a python3 that has already started, one per sandbox (about 7 ms of CPU less
    a request); false starts a new interpreter for each, as SandboxFusion does. A forked program differs only in
    what tells it it was forked: its hash seed is the sandbox's, and 3 frames lie below its own."""
    max_leases: int = Field(200, ge=1)
    """Recycle a sandbox container after this many requests, however healthy it looks."""
    run_id: str | None = None
    """Label of the service's containers (default: one id per process, or AIR_RUN_ID)."""

    @property
    def sandboxes(self) -> int:
        return self.pool_size or self.concurrency
