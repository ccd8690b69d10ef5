"""air as a verifiers v1 environment: `vf-eval air-mlgym` and prime-rl's `env.taskset.id = "air-mlgym"`.

- `AirTaskset`: one task per (task, example); its config is everything a run chooses (tasks, limits, rewards,
  sandbox pool and task GPUs), so one TOML section configures a run.
- `AirEnv`: drives the episode host-side, turn by turn (the pattern of verifiers' TextArena env), in a sandbox
  leased from one pool per env process (started and stopped with the env; prime-rl runs one per env-server
  worker). Rewards, metrics and per-step rewards land on the trace. Infrastructure errors raise SandboxError, so
  the rollout is failed and excluded from training, never scored 0; a rollout whose model endpoint (or harness)
  failed is failed by verifiers, and air evaluates nothing more and records no reward on it.
- `AirHarness` (the default harness): one non-streaming chat completion per turn, in-process, through the
  interception endpoint and secret, over one pooled aiohttp session per event loop (verifiers builds a harness
  per episode; an httpx client per episode cost 16 ms of CPU to build, and an httpx request 0.45 ms against
  aiohttp's 0.07 ms). No subprocess, no uv, no PyPI at run time. In the tools format it offers air's tools
  and leaves the calls to the env, which runs them and answers with tool messages.
- In the tools format (`action_format = "tools"`) the taskset exports air's actions as its toolset
  (air_mlgym/tools.py), so verifiers' MCP-capable harnesses (`bash`, its default, and `null`) play air's tasks
  too: their calls reach the episode through air_mlgym/bridge.py, the same episode code either way.

Imports stay light: prime-rl imports this module to validate configs, where Docker may be absent.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self

import verifiers.v1 as vf
from pydantic import Field, field_validator, model_validator
from verifiers.v1.errors import SandboxError

try:  # verifiers 0.4.0 names the exit code a harness returns when the model connection failed
    from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
except ImportError:  # older verifiers (prime-rl's pinned submodule) has no such code: a plain failure then
    MODEL_TRANSPORT_ERROR_EXIT_CODE = 1

from air.actions import TOOLS, openai_tools
from air.episode.prompts import system_prompt, task_prompt
from air.episode.settings import EpisodeSettings, same_as, task_items
from air.sandbox import PoolConfig
from air_mlgym.logs import route_air_logs
from air_mlgym.tools import AirState, AirToolset, AirToolsetConfig

if TYPE_CHECKING:
    from air.episode.loop import Episode

log = logging.getLogger("air_mlgym")


class AirTasksetConfig(vf.TasksetConfig, EpisodeSettings):
    """A run's taskset: the episode's limits, rewards and trajectory folder are air's EpisodeSettings (declared
    once, shared with `air serve agentgym` and `air serve openenv`); the tasks and sandboxes are declared here."""

    tasks: list[str] = ["prisoners-dilemma", "regression-rmse", "tabular-classification"]
    """Bundled task ids, MLGym tasks as `mlgym:tasks/<name>.yaml` (with `mlgym_root`), Harbor tasks as
    `harbor:<task folder>` (with `harbor_root`)."""
    mlgym_root: str | None = None
    harbor_root: str | None = None
    allow_failed_oracle: bool = False
    """Train on Harbor tasks whose oracle (solution/solve.sh) failed `air tasks check` (refused by default: their
    test may pay a right answer 0)."""
    allow_hackable: bool = False
    """Train on tasks on which `air tasks audit` found a hack that pays (refused by default: training on them may
    teach the hack)."""
    """A Harbor dataset (a folder of task folders; or $HARBOR_ROOT): each task's image is built from its own
    Dockerfile when the env starts."""
    examples_per_task: int = Field(1, ge=1)
    """Tasks in the taskset per task id (identical episodes; rollouts per example come from the trainer)."""
    snapshots: list[str] = []
    """Snapshot files (air eval --snapshot-at) as rows after the tasks' (`task#from-<episode>-turn-<k>`): a row's
    prompt is the conversation up to the snapshot's turn (in the tools format with the replies' tool calls and the
    tool messages answering them), and its rollouts continue the episode from there (its files, shell and
    rewards) in the snapshot's action format, so a trainer runs prefix rollouts unchanged."""
    # The sandboxes: declared in air.sandbox (PoolConfig), taken from there.
    max_sandboxes: int = same_as(PoolConfig, "max_sandboxes")
    warm_sandboxes: int = same_as(PoolConfig, "warm")
    host_budget: int | None = same_as(PoolConfig, "host_budget")
    gpu_ids: list[str] | None = []
    """Host GPUs for task containers, never shared with inference or training; None = detect with nvidia-smi.
    (PoolConfig's own default detects; a taskset asks for GPUs explicitly.)"""
    gpus_per_task: int = Field(0, ge=0)
    """On a GPU host: GPUs for each task's sandbox (exclusive; its scorer borrows them) and its stack's CUDA image
    (cpu -> gpu, jax -> jax-gpu, hf -> hf-gpu), as MLGym gives each task container a GPU. Needs `gpu_ids`."""
    tools: AirToolsetConfig = AirToolsetConfig()
    """air's MCP toolset in the tools format: where it runs (verifiers' default, a subprocess on the env's host,
    which reaches the env over loopback: keep it there) and the prefix of its tool names."""

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, refs: list[str]) -> list[str]:
        # Checked with the rest of the config, which vf-eval reports in one message: an unknown id raised later,
        # from Taskset.load, would reach the user as a traceback through verifiers' runner.
        from air.errors import UsageError
        from air.tasks.registry import require_known

        for ref in refs:
            try:
                require_known(ref)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return refs

    @field_validator("max_sandboxes")
    @classmethod
    def _room_for_the_scorer(cls, value: int) -> int:
        # PoolConfig allows 1, but a rollout's evaluation leases a second sandbox beside the agent's: with one,
        # every validate would wait out lease_timeout and fail.
        if value < 2:
            raise ValueError("max_sandboxes must be at least 2 (the agent's sandbox and its scorer's)")
        return value

    @model_validator(mode="after")
    def _gpus_come_from_somewhere(self) -> Self:
        if self.gpus_per_task and self.gpu_ids == []:
            raise ValueError("gpus_per_task needs GPUs: set gpu_ids (a list, or null to detect them)")
        return self

    def pool_config(self) -> PoolConfig:
        # verifiers' env-server workers are ended with SIGTERM and do not handle it: unwinding lets the pool remove
        # its containers (else the next sweep does).
        return PoolConfig(max_sandboxes=self.max_sandboxes, warm=self.warm_sandboxes, host_budget=self.host_budget,
                          gpu_ids=self.gpu_ids, unwind_on_sigterm=True)


