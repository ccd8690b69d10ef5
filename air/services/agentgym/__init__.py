"""air as an AgentGym-protocol environment server: `air serve agentgym`, for trainers that drive environments
over AgentGym's HTTP protocol (AgentGym's `agentenv` clients, AgentGym-RL, verl agent loops, AgentFly-style
loops).

    air serve agentgym --port 8000 --task prisoners-dilemma --task tabular-classification
    env_idx = POST /create                              -> 7340032
    POST /reset {"env_idx": 7340032, "data_idx": 0}     -> the first observation (system prompt + task prompt)
    POST /step {"env_idx": 7340032, "action": reply}    -> {"observation", "state", "reward", "done", "info"}
    POST /close {"env_idx": 7340032}                    -> true

The wire is that of AgentGym's `env_idx` family of servers and clients, read at WooooDyy/AgentGym 3ef9235:
    agentenv-searchqa/agentenv_searchqa/server.py, model.py, env_wrapper.py
    agentenv-tool/agentenv_todo/todo_server.py, todo_model.py
    agentenv-sqlgym/agentenv_sqlgym/server.py, model.py
    agentenv-webshop/agentenv_webshop/server.py, model.py
    agentenv-webarena/agentenv_webarena/server.py
    agentenv/agentenv/envs/searchqa.py, todo.py, sqlgym.py, webshop.py, webarena.py (the clients)
    agentenv/agentenv/controller/env.py, task.py (BaseEnvClient, BaseTask's episode loop)
and AgentGym-RL 82402a9, whose trainer drives those same clients (create, reset(item_id), observe, step(text)
until done or max_rounds, close): verl/workers/rollout/agent_vllm_rollout/vllm_rollout.py,
verl/utils/agentgym/client.py. Per endpoint:

- `GET /` -> "ok" (health).
- `POST /create`, no body or `{"id": n}` (searchqa and the tool clients send the item they will use) -> the
  new env_idx, a bare JSON integer (`{"env_idx": N}` under `/webarena`). It leases nothing; `reset` does.
- `POST /reset` `{"env_idx", <item index>, "seed"?}` -> the first observation as a JSON string (searchqa/todo
  answer the observation; clients then read it again with GET /observation, as AgentGym's BaseTask does). The
  item index is accepted under every name AgentGym's clients send it: `data_idx` (textcraft, babyai,
  sciworld), `item_id` (sqlgym), `id` (searchqa, tool envs), `session_id` (webshop), `idx` (webarena, with
  `seed`); without one, the `id` given at create, else 0. Items are 0-based indexes into tasks x examples
  (`GET /items`), in the order of air's verifiers taskset, so `item_id` "prisoners-dilemma#0" names the same
  episode in both.
- `GET /observation?env_idx=` -> the current observation, a JSON string.
- `POST /step` `{"env_idx", "action"}` -> `{"observation", "state", "reward", "done", "terminated", "info"}`:
  `observation` is the field of the searchqa/tool/webarena family, `state` (the same text) that of
  webshop/sqlgym, `terminated` (= done) webarena's, so every family of clients reads it. `action` is the model's
  whole reply, parsed as air's verifiers env parses it.
- `POST /close` `{"env_idx"}` -> true.
- `GET /list_envs` -> the live env_idx, a JSON list of integers.
- air's own additions: `GET /items` (the task items; AgentGym's clients are told the count as `data_len`, its
  servers never say it) and `GET /detail?env_idx=` (the env's state, as textcraft's and sciworld's `/detail`).

Client families whose shapes differ are served under their own prefix, so each of AgentGym's clients works
unmodified with `env_server_base` pointing there (schema.FAMILIES):
- `/webshop` (WebshopEnvClient): `reset` answers `[observation, null]` (the client replaces item 0 with GET
  /observation). The client sends only what follows the last `Action:` of the reply; the first observation says
  so (end every reply with `Action:` and the code block).
- `/sqlgym` (SqlGymEnvClient): the client sends only the contents of the reply's last ```sql block; air takes it
  as the command (validate / submit included) and the first observation says to write it there.
- `/webarena` (WebarenaEnvClient): `create` answers `{"env_idx": N}`, `reset` `{"observation", "info"}`; the
  client reads `terminated`.
- the root: searchqa, the tool envs (todo, ...), textcraft-style `data_idx` clients, AgentGym-RL's use of them.
AgentGym's clients send no headers: with `--token`, give them the server as `http://air:TOKEN@host:port[/family]`
(requests sends the URL's credentials as HTTP Basic, which air's guard accepts beside `Bearer TOKEN`).

What air adds to the protocol's semantics:

- Each env_idx runs one air `Episode` at a time in a sandbox leased from one `SandboxPool`: `reset` leases and
  stages the item's task, `step` is `Episode.step` (same parser, observations and delta rewards as the
  verifiers env; done on submit or on a limit, with the automatic final evaluation), the sandbox goes back to
  the pool (reset there) when the episode is done, closed, reset again, or left idle past `idle_timeout`.
- `reward` is the return so far by default: AgentGym's BaseTask, AgentGym-RL and the webarena client keep only
  the last step's reward as a rollout's score, which is then air's return. `reward_report="step"` sends each
  step's own reward (delta improvements: they sum to the return); `info.step_reward` and `info.total_reward`
  always hold both.
- An infrastructure failure before an episode's first command ran (leasing or staging its sandbox, a sandbox
  that died before the first step) is retried once on a fresh sandbox, unseen by the client (ServedEpisodes).
  Later ones (Docker, the pool, a dead container) answer HTTP 503 `{"error", "infrastructure": true,
  "env_idx"}` and that env_idx keeps answering so until it is reset or closed, so a trainer drops the rollout;
  never `reward 0, done`. A retry of the same request (AgentGym's sqlgym and webshop clients retry 503) gets
  the same answer and nothing runs twice. Bad requests answer 4xx with a one-line `detail` and touch no other
  env: 400 malformed JSON or fields, 401 a missing or wrong token, 404 an unknown env_idx, 409 a step before
  reset or after done or while another request of that env_idx runs, 413 a body over `max_body_bytes`, 429 the
  live-env cap of the server or of the client's address (an env_idx whose episode is over counts no more:
  service.py).
- A step or reset runs to its end even if its client disconnects (a half-done step would leave the episode
  inconsistent); a close that arrives meanwhile waits for it, then closes.
- env_idx start at a random base per server process, so after a restart a stale env_idx is unknown (404 saying
  so), never another client's new episode.
- Trajectories (`trajectory_dir/<task>/<episode>.jsonl`) are air's usual files, so `air view` and `air replay`
  read served episodes. An episode the client closes (or resets, or leaves idle) before it is done ends with
  `ended_by: "closed"` and no further evaluation: its recorded return is what the client was paid. One the
  server is shut down under is recorded `failed` (interrupted); one that hit an infrastructure failure,
  `failed` (infrastructure).
"""

from air.services.agentgym.app import create_app, serve
from air.services.agentgym.config import AgentGymConfig
from air.services.agentgym.schema import (
    FAMILIES,
    CloseQuery,
    CreateQuery,
    Family,
    ResetQuery,
    StepQuery,
    StepResponse,
)
from air.services.agentgym.service import AgentGymService, Problem

__all__ = ["AgentGymConfig", "AgentGymService", "CreateQuery", "ResetQuery", "StepQuery", "CloseQuery",
           "StepResponse", "Family", "FAMILIES", "Problem", "create_app", "serve"]
