"""The shipped training and evaluation configs (configs/**/*.toml) are valid and consistent.

Every env section is validated by verifiers' own resolution (`vf.resolve_env_config`, the code prime-rl and
vf-eval run), so a renamed or unknown field fails here rather than on a GPU node. prime-rl itself cannot be
installed here; what its launcher derives from a config is repeated (read at prime-rl 559b447): the GPU split
(inference on [0, num_infer_gpus), the trainer on the next num_train_gpus), the vLLM data parallelism and the
NCCL weight-broadcast group size, which env servers it starts (none for a source with `serve.address`), and
`batch_size % group_size == 0`. Then air's rules: task GPUs never overlap prime-rl's or each other's (per
host, for env servers on other hosts), a remote source and its env-server file agree, every task exists, and
a whole episode fits in `seq_len`:

    seq_len >= prompt_tokens + max_turns * (max_completion_tokens + ceil(observation_chars / 3) + 10)

with 3 characters per token for text and 10 tokens of chat-template framing per turn (two messages), and
`env.agent.max_total_tokens + one turn <= seq_len` when the framework limit is set; in the tools format too (its
prompt also holds the tools' schemas), so a source switched to it still fits. For tool calls, vLLM's parser is
set for the model family (as prime-rl's own table names it) and every renderer validates as the released
`renderers` package's config (the type prime-rl's configs use).

An orchestrator config alone (configs/mlgym/orchestrator_local.toml: prime-rl's orchestrator on a CPU with a local
model, its env server started by hand) gets the same env, group, budget and renderer checks, and its header's env
server command must give the taskset the file sets. prime-rl's own parser reads it in
tests/test_prime_rl_orchestrator.py, where scripts/prime-rl-orchestrator.sh prepared prime-rl.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import verifiers.v1 as vf
from pydantic import ValidationError

from air.actions import openai_tools
from air.episode.config import EpisodeConfig
from air.episode.prompts import system_prompt, task_prompt
from air.tasks.registry import bundled_ids, load_task
from air_mlgym.taskset import AirEnvConfig

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
CHARS_PER_TOKEN = 3
FRAMING_TOKENS_PER_TURN = 10
COMMIT = re.compile(r"prime-rl ([0-9a-f]{40})")


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _kind(data: dict) -> str:
    if "orchestrator" in data:
        return "rl"
    if "data" in data:
        return "sft"
    if "serve" in data and "env" in data:  # prime-rl's EnvServerConfig (`env-server @ file`)
        return "env-server"
    if "env" in data:
        return "vf-eval"
    if "train" in data and "model" in data:  # prime-rl's OrchestratorConfig alone (`orchestrator @ file`)
        return "orchestrator"
    raise AssertionError("neither a prime-rl rl/sft/env-server/orchestrator config nor a vf-eval config")


KINDS = ("rl", "sft", "env-server", "vf-eval", "orchestrator")
ALL = sorted(CONFIGS.rglob("*.toml"))
BY_KIND = {kind: [p for p in ALL if _kind(_load(p)) == kind] for kind in KINDS}


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIGS))


def _orchestrator(data: dict) -> dict:
    """The orchestrator's table: an rl config's [orchestrator], or an orchestrator config whole."""
    if "orchestrator" in data:
        return data["orchestrator"]
    return data if _kind(data) == "orchestrator" else {}


ORCHESTRATING = ("rl", "orchestrator")
"""The kinds whose orchestrator runs training sources (the rl launcher's, or the orchestrator alone)."""


def _sources(data: dict) -> list[tuple[str, dict]]:
    """(label, source table) of every env source: prime-rl train/eval sources, SFT online-eval sources."""
    orchestrator = _orchestrator(data)
    found = [(f"train[{i}]", s) for i, s in enumerate(orchestrator.get("train", {}).get("source", []))]
    found += [(f"eval[{i}]", s) for i, s in enumerate((orchestrator.get("eval") or {}).get("source", []))]
    if _kind(data) != "orchestrator":  # an orchestrator config's own eval is its [eval], found above
        found += [(f"sft-eval[{i}]", s) for i, s in enumerate((data.get("eval") or {}).get("source", []))]
    return found


def _env_sections(data: dict) -> list[tuple[str, dict]]:
    if _kind(data) in ("vf-eval", "env-server"):
        return [("env", data["env"])]
    return [(label, source["env"]) for label, source in _sources(data)]


ENV_CASES = [(p, label, env) for p in ALL for label, env in _env_sections(_load(p))]


def _per_turn_tokens(max_completion_tokens: int, observation_chars: int) -> int:
    return max_completion_tokens + math.ceil(observation_chars / CHARS_PER_TOKEN) + FRAMING_TOKENS_PER_TURN


def _prompt_tokens(env: AirEnvConfig, action_format: str = "text") -> int:
    ts = env.taskset
    episode = EpisodeConfig(max_turns=ts.max_turns, observation_chars=ts.observation_chars)
    tools = len(json.dumps(openai_tools())) if action_format == "tools" else 0  # the template shows the schemas
    longest = max(len(system_prompt(s, action_format)) + len(task_prompt(s, episode)) + tools
                  for s in (load_task(ref, ts.mlgym_root) for ref in ts.tasks))
    return math.ceil(longest / CHARS_PER_TOKEN)


def _seq_len(data: dict) -> int:
    value = data.get("seq_len") or data.get("orchestrator", {}).get("seq_len")
    assert value, "set seq_len: the orchestrator truncates to it (default 2048, far too short for an episode)"
    return value


def test_configs_are_shipped():
    assert all(BY_KIND.values()), {k: [_rel(p) for p in v] for k, v in BY_KIND.items()}
    assert ENV_CASES


# ----- env sections through verifiers' own resolution -------------------------------------------------------
@pytest.mark.parametrize(("path", "label", "env"), ENV_CASES,
                         ids=[f"{_rel(p)}:{lab}" for p, lab, _ in ENV_CASES])
def test_env_section_resolves_through_verifiers(path, label, env):
    config = vf.resolve_env_config(copy.deepcopy(env))
    assert isinstance(config, AirEnvConfig), f"{_rel(path)} {label}: resolved to {type(config).__name__}"
    assert config.taskset.id == "air-mlgym"
    for ref in config.taskset.tasks:
        assert ref.startswith("mlgym:") or ref in bundled_ids(), f"{_rel(path)} {label}: unknown task {ref!r}"
    # Set explicitly in every shipped config: verifiers' own default runtime is remote Prime sandboxes.
    assert env["agent"]["runtime"]["type"] == "subprocess"
    # None would mean "every GPU nvidia-smi reports", including the ones vLLM and the trainer use.
    assert config.taskset.gpu_ids is not None, f"{_rel(path)} {label}: list the task GPUs explicitly"


def _a_shipped_env() -> dict:
    _, _, env = ENV_CASES[0]
    return copy.deepcopy(env)


@pytest.mark.parametrize(("where", "typo"), [
    (("taskset",), "max_turn"),            # a renamed taskset field
    (("taskset",), "observation_char"),
    (("agent",), "max_total_token"),       # a per-agent limit
    ((), "timeouts"),                      # an env-level knob
])
def test_a_typo_in_an_env_section_is_rejected(where, typo):
    env = _a_shipped_env()
    table = env
    for key in where:
        table = table[key]
    table[typo] = 16
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        vf.resolve_env_config(env)


def test_a_wrongly_typed_value_is_rejected():
    env = _a_shipped_env()
    env["taskset"]["max_turns"] = "many"
    with pytest.raises(ValidationError):
        vf.resolve_env_config(env)


def test_an_unknown_task_is_caught():
    with pytest.raises(Exception, match="unknown task"):
        load_task("no-such-task")


# ----- prime-rl configs -------------------------------------------------------------------------------------
# What prime-rl's launcher derives from an rl config, as read at prime-rl 559b447:
# packages/prime-rl-configs/src/prime_rl/configs/rl.py (RLConfig, whose after-validators run in the order they
# are defined: auto_setup_weight_broadcast before auto_setup_deployment) and src/prime_rl/entrypoints/rl.py.
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "*"}
TCP = re.compile(r"tcp://([^:/\s]+):(\d+)")


