"""`air doctor`: what this machine has, what is missing, and the command that fixes each gap."""

from __future__ import annotations

import dataclasses
import shutil

import typer
from rich.table import Table

from air.cli.app import JsonFlag, app, print_json, show_table
from air.checks import Check
from air.cli.images import sandbox_fusion_languages
from air.secrets import redact_text, redact_url




def run_checks() -> list[Check]:
    """Docker (client, daemon, storage, runtimes), GPUs and the NVIDIA runtime, every recipe's image, how leases
    start fresh here (cells or a container each), SandboxFusion's languages."""
    from air.sandbox.spec import PoolConfig

    backend = PoolConfig().backend
    if backend == "kubernetes":  # sandboxes are pods: the cluster's rows, no Docker on this machine needed
        rows = [Check("sandbox backend", True, "kubernetes (PoolConfig.backend; AIR_BACKEND)", required=False),
                _cache_check(), *_kubernetes_checks()]
    elif backend == "enroot":  # enroot containers of this user: the node's rows, no Docker needed (docs/hpc.md)
        from air.sandbox.enroot.probe import probe

        rows = [_cache_check(), *probe()]
    else:
        rows = [_cache_check(), *_docker_checks()]
    # Every row as printed holds no secret, whoever wrote its text (an SDK's error quotes DOCKER_HOST whole).
    return [dataclasses.replace(row, detail=redact_text(row.detail), fix=redact_text(row.fix)) for row in rows]


def _cache_check() -> Check:
    """air's cache folder, written to: every run keeps things there (hidden draws, the baseline's submission, the
    snapshot key), and one that cannot be written is a run's exit 2."""
    from air.errors import UsageError
    from air.paths import writable_cache_dir

    try:
        path = writable_cache_dir()
    except UsageError as exc:
        return Check("cache folder", False, str(exc), "export AIR_CACHE_DIR=<a folder air can write>")
    return Check("cache folder", True, f"{path} (writable)", required=False)


def _docker_checks() -> list[Check]:
    import docker

    from air.errors import DockerUnavailable
    from air.images import build_command, image_ref, load_recipes
    from air.sandbox.docker.docker_api import connect, docker_host

    checks = [Check("sandbox backend", True, "docker (PoolConfig.backend; AIR_BACKEND=kubernetes for a cluster)",
                    required=False),
              Check("docker client", True,
                    f"docker SDK {docker.__version__}; CLI {'found' if shutil.which('docker') else 'not found'}",
                    required=False)]
    try:
        client = connect(timeout=15)
    except DockerUnavailable as exc:
        checks.append(Check("docker daemon", False, str(exc), "scripts/ensure-docker.sh"))
        return checks
    try:
        info, version = client.info(), client.version()
    except Exception as exc:  # noqa: BLE001 - it answered a ping: which calls it no longer answers says what it is
        checks.append(_wedged(client, exc))
        return checks
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    checks += [
        Check("docker daemon", True, f"{version.get('Version')} at {redact_url(docker_host())} "
              f"(API {version.get('ApiVersion')}, cgroup v{info.get('CgroupVersion', '?')})"),
        _engine_check(version),
        Check("live-restore", bool(info.get("LiveRestoreEnabled")),
              "on: a restart of dockerd keeps every sandbox, and its episode, running" if info.get(
                  "LiveRestoreEnabled") else "off: a restart of dockerd ends every sandbox and its episode",
              "" if info.get("LiveRestoreEnabled") else 'set "live-restore": true in /etc/docker/daemon.json and '
              "restart dockerd", required=False),
        Check("storage driver", True, str(info.get("Driver")), required=False),
        Check("runtimes", True, ", ".join(runtimes) or "none", required=False),
        _runtime_check(runtimes),
    ]
    checks += _gpu_checks(client, info)
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
    return checks + _isolation_checks(info) + _sandbox_fusion_checks(client)


def _runtime_check(runtimes: list[str]) -> Check:
    """The runtime sandboxes run under (AIR_DOCKER_RUNTIME), and whether the daemon has it."""
    from air import variables

    runtime = variables.value("AIR_DOCKER_RUNTIME")
    if runtime is None:
        # runc leaves some host-wide tables shared (SECURITY.md: the TCP port table, inode numbers, the rename cookie,
        # sockstat): where a task's hidden data is fixed, a leak is worth something at the next lease (issue 86)
        advice = ("for a task whose hidden data is fixed (Harbor's tests, MLE-bench's answers): "
                  "AIR_DOCKER_RUNTIME=runsc, a kernel of each sandbox's own, its sandboxes made ahead of leases "
                  "(docs/gvisor.md)")
        return Check("sandbox runtime", True, "the daemon's default (runc: the host's kernel, some of whose tables "
                     "every sandbox shares, SECURITY.md)",
                     advice if "runsc" in runtimes else "scripts/gvisor-docker.sh adds gVisor's runsc: " + advice,
                     required=False)
    if runtime not in runtimes:
        return Check("sandbox runtime", False, f"AIR_DOCKER_RUNTIME={runtime}, which the daemon does not have",
                     "scripts/gvisor-docker.sh adds runsc" if runtime == "runsc" else
                     f"add {runtime} to /etc/docker/daemon.json's runtimes")
    return Check("sandbox runtime", True, f"{runtime} (AIR_DOCKER_RUNTIME): a kernel of each sandbox's own, no cells "
                 "(each sandbox used once), no page-cache pins (docs/gvisor.md)", required=False)


