"""`air serve agentgym` driven as AgentGym's trainers drive an environment server: a subprocess on a free
loopback port, and a client written from AgentGym's own `agentenv` clients.

The client follows agentenv/agentenv/envs/searchqa.py and todo.py (WooooDyy/AgentGym 3ef9235): `POST /create`
with `{"id": 0}` answering a bare env_idx; every body carries `env_idx`, every GET `?env_idx=`; `reset(idx)`
posts the item's index; `observe()` reads `GET /observation`; `step(text)` posts the model's raw output and
reads `observation`, `reward`, `done`; `close()` posts `{}` + env_idx. The episode loop follows BaseTask's
`_generate_experience_one` (agentenv/agentenv/controller/task.py): reset, observe, then step until done; the
concurrent one follows AgentGym-RL's rollout (a thread per env client). Where AgentGym's clients assert a 200,
this one raises `ServerError` with the status and body, so the tests can read what a failure says.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import requests
from served import AirServer, assert_stopped_cleanly, expected_step_rewards, wait_until_running

from air.episode.replay import load_recordings
from air.episode.trajectory import read_trajectory
from air.policies.scripted import SCRIPTS, SUBMIT, VALIDATE, ScriptedPolicy
from air.sandbox import list_air_containers

pytestmark = [pytest.mark.docker]

TASKS = ["prisoners-dilemma", "tabular-classification"]
PD = 0  # data_idx of prisoners-dilemma#0
TAB = 1
MAX_ENVS_PER_CLIENT = 17
MAX_ENVS = 24


# ----- a client written from AgentGym's ---------------------------------------------------------------------
@dataclass
class StepOutput:  # agentenv/agentenv/controller/types.py, plus the info AgentGym's clients drop
    state: str
    reward: float
    done: bool
    info: dict


class ServerError(Exception):
    def __init__(self, response: requests.Response):
        super().__init__(f"HTTP {response.status_code}: {response.text[:300]}")
        self.status = response.status_code
        self.body = response.json()


class AgentGymEnvClient:
    def __init__(self, env_server_base: str, data_len: int, timeout: int = 900, headers: dict | None = None):
        self.env_server_base = env_server_base
        self.timeout = timeout
        self.data_len = data_len
        self.headers = headers or {}  # AgentGym's clients send none; a server with --token needs its bearer
        ok = requests.post(f"{self.env_server_base}/create", json={"id": 0}, timeout=self.timeout,
                           headers=self.headers)
        if ok.status_code != 200:
            raise ServerError(ok)
        self.env_id = ok.json()

    def __len__(self) -> int:
        return self.data_len

    def _post(self, path: str, data: dict) -> object:
        data["env_idx"] = self.env_id
        res = requests.post(f"{self.env_server_base}/{path}", json=data, timeout=self.timeout,
                            headers=self.headers)
        if res.status_code != 200:
            raise ServerError(res)
        return res.json()

    def _get(self, path: str) -> object:
        res = requests.get(f"{self.env_server_base}/{path}?env_idx={self.env_id}", timeout=self.timeout,
                           headers=self.headers)
        if res.status_code != 200:
            raise ServerError(res)
        return res.json()

    def observe(self) -> str:
        return self._get("observation")

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        return StepOutput(state=response["observation"], reward=response["reward"], done=response["done"],
                          info=response["info"])

    def reset(self, id: int) -> object:
        return self._post("reset", {"id": id})

    def close(self) -> object:
        return self._post("close", {})


def play(client: AgentGymEnvClient, idx: int) -> tuple[list[str], list[StepOutput]]:
    """BaseTask._generate_experience_one with the scripted policy as the agent: (replies, step outputs)."""
    client.reset(idx)
    state = client.observe()
    messages = [{"role": "user", "content": state}]
    policy = ScriptedPolicy()
    replies, outputs = [], []
    done = False
    while not done:
        reply = policy.reply_for(messages)
        out = client.step(reply)
        replies.append(reply)
        outputs.append(out)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": out.state}]
        done = out.done
    return replies, outputs


# ----- the server as a subprocess ---------------------------------------------------------------------------
class Server(AirServer):
    """`air serve agentgym ... --json` with this file's tasks."""

    def __init__(self, run_id: str, log_path: Path, *extra: str, port: int | None = None,
                 env: dict[str, str] | None = None):
        super().__init__("agentgym", run_id, log_path, "--log-level", "warning",
                         *[a for t in TASKS for a in ("--task", t)], *extra, port=port, env=env)


