"""tasks/gpu-cnn-speedrun through air's real scoring path on a host without a GPU: the task as it would run on one,
but in the CPU image (torch for CPU), without GPUs and on one CPU (Docker refuses the task's 4 on a 2-core host), its
baseline shortened. The agent's workspace imports the task's read-only data/ (model.py, shapes.py), validate draws the
test seed in the scoring cell and scores the baseline beside the submission on it, and a model.pt that would run code
is the submission's failure with its reason."""

from __future__ import annotations

import pytest

from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]

QUICK = "python train.py --steps 5 --valid 100"
PAYLOAD = ("python -c \"import os, torch; torch.save({'config': {'width': 32, 'depth': 2}, 'state_dict': "
           "type('P', (), {'__reduce__': lambda s: (os.system, ('touch /tmp/ran',))})()}, 'model.pt')\"")


async def test_the_gpu_task_on_cpu_trains_validates_and_refuses_a_pickle_payload(pool, monkeypatch):
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "host")  # conftest pins the reference draw; this task draws per evaluation
    spec = load_task("gpu-cnn-speedrun")
    resources = spec.resources.model_copy(update={"gpus": 0, "cpus": 1.0, "memory_mb": 4096})
    spec = spec.replace(image="cpu", resources=resources, baseline=spec.baseline.model_copy(update={"command": QUICK}))
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        ran = await sandbox.session.run(QUICK, timeout=600)
        assert ran.exit_code == 0 and "wrote model.pt" in ran.stdout, (ran.stdout[-1000:], ran.stderr[-1000:])
        honest = await env.evaluate(sandbox)
        assert honest.status == "ok", honest.message
        assert set(honest.metrics) == {"accuracy", "gpu"} and honest.metrics["gpu"] == 0.0, honest.metrics
        assert honest.draw and set(honest.baseline_metrics) == {"accuracy", "gpu"}, honest
        ran = await sandbox.session.run(PAYLOAD, timeout=300)
        assert ran.exit_code == 0, ran.stderr[-1000:]
        hostile = await env.evaluate(sandbox)
        assert hostile.status == "invalid_submission" and "weights_only" in hostile.message, hostile
