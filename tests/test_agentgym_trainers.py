"""What AgentGym's own trainers record from `air serve agentgym` with the server's defaults: air's return.

The loops are written from their source, as they run there (WooooDyy/AgentGym 3ef9235, WooooDyy/AgentGym-RL
82402a9), around AgentGym's `TodoEnvClient` (agentenv/agentenv/envs/todo.py: `create` with `{"id": 0}`, a bare
env_idx back, `assert res.status_code == 200` on every later request, and no `close()`, like five other tool
clients):

- `base_task_experience`: BaseTask._generate_experience_one (agentenv/agentenv/controller/task.py), which keeps
  `reward` of the last step only, with an APIAgent's conversation;
- `agentgym_rl_step`: the env side of AgentGym-RL's vLLMRollout.generate_sequences
  (verl/workers/rollout/agent_vllm_rollout/vllm_rollout.py) with its init_env_client (verl/utils/agentgym/
  client.py): every client created up front from one host, reset one after another, then rounds in which a
  thread per unfinished client steps it; a rollout's score is its last step's reward, any exception scores it 0;
  then `client.close()` for each, whose AttributeError (TodoEnvClient has none) it prints and ignores.

BaseTask's policy writes a worse strategy, validates it, submits: step rewards [0, r, 0] (r < 0). A trainer that
keeps the last step's reward would record 0 where air paid r, unless the server reports the return, as it now
does by default. AgentGym-RL's 40 rollouts write it and submit (one evaluation each, for the test's time). One
episode of each loop meets an infrastructure failure before its first command (its container killed between reset
and the first step): the server plays it again in a fresh sandbox, and the trainer never sees it.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from served import AirServer

from air.episode.trajectory import read_trajectory
from air.policies.scripted import SUBMIT, VALIDATE
from air.sandbox import list_air_containers
from air.services.episodes import ServiceConfig
from air.tasks.registry import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK = "prisoners-dilemma"
DEFECT = "Try always defecting.\n\n```bash\nprintf 'def row_strategy(history):\\n    return 1\\n' > strategy.py\n```"
REPLIES = (DEFECT, VALIDATE, SUBMIT)
DEFECT_SCORE = 2.0704  # the scripted story's always-defect score on the record's draw (the tests' draw)
STEP = 40  # AgentGym-RL clients created up front in one step


def returned() -> float:
    """The return air pays for REPLIES: n(always defect), with the baseline 0."""
    b = load_task(TASK).baseline_score
    return (DEFECT_SCORE - b) / abs(b)


# ----- AgentGym's code, as written at 3ef9235 and 82402a9 (the env side; the model is `policy`) ----------------
@dataclass
class StepOutput:  # agentenv/agentenv/controller/types.py
    state: str
    reward: float
    done: bool


class TodoEnvClient:  # agentenv/agentenv/envs/todo.py: no close()
    def __init__(self, env_server_base: str, data_len: int, *args, timeout: int = 300, **kwargs):
        self.env_server_base = env_server_base
        self.timeout = timeout
        self.data_len = data_len
        self.id = 0
        ok = requests.post(f"{self.env_server_base}/create", json={"id": 0}, timeout=self.timeout)
        if ok.status_code != 200:
            raise requests.RequestException(f"Failed to create environment: {ok}")
        self.env_id = ok.json()

    def __len__(self):
        return self.data_len

    def _post(self, path: str, data: dict) -> dict:
        data["env_idx"] = self.env_id
        res = requests.post(f"{self.env_server_base}/{path}", json=data, timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def _get(self, path: str) -> dict:
        res = requests.get(f"{self.env_server_base}/{path}?env_idx={self.env_id}", timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def observe(self):
        return self._get("observation")

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        return StepOutput(state=response["observation"], reward=response["reward"], done=response["done"])

    def reset(self, id: int):
        self.id = id
        return self._post("reset", {"id": self.id})


def policy(conversation: list[dict], replies: tuple[str, ...] = REPLIES) -> str:
    """The model: `replies` in turn (its conversation holds its earlier replies)."""
    return replies[sum(1 for m in conversation if m["role"] == "assistant")]


def base_task_experience(client: TodoEnvClient, idx: int, generate, max_rounds: int | None = None) -> float:
    """BaseTask._generate_experience_one with an APIAgent: its ExperienceOutput's reward."""
    client.reset(idx)
    reward = 0.0
    done = False
    state = client.observe()
    conversation = [{"role": "user", "content": state}]
    rounds = 0
    while not done:
        generated_text = generate(conversation)
        conversation.append({"role": "assistant", "content": generated_text})
        step_output = client.step(generated_text)
        state, reward, done = step_output.state, step_output.reward, step_output.done
        conversation.append({"role": "user", "content": state})
        rounds += 1
        if max_rounds is not None and rounds >= max_rounds:
            break
    return reward