@pytest.fixture(scope="module")
def server(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("agentgym")
    # Per-step rewards (the default reports the return so far): these tests check each step's delta.
    srv = Server(f"test-ag-{uuid.uuid4().hex[:8]}", folder / "server.log", "--max-envs", str(MAX_ENVS),
                 "--max-envs-per-client", str(MAX_ENVS_PER_CLIENT), "--max-sandboxes", "48",
                 "--reward-report", "step", "--trajectory-dir", str(folder / "trajectories"))
    srv.trajectories = folder / "trajectories"
    with srv.serving():
        yield srv


def trajectory(srv: Server, episode: str) -> list[dict]:
    files = list(srv.trajectories.rglob(f"{episode}.jsonl"))
    assert len(files) == 1, f"no trajectory file for episode {episode}"
    return read_trajectory(files[0])


def raw(srv: Server, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{srv.url}{path}", timeout=600, **kwargs)


# ----- the protocol -----------------------------------------------------------------------------------------
def test_ready_line_health_and_items(server):
    assert server.ready["url"] == server.url and server.ready["items"] == len(TASKS)
    assert requests.get(f"{server.url}/", timeout=30).json() == "ok"
    items = requests.get(f"{server.url}/items", timeout=30).json()
    assert items["count"] == len(TASKS)
    assert [(i["data_idx"], i["item_id"]) for i in items["items"]] == [(PD, "prisoners-dilemma#0"),
                                                                       (TAB, "tabular-classification#0")]


@pytest.mark.slow
def test_a_full_episode_pays_the_hand_computed_rewards(server):
    """One client plays both items in turn, as BaseTask does with one client: every step's reward is the
    hand-computed delta, the first observation carries the system and task prompts, the episode ends on
    submit, and its trajectory reads back (view) and replays without drift."""
    client = AgentGymEnvClient(server.url, data_len=len(TASKS))
    try:
        for idx, task_id in ((PD, "prisoners-dilemma"), (TAB, "tabular-classification")):
            replies, outputs = play(client, idx)
            assert replies == list(SCRIPTS[task_id].replies)
            expected = expected_step_rewards(task_id, replies)
            assert [o.reward for o in outputs] == pytest.approx(expected, abs=1e-9)
            assert [o.done for o in outputs] == [False] * (len(outputs) - 1) + [True]
            last = outputs[-1]
            assert last.info["ended_by"] == "submitted" and last.info["item_id"] == f"{task_id}#0"
            assert last.info["total_reward"] == pytest.approx(sum(o.reward for o in outputs), abs=1e-12)
            assert last.info["score"] == pytest.approx(SCRIPTS[task_id].expected_scores[-1], rel=1e-12)
            assert client.observe() == last.state  # the current observation, after done too
            with pytest.raises(ServerError) as after_done:
                client.step(SUBMIT)
            assert after_done.value.status == 409 and "done" in after_done.value.body["detail"]
            records = trajectory(server, last.info["episode"])
            start, end = records[0], records[-1]
            assert start["agentgym"]["data_idx"] == idx and start["agentgym"]["env_idx"] == client.env_id
            assert (start["system_prompt"] + "\n\n" + start["prompt"]).startswith(
                "You are an autonomous ML research agent") and f"(id: {task_id})" in start["system_prompt"]
            assert end["type"] == "end" and end["ended_by"] == "submitted"
            assert end["step_rewards"] == pytest.approx([o.reward for o in outputs], abs=1e-12)
    finally:
        client.close()
    recordings = load_recordings(server.trajectories)  # what `air view` and `air replay` read
    assert {r.task for r in recordings if r.ok and r.ended_by == "submitted"} >= set(TASKS)
    pd_file = trajectory_file(server, "prisoners-dilemma", "submitted")
    replay = subprocess.run([sys.executable, "-c", "from air.cli.main import main; main()", "replay",
                             str(pd_file), "--json"], check=False, capture_output=True, text=True,
                            timeout=900)
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]


def trajectory_file(srv: Server, task_id: str, ended_by: str) -> Path:
    for path in sorted((srv.trajectories / task_id).glob("*.jsonl")):
        if read_trajectory(path)[-1].get("ended_by") == ended_by:
            return path
    raise AssertionError(f"no {task_id} trajectory that ended {ended_by}")


@pytest.mark.slow
@pytest.mark.heavy  # bench/heavy_tests.sh: load; many clients at once is also test_agentgym_trainers'
def test_sixteen_concurrent_episodes(server):
    """16 env clients at once, each in its own thread as AgentGym-RL's rollout steps them: every one gets its
    own env_idx and sandbox and the exact hand-computed return."""
    n = 16
    clients = [AgentGymEnvClient(server.url, data_len=len(TASKS)) for _ in range(n)]
    try:
        assert len({c.env_id for c in clients}) == n
        assert set(requests.get(f"{server.url}/list_envs", timeout=30).json()) >= {c.env_id for c in clients}
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(lambda c: play(c, PD), clients))
    finally:
        for c in clients:
            c.close()
    expected = expected_step_rewards("prisoners-dilemma", list(SCRIPTS["prisoners-dilemma"].replies))
    sandboxes = set()
    for replies, outputs in results:
        assert [o.reward for o in outputs] == pytest.approx(expected, abs=1e-9)
        assert outputs[-1].done and outputs[-1].info["ended_by"] == "submitted"
        sandboxes.add(outputs[0].info["sandbox"])
    assert len(sandboxes) == n, "two live episodes shared a sandbox"
    assert not set(requests.get(f"{server.url}/list_envs", timeout=30).json()) & {c.env_id for c in clients}


