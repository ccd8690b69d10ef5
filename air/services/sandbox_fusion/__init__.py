"""air's own SandboxFusion-compatible code runner: `GET /v1/ping`, `POST /run_code` and `POST /run_jupyter`, on
air's sandbox pool.

    air serve sandbox-fusion --port 8080 --image air/cpu:latest --concurrency 8
    curl -s localhost:8080/run_code -H 'Content-Type: application/json' \
         -d '{"code": "print(1)", "language": "python"}'

The request and response use SandboxFusion's field names and statuses, so its official client
(`sandbox-fusion` on PyPI) and code written against it work unchanged. What differs is underneath:

- Every request runs in a container leased from one `SandboxPool`: no network, CPU, memory and pid limits, a
  non-root user, and a pool reset between requests (no process, file or temp dir of one request is seen by the
  next). The program runs in a fresh directory under the agent's home, as the agent, as a child of the
  sandbox's warden (a round trip costs well under a millisecond, where a `docker exec` costs tens).
- A timeout kills every process the program started (children, background jobs, double-forked daemons), not
  just its process group.
- Output streams are drained while the program runs, so any amount of output finishes (SandboxFusion's
  server stalls past ~128 KiB); each stream keeps its head and tail within `output_limit` and says how much it
  dropped.
- `fetch_files` never follows a symlink: a path is returned only if it is a regular file inside the request's
  directory with no symlink anywhere on the way.
- Statuses are upstream's wherever a status becomes a reward (verl) or a retry (the official client retries
  `SandboxError` up to 5 times): `SandboxError` for an infrastructure fault (Docker, the pool, a dead
  container) and for what upstream's own server fails on (a Scala program without an object, `files` it cannot
  write); HTTP 422 for a language outside upstream's list; a timeout of 0 or less times out at once. A program
  that fails, a language this image lacks, or a path air refuses (out of the request's directory) is `Failed`
  with a message.
- memory_limit_MB is applied as upstream applies it (soft address-space, data and stack limits on the compile and
  the run), or, with `memory_limit_mode="data"`, as the program's data segment only; the sandbox's memory limit
  holds either way, and an OOM kill is reported on the program whose process it was.
- The same program is compiled once (compiled.py): verl sends it once per test case.
- Requests beyond `concurrency` queue (up to `queue_timeout`) instead of piling onto the host.
- `/run_jupyter` runs a request's cells in one fresh kernel in the same kind of sandbox (jupyter.py): state
  carries across the cells of a request, never across requests; cell_timeout is enforced (upstream ignores it).

Modules: schema (the wire models), config, recipes (languages; scripts/ holds their shell probe), service
(the requests over the pool), compiled (one compile per program), files (a request's files in and out), jupyter
(/run_jupyter; its driver is scripts/jupyter_driver.py), app (FastAPI and uvicorn, imported when the app is made),
client (one that never sends a request twice). Where air differs from upstream on purpose: docs/sandbox-fusion.md.
"""

from __future__ import annotations

from air.services.sandbox_fusion.app import create_app, serve
from air.services.sandbox_fusion.client import SandboxFusionClient, SandboxFusionHTTPError
from air.services.sandbox_fusion.config import SandboxFusionConfig
from air.services.sandbox_fusion.recipes import RECIPES, Recipe
from air.services.sandbox_fusion.schema import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    Language,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)
from air.services.sandbox_fusion.service import SandboxFusionService

__all__ = [
    "Language", "RunCodeRequest", "RunCodeResponse", "RunStatus", "CommandRunStatus", "CommandRunResult",
    "RunJupyterRequest", "RunJupyterResponse", "CellRunResult",
    "SandboxFusionConfig", "Recipe", "RECIPES", "SandboxFusionService", "create_app", "serve",
    "SandboxFusionClient", "SandboxFusionHTTPError",
]