def _gpu_layout(data: dict) -> tuple[set[int], set[int], int]:
    deployment = data.get("deployment", {})
    assert deployment.get("type", "single_node") == "single_node"
    gpus_per_node = deployment.get("gpus_per_node", 8)
    # prime-rl's launcher: inference on [0, num_infer_gpus) when it starts vLLM, the trainer on the next ones.
    num_infer = deployment.get("num_infer_gpus", 1) if "inference" in data else 0
    num_train = deployment.get("num_train_gpus", 1)
    assert num_infer + num_train <= gpus_per_node
    return set(range(num_infer)), set(range(num_infer, num_infer + num_train)), gpus_per_node


def _written_parallelism(data: dict) -> tuple[int, int]:
    """[inference.vllm] data_parallel_size and tensor_parallel_size as the file sets them (defaults 1)."""
    vllm = data["inference"].get("vllm", {})
    return vllm.get("data_parallel_size", 1), vllm.get("tensor_parallel_size", 1)


def _vllm_parallelism(data: dict) -> tuple[int, int]:
    """(data parallel, tensor parallel) that vLLM runs with: RLConfig.auto_setup_deployment (single_node) sets
    data_parallel_size = num_infer_gpus // tensor_parallel_size whenever dp x tp != num_infer_gpus."""
    dp, tp = _written_parallelism(data)
    num_infer = data.get("deployment", {}).get("num_infer_gpus", 1)
    if dp * tp != num_infer:
        assert num_infer % tp == 0, "prime-rl asserts num_infer_gpus % tensor_parallel_size == 0"
        dp = num_infer // tp
    return dp, tp


