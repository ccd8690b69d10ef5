"""How a sandbox's GPUs reach it on a Docker host, by whichever way the host has (docs/gpu.md):

- "runtime": the NVIDIA container runtime (nvidia-container-toolkit), which Docker lists among its runtimes: a device
  request of driver "nvidia"; the toolkit adds the device nodes and the driver's files.
- "cdi": the daemon's CDI feature is on (Docker lists CDI spec directories) and a spec of kind `nvidia.com/gpu`
  names the GPU (nvidia-ctk's, or the one air writes from this machine's device nodes and driver files:
  `cdi_spec`): a device request of driver "cdi" for `nvidia.com/gpu=<id>`.
- "devices": neither: the GPU's device node and the driver's shared nodes passed as devices (the container's device
  cgroup then admits exactly those), and the driver's user-space files bound read-only under /usr/local/nvidia.
  The paths are this machine's, so only for a daemon on this machine.

The first the host has, in that order, unless AIR_GPU_ACCESS (PoolConfig.gpu_access) names one. In every way a
sandbox has only its own GPUs' nodes: another GPU's /dev/nvidiaN is neither in its /dev nor allowed by its device
cgroup, and nothing in it can make a node (no CAP_MKNOD for the agent or scoring; the warden's own is spent on the
cell's /dev, which copies the container's nodes). The driver's files stay the host's, read-only: /usr/local/nvidia
is where CUDA images look (their PATH and LD_LIBRARY_PATH name it), and air adds it to the image's own.

Standard library only: `python3 air/sandbox/gpus.py cdi-spec` runs on a GPU node before air is installed (the
set-up's daemon start, scripts/ensure-docker.sh).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

WAYS = ("runtime", "cdi", "devices")
DRIVER_DIR = "/usr/local/nvidia"
CDI_KIND = "nvidia.com/gpu"
CDI_FILE = "air-nvidia.json"
"""The spec air writes, in the daemon's first CDI directory (/etc/cdi by default)."""
DEV_DIR = Path("/dev")
"""Where this machine's device nodes are (tests point it at stand-in character devices)."""
DRIVER_SEARCH = (Path(DRIVER_DIR),)
"""Folders holding the driver's user space whole (lib64/, bin/), as on GKE-style nodes; else `ldconfig -p` finds
its libraries one by one."""
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
"""The driver's nodes every GPU process opens besides its GPU's own (nvidia-modeset is display only)."""
DRIVER_LIBRARIES = ("libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                    "libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
                    "libnvidia-opencl.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so")
"""The driver's compute and utility libraries (what the toolkit's `compute,utility` capabilities inject)."""
DRIVER_PROGRAMS = ("nvidia-smi", "nvidia-debugdump")


@dataclass(frozen=True)
class HostGpus:
    """What this machine has for GPUs: each GPU id's device node, the driver's shared nodes, and the driver's
    user-space files (a path in the sandbox -> the file or folder on this machine)."""

    nodes: dict[str, str] = field(default_factory=dict)
    shared: tuple[str, ...] = ()
    driver: dict[str, str] = field(default_factory=dict)

    def missing(self, gpu_ids: tuple[str, ...]) -> str | None:
        """Why these GPUs cannot be passed as device nodes, or None."""
        absent = [i for i in gpu_ids if i not in self.nodes]
        if absent:
            return f"no device node for GPU {', '.join(absent)} in {DEV_DIR}"
        if not any(Path(node).name == "nvidiactl" for node in self.shared):
            return f"no {DEV_DIR}/nvidiactl (the NVIDIA driver is not loaded)"
        if DRIVER_DIR not in self.driver and f"{DRIVER_DIR}/lib64/libcuda.so.1" not in self.driver:
            return "the driver's libcuda.so.1 was found neither in /usr/local/nvidia nor by ldconfig"
        return None