class AirData(vf.TaskData):
    id: str | None = None
    """The item's id, `task#example` (verifiers 0.4.0 declares it; prime-rl's pinned verifiers, a60a606, does not
    and would drop it)."""
    task_ref: str
    """Which air task this row is (a bundled id or `mlgym:...`)."""
    action_format: Literal["text", "tools"] = "text"
    """How the model acts in this row's episode, as its system prompt tells it."""
    snapshot: str | None = None
    """A snapshot file this row's episodes start from (its prompt holds the conversation up to it)."""


class AirTask(vf.Task[AirData, AirState, vf.TaskConfig]):
    @vf.stop
    async def episode_over(self, trace: vf.Trace) -> bool:
        """A harness that runs tools itself asks the model again after the call that ended the episode: that
        turn is refused (air's env stops asking on its own)."""
        return trace.state.air_over

    @vf.intercept
    async def only_air_tools(self, request: vf.Request, trace: vf.Trace) -> vf.Request | None:
        """A call to a tool that is not air's (verifiers' `bash` harness has a `bash` and an `edit` of its own,
        run on the env's host) is answered with a refusal instead of running: verifiers' tool gate asks before
        each call is executed. Only for harnesses that run tools (the env sets `air_tools` for them)."""
        from verifiers.v1.types import ToolMessage

        names = trace.state.air_tools
        probe = request.messages[-1] if request.messages else None
        # The gate's probe for a proposed call is an empty tool result named after the call.
        if not names or not isinstance(probe, ToolMessage) or probe.content != "" or probe.name in names:
            return None
        refusal = (f"Tool call {probe.tool_call_id[:60]!r} was not run: `{probe.name}` is not one of this task's "
                   f"tools ({', '.join(names)}); the task's sandbox is reached only through them.")
        return request.model_copy(update={"messages": [*request.messages[:-1],
                                                       probe.model_copy(update={"content": refusal})]})


