"""`air doctor`: what this machine has, what is missing, and the command that fixes each gap."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import docker

from air.errors import DockerUnavailable
from air.sandbox.docker_api import connect, docker_host
from air.images import build_command, image_ref, load_recipes
from air.sandbox.claims import detect_gpus


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def run_checks() -> list[Check]:
    checks = [Check("docker client", True,
                    f"docker SDK {docker.__version__}; CLI {'found' if shutil.which('docker') else 'not found'}",
                    required=False)]
    try:
        client = connect(timeout=15)
    except DockerUnavailable as exc:
        checks.append(Check("docker daemon", False, str(exc), "scripts/ensure-docker.sh"))
        return checks
    info = client.info()
    version = client.version()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    checks += [
        Check("docker daemon", True, f"{version.get('Version')} at {docker_host()} "
              f"(API {version.get('ApiVersion')}, cgroup v{info.get('CgroupVersion', '?')})"),
        Check("storage driver", True, str(info.get("Driver")), required=False),
        Check("runtimes", True, ", ".join(runtimes) or "none", required=False),
    ]
    gpus = detect_gpus()
    nvidia = "nvidia" in runtimes or any("nvidia" in r for r in runtimes)
    checks.append(Check("GPUs", True, f"{len(gpus)} visible ({', '.join(gpus)})" if gpus else "none visible "
                        "(CPU-only tasks still run)", required=False))
    if gpus:
        checks.append(Check("NVIDIA container runtime", nvidia,
                            "present" if nvidia else "GPUs are visible but Docker has no nvidia runtime",
                            "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker`"
                            " and restart dockerd"))
    for name, recipe in sorted(load_recipes().items()):
        ref = image_ref(name)
        # A stack only some tasks need (jax, hf) or a GPU one is optional: its row says which tasks want it.
        required = recipe.default and not recipe.gpu
        what = "" if required else f" ({recipe.description.split(':')[0].split('. ')[0]})"
        try:
            image = client.images.get(ref)
            checks.append(Check(f"image {name}", True, f"{ref} ({image.short_id.split(':')[-1]}, "
                                f"{image.attrs['Size'] / 1e6:.0f} MB)", required=required))
        except docker.errors.ImageNotFound:
            checks.append(Check(f"image {name}", False, "not built" + what, build_command(recipe),
                                required=required))
    return checks
