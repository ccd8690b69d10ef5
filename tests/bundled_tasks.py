"""The bundled tasks as tests iterate them over conftest's pool, which lends no GPU (gpu_ids=[]): a task that asks for
a GPU (tasks/gpu-cnn-speedrun) is skipped with its reason, on any host, never a red test; its own tests are
tests/test_gpu_task.py (host torch) and the GPU node's check."""

from __future__ import annotations

import pytest

from air.tasks.registry import bundled_ids, load_task, why_not_here


def bundled_params(gpus: int = 0) -> list:
    """pytest.mark.parametrize values: each bundled task id; one that needs more GPUs than the test's pool lends
    (`gpus`) is marked skip, saying so."""
    params = []
    for ref in bundled_ids():
        if why_not_here(load_task(ref, draw="reference"), gpus):
            params.append(pytest.param(ref, marks=pytest.mark.skip(
                reason=f"{ref} needs a GPU and the test's pool lends {gpus}")))
        else:
            params.append(ref)
    return params


def bundled_without_gpus() -> list[str]:
    """The bundled tasks a pool without GPUs can run."""
    return [ref for ref in bundled_ids() if not why_not_here(load_task(ref, draw="reference"), 0)]


__all__ = ["bundled_params", "bundled_without_gpus"]