@pytest.mark.slow
def test_a_killed_container_fails_only_its_env_idx_as_infrastructure(server, docker_client):
    """Kill the container of one env_idx while its command runs: that step, and every later request of that
    env_idx, answer 503 saying infrastructure failed (never reward 0, done); the other episodes finish with
    their exact rewards; a reset gives the env_idx a fresh sandbox."""
    victim, *others = [AgentGymEnvClient(server.url, data_len=len(TASKS)) for _ in range(3)]
    try:
        victim.reset(PD)
        first = victim.step("```bash\nls\n```")
        name = first.info["sandbox"]
        with ThreadPoolExecutor(max_workers=3) as pool:
            played = [pool.submit(play, c, PD) for c in others]
            sleeping = pool.submit(victim.step, "Let me wait.\n\n```bash\nsleep 45\n```")
            container = docker_client.containers.get(name)
            deadline = time.monotonic() + 300
            while not any("sleep 45" in " ".join(row) for row in container.top()["Processes"]):
                assert time.monotonic() < deadline and not sleeping.done(), "the command never started"
                time.sleep(0.1)  # polling for the command to be seen running, not guessing how long it takes
            container.kill()
            with pytest.raises(ServerError) as killed:
                sleeping.result(timeout=600)
            results = [p.result(timeout=900) for p in played]
        assert killed.value.status == 503, killed.value.body
        assert killed.value.body["infrastructure"] is True and killed.value.body["env_idx"] == victim.env_id
        assert "infrastructure" in killed.value.body["error"]
        for again in (lambda: victim.step(VALIDATE), victim.observe):  # sticky: a retry runs nothing
            with pytest.raises(ServerError) as still:
                again()
            assert still.value.status == 503 and still.value.body["infrastructure"] is True
        expected = expected_step_rewards("prisoners-dilemma", list(SCRIPTS["prisoners-dilemma"].replies))
        for _, outputs in results:
            assert [o.reward for o in outputs] == pytest.approx(expected, abs=1e-9)
        records = trajectory(server, first.info["episode"])
        assert records[-1]["type"] == "failed" and records[-1]["kind"] == "infrastructure"
        victim.reset(PD)  # the same env_idx starts over in a fresh sandbox
        fresh = victim.step("```bash\ntrue\n```")
        assert fresh.info["sandbox"] != name and fresh.reward == 0.0 and not fresh.done
    finally:
        for c in (victim, *others):
            c.close()