def _weight_broadcast(data: dict) -> tuple[str, int | None]:
    """(type, inference world size) as RLConfig.auto_setup_weight_broadcast derives them: the set type, else
    filesystem with LoRA or without [inference], else NCCL; for NCCL/NIXL the world size is
    data_parallel_size x tensor_parallel_size as written, since this runs before auto_setup_deployment raises
    data parallelism. Filesystem broadcast forms no group (None)."""
    kind = data.get("weight_broadcast", {}).get("type")
    if kind is None:
        lora = data.get("trainer", {}).get("model", {}).get("lora")
        kind = "filesystem" if lora is not None or "inference" not in data else "nccl"
    if kind == "filesystem":
        return kind, None
    dp, tp = _written_parallelism(data) if "inference" in data else (1, 1)
    return kind, dp * tp


WITH_INFERENCE = [p for p in BY_KIND["rl"] if "inference" in _load(p)]


@pytest.mark.parametrize("path", WITH_INFERENCE, ids=_rel)
def test_inference_parallelism_matches_its_gpus_and_the_broadcast_group(path):
    data = _load(path)
    num_infer = data.get("deployment", {}).get("num_infer_gpus", 1)
    dp, tp = _written_parallelism(data)
    assert dp * tp == num_infer, (f"{_rel(path)}: set [inference.vllm] data_parallel_size = "
                                  f"num_infer_gpus / tensor_parallel_size ({num_infer} / {tp})")
    assert _vllm_parallelism(data) == (dp, tp)
    kind, world_size = _weight_broadcast(data)
    if kind in ("nccl", "nixl"):
        assert world_size == dp * tp, f"{_rel(path)}: {kind} group of {world_size} for {dp * tp} vLLM ranks"


def test_an_unset_data_parallel_size_would_leave_the_broadcast_group_short():
    """The failure the explicit setting prevents: 4 vLLM ranks, an NCCL group sized for 1."""
    data = _load(CONFIGS / "mlgym" / "rl.toml")
    del data["inference"]["vllm"]["data_parallel_size"]
    assert _vllm_parallelism(data) == (4, 1)
    assert _weight_broadcast(data) == ("nccl", 1)


def _address(source: dict) -> str | None:
    return source.get("serve", {}).get("address")


def _launcher_env_servers(data: dict) -> list[str]:
    """Labels of the sources the launcher starts an env server for: entrypoints/rl.py `env_servers` keeps only
    sources without serve.address (an address marks the server externally managed)."""
    return [label for label, source in _sources(data) if _address(source) is None]


def _env_server_file(path: Path, source: dict) -> Path:
    """A remote source's env-server config: env_server_<source name>.toml next to the rl config."""
    return path.parent / f"env_server_{source.get('name') or source['env']['taskset']['id']}.toml"


REMOTE_CASES = [(p, label, s) for p in BY_KIND["rl"] for label, s in _sources(_load(p)) if _address(s)]
MULTI_HOST = sorted({p for p, _, _ in REMOTE_CASES})


