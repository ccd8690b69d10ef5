"""A REAL cluster where the suite would use the fake one: `AIR_TEST_BACKEND=kubernetes KUBECONFIG=... pytest ...`
(scripts/kube-local.sh builds and starts one on this machine; `scripts/kube-local.sh env` prints the variable).

`RealCluster` stands in for tests/kube_fake.py's `FakeCluster` where a test needs only what a cluster has: its
kubeconfig, the pods left in the namespace, and a pod killed from outside (deleted at once, as a node that loses it
would). Fault injection beyond that (throttling, lost answers, quota conflicts on demand) is the fake's alone: such a
test is skipped here, by name.

`sandbox_containers` gives the tests that find a sandbox's container by its run (to count scorers, look at their
processes, kill one) the run's pods on this backend, behind the few methods of a Docker container they call."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

NAMESPACE = os.environ.get("AIR_KUBERNETES_NAMESPACE", "air")
REAL = os.environ.get("AIR_TEST_BACKEND") == "kubernetes"


def kubectl(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    r = subprocess.run(["kubectl", "-n", NAMESPACE, *args], input=stdin, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def live_pods(selector: str = "") -> list[dict]:
    """Pods neither ended nor being deleted."""
    items = json.loads(kubectl("get", "pods", "-o", "json", *(["-l", selector] if selector else [])))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") not in ("Succeeded", "Failed")]


class RealCluster:
    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig

    def control(self, what: str, **body: object) -> dict:
        if what == "kill":
            kubectl("delete", "pod", str(body["name"]), "--grace-period=0", "--force", "--wait=false")
            return {}
        pytest.skip(f"fault injection ({what}) needs the fake API server (tests/kube_fake.py)")

    def stats(self) -> dict:
        return {"objects": {"pods": [p["metadata"]["name"] for p in live_pods()]}}


class PodHandle:
    """The methods of docker's Container that the attack tests use, on a pod (its one container, `sandbox`)."""

    def __init__(self, pod: dict):
        self.name = pod["metadata"]["name"]
        self.id = pod["metadata"]["uid"]
        # as the fake's kubelet names them on its containers: air/run -> air.run
        self.labels = {k.replace("/", "."): v for k, v in {**pod["metadata"].get("labels", {}),
                                                           **pod["metadata"].get("annotations", {})}.items()}

    def exec_run(self, argv: list[str]):
        r = subprocess.run(["kubectl", "-n", NAMESPACE, "exec", self.name, "-c", "sandbox", "--", *argv],
                           capture_output=True, timeout=120)

        class Result:
            exit_code, output = r.returncode, r.stdout + r.stderr
        return Result()

    def top(self, ps_args: str = "") -> dict:
        """Every process of the pod's container as [pid, uid, command line], whatever `ps_args` asked (the image
        need not have ps); the tests read the pid, the command line, and the user at [1]."""
        out = self.exec_run(["sh", "-c", "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) && "
                                         "echo \"${p#/proc/}|$(stat -c %u $p)|$c\"; done"]).output.decode()
        return {"Processes": [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]}

    def kill(self) -> None:
        kubectl("delete", "pod", self.name, "--grace-period=0", "--force", "--wait=false")


def sandbox_containers(docker_client, run_id: str, task: str | None = None) -> list:
    """A run's sandbox containers (of one task's name, e.g. "prisoners-dilemma.scoring", if given): Docker
    containers, or on a real cluster its running pods."""
    if REAL:
        from air.sandbox.kubernetes.manifests import label_value

        pods = live_pods(f"air/run={label_value(run_id)}")
        handles = [PodHandle(p) for p in pods]
        return [h for h in handles if task is None or h.labels.get("air.task") == task]
    labels = [f"air.run={run_id}"] + ([f"air.task={task}"] if task else [])
    return docker_client.containers.list(filters={"label": labels}, ignore_removed=True)


def container_pid(pod: str, container: str = "sandbox") -> int:
    """The node's pid of a pod's container's first process (the warden), where the node is this machine: the
    process whose cgroup names the container's id and whose parent's does not (its runtime's shim). Skips where no
    process here has it (a node elsewhere)."""
    status = json.loads(kubectl("get", "pod", pod, "-o", "json"))["status"]
    [cid] = [s["containerID"].split("://")[-1] for s in status.get("containerStatuses", []) if s["name"] == container]
    pids = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and cid in open(f"/proc/{entry}/cgroup").read():
                pids.add(int(entry))
        except OSError:  # gone meanwhile
            continue

    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("PPid:")))

    firsts = [p for p in pids if parent(p) not in pids]
    if len(firsts) != 1:
        pytest.skip(f"pod {pod}'s container {cid[:12]} has no one first process on this machine ({firsts})")
    return firsts[0]
