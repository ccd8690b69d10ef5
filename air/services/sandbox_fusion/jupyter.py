"""`/run_jupyter`: a request's cells in order in one fresh python3 kernel, inside a leased sandbox.

The kernel and air's driver (scripts/jupyter_driver.py) run as the agent, the driver as the warden's own child
(`run_untrusted`), exactly where /run_code's programs run: no network, the agent's uid, the sandbox's limits. The kernel
lives for one request: when the driver exits the warden kills every process of the agent (the kernel, anything a
cell started), and the pool's reset after the lease empties the temp dirs and restores the home, so neither
state nor processes nor files carry over to the next request.

What the answer says, as SandboxFusion's does: `Success` when every cell ran (a cell that raised is still a
cell that ran: its `error` says so); `Failed` when a cell ran past cell_timeout or the cells past total_timeout
(driver status `TimeLimitExceeded`), when the kernel died, or when the input is refused; `SandboxError` only for
the infrastructure (the kernel never answered, the driver failed, Docker). Unlike upstream, a failed request
still returns the cells that ran (the timed-out one with what it printed) and the fetched files, and the
message names the cell.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from air.sandbox import AGENT_HOME, ArchiveUnwritable
from air.services.sandbox_fusion.files import (
    Rejected,
    RequestFiles,
    checked_path,
    decode_files,
    fetch_files,
    no_file_is_a_directory,
    place_absolute,
)
from air.services.sandbox_fusion.output import cap_stream
from air.services.sandbox_fusion.recipes import script
from air.services.sandbox_fusion.schema import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)

MAX_CELLS = 1000
"""Cells of one request: every cell costs room in the driver's answer, which has a fixed budget."""
UPSTREAM_MARGIN = 10.0
"""Seconds upstream's server adds to total_timeout for its whole driver (python's and the kernel's start-up
included: `run_timeout=total_timeout + 10`), which is its only bound on the cells: the cells here may run until
the driver's start + total_timeout + this, as there."""
STARTUP_TIMEOUT = 30.0
"""Seconds the kernel may take to answer once started (outside total_timeout, as upstream's driver start-up is);
about 1-2 s when the machine is quiet."""
SLACK = 15.0
"""Seconds the warden grants the driver beyond start-up and total_timeout (killing the kernel, writing the
answer) before it kills the driver itself."""
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_ANSWER_MARGIN = 16 << 10
"""Bytes of the warden's capture of the driver's stdout kept free below the answer's budget."""


@dataclass(kw_only=True)
class JupyterPlan(RequestFiles):
    """What /run_jupyter will do; its files as a /run_code plan's. The kernel works in the request's directory."""

    request: RunJupyterRequest
    cell_timeout: float
    total_timeout: float


def plan(request: RunJupyterRequest, *, max_timeout: float, max_input_bytes: int) -> JupyterPlan:
    """The request checked and bounded; Rejected (answered Failed) for input it cannot run as asked."""
    if len(request.cells) > MAX_CELLS:
        raise Rejected(f"{len(request.cells)} cells; this server runs at most {MAX_CELLS} in one request")
    files, absolute = decode_files(request.files)
    no_file_is_a_directory(files)
    size = sum(map(len, files.values())) + sum(map(len, absolute.values())) + sum(
        len(c.encode("utf-8", "surrogatepass")) for c in request.cells)
    if size > max_input_bytes:
        raise Rejected(f"cells and files are {size} bytes; this server takes at most {max_input_bytes}")
    for index, cell_code in enumerate(request.cells):
        lone = _LONE_SURROGATE.search(cell_code)
        if lone:
            raise Rejected(f"cell {index} holds a lone surrogate (U+{ord(lone.group()):04X}), which no kernel message "
                           "can carry: send the cells as valid Unicode")
    notes: list[str] = []
    total = request.total_timeout
    if total != total:  # NaN: upstream's driver timeout (total_timeout + 10) fires at once
        total = -UPSTREAM_MARGIN
    if total > max_timeout:
        notes.append(f"total_timeout {total:g}s lowered to this server's maximum {max_timeout:g}s")
    total = min(max(total, -UPSTREAM_MARGIN), max_timeout)  # -10 or less: no time at all, as upstream
    cell = request.cell_timeout if request.cell_timeout > 0 else 0.0
    return JupyterPlan(request=request, files=files, absolute=absolute,
                       fetch=[(path, checked_path(path, "fetch")) for path in request.fetch_files],
                       cell_timeout=cell, total_timeout=total, notes=notes)