@pytest.mark.parametrize("path", BY_KIND["rl"], ids=_rel)
def test_gpus_are_split_without_overlap(path):
    data = _load(path)
    inference, trainer, gpus_per_node = _gpu_layout(data)
    assert not inference & trainer
    taken = inference | trainer
    for label, source in _sources(data):
        env = vf.resolve_env_config(copy.deepcopy(source["env"]))
        ids = [int(g) for g in env.taskset.gpu_ids]
        if _address(source):  # its containers run on the env host: GPUs in its env-server file, checked below
            assert ids == [], f"{label}: list the env host's task GPUs in its env-server file only"
        assert len(set(ids)) == len(ids), f"{label}: duplicate GPU ids"
        assert all(0 <= g < gpus_per_node for g in ids), \
            f"{label}: GPU ids {ids} outside the node's 0..{gpus_per_node - 1}"
        assert not set(ids) & (inference | trainer), \
            f"{label}: task GPUs {ids} overlap inference {sorted(inference)} or trainer {sorted(trainer)}"
        # Each env server (and each of its workers) holds its own GPU inventory: sources may not share GPUs.
        assert not set(ids) & (taken - inference - trainer), \
            f"{label}: task GPUs {ids} given to another source too"
        taken |= set(ids)


def test_a_config_runs_env_servers_on_other_hosts():
    assert CONFIGS / "mlgym" / "rl_multinode.toml" in MULTI_HOST


@pytest.mark.parametrize(("path", "label", "source"), REMOTE_CASES,
                         ids=[f"{_rel(p)}:{lab}" for p, lab, _ in REMOTE_CASES])
def test_a_remote_source_matches_its_env_server(path, label, source):
    where = f"{_rel(path)} {label}"
    match = TCP.fullmatch(_address(source))
    assert match, f"{where}: serve.address must be tcp://HOST:PORT (ZMQ)"
    host, port = match.groups()
    assert host not in LOCAL_HOSTS, f"{where}: an env server on another host needs that host's address"
    # The launcher starts nothing for it, and reads serve.pool/max_concurrent only for servers it starts.
    assert label not in _launcher_env_servers(_load(path))
    assert set(source["serve"]) == {"address"}, f"{where}: size the server in its env-server file"
    server_path = _env_server_file(path, source)
    assert server_path.exists(), f"{where}: no {_rel(server_path)}"
    server = _load(server_path)
    bind = TCP.fullmatch(server["serve"].get("address") or "")
    assert bind and bind.group(2) == port and bind.group(1) in {"0.0.0.0", "*", host}, \
        f"{_rel(server_path)}: bind tcp://0.0.0.0:{port}"
    # The orchestrator builds the prompts from its copy, the server runs the episodes from its own: one
    # config, but for the task GPUs, which are the env host's (the orchestrator's copy lists none).
    ours, theirs = copy.deepcopy(source["env"]), copy.deepcopy(server["env"])
    ours["taskset"]["gpu_ids"] = theirs["taskset"]["gpu_ids"] = []
    assert vf.resolve_env_config(ours).model_dump() == vf.resolve_env_config(theirs).model_dump(), \
        f"{where}: env differs from {_rel(server_path)}"


@pytest.mark.parametrize("path", MULTI_HOST, ids=_rel)
def test_remote_sources_have_their_own_servers_and_task_gpus(path):
    addresses = [_address(source) for _, source in _sources(_load(path)) if _address(source)]
    assert len(set(addresses)) == len(addresses), "two sources on one env server"
    by_host: dict[str, set[int]] = {}
    for _, label, source in (case for case in REMOTE_CASES if case[0] == path):
        host = TCP.fullmatch(_address(source)).group(1)
        server = _load(_env_server_file(path, source))
        ids = [int(g) for g in vf.resolve_env_config(copy.deepcopy(server["env"])).taskset.gpu_ids]
        assert len(set(ids)) == len(ids) and all(g >= 0 for g in ids), f"{label}: GPU ids {ids}"
        assert not set(ids) & by_host.get(host, set()), f"{label}: {host}'s GPUs {ids} on two servers"
        by_host.setdefault(host, set()).update(ids)