class AirTaskset(vf.Taskset[AirTask, AirTasksetConfig]):
    def load(self) -> list[AirTask]:
        route_air_logs()  # before loading: the MLGym loader warns of fields it cannot honour
        config, episode = self.config, self.config.episode_config()
        items = task_items(config.tasks, config.examples_per_task, config.mlgym_root, config.gpus_per_task,
                           config.harbor_root, allow_failed_oracle=config.allow_failed_oracle,
                           allow_hackable=config.allow_hackable)
        tasks = []
        for item in items:
            fmt = episode.format_for(item.spec.action_format)
            tasks.append(AirTask(AirData(id=item.item_id, name=item.spec.name, task_ref=item.ref, action_format=fmt,
                                         system_prompt=system_prompt(item.spec, fmt),
                                         prompt=task_prompt(item.spec, episode)), config.task))
        for path in config.snapshots:
            tasks.append(AirTask(_snapshot_row(path, len(tasks)), config.task))
        return tasks

    @classmethod
    def toolsets(cls, config: AirTasksetConfig) -> list[vf.Toolset]:
        """air's actions as MCP tools, in the tools format (a harness that runs tools itself plays with them)."""
        return [AirToolset(config.tools)] if config.action_format == "tools" else []


class AirEnvConfig(vf.EnvConfig):
    # The role is named `agent` (so `--env.agent.*` works) and needs no flags: the harness defaults to this
    # package's in-process harness and the runtime to a host subprocess, which the harness never uses.
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())

    @model_validator(mode="after")
    def _air_tools_beside_the_bash_harness(self) -> Self:
        # verifiers' `bash` harness offers a `bash` of its own (run on the env's host, refused by AirTask): air's
        # tools then go by air_bash, air_validate, air_submit, unless a prefix was given.
        tools = getattr(self.taskset, "tools", None)
        harness = self.agent.harness.id if self.agent.harness is not None else None
        if harness == "bash" and isinstance(tools, AirToolsetConfig) and "prefix" not in tools.model_fields_set:
            tools = tools.model_copy(update={"prefix": "air"})
            object.__setattr__(self, "taskset", self.taskset.model_copy(update={"tools": tools}))
        return self

    @model_validator(mode="after")
    def _turn_cap_on_the_agent(self) -> Self:
        # verifiers' overview (vf-eval's header) reads the turn cap off the agent, where air declares none: the
        # episode ends itself at the taskset's max_turns. The same cap on the agent shows it, and never refuses
        # a turn the episode would play. An agent cap set explicitly stays as set.
        turns = getattr(self.taskset, "max_turns", None)
        if turns is not None and "max_turns" in type(self.agent).model_fields and self.agent.max_turns is None:
            object.__setattr__(self, "agent", self.agent.model_copy(update={"max_turns": turns}))
        return self