@pytest.mark.slow
def test_bad_requests_get_one_line_4xx_and_touch_no_other_episode(server):
    bystander = AgentGymEnvClient(server.url, data_len=len(TASKS))
    probe = AgentGymEnvClient(server.url, data_len=len(TASKS))
    try:
        bystander.reset(PD)
        assert bystander.step("```bash\necho one\n```").state.startswith("one")

        def status(response: httpx.Response, code: int) -> str:
            assert response.status_code == code, response.text
            detail = response.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail and detail
            return detail

        def step(body: dict) -> httpx.Response:
            return raw(server, "POST", "/step", json=body)

        assert "unknown env_idx" in status(step({"env_idx": 12345, "action": "x"}), 404)
        assert "unknown env_idx" in status(raw(server, "GET", "/observation", params={"env_idx": 12345}), 404)
        assert "POST /reset" in status(step({"env_idx": probe.env_id, "action": "x"}), 409)
        assert "JSON" in status(raw(server, "POST", "/step", content=b'{"env_idx": 1, "action": ',
                                    headers={"content-type": "application/json"}), 400)
        assert "action" in status(step({"env_idx": probe.env_id}), 400)
        assert "env_idx" in status(step({"env_idx": "seven", "action": "x"}), 400)
        assert "out of range" in status(raw(server, "POST", "/reset", json={"env_idx": probe.env_id,
                                                                            "data_idx": 99}), 400)
        assert "twice" in status(raw(server, "POST", "/reset", json={"env_idx": probe.env_id, "data_idx": 0,
                                                                     "item_id": 1}), 400)
        assert "cap" in status(step({"env_idx": probe.env_id, "action": "x" * (2 << 20)}), 413)
        # A second request while one of the same env_idx runs is refused, and the first is unharmed.
        probe.reset(PD)
        with ThreadPoolExecutor(max_workers=1) as pool:
            slow = pool.submit(probe.step, "```bash\nsleep 4; echo slept\n```")
            deadline = time.monotonic() + 120
            while raw(server, "GET", "/detail", params={"env_idx": probe.env_id}).json()["busy"] is None:
                assert not slow.done() and time.monotonic() < deadline, "the step never showed as running"
                time.sleep(0.05)
            assert "still running" in status(step({"env_idx": probe.env_id, "action": VALIDATE}), 409)
            assert slow.result(timeout=600).state.startswith("slept")
        assert probe.step(SUBMIT).done
        assert "done" in status(step({"env_idx": probe.env_id, "action": "x"}), 409)
        # The bystander's episode went on untouched: its next turn is turn 2 and its shell kept its state.
        after = bystander.step("```bash\necho two\n```")
        assert after.state.startswith("two") and after.info["turn"] == 2 and not after.done
    finally:
        bystander.close()
        probe.close()
    assert "closed" in raw(server, "POST", "/close", json={"env_idx": probe.env_id}).json()["detail"]