@pytest.mark.parametrize("path", MULTI_HOST, ids=_rel)
def test_remote_env_servers_reach_the_model(path):
    """The env server makes the model calls, at the orchestrator's client base_url: not a loopback."""
    client = _load(path)["orchestrator"].get("model", {}).get("client", {})
    host = urlsplit(client.get("base_url", "http://localhost:8000/v1")).hostname
    assert host not in LOCAL_HOSTS, "set [orchestrator.model.client] base_url as the env hosts reach it"


@pytest.mark.parametrize("path", BY_KIND["env-server"], ids=_rel)
def test_env_server_files_are_env_server_configs_of_a_remote_source(path):
    data = _load(path)
    # prime-rl's EnvServerConfig (configs/env_server.py) forbids other keys; `serve` is verifiers'.
    assert set(data) <= {"env", "serve", "log", "output_dir"}
    assert TCP.fullmatch(vf.ServeConfig.model_validate(data["serve"]).address or "")
    users = [(p, label) for p, label, source in REMOTE_CASES if _env_server_file(p, source) == path]
    assert len(users) == 1, f"{_rel(path)}: served to {users}, want exactly one remote source"


def _hosted(path: Path) -> list[tuple[str, dict, dict]]:
    """(label, serve, env) of every env server a config sizes: the launcher-started ones of an rl config (the
    remote ones are sized in their env-server files), or an env-server file's own."""
    data = _load(path)
    if _kind(data) == "env-server":
        return [("serve", data["serve"], data["env"])]
    return [(label, source.get("serve", {}), source["env"]) for label, source in _sources(data)
            if _address(source) is None]


def _single_worker(serve: dict) -> bool:
    pool = serve.get("pool", {})
    if pool.get("type") == "static":
        return pool.get("num_workers", 4) == 1
    return pool.get("max_workers") == 1


@pytest.mark.parametrize("path", BY_KIND["rl"] + BY_KIND["env-server"], ids=_rel)
def test_env_servers_are_sized_for_air_pools(path):
    """air's sandbox pool and GPU inventory live in each env-server worker: one worker per source keeps GPUs
    exclusive and max_sandboxes meaningful; and an episode needs its sandbox plus a scoring sandbox."""
    for label, serve, env_section in _hosted(path):
        env = vf.resolve_env_config(copy.deepcopy(env_section))
        assert _single_worker(serve), f"{label}: set serve.pool to one worker"
        max_concurrent = serve.get("max_concurrent")
        assert max_concurrent is not None and 2 * max_concurrent <= env.taskset.max_sandboxes, \
            f"{label}: serve.max_concurrent must be at most max_sandboxes / 2"


@pytest.mark.parametrize("path", BY_KIND["orchestrator"], ids=_rel)
def test_an_orchestrator_configs_env_server_has_room_for_its_rollouts(path):
    """An env server started by hand for an orchestrator config serves up to max_inflight rollouts at once, each
    needing its sandbox and, to be scored, a second: with fewer, every final evaluation waits out the lease timeout
    (seen: four rollouts in four sandboxes, each scorer waiting, the run stalled)."""
    data = _load(path)
    inflight = data["concurrency"]["max_inflight"]
    for label, source in _sources(data):
        env = vf.resolve_env_config(copy.deepcopy(source["env"]))
        assert 2 * inflight <= env.taskset.max_sandboxes, f"{label}: max_sandboxes < 2 x max_inflight ({inflight})"


def _commands(text: str) -> list[str]:
    """Shell commands of a README or a TOML header, continuation lines (also commented ones) joined."""
    return re.sub(r"\\\n[#\s]*", " ", text).splitlines()


DOCS = [CONFIGS / "mlgym" / "rl_debug.toml", CONFIGS / "mlgym" / "README.md", CONFIGS.parent / "README.md",
        *sorted((CONFIGS.parent / "docs").glob("*.md"))]


def test_a_run_without_the_launchers_inference_sends_weight_updates_to_the_engine():
    """`inference` serves a router on server.port (8000) and vLLM on backend_port = server.port + 100
    (InferenceConfig.auto_setup_backend_port); admin calls must bypass the router (docs/inference.md), and
    RLConfig.auto_setup_inference_client points them at the engine only when the launcher starts inference."""
    runs = [line for doc in DOCS for line in _commands(doc.read_text())
            if re.search(r"\brl @ ", line) and "--no-inference" in line]
    assert runs
    for line in runs:
        assert "--orchestrator.model.client.admin-base-url http://localhost:8100/v1" in line, line