class AirEnv(vf.Env[AirEnvConfig]):
    async def start(self) -> None:
        from air.errors import ImageError
        from air.sandbox import SandboxPool
        from air.tasks.registry import load_task

        cfg = self.config.taskset
        route_air_logs()
        self.specs = {ref: load_task(ref, cfg.mlgym_root, cfg.gpus_per_task, harbor_root=cfg.harbor_root)
                      for ref in cfg.tasks}
        try:  # a Harbor task's own image: built now, once, or its failed step said now
            from air.tasks.task_images import build_task_images

            await asyncio.to_thread(build_task_images, list(self.specs.values()))
        except ImageError as exc:
            raise SandboxError(f"air: {exc}") from exc
        self.episode_config = cfg.episode_config()
        self.channel = None
        if cfg.action_format == "tools":  # where the toolset's calls reach the episodes
            from air_mlgym.bridge import CallChannel

            self.channel = CallChannel()
            await self.channel.start()
        self.pool = SandboxPool(cfg.pool_config())
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
                left, swept = await asyncio.gather(pool.close(), self._sweep(pool))
                if left:  # never "removed" while containers remain (the pool's close said which, and why)
                    log.warning("air: %d sandbox(es) left for the next sweep after %.1f s", len(left),
                                time.monotonic() - started)
                else:
                    log.info("air: sandboxes removed in %.1f s (%d of dead runs)", time.monotonic() - started,
                             len(swept))
        finally:
            channel = getattr(self, "channel", None)
            if channel is not None:
                await channel.stop()
            await close_model_sessions()

    @staticmethod
    async def _sweep(pool) -> list[str]:
        from air.sandbox import sweep_dead_runs

        try:
            return await pool.docker.call(sweep_dead_runs, pool.docker.client, timeout=120, idempotent=True)
        except Exception as exc:  # noqa: BLE001 - best effort at shutdown; `air containers clean` remains
            log.warning("air: could not sweep containers of dead runs: %s", exc)
            return []

    async def run(self, task: AirTask, agents) -> None:
        from air.episode.live import failure_kind, record_failure
        from air.episode.loop import Episode
        from air.episode.trajectory import TrajectoryWriter
        from air.errors import InfraError
        from air.tasks.environment import TaskEnvironment
        from air.tasks.registry import load_task
        from air_mlgym.bridge import TraceStepper

        cfg = self.config.taskset
        spec = self.specs.get(task.data.task_ref)
        if spec is None:  # served, the orchestrator owns the taskset: run any task it sends, not only ours
            spec = self.specs[task.data.task_ref] = await asyncio.to_thread(load_task, task.data.task_ref,
                                                                            cfg.mlgym_root, cfg.gpus_per_task,
                                                                            harbor_root=cfg.harbor_root)
        task_env = TaskEnvironment(spec, self.pool)
        # The format the task's prompt told the model (the orchestrator's taskset made it, when served).
        config = self.episode_config.model_copy(update={"action_format": task.data.action_format})
        writer = episode = calls = None
        from air import progress

        watch = progress.rollout(spec.id)  # said from the lease on: a log sees the sandbox awaited too
        try:
            async with task_env.lease() as sandbox:
                async with agents.agent.interaction(task) as interaction:
                    # Typed inside the interaction: it records the error on the trace as it leaves.
                    try:
                        trace = interaction.trace
                        if cfg.trajectory_dir:
                            writer = TrajectoryWriter(Path(cfg.trajectory_dir) / spec.id / f"{trace.id}.jsonl")
                        start = _start_of(task.data.snapshot, spec)
                        if start is not None:  # a prefix row: the snapshot's files, shell and rewards first
                            await sandbox.session.restore(start.shell)
                            episode = Episode.resume(task_env, sandbox, start, config=config, writer=writer,
                                                     meta={"trace": str(trace.id)})
                        else:
                            episode = Episode(task_env, sandbox, config, writer, meta={"trace": str(trace.id)})
                        prefix = cfg.tools.prefix
                        stepper = TraceStepper(episode, trace, prefix)
                        if start is not None:  # the prompt's replies are the snapshot's turns: not stepped again
                            stepper.stepped = sum(1 for m in start.state.messages if m.get("role") == "assistant")
                        if self.channel is not None and episode.action_format == "tools" and \
                                not isinstance(agents.agent.harness, AirHarness):  # it runs tools itself
                            calls = trace.state.air_calls = self.channel.open(stepper)
                            trace.state.air_tools = [f"{prefix}_{t.name}" if prefix else t.name for t in TOOLS]
                        segment = await interaction.turn()
                        while not segment.terminated:
                            # The replies not stepped yet: air's harness returns each one; a harness that
                            # runs tools returns the text-only reply that ended its loop.
                            step = await stepper.catch_up()
                            if episode.done or step is None:
                                break
                            segment = await interaction.turn(step.answers)
                        if stepper.failure is not None:  # a tool call through MCP broke the episode
                            raise stepper.failure
                        if not episode.done:
                            if trace.errors:  # the model endpoint or the harness failed: failed, nothing scored
                                watch.failed("infrastructure", _errors(trace))
                                if writer is not None:
                                    record_failure(writer, episode, "infrastructure", _errors(trace))
                                return
                            await episode.finish("stopped")  # the framework ended the exchange (a limit, @stop)
                        _record(trace, episode)
                    except InfraError as exc:
                        raise SandboxError(f"air: {exc}") from exc
                    finally:
                        if calls is not None:
                            self.channel.close(calls)
        except BaseException as exc:
            cause = exc.__cause__ if isinstance(exc, SandboxError) and exc.__cause__ is not None else exc
            watch.failed(failure_kind(cause), f"{type(cause).__name__}: {cause}")
            if writer is not None and not (episode is not None and episode.done):
                record_failure(writer, episode, failure_kind(cause), f"{type(cause).__name__}: {cause}")
            if isinstance(exc, InfraError):  # leasing or staging failed before the exchange began
                raise SandboxError(f"air: {exc}") from exc
            raise
        finally:
            if writer is not None:
                writer.close()


