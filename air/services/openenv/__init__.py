"""air as an OpenEnv environment: `air serve openenv`, for trainers that drive environments through OpenEnv
(`openenv-core` on PyPI: TRL's GRPOTrainer, torchforge, Unsloth, SkyRL ...).

    air serve openenv --port 8000 --task prisoners-dilemma
    from openenv.core import GenericEnvClient
    async with GenericEnvClient(base_url="http://127.0.0.1:8000", message_timeout_s=900) as env:
        first = await env.reset(item="prisoners-dilemma#0")     # observation: text, system_prompt, task, ...
        result = await env.step({"reply": model_reply})          # reward (the step's), done, observation

The server is OpenEnv's own (`create_fastapi_app` with air's `AirEnvironment`, `AirAction`, `AirObservation`,
`AirState`: environment.py, models.py); air adds its core (items, pool, records: air/services/episodes.py) and
its guard (token, body cap, sessions per client: air/services/guard.py).

- A session is OpenEnv's: a WebSocket (`/ws`) opened by `EnvClient`/`GenericEnvClient` (async, or `.sync()`),
  one `AirEnvironment` each, up to `--max-envs` at once (OpenEnv answers more with its CAPACITY_REACHED error)
  and `--max-envs-per-client` per client address (refused at the handshake, 429). Each runs one air episode at a
  time in a sandbox leased from the pool: `reset` leases and stages (ending a live episode, recorded closed),
  the sandbox goes back when the episode is done or fails, at the next reset, when the session closes, or when
  it sat idle past `--idle-timeout` (never during a running step).
- `reset(item=..., seed=..., episode_id=...)`: `item` an index into tasks x examples or `task#example` (the
  verifiers taskset's row id), default 0; an unknown field or item is refused (400 over HTTP, an error frame on
  the WebSocket). The observation's `text` is the task prompt, `system_prompt` how to act.
- `step({"reply": ...})`: the model's whole reply, air's parser, observations and delta rewards (`reward` is the
  step's own: an episode's rewards sum to its return); or `step({"command": ...})`: one shell command, or
  `validate`, or `submit`, alone. The observation carries air's metrics (`total_reward`, `score`, `best_score`,
  `validations`, `turn`, `ended_by`, `episode`).
- In the tools format (`--action-format tools`), `reset` also answers `tools` (air's, to offer the model) and
  `step({"tool_calls": [...], "reply": text})` takes the reply's OpenAI tool calls (a command alone becomes the
  one call that runs it); the observation's `tool_results` holds one tool message per call, in order, and
  `text` the results one after another. A call that cannot run (arguments that are not JSON, an unknown tool)
  is answered by a format error, as a reply without a call is.
- An infrastructure failure (Docker, the pool, a dead container) is an observation with `done` true, `reward`
  None and `failure` "infrastructure" (a bug in air: "error"), with `error` saying what: a trainer drops that
  rollout; it is never scored 0, and the session answers it again to every step until the next reset.
- OpenEnv's HTTP `/reset` and `/step` are stateless (a fresh environment per request): `/reset` answers the
  first observation (its sandbox goes straight back), `/step` is 409 (no episode). `/health`, `/schema`,
  `/metadata`, `/state` are OpenEnv's.
- Token (`--token`): `Authorization: Bearer TOKEN`, or the server's URL with it as password
  (`http://air:TOKEN@host:port`), which OpenEnv's client sends as HTTP Basic when it opens the WebSocket.
- Trajectories (`--trajectory-dir`) are air's usual files (`air view`, `air replay`); the start record's
  `openenv` names the item, seed and the client's episode_id.
"""

from air.services.openenv.config import OpenEnvConfig


def __getattr__(name: str):
    # The server needs the `openenv` package; its config (the CLI's flags) does not.
    if name in ("create_app", "serve"):
        from air.services.openenv import app

        return getattr(app, name)
    if name in ("AirEnvironment", "Sessions"):
        from air.services.openenv import environment

        return getattr(environment, name)
    if name in ("AirAction", "AirObservation", "AirState"):
        from air.services.openenv import models

        return getattr(models, name)
    raise AttributeError(name)


__all__ = ["OpenEnvConfig", "create_app", "serve", "AirEnvironment", "Sessions", "AirAction", "AirObservation",
           "AirState"]
