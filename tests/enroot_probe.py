"""The attack probes of tests/test_enroot.py, run as the non-root user that owns the enroot containers (a program of its
own: the test process may be root). Prints one JSON object: what the probes saw in a cell of an enroot sandbox, as the
agent, and (the positive control) in a plain `enroot start` of the same image with enroot's own mounts.

    python3 tests/enroot_probe.py IMAGE PIDS MEMORY_MB
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

INTERFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"
PROCESSES = "ls /proc | grep -c '^[0-9]'"
HOST_PID = "test -e /proc/{pid} && echo seen || echo unseen"
FORKS = """python3 - <<'EOF'
import os, time
made = 0
for _ in range({most}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made)
EOF"""
HOG = """python3 - <<'EOF'
chunks = []
for _ in range({mb} // 16):
    chunks.append(bytearray(16 << 20))
print("allocated", len(chunks) * 16, "MB")
EOF"""


async def in_cell(image: str, pids: int, memory_mb: int) -> dict:
    from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec

    spec = SandboxSpec(image=image, task="probe", resources=Resources(pids=pids, memory_mb=memory_mb),
                       workspace_mb=64, tmp_mb=16)
    out: dict = {}
    async with SandboxPool(PoolConfig(backend="enroot")) as pool:
        async with pool.lease(spec) as sandbox:
            run = sandbox.session.run
            out["uid"] = (await run("id -u")).stdout.strip()
            out["interfaces"] = (await run(INTERFACES)).stdout.split()
            out["processes"] = int((await run(PROCESSES)).stdout.strip())
            out["host_pid"] = (await run(HOST_PID.format(pid=os.getpid()))).stdout.strip()
            out["forks"] = int((await run(FORKS.format(most=4 * pids), timeout=120)).stdout.strip() or -1)
            await sandbox.session.reset()
            hog = await run(HOG.format(mb=2 * spec.memory_limit_mb), timeout=120)
            out["hog"] = {"exit": hog.exit_code, "out": hog.stdout.strip()[-200:], "oom": await sandbox.oom_kills()}
            out["limits"] = [str(f) for f in getattr(sandbox, "limits").folders]
    return out


def plain(image: str, pids: int, memory_mb: int) -> dict:
    """The same probes in a plain `enroot start` (enroot's own mounts: the node's /proc, its network), no air."""
    interfaces, processes, host_pid, forks = plain_sh(image, [INTERFACES, PROCESSES, HOST_PID.format(pid=os.getpid()),
                                                              FORKS.format(most=4 * pids)])
    return {"interfaces": interfaces.split(), "processes": int(processes), "host_pid": host_pid,
            "forks": int(forks or -1)}


def plain_sh(image: str, scripts: list[str]) -> list[str]:
    """Each script's output in a plain `enroot start` of the image: enroot's own system mounts (the node's /proc,
    /dev and network), as the user namespace's root, no air."""
    from air import squashfs
    from air.sandbox.enroot.launcher import USERNS

    enroot = subprocess.run(["sh", "-c", "command -v enroot"], capture_output=True, text=True).stdout.strip()
    installed = Path(enroot).resolve().parent.parent / "etc" / "enroot"
    path, _ = squashfs.resolve(image)
    with tempfile.TemporaryDirectory(prefix="air-enroot-plain-") as tmp:
        conf = Path(tmp) / "conf"
        (conf / "mounts.d").mkdir(parents=True)
        (conf / "hooks.d").mkdir()  # enroot's shadow hook cannot write air images' /etc/passwd (a link)
        (conf / "enroot.conf").touch()
        (conf / "mounts.d" / "10-system.fstab").write_text((installed / "mounts.d" / "10-system.fstab").read_text())
        env = {**os.environ, "ENROOT_SYSCONF_PATH": str(conf), "ENROOT_DATA_PATH": f"{tmp}/data",
               "ENROOT_CACHE_PATH": f"{tmp}/cache", "ENROOT_RUNTIME_PATH": f"{tmp}/run",
               "ENROOT_TEMP_PATH": tmp, "ENROOT_ALLOW_SUPERUSER": "y", "ENROOT_MOUNT_HOME": "n"}
        subprocess.run([*USERNS, "enroot", "create", "--name", "plain", str(path)], env=env, check=True,
                       capture_output=True)
        try:
            return [subprocess.run([*USERNS, "enroot", "start", "--rw", "plain", "sh", "-c", script], env=env,
                                   capture_output=True, text=True, timeout=180).stdout.strip() for script in scripts]
        finally:
            subprocess.run([*USERNS, "enroot", "remove", "--force", "plain"], env=env, capture_output=True)


def main() -> None:
    image, pids, memory_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps({"cell": asyncio.run(in_cell(image, pids, memory_mb)), "plain": plain(image, pids, memory_mb)}))


if __name__ == "__main__":
    main()
