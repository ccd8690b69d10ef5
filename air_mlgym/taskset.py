"""air as a verifiers v1 environment: `vf-eval air-mlgym` and prime-rl's `env.taskset.id = "air-mlgym"`.

- `AirTaskset`: one task per (task, example); its config is everything a run chooses (tasks, limits, rewards,
  sandbox pool and task GPUs), so one TOML section configures a run.
- `AirEnv`: drives the episode host-side, turn by turn (the pattern of verifiers' TextArena env), in a sandbox
  leased from one pool per env process (started and stopped with the env; prime-rl runs one per env-server
  worker). Rewards, metrics and per-step rewards land on the trace. Infrastructure errors raise SandboxError, so
  the rollout is failed and excluded from training, never scored 0.
- `AirHarness` (the default harness): one non-streaming chat completion per turn, in-process, through the
  interception endpoint and secret, over one pooled aiohttp session per event loop (verifiers builds a harness
  per episode; an httpx client per episode cost 16 ms of CPU to build, and an httpx request 0.45 ms against
  aiohttp's 0.07 ms). No subprocess, no uv, no PyPI at run time.

Imports stay light: prime-rl imports this module to validate configs, where Docker may be absent.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from pathlib import Path
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.errors import SandboxError

try:  # verifiers 0.4.0 names the exit code a harness returns when the model connection failed
    from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
except ImportError:  # older verifiers (prime-rl's pinned submodule) has no such code: a plain failure then
    MODEL_TRANSPORT_ERROR_EXIT_CODE = 1

from air.episode.config import EpisodeConfig
from air.episode.prompts import system_prompt, task_prompt
from air.episode.rewards import RewardConfig

log = logging.getLogger("air_mlgym")


class AirTasksetConfig(vf.TasksetConfig):
    tasks: list[str] = ["prisoners-dilemma", "regression-rmse", "tabular-classification"]
    """Bundled task ids, or MLGym tasks as `mlgym:tasks/<name>.yaml` (with `mlgym_root`)."""
    mlgym_root: str | None = None
    examples_per_task: int = Field(1, ge=1)
    """Tasks in the taskset per task id (identical episodes; rollouts per example come from the trainer)."""
    max_turns: int = Field(30, ge=1)
    max_seconds: float = Field(3600, gt=0)
    max_format_errors: int = Field(5, ge=1)
    command_timeout: float | None = Field(None, gt=0)
    """Cap on each command's timeout below the task's own (None: the task's limits)."""
    observation_chars: int = Field(8000, ge=256)
    reward_mode: Literal["delta", "best"] = "delta"
    failed_validation_penalty: float = Field(0.1, ge=0)
    reward_clip: float | None = Field(None, gt=0)
    score_bound: float | None = Field(10.0, gt=0)
    """Normalised scores are clamped to [-score_bound, score_bound] (see air/episode/rewards.py)."""
    max_sandboxes: int = Field(32, ge=2)
    """Live containers per env process (agent and scoring sandboxes together)."""
    warm_sandboxes: int = Field(0, ge=0)
    gpu_ids: list[str] | None = []
    """Host GPUs for task containers, never shared with inference or training; None = detect with nvidia-smi."""
    trajectory_dir: str | None = None
    """Also write air's own JSON-lines trajectory of every rollout here."""

    def episode_config(self) -> EpisodeConfig:
        return EpisodeConfig(
            max_turns=self.max_turns, max_seconds=self.max_seconds, max_format_errors=self.max_format_errors,
            command_timeout=self.command_timeout, observation_chars=self.observation_chars,
            reward=RewardConfig(mode=self.reward_mode, failed_validation_penalty=self.failed_validation_penalty,
                                clip=self.reward_clip, score_bound=self.score_bound),
        )


class AirData(vf.TaskData):
    task_ref: str
    """Which air task this row is (a bundled id or `mlgym:...`)."""


class AirTask(vf.Task[AirData, vf.State, vf.TaskConfig]):
    pass


class AirTaskset(vf.Taskset[AirTask, AirTasksetConfig]):
    def load(self) -> list[AirTask]:
        from air.tasks.registry import load_task

        config, episode = self.config, self.config.episode_config()
        tasks = []
        for ref in config.tasks:
            spec = load_task(ref, config.mlgym_root)
            for i in range(config.examples_per_task):
                data = AirData(id=f"{ref}#{i}", name=spec.name, task_ref=ref, system_prompt=system_prompt(spec),
                               prompt=task_prompt(spec, episode))
                tasks.append(AirTask(data, config.task))
        return tasks


class AirEnvConfig(vf.EnvConfig):
    # The role is named `agent` (so `--env.agent.*` works) and needs no flags: the harness defaults to this
    # package's in-process harness and the runtime to a host subprocess, which the harness never uses.
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class AirEnv(vf.Env[AirEnvConfig]):
    async def start(self) -> None:
        from air.sandbox import PoolConfig, SandboxPool
        from air.tasks.registry import load_task

        cfg = self.config.taskset
        self.specs = {ref: load_task(ref, cfg.mlgym_root) for ref in cfg.tasks}
        self.episode_config = cfg.episode_config()
        self.pool = SandboxPool(PoolConfig(max_sandboxes=cfg.max_sandboxes, warm=cfg.warm_sandboxes,
                                           gpu_ids=cfg.gpu_ids))
        try:
            await self.pool.start()  # also sweeps the containers of dead runs
        except Exception as exc:
            raise SandboxError(f"air: the sandbox pool did not start: {exc}") from exc

    async def stop(self) -> None:
        pool = getattr(self, "pool", None)
        try:
            if pool is not None:
                # A sibling env-server worker killed outright (SIGKILL, OOM) left its containers behind: the
                # workers that stop remove them, as every pool's start() removes those of dead runs. Alongside
                # the pool's own removals, not after them: verifiers' pool gives a stopping worker 10 s.
                started = time.monotonic()
                _, swept = await asyncio.gather(pool.close(), self._sweep(pool))
                log.info("air: sandboxes removed in %.1f s (%d of dead runs)", time.monotonic() - started,
                         len(swept))
        finally:
            await close_model_sessions()

    @staticmethod
    async def _sweep(pool) -> list[str]:
        try:
            return await pool.docker.call(_sweep_dead_runs, pool.docker.client, timeout=120, idempotent=True)
        except Exception as exc:  # noqa: BLE001 - best effort at shutdown; `air containers clean` remains
            log.warning("air: could not sweep containers of dead runs: %s", exc)
            return []

    async def run(self, task: AirTask, agents) -> None:
        from air.episode.loop import Episode
        from air.episode.trajectory import TrajectoryWriter
        from air.errors import InfraError
        from air.tasks.environment import TaskEnvironment
        from air.tasks.registry import load_task

        cfg = self.config.taskset
        spec = self.specs.get(task.data.task_ref)
        if spec is None:  # served, the orchestrator owns the taskset: run any task it sends, not only ours
            spec = self.specs[task.data.task_ref] = await asyncio.to_thread(load_task, task.data.task_ref,
                                                                            cfg.mlgym_root)
        task_env = TaskEnvironment(spec, self.pool)
        writer = None
        try:
            async with task_env.lease() as sandbox:
                async with agents.agent.interaction(task) as interaction:
                    # Typed inside the interaction: it records the error on the trace as it leaves.
                    try:
                        trace = interaction.trace
                        if cfg.trajectory_dir:
                            writer = TrajectoryWriter(Path(cfg.trajectory_dir) / spec.id / f"{trace.id}.jsonl")
                        episode = Episode(task_env, sandbox, self.episode_config, writer,
                                          meta={"trace": str(trace.id)})
                        segment = await interaction.turn()
                        while not segment.terminated:
                            step = await episode.step(segment.last_reply)
                            if step.done:
                                break
                            segment = await interaction.turn(step.observation)
                        if not episode.done:  # the framework ended the exchange (its turn or token limit)
                            await episode.finish("stopped")
                        _record(trace, episode, self.episode_config)
                    except InfraError as exc:
                        raise SandboxError(f"air: {exc}") from exc
        except InfraError as exc:  # leasing or staging failed before the exchange began
            raise SandboxError(f"air: {exc}") from exc
        finally:
            if writer is not None:
                writer.close()


def _sweep_dead_runs(client) -> list[str]:
    """The sandbox layer's sweep of dead runs, with a zombie owner counted as dead (`owner_alive` counts it as
    alive): verifiers' pool reaps a killed worker only as it shuts down, after its workers have stopped. The
    zombie's sandboxes go, then its claims on the host budget, unless they name a kept sandbox."""
    import socket

    from air.sandbox import list_air_containers, remove_containers, sweep_dead_runs
    from air.sandbox.labels import HOLDER, SANDBOX

    def zombie(owner: str) -> bool:
        host, _, rest = owner.partition(":")
        try:
            stat = Path(f"/proc/{int(rest.partition(':')[0])}/stat").read_text()
        except (OSError, ValueError):
            return False
        return host == socket.gethostname() and stat.rsplit(")", 1)[1].split()[0] == "Z"

    rows = list_air_containers(client)
    kept = {c.labels.get(SANDBOX) for c in rows if c.kept}
    zombies = [c for c in rows if not c.kept and zombie(c.owner)]
    doomed = [c.id for c in zombies if not c.claim] + \
        [c.id for c in zombies if c.claim and c.labels.get(HOLDER) not in kept]
    return remove_containers(client, doomed) + sweep_dead_runs(client)


def _record(trace, episode, config: EpisodeConfig) -> None:
    summary = episode.summary()
    trace.record_reward("improvement", summary["total_reward"], 1.0)
    metrics = {"best_score": summary["best_score"], "last_score": summary["last_score"],
               "validations": summary["validations"], "failed_validations": summary["failed_validations"],
               "format_errors": summary["format_errors"], "turns": summary["turns"]}
    # No successful validation means no score: leave those metrics out rather than invent a number. verifiers'
    # summaries read a missing metric as 0, so `scored` says how many rollouts have one: the mean best score over
    # the rollouts that scored is mean(best_score) / mean(scored).
    metrics["scored"] = summary["best_score"] is not None
    trace.record_metrics({k: float(v) for k, v in metrics.items() if v is not None})
    trace.info.update({"air_episode": episode.id, "task": summary["task"], "ended_by": summary["ended_by"],
                       "step_rewards": summary["step_rewards"], "baseline": summary["baseline"],
                       "env_seconds": summary["env_seconds"], "step_scores": summary["step_scores"],
                       "step_evaluated": summary["step_evaluated"], "task_hash": episode.spec.content_hash,
                       "episode_config": config.model_dump(), "primary": episode.spec.primary.model_dump(),
                       "final_status": episode.final_status})


class AirHarnessConfig(vf.HarnessConfig):
    timeout: float = Field(900, gt=0)
    """Seconds one model call may take (a long reasoning reply on a busy server)."""


class AirHarness(vf.Harness[AirHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_: object):
        import aiohttp
        from verifiers.v1.dialects.chat import message_to_wire
        from verifiers.v1.runtimes import ProgramResult

        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages += [message_to_wire(m) for m in prompt]
        try:
            body = {"model": ctx.model, "messages": messages}
            async with _model_session().post(
                    f"{endpoint.rstrip('/')}/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {secret}"},
                    timeout=aiohttp.ClientTimeout(total=self.config.timeout)) as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset, timed out: the connection
            return ProgramResult(MODEL_TRANSPORT_ERROR_EXIT_CODE, "", f"{type(exc).__name__}: {exc}")
        if status == 200 or (status == 400 and "rollout stopped" in text):
            return ProgramResult(0, "", "")  # a refused turn is a stop (limits, @stop), not a failure
        return ProgramResult(1, "", f"model call failed: HTTP {status}: {text[:500]}")


# One session per event loop, shared by every episode's harness (verifiers builds a harness per episode): no
# connection setup per episode, and no connection cap (aiohttp's default of 100 would queue the turns of a
# worker serving more rollouts than that).
_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_session():
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        session = _sessions[loop] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return session


async def close_model_sessions() -> None:
    """Close this event loop's session (the env stops with its loop; a later run opens a new one)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


__all__ = ["AirTaskset", "AirEnv", "AirHarness"]
