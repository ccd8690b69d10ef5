"""air behind verifiers' own env server, as prime-rl runs it, and the orchestrator's side of that wire.

Serve (what prime-rl's `env-server` entry point does, for a machine without prime-rl):

    python -m air_mlgym.serve --serve.address tcp://127.0.0.1:5000 \\
        --serve.pool.type static --serve.pool.num-workers 2 --env.taskset.tasks '["prisoners-dilemma"]'

The config has the shape of prime-rl's `EnvServerConfig` (`env`, `serve`, `log`), so one file serves both:
`python -m air_mlgym.serve @ server.toml` here, `uv run env-server @ server.toml` under prime-rl. The
taskset id defaults to `air-mlgym`. `serve.pool` is `static` (`num_workers` processes from the start) or
`elastic` (one worker, another whenever in-flight episodes reach 90% of `workers * multiplex`, up to
`max_workers`). Each
worker is its own process with its own env, interception server and sandbox pool, so
`env.taskset.max_sandboxes` bounds each worker's containers, not the server's. `--address-file F` writes the
bound address once the socket is bound (bind `tcp://127.0.0.1:0` to let the OS pick a free port). SIGTERM
stops the server and its workers; each worker removes its containers as it stops; the server then exits 143
(129 for SIGHUP, 130 for Ctrl-C).

Drive (what prime-rl's orchestrator does; verifiers 0.4.0's `vf-eval` only runs in-process):

    python -m air_mlgym.serve drive --address tcp://127.0.0.1:5000 -m MODEL --client.base-url URL \\
        -r 2 -c 16 --env.taskset.tasks '["prisoners-dilemma"]' -o outputs/served

loads the taskset here, sends each task's data in a `RunRequest` through verifiers' `EnvClient.run`, gets each
episode back as a `WireEpisode` assembled from the streamed trace deltas, appends it to `traces.jsonl` in
vf-eval's format and prints a line per task. A request that fails on the wire becomes a failed episode, as in
prime-rl's dispatcher; any failed rollout makes the exit status 1.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import verifiers.v1 as vf
from pydantic import AliasChoices, Field, SerializeAsAny, model_validator
from pydantic_config import BaseConfig

TASKSET_ID = "air-mlgym"


class ServerLogConfig(BaseConfig):
    level: str = "info"
    """verifiers' and air's records at this level, to stderr; other libraries' warnings only."""
    json_logging: bool = False
    """Newline-delimited JSON records (as prime-rl's `log.json_logging`)."""


class AirEnvServerConfig(BaseConfig):
    env: SerializeAsAny[vf.EnvConfig] = Field(default_factory=lambda: vf.resolve_env_config(
        {"taskset": {"id": TASKSET_ID}}))
    """What to serve: verifiers' `[env]` block (`--env.taskset.*` as under vf-eval)."""
    serve: vf.ServeConfig = vf.ServeConfig()
    """How: `serve.pool` (static or elastic), `serve.address`, `serve.max_concurrent` per worker."""
    log: ServerLogConfig = ServerLogConfig()
    address_file: Path | None = None
    """Write the bound address here once the socket is bound (before the workers have loaded the env)."""

    @model_validator(mode="before")
    @classmethod
    def _resolve_env(cls, data):
        from verifiers.v1.configs.cli.env import narrowed_env_annotation, resolve_env_field

        return resolve_env_field(data, narrowed_env_annotation(cls))


def setup_logging(level: str, json_logging: bool = False) -> None:
    """Logging for the server and each spawned worker (a spawned process inherits no handlers): verifiers' and
    air's records at `level` to stderr, other libraries' warnings only (httpx would log every model call)."""
    from loguru import logger
    from verifiers.v1.utils.logging import InterceptHandler
    from verifiers.v1.utils.logging import setup_logging as vf_setup_logging

    vf_setup_logging(level)
    if json_logging:
        logger.remove()
        logger.add(sys.stderr, level=level.upper(), serialize=True)
    logging.basicConfig(level=logging.WARNING, handlers=[InterceptHandler()], force=True)
    for name in ("air", "air_mlgym"):
        logging.getLogger(name).setLevel(level.upper())


