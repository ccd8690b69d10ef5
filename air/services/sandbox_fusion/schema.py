"""SandboxFusion's wire schema: the `/run_code` and `/run_jupyter` requests and responses, with upstream's field
names and values, so that its official client (`sandbox-fusion` on PyPI) and code written against it work unchanged."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel

Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
    "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
    "verilog", "python_gpu", "lean", "swift", "racket",
]
"""The languages of upstream's server model: any other (the client's own list adds python2, gtest and react) is
an HTTP 422, as there."""


class RunCodeRequest(BaseModel):
    """SandboxFusion's `/run_code` request. Unknown fields are ignored, as upstream does."""

    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    """> 0: the compile's and the program's limits as upstream sets them (address space, data and stack, see
    SandboxFusionConfig.memory_limit_mode); the sandbox's memory limit always applies."""
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


class RunJupyterRequest(BaseModel):
    """SandboxFusion's `/run_jupyter` request: cells run in order in one fresh kernel. Unknown fields are
    ignored, as upstream does."""

    cells: list[str]
    cell_timeout: float = 0
    """Seconds one cell may run; 0 (or less): no limit of its own (total_timeout still bounds it)."""
    total_timeout: float = 45
    """Seconds all the cells may run together (the kernel's start-up is not counted)."""
    memory_limit_MB: int = -1
    """> 0: the kernel's data segment limit (RLIMIT_DATA); the sandbox's memory limit always applies."""
    kernel: Literal["python3"] = "python3"
    files: dict[str, str | None] = {}
    """Path -> base64 content, written before the kernel starts (relative: in its working directory)."""
    fetch_files: list[str] = []


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    """The `data` of each display_data and execute_result message (MIME type -> content)."""
    error: list[dict[str, Any]]
    """The content of each error message (ename, evalue, traceback)."""


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}