def test_evals_in_prime_rls_environment_use_the_v1_cli():
    """prime-rl's verifiers (submodule a60a606) installs the v1 eval CLI as `eval`; its `vf-eval` is the old
    pre-v1 CLI, which cannot read an `@ eval.toml`."""
    for doc in DOCS + [CONFIGS / "mlgym" / "eval.toml"]:
        for line in _commands(doc.read_text()):
            assert not re.search(r"uv run( --no-sync)? vf-eval", line), f"{doc.name}: {line}"


@pytest.mark.parametrize("path", BY_KIND["rl"] + BY_KIND["orchestrator"], ids=_rel)
def test_batches_hold_whole_groups(path):
    orchestrator = _orchestrator(_load(path))
    group_size = orchestrator.get("group_size", 1)
    assert group_size > 1, "group_size 1 gives every rollout zero advantage"
    assert orchestrator["batch_size"] % group_size == 0
    for source in orchestrator["train"]["source"]:
        assert orchestrator["batch_size"] % source.get("group_size", group_size) == 0
    max_inflight = orchestrator.get("concurrency", {}).get("max_inflight")
    assert max_inflight is None or max_inflight >= group_size


def _budget_cases():
    cases = []
    for path in BY_KIND["rl"] + BY_KIND["orchestrator"]:
        data = _load(path)
        orchestrator = _orchestrator(data)
        for label, source in _sources(data):
            split = "eval" if label.startswith("eval") else "train"
            shared = (orchestrator.get(split) or {}).get("sampling", {})
            max_tokens = source.get("sampling", {}).get("max_completion_tokens",
                                                        shared.get("max_completion_tokens"))
            cases.append((path, label, source["env"], max_tokens, _seq_len(data)))
    rl_seq_len = _seq_len(_load(CONFIGS / "mlgym" / "rl.toml"))
    for path in BY_KIND["vf-eval"]:
        data = _load(path)  # evaluated against the context the RL run trains with
        cases.append((path, "env", data["env"], data.get("sampling", {}).get("max_tokens"), rl_seq_len))
    return cases


BUDGET_CASES = _budget_cases()


@pytest.mark.parametrize(("path", "label", "env", "max_tokens", "seq_len"), BUDGET_CASES,
                         ids=[f"{_rel(c[0])}:{c[1]}" for c in BUDGET_CASES])
def test_a_whole_episode_fits_in_seq_len(path, label, env, max_tokens, seq_len):
    assert max_tokens, f"{_rel(path)} {label}: set a per-turn token limit, or one reply can fill the context"
    config = vf.resolve_env_config(copy.deepcopy(env))
    ts = config.taskset
    per_turn = _per_turn_tokens(max_tokens, ts.observation_chars)
    for action_format in ("text", "tools"):
        needed = _prompt_tokens(config, action_format) + ts.max_turns * per_turn
        assert needed <= seq_len, (f"{_rel(path)} {label} ({action_format}): {ts.max_turns} turns x {per_turn} "
                                   f"tokens + prompt = {needed} > seq_len {seq_len}")
    if config.agent.max_total_tokens is not None:
        assert config.agent.max_total_tokens + per_turn <= seq_len


@pytest.mark.parametrize(("path", "label", "env"), ENV_CASES,
                         ids=[f"{_rel(p)}:{lab}" for p, lab, _ in ENV_CASES])
def test_the_episode_deadline_is_only_a_backstop(path, label, env):
    """verifiers drops the whole trace when `env.timeout.episode` expires, so it must outlast air's own limit:
    max_seconds is checked between turns, and the last command may still run a full training timeout."""
    config = vf.resolve_env_config(copy.deepcopy(env))
    ts = config.taskset
    longest_command = max(min(load_task(ref, ts.mlgym_root).timeouts.training, ts.command_timeout or math.inf)
                          for ref in ts.tasks)
    assert config.timeout.episode is not None
    assert config.timeout.episode >= ts.max_seconds + longest_command, f"{_rel(path)} {label}"


@pytest.mark.parametrize("path", BY_KIND["rl"], ids=_rel)
def test_inference_context_covers_seq_len(path):
    data = _load(path)
    max_model_len = data.get("inference", {}).get("vllm", {}).get("max_model_len")
    assert max_model_len is None or max_model_len >= _seq_len(data)