def _gpu_checks(client, info: dict) -> list[Check]:
    """The host's GPUs, and the way air passes them into sandboxes (gpus.py), with why each other way does not."""
    import socket

    from air import variables
    from air.sandbox import gpus
    from air.sandbox.gpus import detect_gpus
    from air.sandbox.docker.docker_api import docker_host

    found = detect_gpus()
    rows = [Check("GPUs", True, f"{len(found)} visible ({', '.join(found)})" if found else "none visible "
                  "(CPU-only tasks still run)", required=False)]
    if not found:
        return rows
    try:
        local = info.get("Name") == socket.gethostname() and not docker_host().startswith(("tcp:", "ssh:", "http"))
        access = gpus.choose(info, local=local, gpu_ids=tuple(found), force=variables.value("AIR_GPU_ACCESS"))
    except Exception as exc:  # noqa: BLE001 - a check reports, it does not stop the others
        return rows + [Check("GPU access", False, f"could not be chosen: {str(exc).splitlines()[0]}")]
    others = "; ".join(f"{way}: {why}" for way, why in access.why_not.items())
    if access.way is None:
        return rows + [Check("GPU access", False, f"no way to pass a GPU into a sandbox ({others})",
                             "install nvidia-container-toolkit, or turn on Docker's CDI feature and write a spec "
                             "(`python3 air/sandbox/gpus.py cdi-spec /etc/cdi/air-nvidia.json`), or use a daemon "
                             "on this machine (device nodes); docs/gpu.md")]
    return rows + [Check("GPU access", True, f"{access.way}" + (f" (not: {others})" if others else ""),
                         required=False)]


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check Docker, images and GPUs, and say how to fix what is missing.

    Example: air doctor --json
    """
    checks = run_checks()
    if as_json:
        print_json([c.__dict__ for c in checks])
    else:
        table = Table(show_header=True, header_style="bold")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for c in checks:
            status = "[green]ok[/]" if c.ok else ("[red]missing[/]" if c.required else "[yellow]optional[/]")
            table.add_row(c.name, status, c.detail, c.fix)
        show_table(table)  # in a pipe or a log, each row whole (a folded one splits what it quotes)
    if any(not c.ok and c.required for c in checks):
        raise typer.Exit(3)


KNOWN_DEADLOCK = "20.10."
"""Docker 20.10 (Debian 12's docker.io): libnetwork's lock-order deadlock (moby/moby#46661, fixed after 20.10 by
moby PR #42545) wedged the daemon after 25 minutes of several air processes at once; it is past its end of life."""
SUPPORTED_MAJOR = 25
"""Engines before 25.0 are past Docker's end of life."""


def _engine_check(version: dict) -> Check:
    """The engine's version, and whether it is one with a known deadlock or past its end of life."""
    number = str(version.get("Version", "?"))
    parts = {c.get("Name"): c.get("Version") for c in version.get("Components") or []}
    detail = f"Docker {number}, containerd {parts.get('containerd', '?')}, runc {parts.get('runc', '?')}"
    fix = ("stop it, then scripts/ensure-docker.sh installs Debian 13's docker.io 26.1 (on Debian 12), or install a "
           "current Docker Engine")
    if number.startswith(KNOWN_DEADLOCK):
        return Check("engine", False, f"{detail}: deadlocks under several air processes at once (moby/moby#46661) "
                     "and is past its end of life", fix)
    try:
        major = int(number.split(".")[0])
    except ValueError:
        major = SUPPORTED_MAJOR
    if major < SUPPORTED_MAJOR:
        return Check("engine", False, f"{detail}: past its end of life", fix, required=False)
    return Check("engine", True, detail, required=False)


def _wedged(client, exc: BaseException) -> Check:
    """The daemon answered a ping but not /info: if it still lists containers, its network controller is wedged
    (the libnetwork deadlock of moby/moby#46661: `docker ps` answers, `docker info` and `inspect` hang)."""
    from air.sandbox.docker.docker_api import docker_host

    try:
        client.api.containers(limit=1)
        lists = True
    except Exception:  # noqa: BLE001 - it answers nothing: busy or gone
        lists = False
    what = ("wedged: it lists containers but `/info` did not answer within 15 s (the lock-order deadlock of "
            "moby/moby#46661 in Docker 20.10 looks like this)" if lists else
            f"stuck: it answered a ping, then nothing within 15 s ({type(exc).__name__})")
    return Check("docker daemon", False, f"the daemon at {redact_url(docker_host())} is {what}",
                 "restart it (`kill -TERM $(pidof dockerd)`, then scripts/ensure-docker.sh): with live-restore, "
                 "running sandboxes and their episodes survive; `kill -USR1 $(pidof dockerd)` first writes its "
                 "goroutine stacks to /var/run/docker for a bug report")


def _isolation_checks(info: dict) -> list[Check]:
    """How each lease starts fresh on this host: in a new cell of a warm container, or (where the host forbids
    cells) in a container of its own; found by starting one sandbox, as a pool does."""
    import asyncio

    from air.errors import InfraError
    from air.images import image_ref
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec

    security = " ".join(info.get("SecurityOptions") or [])

    async def probe():
        config = PoolConfig(max_sandboxes=1, gpu_ids=[], sweep_dead_runs=False, lease_timeout=120)
        async with SandboxPool(config) as pool:
            async with pool.lease(SandboxSpec(image=image_ref("base"), task="doctor")) as sandbox:
                return sandbox.session.ready, config.apparmor, await pool.page_cache_pins()

    try:
        ready, apparmor, pins = asyncio.run(probe())
    except InfraError as exc:
        return [Check("isolation", False, f"no sandbox could start: {exc}", "air images build", required=False)]
    pinned = [Check("page cache", True, f"pinned: every page of an image's files held for all its sandboxes ("
                    f"{pin['name']}, {pin['scope']} scope: air/base holds {pin.get('files', '?')} files, "
                    f"{pin.get('bytes', 0) / 1e6:.0f} MB; each image costs its size in locked memory)", required=False)
              for pin in pins[:1]]
    if ready.cells:
        forks = [Check("forks", True, "a fork's branches share the snapshot's home: unpacked once, a read-only lower "
                       "layer of every branch's home, mapped to its agent uid" if not ready.lowers else
                       f"a fork's branches each copy the snapshot's files (no shared lower layer: {ready.lowers})",
                       "" if not ready.lowers else "Linux 6.3 or later (idmapped mounts of tmpfs) shares them",
                       required=False)]
        return [Check("isolation", True, "cells: every lease, evaluation and request in new namespaces, home and "
                      "temp dirs of a warm container, under an agent uid of the sandbox's own", required=False),
                *forks, *pinned]
    fix = ""
    if "apparmor" in security and not apparmor:
        fix = ("Docker's AppArmor profile forbids the cells' mounts: AIR_APPARMOR=unconfined gives cells "
               "(SECURITY.md says what that trades)")
    elif "rootless" in security:
        fix = "rootless Docker cannot mount a cell's /proc: use a rootful daemon for cells"
    return [Check("isolation", True, f"a new container per lease (slower; same guarantees): {ready.why_not}",
                  fix, required=False), *pinned]


def _kubernetes_checks() -> list[Check]:
    """The cluster's rows (air/sandbox/kubernetes/probe.py)."""
    import asyncio

    from air.sandbox.kubernetes.config import KubernetesConfig
    from air.sandbox.kubernetes.probe import probe

    return asyncio.run(probe(KubernetesConfig()))


def _sandbox_fusion_checks(client) -> list:
    """One row per built air image: the SandboxFusion languages it serves (the daemon answered the checks above)."""
    from air.images import image_ref, list_images
    from air.services.sandbox_fusion.recipes import SERVE_TOOLCHAIN, TOOLCHAIN_IMAGE

    try:
        rows = [r for r in list_images(client) if r["current"]]
    except Exception:  # noqa: BLE001 - the daemon check above already says why
        return []
    checks = []
    for row in rows:
        tag = image_ref(row["recipe"])
        languages = sandbox_fusion_languages(client, tag)
        if languages:
            checks.append(Check(f"sandbox-fusion on {tag}", True, ", ".join(languages), required=False))
    if not any(TOOLCHAIN_IMAGE in r["tags"] for r in rows):
        checks.append(Check(f"sandbox-fusion on {TOOLCHAIN_IMAGE}", False, "not built (compiled languages: cpp, "
                            "java, go, rust, ...)", SERVE_TOOLCHAIN, required=False))
    return checks