def test_every_agentgym_name_for_the_item_index_selects_the_item(server):
    """data_idx (textcraft, babyai, sciworld), item_id (sqlgym), id (searchqa, tool envs), session_id
    (webshop), idx with seed (webarena); and create's `id` is the default of a reset that names none."""
    env = AgentGymEnvClient(server.url, data_len=len(TASKS))
    try:
        for body, idx in (({"data_idx": TAB}, TAB), ({"item_id": PD}, PD), ({"id": TAB}, TAB),
                          ({"session_id": PD}, PD), ({"idx": TAB, "seed": 0}, TAB)):
            first = env._post("reset", dict(body))
            detail = env._get("detail")
            assert detail["data_idx"] == idx, body
            assert isinstance(first, str) and first == env.observe() and f"(id: {TASKS[idx]})" in first
        default = requests.post(f"{server.url}/create", json={"id": TAB}, timeout=60).json()
        try:
            requests.post(f"{server.url}/reset", json={"env_idx": default}, timeout=600).raise_for_status()
            assert requests.get(f"{server.url}/detail", params={"env_idx": default}, timeout=60).json()[
                "data_idx"] == TAB
        finally:
            requests.post(f"{server.url}/close", json={"env_idx": default}, timeout=600)
    finally:
        env.close()


def test_live_env_caps_per_client_and_per_server(server):
    """Creating past a cap is 429 with the reason; another loopback address is another client; closing
    frees a slot."""
    def client_from(address: str) -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=60,
                            transport=httpx.HTTPTransport(local_address=address))

    created: list[int] = []
    with client_from("127.0.0.1") as one, client_from("127.0.0.2") as two:
        try:
            before = len(one.get("/list_envs").json())
            assert before == 0, "an earlier test left env_idx open"
            for _ in range(MAX_ENVS_PER_CLIENT):
                created.append(one.post("/create").json())
            refused = one.post("/create")
            assert refused.status_code == 429 and "max_envs_per_client" in refused.json()["detail"]
            for _ in range(MAX_ENVS - MAX_ENVS_PER_CLIENT):
                created.append(two.post("/create").json())
            refused = two.post("/create")
            assert refused.status_code == 429 and "max_envs)" in refused.json()["detail"]
            assert one.post("/close", json={"env_idx": created.pop()}).json() is True
            created.append(two.post("/create").json())
        finally:
            for idx in created:
                one.post("/close", json={"env_idx": idx})
        assert one.get("/list_envs").json() == []


# ----- restarts, shutdown, token, idle timeout --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_step_ends_it_promptly_and_cleanly(images, docker_client, tmp_path, sig, code):
    """Issue 49, as for `air serve openenv`: signalled while a step runs a long command, the server waited 30 s
    (uvicorn's graceful shutdown), then cancelled the request under the app (a traceback, a bare 500). Now the
    step ends at once (its command killed with its sandbox, recorded interrupted) and is answered 503, an
    infrastructure failure to drop, the server exits 128 + the signal in one line, and no container is left."""
    run = f"test-ag-{uuid.uuid4().hex[:8]}"
    srv = AirServer("agentgym", run, tmp_path / "server.log", "--log-level", "warning", "--task", TASKS[PD],
                    "--trajectory-dir", str(tmp_path / "traj"))
    try:
        srv.wait_ready()
        env = AgentGymEnvClient(srv.url, data_len=1)
        env.reset(PD)
        with ThreadPoolExecutor(max_workers=1) as pool:
            stepping = pool.submit(env.step, "```bash\nsleep 60\n```")
            wait_until_running(docker_client, run, "sleep 60", stepping)
            signalled = time.monotonic()
            srv.proc.send_signal(sig)
            returned = srv.proc.wait(120)
            took = time.monotonic() - signalled
            print(f"{sig.name}: the server exited {returned} {took:.1f} s after the signal")
            assert returned == code, srv.output()
            assert took < 20, f"the server waited {took:.0f} s for the step's command: {srv.output()}"
            with pytest.raises(ServerError) as stopped:
                stepping.result(timeout=10)
        assert stopped.value.status == 503 and stopped.value.body["infrastructure"] is True, stopped.value.body
        assert "the server shut down" in stopped.value.body["error"]
        assert_stopped_cleanly(srv, sig, docker_client, tmp_path / "traj")
    finally:
        srv.stop()
        srv.log.close()


