"""Compiled programs, kept so that the same program is compiled once.

verl sends one `/run_code` request per test case, each with the same program (and its own stdin), so SandboxFusion
compiles a C++, Go, Java... program once per test case, at the same moment. Here the first request of a program
compiles it and the others wait for that (holding no sandbox) and then start from its result: the request's
directory as the compiler left it (a tar, unpacked into their own fresh sandbox), or the compile error. What a
later request sees is what its own compile would have made: the compiler reads only the request's code and files
(the key), runs in a fresh sandbox, and its directory is packed after every process of the compile was reaped and
before the program ever runs, so no run can change what another starts from; it is unpacked with the agent's
rights, so even a directory a compile-time processor shaped (symlinks included) writes only where the program
itself could.

Not kept: a compile that timed out or was killed (its outcome depends on the moment, not on the program); and an
entry is not used for a request whose compile_timeout is shorter than the compile took. Bounded in bytes, least
recently used first out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from air.services.sandbox_fusion.schema import CommandRunResult, CommandRunStatus, RunCodeRequest


@dataclass(frozen=True)
class Compiled:
    result: CommandRunResult
    """The compile's own result, answered again for every request that starts from it."""
    request_id: str
    """The directory name the tar holds (under the agent's sf/)."""
    tar: bytes | None
    """The request's directory after a successful compile; None for a compile error."""

    @property
    def size(self) -> int:
        return len(self.tar or b"") + len(self.result.stdout or "") + len(self.result.stderr or "") + 256


def compile_key(request: RunCodeRequest, limits: str) -> str:
    """What a compile's outcome depends on: the language, the code, the files (names and contents) and the limits
    it runs under (the memory limit's shell prefix)."""
    files = sorted((path, content) for path, content in request.files.items() if content is not None)
    return hashlib.sha256(json.dumps([request.language, request.code, files, limits]).encode()).hexdigest()


def keepable(result: CommandRunResult) -> bool:
    """A compile whose outcome is the program's: it finished by itself (exit code 0 or a compile error)."""
    return result.status == CommandRunStatus.Finished and result.return_code is not None and result.return_code >= 0


class CompileCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Compiled] = OrderedDict()
        self._bytes = 0
        self._compiling: dict[str, asyncio.Future[Compiled | None]] = {}
        self.hits = self.misses = 0

    async def lookup(self, key: str, compile_timeout: float) -> tuple[Compiled | None, bool]:
        """(entry, lead). An entry to start from; else lead=True: the caller compiles and must `settle` the key
        (with None if the outcome is not keepable); lead=False: compile without keeping (another compile of the
        same program was not keepable, or the entry took longer than this request's compile_timeout)."""
        while True:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if (entry.result.execution_time or 0) > compile_timeout:
                    return None, False
                self.hits += 1
                return entry, False
            compiling = self._compiling.get(key)
            if compiling is None:
                self._compiling[key] = asyncio.get_running_loop().create_future()
                self.misses += 1
                return None, True
            if await asyncio.shield(compiling) is None:
                return None, False

    def settle(self, key: str, entry: Compiled | None) -> None:
        """The leader's outcome: kept (if it fits) and handed to the requests waiting for it."""
        if entry is not None and entry.size <= self.max_bytes:
            self._entries[key] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.size
        waiting = self._compiling.pop(key, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(entry if key in self._entries else None)