def detect_gpus() -> list[str]:
    """The GPU indices this process may hand out: nvidia-smi's, narrowed to those `CUDA_VISIBLE_DEVICES` names
    where it is set (by index or UUID, as CUDA reads it). Slurm's `--gres=gpu:N` sets it to the job's GPUs, in the
    numbering nvidia-smi shows the job (the node's without `ConstrainDevices`, the job's own with it): without it,
    every job sharing a node would hand out GPU 0. Empty without a GPU or driver, or where it names none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    rows = [[v.strip() for v in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [row[0] for row in rows]
    named = {g.strip() for g in given.split(",") if g.strip()}
    return [row[0] for row in rows if named.intersection(row)]


def read_host(gpu_ids: tuple[str, ...] | None = None) -> HostGpus:
    """This machine's GPU device nodes (by the driver's minor numbers), shared nodes and driver files."""
    minors = gpu_minors()
    nodes: dict[str, str] = {}
    for index, minor in minors.items() if minors else ((i, int(i)) for i in (gpu_ids or ()) if i.isdigit()):
        path = DEV_DIR / f"nvidia{minor}"
        if _is_char_device(path):
            nodes[index] = str(path)
    shared = tuple(str(DEV_DIR / n) for n in SHARED_NODES if _is_char_device(DEV_DIR / n))
    return HostGpus(nodes=nodes, shared=shared, driver=driver_files())


def _is_char_device(path: Path) -> bool:
    try:
        return path.is_char_device()
    except OSError:
        return False


def gpu_minors() -> dict[str, int]:
    """GPU index (nvidia-smi's, the id air hands out) -> the minor number of its /dev/nvidiaN, from the driver's
    /proc/driver/nvidia/gpus/<bus>/information; {} where either is missing (then index = minor is assumed)."""
    by_bus: dict[str, int] = {}
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        try:
            text = Path(info).read_text()
        except OSError:
            continue
        minor = re.search(r"Device Minor:\s*(\d+)", text)
        if minor:
            by_bus[_bus_id(Path(info).parent.name)] = int(minor.group(1))
    if not by_bus or shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    pairs = (line.split(",") for line in out.stdout.splitlines() if "," in line)
    return {index.strip(): by_bus[_bus_id(bus)] for index, bus in pairs if _bus_id(bus) in by_bus}


def _bus_id(text: str) -> str:
    """`00000000:18:00.0` (nvidia-smi) and `0000:18:00.0` (/proc) as one key."""
    parts = text.strip().lower().split(":")
    return ":".join([f"{int(parts[0], 16):x}", *parts[1:]]) if len(parts) == 3 else text.strip().lower()


def driver_files() -> dict[str, str]:
    """The driver's user space as read-only binds: a folder that holds it whole (/usr/local/nvidia), else each
    library `ldconfig -p` knows (at its soname, and libcuda also as libcuda.so) and each program on PATH."""
    for folder in DRIVER_SEARCH:
        if (folder / "lib64" / "libcuda.so.1").exists():
            return {DRIVER_DIR: str(folder)}
    files: dict[str, str] = {}
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    for line in listing.splitlines():
        match = re.match(r"\s*(\S+) \((.*)\) => (\S+)$", line)
        if not match or "64" not in match.group(2):  # 64-bit entries (x86-64, AArch64), not the 32-bit ones
            continue
        soname, path = match.group(1), match.group(3)
        if any(soname == lib or soname.startswith(lib + ".") for lib in DRIVER_LIBRARIES) and os.path.exists(path):
            files.setdefault(f"{DRIVER_DIR}/lib64/{soname}", os.path.realpath(path))
    if f"{DRIVER_DIR}/lib64/libcuda.so.1" in files:
        files.setdefault(f"{DRIVER_DIR}/lib64/libcuda.so", files[f"{DRIVER_DIR}/lib64/libcuda.so.1"])
    for program in DRIVER_PROGRAMS:
        found = shutil.which(program)
        if found:
            files[f"{DRIVER_DIR}/bin/{program}"] = os.path.realpath(found)
    return files


def cdi_spec(host: HostGpus) -> dict:
    """A CDI spec of kind nvidia.com/gpu for this machine: one device per GPU id (its node), and for all of them the
    shared nodes and the driver's files bound read-only. What nvidia-ctk would write, without its hooks: air adds
    /usr/local/nvidia to each sandbox's LD_LIBRARY_PATH and PATH itself."""
    devices = [{"name": index, "containerEdits": {"deviceNodes": [{"path": f"/dev/{Path(node).name}",
                                                                   "hostPath": node}]}}
               for index, node in sorted(host.nodes.items(), key=lambda kv: kv[0])]
    mounts = [{"hostPath": source, "containerPath": target, "options": ["ro", "nosuid", "nodev", "bind"]}
              for target, source in sorted(host.driver.items())]
    shared = [{"path": f"/dev/{Path(node).name}", "hostPath": node} for node in host.shared]
    return {"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": devices,
            "containerEdits": {"deviceNodes": shared, "mounts": mounts}}


@dataclass(frozen=True)
class GpuAccess:
    """The way this host passes GPUs to sandboxes (None: none works), and why each other way does not."""

    way: str | None
    why_not: dict[str, str]
    host: HostGpus | None = None

    def describe(self) -> str:
        others = "; ".join(f"{w}: {r}" for w, r in self.why_not.items())
        return f"{self.way} ({others})" if self.way and others else (self.way or f"none ({others})")

    def container_kwargs(self, gpu_ids: tuple[str, ...], image_env: dict[str, str]) -> dict:
        """Docker's `containers.run` arguments for these GPUs: the device request or nodes and binds, and the
        environment the driver's files need (added to the image's PATH and LD_LIBRARY_PATH, never replacing them)."""
        if self.way is None:
            raise GpuUnavailable(f"GPU {','.join(gpu_ids)} cannot be passed to a sandbox here: {self.describe()}")
        import docker.types  # here, not at the top: `gpus.py cdi-spec` runs before air's dependencies are installed

        env = sandbox_env(image_env, gpu_ids, self.way)
        if self.way == "runtime":
            return {"device_requests": [docker.types.DeviceRequest(driver="nvidia", device_ids=list(gpu_ids),
                                                                   capabilities=[["gpu", "compute", "utility"]])],
                    "environment": env}
        if self.way == "cdi":
            return {"device_requests": [docker.types.DeviceRequest(
                driver="cdi", device_ids=[f"{CDI_KIND}={i}" for i in gpu_ids])], "environment": env}
        assert self.host is not None
        nodes = [self.host.nodes[i] for i in gpu_ids] + list(self.host.shared)
        return {"devices": [f"{node}:/dev/{Path(node).name}:rwm" for node in nodes],
                "mounts": [docker.types.Mount(target=target, source=source, type="bind", read_only=True)
                           for target, source in sorted(self.host.driver.items())],
                "environment": env}


class GpuUnavailable(RuntimeError):
    """No way to pass a GPU into a sandbox on this host (the pool raises it as an infrastructure error)."""


def sandbox_env(base: dict[str, str], gpu_ids: tuple[str, ...], way: str | None) -> dict[str, str]:
    """The variables a sandbox's processes need for its GPUs, over `base` (the image's environment, or the agent
    shell's): which GPUs (host ids for the toolkit; CUDA renumbers them from 0 inside), and where the driver's files
    were bound (cdi, devices), added to `base`'s PATH and LD_LIBRARY_PATH. {} without GPUs."""
    if not gpu_ids:
        return {}
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(gpu_ids),
           "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpu_ids)))}
    if way in ("cdi", "devices"):
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        env["PATH"] = _joined(base.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              f"{DRIVER_DIR}/bin")
        env["LD_LIBRARY_PATH"] = _joined(base.get("LD_LIBRARY_PATH", ""), f"{DRIVER_DIR}/lib64")
    return env


def _joined(existing: str, extra: str) -> str:
    parts = [p for p in existing.split(":") if p]
    return ":".join(parts + ([extra] if extra not in parts else []))


def choose(info: dict, *, local: bool, gpu_ids: tuple[str, ...], force: str = "auto",
           host: HostGpus | None = None) -> GpuAccess:
    """The way to pass `gpu_ids` on a daemon that reports `info` (`docker info`), `local` if it runs on this
    machine; `force`: one of WAYS, or "auto" for the first that works."""
    why_not: dict[str, str] = {}
    runtimes = info.get("Runtimes") or {}
    hook = local and shutil.which("nvidia-container-runtime-hook") is not None
    if not hook and not any("nvidia" in name for name in runtimes):
        why_not["runtime"] = "Docker lists no nvidia runtime (the NVIDIA container toolkit is not installed)"
    spec_dirs = info.get("CDISpecDirs") or []
    if not spec_dirs:
        why_not["cdi"] = "the daemon's CDI feature is off (no CDI spec directories in `docker info`)"
    elif local:
        named = cdi_devices(spec_dirs)
        absent = [i for i in gpu_ids if i not in named]
        if absent:
            why_not["cdi"] = (f"no CDI spec of kind {CDI_KIND} names GPU {', '.join(absent)} in "
                              f"{', '.join(spec_dirs)}")
    if host is None and local:
        host = read_host(gpu_ids)
    if not local:
        why_not["devices"] = "the daemon is on another machine (device nodes and driver files are its own)"
    elif host is not None and (missing := host.missing(gpu_ids)):
        why_not["devices"] = missing
    if force != "auto":
        if force not in WAYS:
            raise ValueError(f"unknown GPU access {force!r}: one of auto, {', '.join(WAYS)}")
        if force in why_not:
            return GpuAccess(None, {force: f"{why_not[force]} (AIR_GPU_ACCESS={force})"}, host)
        return GpuAccess(force, {w: "not chosen (AIR_GPU_ACCESS)" for w in WAYS if w != force}, host)
    way = next((w for w in WAYS if w not in why_not), None)
    return GpuAccess(way, why_not, host)


def cdi_devices(spec_dirs: list[str]) -> set[str]:
    """The device names of kind nvidia.com/gpu in the CDI specs of these folders (JSON or YAML: YAML is read only
    where PyYAML is installed)."""
    names: set[str] = set()
    for folder in spec_dirs:
        for path in sorted(glob.glob(os.path.join(folder, "*.json")) + glob.glob(os.path.join(folder, "*.yaml"))
                           + glob.glob(os.path.join(folder, "*.yml"))):
            try:
                text = Path(path).read_text()[:1 << 20]
                spec = json.loads(text) if path.endswith(".json") else _yaml(text)
            except (OSError, ValueError):
                continue
            if isinstance(spec, dict) and spec.get("kind") == CDI_KIND:
                names.update(str(d.get("name")) for d in spec.get("devices") or () if isinstance(d, dict))
    return names


def _yaml(text: str):
    try:
        import yaml
    except ImportError:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


def _main(argv: list[str]) -> int:
    """`gpus.py cdi-spec [FILE]`: this machine's spec (to FILE, else stdout); exit 1 without a GPU."""
    if not argv or argv[0] != "cdi-spec" or len(argv) > 2:
        print("usage: python3 air/sandbox/gpus.py cdi-spec [FILE]", file=sys.stderr)
        return 2
    host = read_host()
    if not host.nodes:
        print(f"gpus: no NVIDIA GPU device node in {DEV_DIR}: no CDI spec written", file=sys.stderr)
        return 1
    text = json.dumps(cdi_spec(host), indent=1) + "\n"
    if len(argv) == 2:
        Path(argv[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[1]).write_text(text)
        print(f"gpus: CDI spec for GPU {', '.join(sorted(host.nodes))} written to {argv[1]}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