def _start_of(path: str | None, spec):
    """The snapshot a row starts from, loaded (sealed, of this task), or None."""
    if not path:
        return None
    from air.episode.snapshot import check_task, load

    snap = load(path)
    check_task(snap, spec)
    return snap


def _snapshot_row(path: str, index: int) -> AirData:
    """A row that starts from a snapshot: its system prompt and conversation so far (the model's replies among
    them, and in the tools format their calls and the tool messages answering them), checked as `air eval --from`
    checks it (sealed, of a known task). The row acts in the snapshot's format, whatever the taskset's: its
    conversation is in it."""
    from air.episode.settings import snapshot_items

    (item,) = snapshot_items([path], index)
    messages = item.start.state.messages
    fmt = item.start.config.get("action_format") or item.spec.action_format  # the parent's: its run's, or its task's
    system = messages[0]["content"] if messages and messages[0].get("role") == "system" else None
    return AirData(id=item.item_id, name=item.spec.name, task_ref=item.ref, action_format=fmt, snapshot=path,
                   system_prompt=system,
                   prompt=[_verifiers_message(m) for m in messages if m.get("role") != "system"])


def _verifiers_message(message: dict) -> dict:
    """An OpenAI chat message of air's conversation in the shape of verifiers' own message types
    (verifiers.v1.types): a tool call is flat, `{id, type, name, arguments}`, where OpenAI nests its name and
    arguments under `function`. The arguments stay the text the model wrote; the rest is as air recorded it."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls:
        return message
    flat = [{"id": c["id"], "type": "function", "name": c["function"]["name"],
             "arguments": c["function"]["arguments"]} for c in calls]
    return {**message, "tool_calls": flat}


def _errors(trace: vf.Trace) -> str:
    """What verifiers recorded as the failure of a rollout (a model call, the harness), in one line."""
    return "; ".join(f"{e.type}: {e.message}" for e in trace.errors)[:2000]


def _record(trace: vf.Trace, episode: Episode) -> None:
    """What air puts on a trace, from the episode's typed start record and summary (air/episode/records.py): the
    return as the reward, the metrics (a rollout that never scored has no best/last score, and `scored` 0), and
    what replay and export read back."""
    from air.episode.records import RETURN_REWARD, TraceRecord

    air = TraceRecord.of(episode.start_record, episode.summary_record())
    trace.record_reward(RETURN_REWARD, air.improvement, 1.0)
    trace.record_metrics(air.metrics.model_dump(exclude_none=True))
    trace.info.update(air.info.model_dump())


class AirHarnessConfig(vf.HarnessConfig):
    timeout: float = Field(900, gt=0)
    """Seconds one model call may take (a long reasoning reply on a busy server)."""


class AirHarness(vf.Harness[AirHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    SUPPORTS_MCP = True
    """It offers air's tools itself (the definitions the taskset's MCP toolset serves) and leaves the calls to
    the env; the toolset's URL goes unused."""

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
            if getattr(data, "action_format", "text") == "tools":
                body["tools"] = openai_tools()
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