# Tool calls. vLLM's tool-call parser of each model family shipped, as prime-rl 559b447 names it for the family
# (packages/prime-rl-configs/src/prime_rl/utils/parsers.py, TOOL_CALL_PARSER_PATTERNS: Qwen3, but Coder and 3.5+,
# write hermes-style <tool_call> JSON). prime-rl's "auto" finds it by the model's hub name; a fine-tuned
# checkpoint's path has none, so the configs set it.
FAMILY_TOOL_PARSERS = [(re.compile(r"^Qwen/Qwen3-(?!Coder)"), "hermes")]


@pytest.mark.parametrize("path", WITH_INFERENCE, ids=_rel)
def test_vllm_parses_the_model_familys_tool_calls(path):
    data = _load(path)
    model = data["model"]["name"]
    expected = [parser for pattern, parser in FAMILY_TOOL_PARSERS if pattern.search(model)]
    assert expected, f"{_rel(path)}: which tool-call parser does {model} need? (add its family above)"
    assert data["inference"]["vllm"].get("tool_call_parser") == expected[0]


def _renderer_tables() -> list[tuple[Path, dict]]:
    found = []
    for path in BY_KIND["rl"] + BY_KIND["sft"] + BY_KIND["orchestrator"]:
        data = _load(path)
        found.append((path, data["orchestrator"]["renderer"] if "orchestrator" in data else data["renderer"]))
    return found


@pytest.mark.parametrize(("path", "table"), _renderer_tables(), ids=[_rel(p) for p, _ in _renderer_tables()])
def test_the_renderer_validates_and_reads_tool_calls(path, table):
    """prime-rl types `renderer` as renderers' RendererConfig: a name it lacks, or a field the renderer does not
    take, fails there. The model families' renderers parse their tool calls themselves; the default renderer
    (apply_chat_template) needs its `tool_parser` named, or an env with tools fails at rollout time."""
    from pydantic import TypeAdapter
    from renderers import DefaultRendererConfig, RendererConfig

    config = TypeAdapter(RendererConfig).validate_python(table)
    assert config.name != "auto"
    if isinstance(config, DefaultRendererConfig) and _kind(_load(path)) == "orchestrator":
        # The local model's chat template renders no tools (`air serve model` refuses them): text episodes only.
        for label, source in _sources(_load(path)):
            ts = vf.resolve_env_config(copy.deepcopy(source["env"])).taskset
            formats = {ts.action_format or load_task(ref, ts.mlgym_root).action_format for ref in ts.tasks}
            assert formats == {"text"}, f"{_rel(path)} {label}: {formats}"
    elif isinstance(config, DefaultRendererConfig):
        assert config.tool_parser, f"{_rel(path)}: set the default renderer's tool_parser"


@pytest.mark.parametrize("path", BY_KIND["rl"] + BY_KIND["orchestrator"], ids=_rel)
def test_renderer_is_explicit(path):
    """Explicit, so a fine-tuned checkpoint (not in renderers' model map) still validates under prime-rl."""
    assert _orchestrator(_load(path))["renderer"]["name"] != "auto"


@pytest.mark.parametrize("path", BY_KIND["orchestrator"], ids=_rel)
def test_an_orchestrator_configs_env_server_command_gives_its_taskset(path):
    """An orchestrator config alone drives an env server started by hand (its header's `air_mlgym.serve`
    command), which runs the episodes with its own options while the orchestrator renders the prompts from the
    config's copy: the command gives every taskset option the file sets, with the same value."""
    import shlex

    (line,) = [c for c in _commands(path.read_text()) if "air_mlgym.serve" in c]
    words = shlex.split(line.replace("#", " "))
    given = {w.removeprefix("--env.taskset.").replace("-", "_"): json.loads(v)
             for w, v in zip(words, words[1:]) if w.startswith("--env.taskset.")}
    ((_, source),) = _sources(_load(path))
    expected = {k: v for k, v in source["env"]["taskset"].items() if k != "id"}
    assert given == expected
    assert _address(source) in words  # where the orchestrator finds it


def test_sft_config_trains_what_rl_trains_on_whole_episodes():
    sft = _load(CONFIGS / "mlgym" / "sft.toml")
    rl = _load(CONFIGS / "mlgym" / "rl.toml")
    assert sft["data"].get("type", "sft") == "sft"
    assert sft["data"]["seq_len"] >= _seq_len(rl)
    assert sft["data"]["batch_size"] % sft["data"].get("micro_batch_size", 1) == 0
    assert sft["model"]["name"] == rl["model"]["name"]
    assert sft["renderer"]["name"] == rl["orchestrator"]["renderer"]["name"]
    assert sft["data"].get("loss_mask", {}).get("assistant", True) is True