@pytest.mark.slow
def test_server_restart_stale_env_idx_answer_a_clear_error_and_nothing_leaks(images, docker_client, tmp_path):
    """A server with a bearer token is stopped (SIGTERM) under a live episode: its containers are gone and the
    episode is recorded interrupted. A new server on the same port answers the stale env_idx 404 saying it
    never created it; there an idle env_idx is closed after --idle-timeout and its sandbox goes back."""
    token = uuid.uuid4().hex
    first = Server(f"test-ag-{uuid.uuid4().hex[:8]}", tmp_path / "first.log", "--trajectory-dir",
                   str(tmp_path / "traj"), env={"AIR_AGENTGYM_TOKEN": token})
    second = None
    auth = {"Authorization": f"Bearer {token}"}
    try:
        first.wait_ready()
        assert raw(first, "GET", "/").json() == "ok"  # health needs no token
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = raw(first, "POST", "/create", headers=headers)
            assert refused.status_code == 401 and "token" in refused.json()["detail"]
        # By default each step's reward is the return so far (AgentGym's trainers keep only the last).
        player = AgentGymEnvClient(first.url, data_len=len(TASKS), headers=auth)
        replies, outputs = play(player, PD)
        running = list(itertools.accumulate(expected_step_rewards("prisoners-dilemma", replies)))
        assert [o.reward for o in outputs] == pytest.approx(running, abs=1e-9)
        assert [o.info["step_reward"] for o in outputs] == pytest.approx(
            expected_step_rewards("prisoners-dilemma", replies), abs=1e-9)
        player.close()
        env_idx = raw(first, "POST", "/create", headers=auth).json()
        reset = raw(first, "POST", "/reset", json={"env_idx": env_idx, "data_idx": PD}, headers=auth)
        assert reset.status_code == 200, reset.text
        step = raw(first, "POST", "/step", json={"env_idx": env_idx, "action": "```bash\nls\n```"},
                   headers=auth)
        assert step.status_code == 200 and not step.json()["done"]
        assert list_air_containers(docker_client, run=first.run_id), "the live episode has no container?"
        assert first.stop() == 143, first.output()  # a stop, as every air command says it (issue 42)
        left = list_air_containers(docker_client, run=first.run_id)
        assert not left, f"containers left by the stopped server: {[c.name for c in left]}"
        ends = sorted(read_trajectory(f)[-1].get("kind") or read_trajectory(f)[-1]["ended_by"]
                      for f in (tmp_path / "traj").rglob("*.jsonl"))
        assert ends == ["interrupted", "submitted"]

        second = Server(f"test-ag-{uuid.uuid4().hex[:8]}", tmp_path / "second.log", "--idle-timeout", "3",
                        port=first.port)
        second.wait_ready()
        stale = raw(second, "POST", "/step", json={"env_idx": env_idx, "action": "```bash\nls\n```"})
        assert stale.status_code == 404 and "restart" in stale.json()["detail"], stale.text
        assert raw(second, "GET", "/list_envs").json() == []

        idle = raw(second, "POST", "/create").json()
        assert raw(second, "POST", "/reset", json={"env_idx": idle, "data_idx": PD}).status_code == 200
        deadline = time.monotonic() + 300
        while idle in raw(second, "GET", "/list_envs").json():
            assert time.monotonic() < deadline, "the idle env_idx was never closed"
            time.sleep(0.5)
        gone = raw(second, "POST", "/step", json={"env_idx": idle, "action": "```bash\nls\n```"})
        assert gone.status_code == 404 and "idle_timeout" in gone.json()["detail"]
    finally:
        first.stop()
        first.log.close()
        if second is not None:
            second.stop()
            second.log.close()
    for srv in (first, second):
        left = list_air_containers(docker_client, run=srv.run_id)
        assert not left, f"containers leaked: {[c.name for c in left]}"


# ----- AgentGym's other client families, with the shapes of their own source --------------------------------
def _post(base: str, path: str, env_id, data: dict):
    """The families' `_post`: the body gets env_idx, a non-200 fails (AgentGym's clients assert)."""
    data["env_idx"] = env_id
    res = requests.post(f"{base}/{path}", json=data, timeout=600)
    assert res.status_code == 200, res.text
    return res.json()