def init_env_client(env_addr: str, max_retries: int = 3) -> TodoEnvClient:  # verl/utils/agentgym/client.py
    retry = 0
    while True:
        try:
            return TodoEnvClient(env_server_base=env_addr, data_len=1, timeout=2400)
        except Exception:  # noqa: BLE001 - as AgentGym-RL does: any failure to create is retried
            retry += 1
            if retry > max_retries:
                raise
            time.sleep(5)


@dataclass
class Handler:  # verl/workers/rollout/schemas.py's RolloutHandler, the fields the env side uses
    item_id: int
    messages: list[dict]
    score: float = 0
    done: bool = False


def agentgym_rl_step(env_addr: str, item_ids: list[int], before_rounds=None, max_rounds: int = 10
                     ) -> tuple[list[TodoEnvClient], list[Handler]]:
    """The env side of vLLMRollout.generate_sequences: (its clients, its rollouts with their scores)."""
    handlers = [Handler(item_id=i, messages=[]) for i in item_ids]
    env_clients = [init_env_client(env_addr) for _ in range(len(handlers))]
    for idx, handler in enumerate(handlers):
        try:
            env_clients[idx].reset(handler.item_id)
            handler.messages.append({"role": "user", "content": env_clients[idx].observe()})
        except TimeoutError:
            handler.done = True
            handler.score = 0
    if before_rounds is not None:
        before_rounds(env_clients)

    def agent_step(idx: int) -> bool:
        content = policy(handlers[idx].messages, (DEFECT, SUBMIT))
        handlers[idx].messages.append({"role": "assistant", "content": content})
        try:
            step_output = env_clients[idx].step(content)
            state, handlers[idx].score, handlers[idx].done = step_output.state, step_output.reward, step_output.done
            handlers[idx].messages.append({"role": "user", "content": state})
            return step_output.done
        except Exception:  # noqa: BLE001 - as AgentGym-RL does: a failed step scores the rollout 0
            handlers[idx].score = 0
            handlers[idx].done = True
            return True

    rounds, all_done = 0, False
    while rounds < max_rounds and not all_done:
        not_done = [idx for idx, handler in enumerate(handlers) if not handler.done]
        all_done = True
        if not_done:
            with ThreadPoolExecutor(max_workers=len(not_done)) as executor:
                all_done = all(executor.map(agent_step, not_done))
        rounds += 1
    for client in env_clients:
        try:
            client.close()
        except Exception as e:  # noqa: BLE001 - as AgentGym-RL does: "Error during closing env"
            print(f"Error during closing env: {e}")
    return env_clients, handlers


# ----- the server, with its defaults --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("agentgym-trainers")
    srv = AirServer("agentgym", f"test-agt-{uuid.uuid4().hex[:8]}", folder / "server.log", "--log-level", "warning",
                    "--task", TASK, "--trajectory-dir", str(folder / "trajectories"))
    srv.trajectories = folder / "trajectories"
    with srv.serving():
        yield srv


def episodes_of(srv: AirServer, env_idx: int) -> list[list[dict]]:
    """The trajectories of one env_idx's episodes, oldest first."""
    found = [read_trajectory(p) for p in srv.trajectories.rglob("*.jsonl")]
    return sorted((r for r in found if r[0]["agentgym"]["env_idx"] == env_idx), key=lambda r: r[0]["time"])


def kill_sandbox(srv: AirServer, docker_client, env_idx: int) -> str:
    """Kill the container of an env_idx's episode (air's GET /detail names it): an infrastructure failure. Its
    id."""
    name = requests.get(f"{srv.url}/detail", params={"env_idx": env_idx}, timeout=60).json()["sandbox"]
    container = docker_client.containers.get(name)
    container.kill()
    return container.id


