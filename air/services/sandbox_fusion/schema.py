"""SandboxFusion's wire schema: the `/run_code` request and response, with upstream's field names and values,
so that its official client (`sandbox-fusion` on PyPI) and code written against it work unchanged."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel

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