def test_vf_eval_config_resolves_whole():
    from verifiers.v1.configs.cli.eval import EvalConfig

    for path in BY_KIND["vf-eval"]:
        config = EvalConfig.model_validate(_load(path))
        assert isinstance(config.env, AirEnvConfig)
        assert config.push is False, f"{_rel(path)}: keep local results local"
        assert config.max_concurrent * 2 <= config.env.taskset.max_sandboxes


def test_eval_config_covers_the_rl_eval_tasks():
    rl = _load(CONFIGS / "mlgym" / "rl.toml")
    evaluation = _load(CONFIGS / "mlgym" / "eval.toml")
    rl_eval_tasks = {t for s in rl["orchestrator"]["eval"]["source"] for t in s["env"]["taskset"]["tasks"]}
    assert set(evaluation["env"]["taskset"]["tasks"]) == rl_eval_tasks


def test_prime_rl_configs_name_one_checked_commit():
    prime_rl_configs = BY_KIND["rl"] + BY_KIND["sft"] + BY_KIND["env-server"] + BY_KIND["orchestrator"]
    commits = {p: set(COMMIT.findall(p.read_text())) for p in prime_rl_configs}
    assert all(len(found) == 1 for found in commits.values()), {_rel(p): c for p, c in commits.items()}
    assert len(set.union(*commits.values())) == 1


def test_a_second_config_file_replaces_a_source_list_and_an_index_flag_is_refused(tmp_path):
    """What configs/mlgym/README.md tells prime-rl users about `rl @ rl.toml @ mine.toml`, held to the library
    that parses it (prime-pydantic-config, as prime-rl's `cli` calls it): tables merge, lists are replaced."""
    from pydantic_config import BaseConfig, ConfigFileError, cli

    class Source(BaseConfig):
        name: str
        ratio: float = 1.0

    class Train(BaseConfig):
        source: list[Source] = []
        seed: int = 0

    class Orchestrator(BaseConfig):
        train: Train = Train()

    class Run(BaseConfig):
        orchestrator: Orchestrator = Orchestrator()

    sources = [s["name"] for s in _load(CONFIGS / "mlgym" / "rl.toml")["orchestrator"]["train"]["source"]]
    assert len(sources) > 1
    mine = tmp_path / "mine.toml"
    mine.write_text('[orchestrator.train]\nseed = 7\n[[orchestrator.train.source]]\nname = "mine"\n')
    shipped = tmp_path / "sources.toml"  # the shipped file's source list, in the shape parsed here
    shipped.write_text("".join(f'[[orchestrator.train.source]]\nname = "{name}"\n' for name in sources))
    merged = cli(Run, args=["@", str(shipped), "@", str(mine)])
    assert [s.name for s in merged.orchestrator.train.source] == ["mine"] and merged.orchestrator.train.seed == 7
    with pytest.raises(ConfigFileError):
        cli(Run, args=["@", str(shipped), "--orchestrator.train.source.0.ratio", "2"])


def test_drive_names_tasks_when_the_task_data_has_no_id():
    """prime-rl's pinned verifiers (a60a606) has no `TaskData.id`: `air_mlgym.serve drive` names each task by
    air's `task_ref`, which any verifiers keeps on the wire."""
    from air_mlgym.serve import failed_episode, summary_lines
    from air_mlgym.taskset import AirData, AirTask

    wire = vf.WireEpisode.model_validate({
        "env": {"id": "air-mlgym"}, "ok": True, "traces": [],
        "task": {"type": "AirTask", "data": {"task_ref": "prisoners-dilemma", "prompt": "p"}}})
    assert getattr(wire.task.data, "id", None) is None
    failed = failed_episode(AirTask(AirData(task_ref="regression-rmse", prompt="p")), RuntimeError("gone"))
    assert summary_lines([wire, failed]) == ["prisoners-dilemma: 1 rollouts, 1 failed, mean reward nan",
                                             "regression-rmse: 1 rollouts, 1 failed, mean reward nan"]