class _AddressFile:
    """`serve_env` reports the bound address with `.put()`: write it atomically where the caller waits."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def put(self, address: str) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(address)
        tmp.replace(self.path)


_ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ended_by: list[int] = []
"""The signals that stopped this server, as they came (the main process's; a worker's is its own)."""


def _setup(level: str, json_logging: bool) -> None:
    """`serve_env`'s log_setup, which it calls after arming its own SIGTERM teardown (and in each worker): the
    logging, and in the server's own process the stopping signals noted before their teardown runs. verifiers
    swallows the KeyboardInterrupt its teardown raises, so without the note a stopped server would exit 0 and a
    supervisor would take the stop for a clean finish."""
    setup_logging(level, json_logging)
    if multiprocessing.parent_process() is not None:
        return
    for sig in _ENDING:
        prior = signal.getsignal(sig)
        if prior is not signal.SIG_IGN:  # a background job's SIGINT stays ignored
            signal.signal(sig, partial(_noting, prior))


def _noting(prior, signum: int, frame) -> None:
    _ended_by.append(signum)
    if callable(prior):
        prior(signum, frame)
    else:  # SIGHUP's default: end as SIGTERM does, through the teardown
        raise KeyboardInterrupt


def serve(config: AirEnvServerConfig) -> None:
    """Serve until SIGTERM, SIGHUP or Ctrl-C, exactly as prime-rl's `env-server` calls verifiers' `serve_env`;
    then exit 128 + the signal's number (143 for SIGTERM), as a shell reports a process the signal killed."""
    from verifiers.v1 import pool_serve_kwargs
    from verifiers.v1.serve import env_config_data, serve_env

    serve_env(
        **pool_serve_kwargs(config.serve.pool),
        address=config.serve.address,
        address_queue=_AddressFile(config.address_file) if config.address_file else None,
        log_setup=partial(_setup, config.log.level, config.log.json_logging),
        config_data=env_config_data(config.env),
        max_concurrent=config.serve.max_concurrent,
    )
    if _ended_by:
        raise SystemExit(128 + _ended_by[0])


class DriveConfig(BaseConfig):
    address: str
    """The env server's address, e.g. `tcp://127.0.0.1:5000`."""
    env: SerializeAsAny[vf.EnvConfig] = Field(default_factory=lambda: vf.resolve_env_config(
        {"taskset": {"id": TASKSET_ID}}))
    """The taskset to send (`--env.taskset.*`); the episode's own knobs are the server's."""
    model: str = Field(validation_alias=AliasChoices("model", "m"))
    client: vf.EvalClientConfig = vf.EvalClientConfig()
    sampling: vf.SamplingConfig = vf.SamplingConfig()
    num_rollouts: int = Field(1, ge=1, validation_alias=AliasChoices("num_rollouts", "r"))
    max_concurrent: int = Field(16, ge=1, validation_alias=AliasChoices("max_concurrent", "c"))
    output_dir: Path = Field(Path("outputs/served"), validation_alias=AliasChoices("output_dir", "o"))
    """`traces.jsonl` goes here, one episode per line as vf-eval writes it."""

    @model_validator(mode="before")
    @classmethod
    def _resolve_env(cls, data):
        from verifiers.v1.configs.cli.env import narrowed_env_annotation, resolve_env_field

        return resolve_env_field(data, narrowed_env_annotation(cls))


def run_drive(config: DriveConfig) -> int:
    try:  # verifiers 0.4.0
        from verifiers.v1.utils.trace_store import write_episode
    except ImportError:  # prime-rl's pinned verifiers (a60a606) keeps it with vf-eval's output
        from verifiers.v1.cli.output import write_episode

    tasks = list(vf.load_taskset(config.env.taskset))
    config.output_dir.mkdir(parents=True, exist_ok=True)
    episodes = asyncio.run(drive(config.address, tasks, client=config.client, model=config.model,
                                 sampling=config.sampling, rollouts=config.num_rollouts,
                                 concurrency=config.max_concurrent,
                                 on_episode=lambda episode: write_episode(config.output_dir, episode)))
    for line in summary_lines(episodes):
        print(line)
    print(f"traces: {config.output_dir / 'traces.jsonl'}")
    return 0 if all(e.ok for e in episodes) else 1