async def execute(service, sandbox, plan: JupyterPlan) -> RunJupyterResponse:
    """Run the plan in a leased sandbox: files in, the driver (and so the kernel), files out."""
    if plan.files:
        try:
            await sandbox.session.unpack(AGENT_HOME, plan.tar())
        except ArchiveUnwritable as exc:  # the request's files do not fit the home: upstream's answer to files it
            return RunJupyterResponse(status=RunStatus.SandboxError, message=str(exc),  # cannot write
                                      executor_pod_name=sandbox.name)
    if plan.absolute:
        problem = await place_absolute(sandbox, plan.directory, plan.absolute)
        if problem:
            return RunJupyterResponse(status=RunStatus.Failed, message=problem, executor_pod_name=sandbox.name)
    request = plan.request
    captured = service._captured
    budget = captured - _ANSWER_MARGIN
    job = {"directory": plan.directory, "cells": request.cells, "cell_timeout": plan.cell_timeout,
           "total_timeout": plan.total_timeout, "margin": UPSTREAM_MARGIN,
           "startup_timeout": STARTUP_TIMEOUT, "kernel": request.kernel,
           "memory_limit_MB": request.memory_limit_MB,
           "stream_limit": min(service.config.output_limit, budget), "budget": budget}
    oom_before = await sandbox.oom_kills()  # a kill counted from here on is the kernel's or a cell's
    result = await sandbox.session.run_untrusted(["python3", "-I", "-c", script("jupyter_driver.py")],
                                                 stdin=json.dumps(job), cwd=AGENT_HOME,
                                                 timeout=STARTUP_TIMEOUT + plan.total_timeout + UPSTREAM_MARGIN
                                                 + SLACK)
    stderr = cap_stream(result.stderr, service.config.output_limit, captured)
    answer = RunJupyterResponse(status=RunStatus.Failed, executor_pod_name=sandbox.name)
    if result.timed_out:  # the driver itself overran: upstream's only timeout, answered the same way
        answer.driver = CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=result.duration,
                                         stdout="", stderr=stderr)
        answer.message = _join(plan.notes + ["the request ran past total_timeout and the kernel's start-up"])
        return answer
    driver = CommandRunResult(status=CommandRunStatus.Finished, execution_time=result.duration,
                              return_code=result.exit_code, stdout="", stderr=stderr)
    answer.driver = driver
    if result.exit_code is not None and result.exit_code < 0:  # killed: by a cell (it is its parent), or OOM
        oom = result.exit_code == -9 and await sandbox.oom_kills() > oom_before
        if oom:
            sandbox.mark_broken("the Jupyter driver was OOM-killed")
        why = "the sandbox's memory limit" if oom else f"signal {-result.exit_code}"
        answer.message = _join(plan.notes + [f"the Jupyter driver was killed by {why} while the cells ran"])
        return answer
    try:
        document = json.loads(result.stdout) if result.exit_code == 0 else None
    except ValueError:
        document = None
    if document is None:
        last = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        answer.status = RunStatus.SandboxError
        answer.message = f"air's Jupyter driver failed (exit code {result.exit_code}): {last[:500]}"
        return answer
    status = document["status"]
    answer.cells = [CellRunResult.model_validate(cell) for cell in document["cells"]]
    if status == "KernelSlow":
        answer.status = RunStatus.SandboxError
        answer.message = document["message"]
        return answer
    if status == "TimeLimitExceeded":
        driver.status, driver.return_code = CommandRunStatus.TimeLimitExceeded, None
    answer.status = RunStatus.Success if status == "Finished" else RunStatus.Failed
    answer.files = (await fetch_files(sandbox, plan.directory, plan.fetch, plan.notes,
                                      service.config.max_fetch_bytes) if plan.fetch else {})
    answer.message = _join(plan.notes + ([document["message"]] if document["message"] else []))
    return answer


def _join(parts: list[str]) -> str:
    return "; ".join(parts)
