"""air's own directory (/srv/air) in memory, where a spec asks (SandboxSpec.air_dir_mb): a tmpfs of that size on
Docker and on a cluster, counted in the memory limit, and a key of its own. What it is for, that a cell's lookups
leave nothing to forget and the warden drops none, is tests/test_dentry_cache.py's (Docker)."""

from __future__ import annotations

from air.sandbox import SandboxSpec, container_kwargs
from air.sandbox.kubernetes import manifests
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.layout import AIR_DIR
from air.services.sandbox_fusion.service import AIR_DIR_MB, SandboxFusionService

ON_DISK = SandboxSpec(image="air/cpu:latest", task="t")
IN_MEMORY = ON_DISK.model_copy(update={"air_dir_mb": 64})


def docker_places(spec: SandboxSpec) -> tuple[list[str], dict[str, str]]:
    kwargs = container_kwargs(spec, run="r", role="agent", gpu_ids=())
    return [m["Target"] for m in kwargs["mounts"] if m["Type"] == "volume"], kwargs["tmpfs"]


def test_airs_directory_is_a_disk_volume_unless_the_spec_puts_it_in_memory():
    volumes, tmpfs = docker_places(ON_DISK)
    assert volumes == [AIR_DIR] and AIR_DIR not in tmpfs
    volumes, tmpfs = docker_places(IN_MEMORY)
    assert volumes == [] and tmpfs[AIR_DIR] == "rw,exec,nosuid,nodev,size=64m,mode=755"
    assert IN_MEMORY.memory_limit_mb == ON_DISK.memory_limit_mb + 64, "a full tmpfs never takes the processes' memory"
    assert IN_MEMORY.key != ON_DISK.key, "a sandbox of one is never leased for the other"


def test_a_clusters_pod_has_it_where_dockers_container_has_it():
    def air_volume(spec: SandboxSpec) -> dict:
        volumes, mounts = manifests.pod_volumes(spec, KubernetesConfig(), config_map="c", secret="s")
        (mount,) = [m for m in mounts if m["mountPath"] == AIR_DIR]
        return next(v for v in volumes if v["name"] == mount["name"])

    assert air_volume(ON_DISK)["emptyDir"] == {"sizeLimit": "4096Mi"}
    assert air_volume(IN_MEMORY)["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}


def test_a_sandbox_fusion_servers_sandboxes_have_it_in_memory():
    assert SandboxFusionService().spec.air_dir_mb == AIR_DIR_MB
