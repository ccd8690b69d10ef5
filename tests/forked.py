"""Run a probe in a forked child of the test process: what it installs there (a seccomp filter, a changed identity)
stays in the child, and the test's own process keeps running unfiltered."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def in_a_child(work: Callable[[], Any]) -> Any:
    """work() in a forked child; its result, which must be JSON. An exception in the child fails the test in the
    parent, named, rather than leaving the parent an empty answer to parse."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            answer = {"result": work()}
        except BaseException as exc:  # noqa: BLE001 - said to the parent
            answer = {"error": repr(exc)}
        try:
            os.write(w, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    answer = json.loads(data)
    assert "error" not in answer, f"the child failed: {answer['error']}"
    return answer["result"]