def summary_lines(episodes: Sequence[vf.WireEpisode]) -> list[str]:
    """One line per task: its rollouts, how many failed, the mean reward of the rest. The task is named by air's
    `task_ref` (kept by every verifiers as an extra field of the task data), else the item's id or index."""
    by_task: dict[str, list[vf.WireEpisode]] = {}
    for episode in episodes:
        data = episode.task.data
        ref = getattr(data, "task_ref", None) or getattr(data, "id", None) or f"task {data.idx}"
        by_task.setdefault(str(ref), []).append(episode)
    lines = []
    for ref, group in by_task.items():
        ok = [t for e in group if e.ok for t in e.traces]
        mean = sum(t.reward for t in ok) / len(ok) if ok else float("nan")
        lines.append(f"{ref}: {len(group)} rollouts, {len(group) - len(ok)} failed, mean reward {mean:.4f}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    from pydantic_config import cli
    from verifiers.v1.cli.resolve import extract_id, narrow_config, plugin_errors, references_config_file

    argv = list(sys.argv[1:] if argv is None else argv)
    driving = bool(argv) and argv[0] == "drive"
    argv = argv[1:] if driving else argv
    if not extract_id(argv, "env.taskset") and not references_config_file(argv):
        argv = ["--env.taskset.id", TASKSET_ID, *argv]
    with plugin_errors():
        config_type = narrow_config(DriveConfig if driving else AirEnvServerConfig, argv)
        sys.argv = [sys.argv[0], *argv]
        config = cli(config_type)
    if driving:
        raise SystemExit(run_drive(config))
    serve(config)


# ----- the orchestrator's side ------------------------------------------------------------------------------

def failed_episode(task: vf.Task, exc: BaseException) -> vf.WireEpisode:
    """A request that failed on the wire (the server answered an error, or none came): a failed episode, as
    prime-rl's dispatcher records it, so it is excluded from training rather than scored. Built from its wire
    form, as the client reads an answer: the task's data is then wire data whatever verifiers declares."""
    return vf.WireEpisode.model_validate({
        "env": {"id": TASKSET_ID}, "ok": False, "traces": [],
        "task": {"type": type(task).__name__, "data": task.data.model_dump(mode="json"), "key": task.key,
                 "hash": task.hash},
        "errors": [{"type": type(exc).__name__, "message": str(exc)}]})


async def drive(address: str, tasks: Sequence[vf.Task], *, client: vf.ClientConfig, model: str,
                rollouts: int = 1, concurrency: int = 16, sampling: vf.SamplingConfig | None = None,
                startup_timeout: float = 600, rollout_timeout: float | None = None,
                on_episode: Callable[[vf.WireEpisode], None] | None = None) -> list[vf.WireEpisode]:
    """Run `rollouts` episodes of each task through the env server at `address`, `concurrency` at a time.

    `rollout_timeout` (None: wait as prime-rl does, for ever) bounds each request on the client: verifiers'
    pool neither restarts a dead worker nor answers for its requests, so without it they never return."""
    from verifiers.v1.serve import EnvClient

    env_client = EnvClient(address)
    sampling = sampling or vf.SamplingConfig()
    gate = asyncio.Semaphore(concurrency)

    async def one(task: vf.Task) -> vf.WireEpisode:
        async with gate:
            try:
                async with asyncio.timeout(rollout_timeout):
                    episode = await env_client.run(client=client, model=model, sampling=sampling,
                                                   task_data=task.data.model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - a failed request is a failed episode, never a crash
                episode = failed_episode(task, exc)
        if on_episode is not None:
            on_episode(episode)
        return episode

    try:
        await env_client.wait_for_server_startup(timeout=startup_timeout)
        return list(await asyncio.gather(*(one(task) for task in tasks for _ in range(rollouts))))
    finally:
        await env_client.close()


if __name__ == "__main__":
    main()