def _command_of(reply: str) -> str:
    """The command inside a scripted reply's one fenced block (validate / submit included)."""
    from air.episode.parse import parse_reply

    action = parse_reply(reply)
    return action.text if action.kind == "command" else action.kind


def play_family(base: str, family: str, idx: int) -> list[dict]:
    """WebshopEnvClient, SqlGymEnvClient, WebarenaEnvClient (agentenv/agentenv/envs/*.py at 3ef9235): their
    create, reset and step, each reply written as that client's prompt asks and reduced as the client does."""
    created = requests.post(f"{base}/create", timeout=60)
    assert created.status_code == 200
    env_id = created.json()["env_idx"] if family == "webarena" else created.json()
    if family == "webshop":
        response = _post(base, "reset", env_id, {"session_id": idx})
        response[0] = requests.get(f"{base}/observation?env_idx={env_id}", timeout=60).json()
        first = response[0]
    elif family == "sqlgym":
        _post(base, "reset", env_id, {"item_id": idx})
        first = requests.get(f"{base}/observation?env_idx={env_id}", timeout=60).json()
    else:
        response = _post(base, "reset", env_id, {"seed": 0, "idx": idx})
        assert response["observation"] != "TimeoutError"
        first = response["observation"]
    outputs = []
    for reply in SCRIPTS["prisoners-dilemma"].replies:
        command = _command_of(reply)
        if family == "webshop":  # BaseAdapter.parse_react: what follows the last "Action:", stripped
            text = f"Thought:\nI act.\n\nAction:\n```bash\n{command}\n```"
            action = text.rsplit("Action:", 1)[1].strip()
        elif family == "sqlgym":  # SqlGymEnvClient.step
            text = f"Thought: I act.\n\nAction: ```sql\n{command}\n```"
            action = text.split("```sql")[-1].split("```")[0].strip()
        else:  # WebarenaEnvClient.step sends the whole reply when it holds a ``` block
            action = f"In summary, the next action I will perform is\n```bash\n{command}\n```"
        response = _post(base, "step", env_id, {"action": action})
        done = response["terminated"] if family == "webarena" else response["done"]
        state = response["observation"] if family == "webarena" else response["state"]
        outputs.append({"state": state, "reward": response["reward"], "done": done})
        if done:
            break
    if family != "sqlgym":  # SqlGymEnvClient has no close
        _post(base, "close", env_id, {})
    outputs[0]["first"] = first
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("family", ["webshop", "sqlgym", "webarena"])
def test_agentgym_client_families_unmodified(server, family):
    outputs = play_family(f"{server.url}/{family}", family, PD)
    expected = expected_step_rewards("prisoners-dilemma", list(SCRIPTS["prisoners-dilemma"].replies))
    assert [o["reward"] for o in outputs] == pytest.approx(expected, abs=1e-9)
    assert outputs[-1]["done"] and not any(o["done"] for o in outputs[:-1])
    assert "(id: prisoners-dilemma)" in outputs[0]["first"]
    if family in ("webshop", "sqlgym"):  # the first observation says how to reply through this client
        assert ("Action:" if family == "webshop" else "```sql") in outputs[0]["first"].rsplit("\n\n", 1)[1]


@pytest.mark.slow
def test_token_through_a_url_with_credentials(images, tmp_path):
    """AgentGym's clients send no headers: the token goes in the server's URL, which requests sends as Basic."""
    token = uuid.uuid4().hex
    srv = Server(f"test-ag-{uuid.uuid4().hex[:8]}", tmp_path / "server.log", env={"AIR_AGENTGYM_TOKEN": token})
    try:
        srv.wait_ready()
        assert requests.post(f"{srv.url}/webshop/create", timeout=60).status_code == 401
        wrong = srv.url.replace("http://", "http://air:wrong@")
        assert requests.post(f"{wrong}/webshop/create", timeout=60).status_code == 401
        authed = srv.url.replace("http://", f"http://air:{token}@")
        outputs = play_family(f"{authed}/webshop", "webshop", PD)
        assert outputs[-1]["done"]
    finally:
        srv.stop()
        srv.log.close()