def assert_replayed_once(runs: list[list[dict]], killed: str) -> list[dict]:
    """The killed episode failed as infrastructure in its first turn and was played again, once, in another
    sandbox; the new one names it. Returns the episode that finished."""
    failed, finished = runs
    assert failed[-1]["type"] == "failed" and failed[-1]["kind"] == "infrastructure", failed[-1]
    assert killed.startswith(failed[0]["sandbox"]) and not killed.startswith(finished[0]["sandbox"])
    assert finished[0]["retry_of"]["episode"] == failed[0]["episode"]
    return finished


# ----- the tests ----------------------------------------------------------------------------------------------
def test_the_defaults_take_a_usual_agentgym_rl_step_from_one_host():
    assert ServiceConfig().max_envs >= STEP and ServiceConfig().max_envs_per_client >= STEP


def test_base_task_records_airs_return(server, docker_client):
    """BaseTask's loop with one TodoEnvClient, three episodes of one item, the second's container killed before
    its first command: each ExperienceOutput's reward is the return air recorded, and it is air's return."""
    client = TodoEnvClient(server.url, data_len=1)
    killed = []

    def generate(conversation: list[dict]) -> str:
        if len(conversation) == 1 and len(rewards) == 1:  # the second episode, before its first command
            killed.append(kill_sandbox(server, docker_client, client.env_id))
        return policy(conversation)

    rewards: list[float] = []
    for _ in range(3):
        rewards.append(base_task_experience(client, 0, generate))
    assert rewards == pytest.approx([returned()] * 3, abs=1e-9) and returned() < -0.1
    runs = episodes_of(server, client.env_id)
    assert len(runs) == 4 and killed
    first, second, third = runs[0], assert_replayed_once(runs[1:3], killed[0]), runs[3]
    for reward, records in zip(rewards, (first, second, third)):
        assert records[-1]["type"] == "end" and records[-1]["total_reward"] == reward
        assert [r["reward"] for r in records[1:-1]] == pytest.approx([0.0, returned(), 0.0], abs=1e-9)


def test_agentgym_rl_records_airs_return_and_clients_without_close_never_fill_the_caps(server, docker_client):
    """An AgentGym-RL step of 40 TodoEnvClients created up front from one host, with the server's default caps;
    one client's container killed between the resets and the first round. Every rollout's score is the return
    air recorded for its episode; none is scored 0. The clients never close (TodoEnvClient has no close), yet
    their finished episodes hold no place: the next step's 40 clients are created, and the caps still refuse
    what passes them, saying which cap and how to raise it."""
    killed = []
    clients, handlers = agentgym_rl_step(
        server.url, [0] * STEP, before_rounds=lambda cs: killed.append(kill_sandbox(server, docker_client,
                                                                                    cs[7].env_id)))
    assert len({c.env_id for c in clients}) == STEP
    assert [h.score for h in handlers] == pytest.approx([returned()] * STEP, abs=1e-9)
    assert all(h.done for h in handlers)
    for client, handler in zip(clients, handlers):
        runs = episodes_of(server, client.env_id)
        finished = assert_replayed_once(runs, killed[0]) if client is clients[7] else runs[0]
        assert finished[-1]["type"] == "end" and finished[-1]["total_reward"] == handler.score
    # Unclosed and finished: all 40 still answer (their last observation), none counts under the caps.
    listed = set(requests.get(f"{server.url}/list_envs", timeout=60).json())
    assert {c.env_id for c in clients} <= listed
    assert clients[0].observe() == handlers[0].messages[-1]["content"]
    cap = ServiceConfig().max_envs
    more: list[TodoEnvClient] = []
    try:
        more += [init_env_client(server.url) for _ in range(cap)]  # the next step, and as many more as the cap
        refused = requests.post(f"{server.url}/create", json={"id": 0}, timeout=60)
        assert refused.status_code == 429, refused.text
        assert "(max_envs)" in refused.json()["detail"] and "--max-envs" in refused.json()["detail"]
    finally:
        for client in more:
            requests.post(f"{server.url}/close", json={"env_idx": client.env_id}, timeout=600)


def test_nothing_is_left_once_the_server_stops(server, docker_client):
    """Last in this file: the server gives back every container when it stops (SIGTERM)."""
    server.stop()
    assert not list_air_containers(docker_client, run=server.run_id)
    assert Path(server.log_path).exists()
