"""Layer 1, the sandbox: containers, the agent's shell, warm pools, host-wide claims. It knows nothing about tasks or
RL; the layers above import from here, never from its modules.

    pool = SandboxPool(PoolConfig(max_sandboxes=16))        # a warm pool (several Docker hosts: `hosts=`)
    async with pool, pool.lease(SandboxSpec(image="air/cpu:latest", task="t")) as sandbox:
        result = await sandbox.session.run("python train.py", timeout=600)   # -> CommandResult
        await sandbox.session.run_untrusted(["python", "eval.py"])  # the warden's child: an unforgeable exit status
        blob = await sandbox.session.pack(["submission.csv"])   # the agent's files, with the agent's rights
    # released: reset (nothing of this rollout survives) or removed; a broken one never comes back

The interface: `Sandbox` and `Shell` (protocols, interface.py), `SandboxSpec`/`Resources` (what is asked for),
`PoolConfig`/`DockerHost`/`SandboxPool`, the results `CommandResult`/`ExecResult`, the errors `ArchiveTooLarge`/
`ArchiveUnreadable`/`ArchiveUnwritable` (plus air.errors: InfraError and its kind for everything that is
infrastructure), the layout inside every sandbox (layout.py), and the tools of the CLI and services: labels and
cleanup, Docker. Images are built by air.images; a sandbox needs only their reference.

Each backend (`PoolConfig.backend`) is a package of its own over the parts every backend shares, which lie here at
the top (the interface, base_sandbox.py and base_pool.py, the warden and its link, the spec, GPUs, pins): docker/
(the default), kubernetes/, enroot/. No backend imports another (tests/test_layers.py).
Names load on first use, so that importing a config class does not import the Docker SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from air.sandbox.layout import (
    AGENT_HOME,
    AGENT_UID,
    AGENT_USER,
    AIR_DIR,
    OUT_DIR,
    BASE_PATH,
    DATA,
    FIXED_MTIME,
    PRISTINE_HOME,
    SCRATCH_DIRS,
    WORKSPACE,
)

_LAZY = {
    # the interface
    "Sandbox": "interface", "Shell": "interface", "CommandResult": "interface", "ExecResult": "interface",
    "ArchiveTooLarge": "interface", "ArchiveUnreadable": "interface", "ArchiveUnwritable": "interface",
    "Resources": "spec", "SandboxSpec": "spec",
    "PoolConfig": "spec", "DockerHost": "spec", "SandboxPool": "base_pool", "PoolStats": "base_pool",
    # helpers of the layers above
    "make_tar": "base_sandbox", "gpu_env": "base_sandbox", "container_kwargs": "docker.container",
    "connect": "docker.docker_api", "Docker": "docker.docker_api",
    "list_air_containers": "docker.listing", "remove_containers": "docker.listing",
    "make_labels": "labels", "GPUS": "labels",
    "sweep_dead_runs": "docker.cleanup", "sweep_stale_claims": "docker.cleanup",
    "truncate_text": "output",
}

__all__ = [
    "AGENT_HOME", "AGENT_UID", "AGENT_USER", "AIR_DIR", "OUT_DIR", "BASE_PATH", "DATA", "FIXED_MTIME", "PRISTINE_HOME",
    "SCRATCH_DIRS", "WORKSPACE",
    "Sandbox", "Shell", "CommandResult", "ExecResult", "ArchiveTooLarge", "ArchiveUnreadable", "ArchiveUnwritable",
    "Resources", "SandboxSpec", "PoolConfig", "DockerHost", "SandboxPool", "PoolStats",
    "make_tar", "gpu_env", "container_kwargs", "connect", "Docker", "list_air_containers", "remove_containers",
    "make_labels", "GPUS", "sweep_dead_runs", "sweep_stale_claims", "truncate_text",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'air.sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"air.sandbox.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and editors: the same names, eagerly
    from air.sandbox.base_pool import PoolStats, SandboxPool
    from air.sandbox.base_sandbox import gpu_env, make_tar
    from air.sandbox.docker.cleanup import sweep_dead_runs, sweep_stale_claims
    from air.sandbox.docker.container import container_kwargs
    from air.sandbox.docker.docker_api import Docker, connect
    from air.sandbox.interface import (
        ArchiveTooLarge,
        ArchiveUnreadable,
        ArchiveUnwritable,
        CommandResult,
        ExecResult,
        Sandbox,
        Shell,
    )
    from air.sandbox.docker.listing import list_air_containers, remove_containers
    from air.sandbox.labels import GPUS, make_labels
    from air.sandbox.output import truncate_text
    from air.sandbox.spec import DockerHost, PoolConfig, Resources, SandboxSpec
