"""FakeKubernetes: a FAKE Kubernetes API server for air's tests and benches, because no real cluster runs on this
machine (no kube-apiserver, kubelet, kind or k3s; PyPI has clients only). It is not Kubernetes: it is a stateful
stand-in that speaks the real wire shapes to the real client (kubernetes_asyncio), so that the kubernetes backend's
lifecycle runs end to end. What it does, and what it only pretends:

- API server: JSON over HTTP with a bearer token; pods, secrets, configmaps, resourcequotas, leases, networkpolicies
  (and agent-sandbox's kinds when asked: `--agent-sandbox`); create (409 AlreadyExists), get, list with label
  selectors and a resourceVersion, merge-patch, delete (grace and propagation), deletecollection; watches streamed as
  the API server streams them (chunked JSON lines, bookmarks, `timeoutSeconds`), resumed from a resourceVersion, and
  410 Gone (an ERROR event) once that version left the kept history (`/fake/compact` drops it on demand).
- Admission: a ResourceQuota's `pods` (pods not yet ended) refuses a create past it with 403 "exceeded quota", in
  the API server's words; a pod deleted, or ended, is out of it at once (a real quota controller takes a moment).
  `/fake/quota-conflicts` makes the next N pod creates that a quota admits fail as a real API server's do when
  many race to update the quota's usage: 409 Conflict, reason "Conflict", 'Operation cannot be fulfilled on
  resourcequotas "<name>": the object has been modified; ...' (the pod is not created).
- Garbage collector: deleting an owner deletes its dependents (ownerReferences by uid), recursively, in background.
- Throttling: `/fake/inject` makes the next N matching requests fail with a status (429 with Retry-After, 500, 409),
  or answer late (`delay`);
  `--qps` rejects requests past a rate with 429, as API Priority and Fairness would.
- Scheduler: one fake node (or more: `--nodes`) with allocatable pods, CPU, memory and `nvidia.com/gpu` (0 here);
  a pod that does not fit stays Pending with PodScheduled=False, Unschedulable, naming what was short in the
  scheduler's words ("0/1 nodes are available: 1 Insufficient cpu."), and is tried again whenever a pod is deleted
  or ends, as the scheduler retries unschedulable pods when the cluster changes.
- Kubelet, two kinds:
  * `docker`: each pod is a local Docker container (this machine's daemon) built from the PodSpec as a kubelet would:
    command, env, working dir, capabilities, read-only root, no_new_privs, AppArmor, CPU and memory limits, emptyDir
    (in memory: a sized tmpfs; on disk: an anonymous volume), configMap and secret volumes (files in a host directory
    bound read-only), hostPath; the pod's IP is the container's on a network of the fake's own (internal, no traffic
    between containers), the warden reached there. NOT done: ephemeral-storage accounting and eviction, per-pod PID
    limits (a kubelet's podPidsLimit, `--pod-pids-limit`, stands in), NetworkPolicy (the network stands in: no egress,
    no pod-to-pod, but the host is reachable), image pulls (an image missing locally is ErrImagePull).
  * `stub`: no container; a tiny FAKE warden per pod on a loopback address of its own (127.x.y.z) that does the
    secret-first handshake and answers the protocol with canned replies. For the control plane at scale (bench/).
- Faults on demand: `/fake/evict` (phase Failed, reason Evicted), `/fake/lose-node` (the node's pods get a
  DisruptionTarget condition and are deleted, as the taint manager does), `/fake/kill` (the pod's container dies),
  images listed by `--unpullable` (ErrImagePull), `/fake/pin-words` (what the stub kubelet's page-cache pin pods,
  pods with no Secret, write to their log: by default the `air-pinned` line of air's pin program).
- Pod logs (`.../pods/<name>/log`, text): the container's output (Docker), or the stub's words.
- Quota scopes: `NotBestEffort` and `BestEffort` (pods with or without a CPU or memory request or limit).
- A pod created with a `nodeName` is started there without the scheduler.
- `/fake/stats`: requests by verb and kind, objects by kind, containers running.

Run: `python tests/kube_fake.py --kubelet docker --kubeconfig /tmp/k.yaml` prints one JSON line (url, kubeconfig)
when it answers; SIGTERM removes every container and network it made.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import datetime
import ipaddress
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

GROUPS = {  # (prefix, plural) -> kind
    ("/api/v1", "pods"): "Pod", ("/api/v1", "secrets"): "Secret", ("/api/v1", "configmaps"): "ConfigMap",
    ("/api/v1", "resourcequotas"): "ResourceQuota", ("/api/v1", "events"): "Event",
    ("/apis/coordination.k8s.io/v1", "leases"): "Lease",
    ("/apis/networking.k8s.io/v1", "networkpolicies"): "NetworkPolicy",
}
AGENT_SANDBOX = {
    ("/apis/extensions.agents.x-k8s.io/v1alpha1", "sandboxtemplates"): "SandboxTemplate",
    ("/apis/extensions.agents.x-k8s.io/v1alpha1", "sandboxwarmpools"): "SandboxWarmPool",
    ("/apis/extensions.agents.x-k8s.io/v1alpha1", "sandboxclaims"): "SandboxClaim",
}
TOKEN = "air-fake-token"
FAKE_LABEL = "air-k8s-fake"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def selector_matches(selector: str, labels: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number (cpu in cores, memory in bytes)."""
    text = str(text)
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("m", 1e-3),
                           ("k", 1e3), ("M", 1e6), ("G", 1e9)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


class Store:
    def __init__(self, history: int):
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name) -> object
        self.rv = 1000
        self.history: deque = deque(maxlen=history)  # (rv, plural, namespace, type, object)
        self.watchers: set[tuple[str, str, str, asyncio.Queue]] = set()
        self.oldest = self.rv

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def record(self, plural: str, namespace: str, kind: str, obj: dict) -> None:
        obj = copy.deepcopy(obj)
        if len(self.history) == self.history.maxlen:
            self.oldest = self.history[0][0]
        self.history.append((int(obj["metadata"]["resourceVersion"]), plural, namespace, kind, obj))
        for w_plural, w_ns, w_sel, queue in list(self.watchers):
            if w_plural == plural and w_ns == namespace and selector_matches(w_sel, obj["metadata"].get("labels", {})):
                queue.put_nowait({"type": kind, "object": obj})

    def put(self, plural: str, obj: dict, kind: str) -> dict:
        obj["metadata"]["resourceVersion"] = self.bump()
        meta = obj["metadata"]
        self.objects[(plural, meta["namespace"], meta["name"])] = obj
        self.record(plural, meta["namespace"], kind, obj)
        return obj

    def remove(self, plural: str, namespace: str, name: str) -> dict | None:
        obj = self.objects.pop((plural, namespace, name), None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self.bump()
            self.record(plural, namespace, "DELETED", obj)
        return obj


class Fake:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.kinds = dict(GROUPS)
        if args.agent_sandbox:
            self.kinds.update(AGENT_SANDBOX)
        self.store = Store(args.history)
        self.requests: Counter[str] = Counter()
        self.injected: list[dict] = []
        self.qps_tokens, self.qps_stamp = float(args.qps or 0), time.monotonic()
        self.nodes = {f"fake-node-{i + 1}": {"pods": 110, "cpu": args.node_cpus, "memory": args.node_memory_gb << 30,
                                             "nvidia.com/gpu": args.node_gpus} for i in range(args.nodes)}
        self.kubelet = DockerKubelet(self) if args.kubelet == "docker" else StubKubelet(self)
        self.controller = AgentSandboxController(self)
        self.tasks: set[asyncio.Task] = set()
        self.pod_faults: list[str] = []
        self.quota_conflicts = 0
        self.unscheduled: set[tuple[str, str]] = set()
        """Pods the scheduler found no node for: tried again when a pod is deleted or ends."""

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ----- routing ----------------------------------------------------------------------------------------------------
    def resolve(self, path: str) -> tuple[str, str, str, str | None] | None:
        """(prefix, plural, namespace, name) of an API path this fake serves."""
        for (prefix, plural) in self.kinds:
            head = prefix + "/namespaces/"
            if path.startswith(head):
                rest = path[len(head):].split("/")
                if len(rest) >= 2 and rest[1] == plural:
                    return prefix, plural, rest[0], rest[2] if len(rest) > 2 else None
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if request.path.startswith("/fake/"):
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return status(401, "Unauthorized", "Unauthorized")
        target = self.resolve(request.path)
        kind = target[1] if target else "discovery"
        verb = "WATCH" if request.query.get("watch") in ("true", "1") else request.method
        self.requests[f"{verb} {kind}"] += 1
        for rule in self.injected:
            if rule["count"] > 0 and rule.get("method", verb) == verb and rule.get("plural", kind) == kind:
                rule["count"] -= 1
                if rule.get("delay"):  # a slow server: the request is done, its answer comes late
                    await asyncio.sleep(rule["delay"])
                    return await handler(request)
                if rule.get("after"):  # done, but the answer is lost on the way (a timeout, a proxy's 504)
                    await handler(request)
                response = status(rule["status"], rule.get("reason", "Injected"), "injected by the fake")
                if rule["status"] == 429:
                    response.headers["Retry-After"] = str(rule.get("retry_after", 1))
                return response
        if self.args.qps:
            stamp = time.monotonic()
            self.qps_tokens = min(self.args.qps, self.qps_tokens + (stamp - self.qps_stamp) * self.args.qps)
            self.qps_stamp = stamp
            if self.qps_tokens < 1 and verb != "WATCH":
                self.requests["429 qps"] += 1
                response = status(429, "TooManyRequests", "the fake's --qps is exceeded")
                response.headers["Retry-After"] = "1"
                return response
            self.qps_tokens -= 1
        return await handler(request)

    async def api(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/version":
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-air-fake"})
        if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:
            return web.json_response({"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": path.rsplit("/", 1)[1]}, "status": {"phase": "Active"}})
        if path in {p for p, _ in self.kinds} or path in ("/api", "/apis", "/api/v1"):
            return web.json_response({"kind": "APIResourceList", "groupVersion": path.split("/", 2)[-1],
                                      "resources": [{"name": pl, "namespaced": True, "kind": k}
                                                    for (p, pl), k in self.kinds.items() if p == path]})
        target = self.resolve(path)
        if target is None:
            return status(404, "NotFound", f"the server could not find the requested resource ({path})")
        prefix, plural, namespace, name = target
        if plural == "pods" and name and path.endswith(f"/pods/{name}/log"):
            return await self.log(namespace, name)
        if name is None:
            if request.method == "POST":
                return await self.create(request, prefix, plural, namespace)
            if request.method == "DELETE":
                return self.delete_collection(plural, namespace, request.query.get("labelSelector", ""))
            if request.query.get("watch") in ("true", "1"):
                return await self.watch(request, plural, namespace)
            return self.list(prefix, plural, namespace, request.query.get("labelSelector", ""))
        obj = self.store.objects.get((plural, namespace, name))
        if obj is None:
            return status(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "PATCH":
            patched = merge_patch(obj, await request.json())
            patched["metadata"]["uid"] = obj["metadata"]["uid"]
            return web.json_response(self.store.put(plural, patched, "MODIFIED"))
        if request.method == "DELETE":
            body = await request.json() if request.can_read_body else {}
            self.delete(plural, namespace, name, body.get("propagationPolicy", "Background"))
            return web.json_response({"kind": "Status", "status": "Success"})
        return status(405, "MethodNotAllowed", request.method)

    async def log(self, namespace: str, name: str) -> web.Response:
        """The pod log subresource: what the pod's container wrote (text/plain), as a kubelet serves it."""
        pod = self.pod(namespace, name)
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        if pod["status"].get("phase") == "Pending":
            return status(400, "BadRequest", f'container "{pod["spec"]["containers"][0]["name"]}" in pod "{name}" '
                                             "is waiting to start: ContainerCreating")
        return web.Response(text=await self.kubelet.logs(namespace, name), content_type="text/plain")

    # ----- verbs ------------------------------------------------------------------------------------------------------
    async def create(self, request: web.Request, prefix: str, plural: str, namespace: str) -> web.Response:
        obj = await request.json()
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", (meta.get("generateName") or "x-") + uuid.uuid4().hex[:5])
        meta["namespace"] = namespace
        if (plural, namespace, meta["name"]) in self.store.objects:
            return status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
        if plural == "pods":
            refused = self.quota_refusal(namespace, obj)
            if refused:
                return status(403, "Forbidden", refused)
            quota = next((n for (pl, ns, n) in self.store.objects if pl == "resourcequotas" and ns == namespace), None)
            if quota is not None and self.quota_conflicts > 0:
                self.quota_conflicts -= 1
                return status(409, "Conflict", f'Operation cannot be fulfilled on resourcequotas "{quota}": the object '
                                               "has been modified; please apply your changes to the latest version "
                                               "and try again")
        return web.json_response(self.add(prefix, plural, namespace, obj), status=201)

    def add(self, prefix: str, plural: str, namespace: str, obj: dict) -> dict:
        meta = obj["metadata"]
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now())
        obj.setdefault("apiVersion", prefix.rsplit("/", 2)[-2] + "/" + prefix.rsplit("/", 1)[-1]
                       if prefix.startswith("/apis/") else "v1")
        obj["kind"] = self.kinds[(prefix, plural)]
        if plural == "pods":
            obj["status"] = {"phase": "Pending", "conditions": []}
        created = self.store.put(plural, obj, "ADDED")
        if plural == "pods":
            self.spawn(self.run_pod(namespace, meta["name"]))
        elif plural == "sandboxwarmpools":
            self.spawn(self.controller.fill(namespace, meta["name"]))
        elif plural == "sandboxclaims":
            self.spawn(self.controller.claim(namespace, meta["name"]))
        return created

    def quota_refusal(self, namespace: str, pod: dict) -> str:
        for (plural, ns, name), quota in self.store.objects.items():
            if plural != "resourcequotas" or ns != namespace:
                continue
            hard = quota.get("spec", {}).get("hard", {})
            counted = self.best_effort_counted(quota)
            if not counted(pod):
                continue
            if "pods" in hard:
                used = sum(1 for (pl, n, _), p in self.store.objects.items() if pl == "pods" and n == namespace
                           and p["status"]["phase"] not in ("Succeeded", "Failed") and counted(p))
                if used + 1 > int(hard["pods"]):
                    return (f'pods "{pod["metadata"]["name"]}" is forbidden: exceeded quota: {name}, requested: '
                            f'pods=1, used: pods={used}, limited: pods={hard["pods"]}')
        return ""

    @staticmethod
    def best_effort_counted(quota: dict):
        """Which pods a quota counts, by its scopes: `NotBestEffort` (pods with a request or limit of CPU or memory)
        and `BestEffort` (pods with none), as the API server's quota admission reads them; others are refused."""
        scopes = set(quota.get("spec", {}).get("scopes") or ())
        unknown = scopes - {"NotBestEffort", "BestEffort"}
        if unknown:
            raise ValueError(f"the fake supports no quota scope {sorted(unknown)}")

        def best_effort(pod: dict) -> bool:
            return not any(k in (c.get("resources") or {}).get(field, {}) for c in pod["spec"]["containers"]
                           for field in ("requests", "limits") for k in ("cpu", "memory"))

        return lambda pod: ("NotBestEffort" not in scopes or not best_effort(pod)) and (
            "BestEffort" not in scopes or best_effort(pod))

    def list(self, prefix: str, plural: str, namespace: str, selector: str) -> web.Response:
        items = [o for (pl, ns, _), o in self.store.objects.items()
                 if pl == plural and ns == namespace and selector_matches(selector, o["metadata"].get("labels", {}))]
        return web.json_response({"apiVersion": "v1", "kind": self.kinds[(prefix, plural)] + "List",
                                  "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})

    def delete(self, plural: str, namespace: str, name: str, propagation: str = "Background") -> None:
        obj = self.store.remove(plural, namespace, name)
        if obj is None:
            return
        if plural == "pods":
            self.kubelet.stop(namespace, name)
            self.unscheduled.discard((namespace, name))
            self.reschedule()
        if propagation != "Orphan":
            self.spawn(self.collect(obj["metadata"]["uid"]))

    def delete_collection(self, plural: str, namespace: str, selector: str) -> web.Response:
        for (pl, ns, name), o in list(self.store.objects.items()):
            if pl == plural and ns == namespace and selector_matches(selector, o["metadata"].get("labels", {})):
                self.delete(pl, ns, name)
        return web.json_response({"kind": "Status", "status": "Success"})

    async def collect(self, uid: str) -> None:
        """The garbage collector: dependents of a deleted owner go, a moment later, recursively."""
        await asyncio.sleep(0.05)
        for (plural, ns, name), o in list(self.store.objects.items()):
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or []):
                self.delete(plural, ns, name)

    async def watch(self, request: web.Request, plural: str, namespace: str) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        since = request.query.get("resourceVersion", "")
        seconds = float(request.query.get("timeoutSeconds", 1800))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        entry = (plural, namespace, selector, queue)

        async def send(event: dict) -> None:
            await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")

        if since and since != "0" and int(since) < self.store.oldest:
            await send({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                    "code": 410, "reason": "Expired",
                                                    "message": f"too old resource version: {since} "
                                                               f"({self.store.oldest})"}})
            return response
        if not since or since == "0":
            backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for (pl, ns, _), o in self.store.objects.items()
                       if pl == plural and ns == namespace and selector_matches(selector, o["metadata"]
                                                                                .get("labels", {}))]
        else:
            backlog = [{"type": t, "object": copy.deepcopy(o)} for rv, pl, ns, t, o in self.store.history
                       if rv > int(since) and pl == plural and ns == namespace
                       and selector_matches(selector, o["metadata"].get("labels", {}))]
        self.store.watchers.add(entry)
        deadline = time.monotonic() + seconds
        try:
            for event in backlog:
                await send(event)
            while time.monotonic() < deadline:
                try:
                    event = await asyncio.wait_for(queue.get(), min(10.0, max(0.01, deadline - time.monotonic())))
                except asyncio.TimeoutError:
                    await send({"type": "BOOKMARK", "object": {"kind": self.kinds[(self.prefix(plural), plural)],
                                                               "apiVersion": "v1",
                                                               "metadata": {"resourceVersion": str(self.store.rv)}}})
                    continue
                if event is None:
                    break
                await send(event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(entry)
        return response

    def prefix(self, plural: str) -> str:
        return next(p for p, pl in self.kinds if pl == plural)

    # ----- the scheduler and the kubelet's status --------------------------------------------------------------------
    def pod(self, namespace: str, name: str) -> dict | None:
        return self.store.objects.get(("pods", namespace, name))

    def set_status(self, namespace: str, name: str, **changes) -> dict | None:
        pod = self.pod(namespace, name)
        if pod is None:
            return None
        pod = copy.deepcopy(pod)
        pod["status"].update(changes)
        return self.store.put("pods", pod, "MODIFIED")

    def reschedule(self) -> None:
        """Something was freed: the pods no node had room for are tried again."""
        waiting, self.unscheduled = self.unscheduled, set()
        for namespace, name in waiting:
            self.spawn(self.run_pod(namespace, name))

    def shortage(self, pod: dict) -> str:
        """What no node has enough of for `pod`, as the scheduler says it ("1 Insufficient cpu")."""
        want = self.wanted(pod)
        short = Counter()
        for node in self.nodes:
            used = self.used(node)
            if used["pods"] >= self.nodes[node]["pods"]:
                short["Too many pods"] += 1
                continue
            for k in ("nvidia.com/gpu", "cpu", "memory"):
                if want[k] and used[k] + want[k] > self.nodes[node].get(k, 0):
                    short[f"Insufficient {k}"] += 1
        return ", ".join(f"{n} {what}" for what, n in sorted(short.items()))

    @staticmethod
    def wanted(pod: dict) -> Counter:
        want = Counter()
        for c in pod["spec"]["containers"]:
            for k, v in (c.get("resources", {}).get("requests") or {}).items():
                want[k] += quantity(v)
        return want

    def used(self, node: str) -> Counter:
        used = Counter()
        for (pl, _, _), p in self.store.objects.items():
            if pl == "pods" and p["spec"].get("nodeName") == node and p["status"]["phase"] in ("Pending", "Running"):
                used["pods"] += 1
                used.update(self.wanted(p))
        return used

    def schedule(self, pod: dict) -> str | None:
        want = self.wanted(pod)
        for node, free in self.nodes.items():
            used = self.used(node)
            if used["pods"] < free["pods"] and all(used[k] + want[k] <= free.get(k, 0) for k in want
                                                   if k in ("cpu", "memory", "nvidia.com/gpu")):
                return node
        return None

    async def run_pod(self, namespace: str, name: str) -> None:
        pod = self.pod(namespace, name)
        if pod is None or any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                              for c in pod["status"].get("conditions", [])):
            return
        # A pod created with its nodeName is the kubelet's at once: the scheduler never sees it.
        node = pod["spec"].get("nodeName") or self.schedule(pod)
        if node is None:
            self.unscheduled.add((namespace, name))
            message = f"0/{len(self.nodes)} nodes are available: {self.shortage(pod)}."
            if pod["status"].get("conditions") != [{"type": "PodScheduled", "status": "False",
                                                    "reason": "Unschedulable", "message": message}]:
                self.set_status(namespace, name, conditions=[{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}])
            return
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        self.store.put("pods", pod, "MODIFIED")
        # The kubelet waits for the volumes it must mount (a Secret made just after the pod).
        for _ in range(600):
            pod = self.pod(namespace, name)
            if pod is None:
                return
            missing = [v for v in pod["spec"].get("volumes", []) if
                       ("secret" in v and ("secrets", namespace, v["secret"]["secretName"]) not in self.store.objects)
                       or ("configMap" in v and ("configmaps", namespace, v["configMap"]["name"])
                           not in self.store.objects)]
            if not missing:
                break
            await asyncio.sleep(0.05)
        else:
            return
        image = pod["spec"]["containers"][0]["image"]
        fault = self.pod_faults.pop(0) if self.pod_faults else None
        if fault == "evict":
            self.set_status(namespace, name, phase="Failed", reason="Evicted",
                            message="The node was low on resource: ephemeral-storage.")
            return
        if fault == "lose-node":
            conditions = pod["status"].get("conditions", []) + [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                "message": f"Taint manager: deleting due to NoExecute taint (node {node} unreachable)"}]
            self.set_status(namespace, name, conditions=conditions)
            self.delete("pods", namespace, name)
            return
        if fault == "image" or image in self.args.unpullable or not await self.kubelet.has_image(image):
            self.set_status(namespace, name, containerStatuses=[{
                "name": "sandbox", "image": image, "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImagePull",
                                      "message": f'failed to pull image "{image}": not found (the fake pulls none)'}}}])
            return
        try:
            ip = await self.kubelet.start(namespace, name, pod)
        except Exception as exc:  # noqa: BLE001 - the kubelet's failure is the pod's status
            self.set_status(namespace, name, containerStatuses=[{
                "name": "sandbox", "image": image, "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerError", "message": str(exc)[:300]}}}])
            return
        if self.pod(namespace, name) is None:  # deleted while it started
            self.kubelet.stop(namespace, name)
            return
        self.set_status(namespace, name, phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP="10.0.0.1",
                        startTime=now(), conditions=[{"type": "PodScheduled", "status": "True"},
                                                     {"type": "Ready", "status": "True"}],
                        containerStatuses=[{"name": "sandbox", "image": image, "ready": True, "restartCount": 0,
                                            "imageID": await self.kubelet.image_id(image),
                                            "started": True, "state": {"running": {"startedAt": now()}}}])

    def container_ended(self, namespace: str, name: str, exit_code: int, oom: bool) -> None:
        pod = self.pod(namespace, name)
        if pod is None or pod["status"].get("phase") in ("Succeeded", "Failed"):
            return
        reason = "OOMKilled" if oom else ("Completed" if exit_code == 0 else "Error")
        self.set_status(namespace, name, phase="Succeeded" if exit_code == 0 else "Failed",
                        containerStatuses=[{"name": "sandbox", "image": pod["spec"]["containers"][0]["image"],
                                            "ready": False, "restartCount": 0,
                                            "state": {"terminated": {"exitCode": exit_code, "reason": reason}}}])
        self.reschedule()

    # ----- faults on demand ------------------------------------------------------------------------------------------
    async def control(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        body = await request.json() if request.can_read_body else {}
        if what == "stats":
            objects = Counter(pl for (pl, _, _) in self.store.objects)
            return web.json_response({"requests": dict(self.requests), "objects": dict(objects),
                                      "containers": self.kubelet.running(), "rv": self.store.rv})
        if what == "inject":
            self.injected.append(dict(body))
            return web.json_response({"ok": True})
        if what == "drop-watches":  # every watch stream ends, as when the API server restarts
            for *_, queue in list(self.store.watchers):
                queue.put_nowait(None)
            return web.json_response({"ok": True})
        if what == "pod-faults":  # the next pods started meet these, in order: "evict", "image", "lose-node"
            self.pod_faults.extend(body["faults"])
            return web.json_response({"ok": True})
        if what == "quota-conflicts":  # the next N pod creates a quota admits meet 409 Conflict on the quota
            self.quota_conflicts += int(body["count"])
            return web.json_response({"ok": True})
        if what == "pin-words":  # what the stub kubelet's pin pods started from now on write ("" : nothing yet)
            self.kubelet.pin_words = body["words"]
            return web.json_response({"ok": True})
        if what == "compact":
            self.store.history.clear()
            self.store.oldest = self.store.rv
            return web.json_response({"ok": True})
        ns, name = body.get("namespace", "air"), body.get("name", "")
        if what == "evict":
            self.kubelet.stop(ns, name)
            self.set_status(ns, name, phase="Failed", reason="Evicted",
                            message=body.get("message", "The node was low on resource: memory."))
            self.reschedule()
            return web.json_response({"ok": True})
        if what == "kill":
            self.kubelet.kill(ns, name)
            return web.json_response({"ok": True})
        if what == "lose-node":
            node = body.get("node", "fake-node-1")
            for (pl, n, pod_name), pod in list(self.store.objects.items()):
                if pl == "pods" and pod["spec"].get("nodeName") == node:
                    self.kubelet.stop(n, pod_name)
                    conditions = pod["status"].get("conditions", []) + [{
                        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                        "message": f"Taint manager: deleting due to NoExecute taint (node {node} unreachable)"}]
                    self.set_status(n, pod_name, conditions=conditions)
                    self.delete(pl, n, pod_name)
            return web.json_response({"ok": True})
        return status(404, "NotFound", what)

    async def close(self) -> None:
        await self.kubelet.close()


class AgentSandboxController:
    """A FAKE of agent-sandbox's extensions controller, as far as air uses it: a SandboxWarmPool keeps `replicas` pods
    of its SandboxTemplate; a SandboxClaim gets one of them (labelled with the claim's additionalPodMetadata, owned
    by the claim, and replaced in the pool), or a new pod when none is left. Deleting a claim deletes its pod (the
    garbage collector, by ownerReference). The real controller goes through a Sandbox object per pod; air never
    reads it, so the fake has none."""

    POOL = "agents.x-k8s.io/warm-pool"

    def __init__(self, fake: Fake):
        self.fake = fake

    def objects(self, plural: str, namespace: str, name: str) -> dict | None:
        return self.fake.store.objects.get((plural, namespace, name))

    def new_pod(self, namespace: str, template: dict, owner: dict, labels: dict) -> dict:
        spec = template["spec"]["podTemplate"]
        name = f"{owner['metadata']['name'][:50]}-{uuid.uuid4().hex[:5]}"
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(spec["spec"]),
               "metadata": {"name": name, "labels": {**spec.get("metadata", {}).get("labels", {}), **labels},
                            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                                 "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]}}
        return self.fake.add("/api/v1", "pods", namespace, pod)

    async def fill(self, namespace: str, name: str) -> None:
        pool = self.objects("sandboxwarmpools", namespace, name)
        if pool is None:
            return
        template = self.objects("sandboxtemplates", namespace, pool["spec"]["sandboxTemplateRef"]["name"])
        have = [p for (pl, ns, _), p in self.fake.store.objects.items() if pl == "pods" and ns == namespace
                and p["metadata"].get("labels", {}).get(self.POOL) == name]
        for _ in range(pool["spec"]["replicas"] - len(have)):
            self.new_pod(namespace, template, pool, {self.POOL: name})

    async def claim(self, namespace: str, name: str) -> None:
        claim = self.objects("sandboxclaims", namespace, name)
        if claim is None:
            return
        spec = claim["spec"]
        labels = (spec.get("additionalPodMetadata") or {}).get("labels", {})
        pool_name = spec.get("warmpool", "default")
        ready = sorted((p for (pl, ns, _), p in self.fake.store.objects.items() if pl == "pods" and ns == namespace
                        and p["metadata"].get("labels", {}).get(self.POOL) == pool_name),
                       key=lambda p: p["status"].get("phase") != "Running")
        ref = {"apiVersion": claim["apiVersion"], "kind": "SandboxClaim", "name": name,
               "uid": claim["metadata"]["uid"]}
        if ready:
            pod = copy.deepcopy(ready[0])
            pod["metadata"]["labels"].pop(self.POOL)
            pod["metadata"]["labels"].update(labels)
            pod["metadata"]["ownerReferences"] = [ref]
            pod = self.fake.store.put("pods", pod, "MODIFIED")
            await self.fill(namespace, pool_name)
        else:
            template = self.objects("sandboxtemplates", namespace, spec["sandboxTemplateRef"]["name"])
            pod = self.new_pod(namespace, template, claim, labels)
        claim = copy.deepcopy(claim)
        claim["status"] = {"sandbox": {"name": pod["metadata"]["name"]}}
        self.fake.store.put("sandboxclaims", claim, "MODIFIED")


class StubKubelet:
    """Pods with no container: a FAKE warden per pod (handshake + canned replies) on a loopback address of its own."""

    def __init__(self, fake: Fake):
        self.fake = fake
        self.servers: dict[tuple[str, str], asyncio.AbstractServer] = {}
        self.live: set[tuple[str, str]] = set()
        """Pods whose fake warden listens or is connected (as a container would be running)."""
        self.addresses = (str(ipaddress.ip_address("127.1.0.0") + i) for i in itertools.count(1))
        self.said: dict[tuple[str, str], str] = {}
        """What each pod's container wrote (the log subresource)."""
        self.pin_words = 'air-pinned {"files": 3, "bytes": 12288, "seconds": 0.001}\n'

    async def has_image(self, image: str) -> bool:
        return True

    async def image_id(self, image: str) -> str:
        return "sha256:" + "0" * 64

    def running(self) -> int:
        return len(self.live)

    async def logs(self, namespace: str, name: str) -> str:
        """A pin (a pod with no warden) says it holds its pages, as air's pin program does; a sandbox says nothing."""
        return self.said.get((namespace, name), "")

    async def start(self, namespace: str, name: str, pod: dict) -> str:
        from air.sandbox.warden import protocol as p

        key = (namespace, name)
        if not any("secret" in v for v in pod["spec"].get("volumes", [])):  # a page-cache pin: nothing to serve
            self.live.add(key)
            self.said[key] = self.pin_words
            return str(next(self.addresses))
        secret_name = next(v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v)
        secret = base64.b64decode(self.fake.store.objects[("secrets", namespace, secret_name)]["data"]["secret"])
        port = int(next(c["containerPort"] for c in pod["spec"]["containers"][0]["ports"]))
        replies = {"hello": lambda r: p.Ready(cells=True, why_not=""),
                   "reset": lambda r: p.WasReset(cell=True, end_ms=0.0, build_ms=0.0, ms=0.0),
                   "ping": lambda r: p.ShellState(alive=True), "start-shell": lambda r: p.Done(),
                   "interrupt": lambda r: p.Done(), "oom": lambda r: p.OomKills(count=0),
                   "unpack": lambda r: p.Unpacked(problem=b""), "keep": lambda r: p.Kept(init=0),
                   "run": lambda r: p.Ran(out=r.command + b"\n", err=b"", dropped=0, exit_code=0, timed_out=False,
                                          duration=0.0, cwd=b"/home/agent/workspace", restarted=False),
                   "exec": lambda r: p.Exited(out=b"", err=b"", dropped=0, exit_code=0, timed_out=False,
                                              duration=0.0, problem=b"")}

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                proof = await reader.readexactly(len(secret))
                if proof != secret:
                    writer.close()
                    return
                self.servers.pop(key).close()  # one host, as the warden: nobody connects after it
                frames = p.FrameReader()
                while True:
                    data = await reader.read(1 << 16)
                    if not data:
                        break
                    if key not in self.live:  # torn down: silence, as a pod's vanished network would give
                        await asyncio.Event().wait()
                    for head, body in frames.feed(data):
                        ident, request = p.decode(head, body, p.REQUESTS)
                        writer.write(p.encode(ident, replies[request.op](request)))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, KeyError):
                pass
            finally:
                writer.close()
                if key in self.live:
                    self.live.discard(key)
                    self.fake.container_ended(namespace, name, 0, False)  # the warden ends with its connection

        for _ in range(50):
            address = next(self.addresses)
            try:
                self.servers[key] = await asyncio.start_server(serve, address, port)
                self.live.add(key)
                return address
            except OSError:
                continue
        raise RuntimeError("no loopback address free")

    def stop(self, namespace: str, name: str) -> None:
        """The pod's sandbox is torn down: nothing more is answered (its network goes with it, so no FIN reaches the
        host: the connection stays open until the pool gives up on it)."""
        self.live.discard((namespace, name))
        server = self.servers.pop((namespace, name), None)
        if server is not None:
            server.close()

    kill = stop

    async def close(self) -> None:
        for key in list(self.servers):
            self.stop(*key)


class DockerKubelet:
    """Each pod a container of this machine's Docker daemon, made from the PodSpec (see the module's docstring)."""

    def __init__(self, fake: Fake):
        import docker

        self.fake = fake
        self.client = docker.from_env(timeout=120)
        self.id = uuid.uuid4().hex[:10]
        self.pool = ThreadPoolExecutor(16)
        self.containers: dict[tuple[str, str], str] = {}
        self.alive: set[tuple[str, str]] = set()
        """Pods whose container runs (not yet died): what `running` counts."""
        self.files = Path(tempfile.mkdtemp(prefix="air-k8s-fake-"))
        self.sweep()
        self.network = self.client.networks.create(
            f"air-k8s-fake-{self.id}", driver="bridge", internal=True,
            labels={FAKE_LABEL: self.id, f"{FAKE_LABEL}-pid": str(os.getpid())},
            options={"com.docker.network.bridge.enable_icc": "false"}).name
        self.loop = asyncio.get_event_loop()
        threading.Thread(target=self._events, daemon=True, name="fake-kubelet-events").start()

    def running(self) -> int:
        return len(self.alive)

    def sweep(self) -> None:
        """Containers and networks of fakes that died without cleaning up (killed): theirs, by the pid label."""
        label = f"{FAKE_LABEL}-pid"
        dead = lambda labels: not os.path.exists(f"/proc/{labels.get(label, 0)}")  # noqa: E731
        for c in self.client.api.containers(all=True, filters={"label": label}):
            if dead(c.get("Labels") or {}):
                self.client.api.remove_container(c["Id"], force=True, v=True)
        for n in self.client.networks.list(filters={"label": label}):
            if dead(n.attrs.get("Labels") or {}):
                n.remove()

    async def image_id(self, image: str) -> str:
        return await self.loop.run_in_executor(self.pool, lambda: self.client.images.get(image).id)

    async def has_image(self, image: str) -> bool:
        import docker

        def check() -> bool:
            try:
                self.client.images.get(image)
                return True
            except docker.errors.ImageNotFound:
                return False

        return await self.loop.run_in_executor(self.pool, check)

    def _volume_files(self, namespace: str, name: str, volume: dict) -> str:
        directory = self.files / namespace / name / volume["name"]
        directory.mkdir(parents=True)
        if "secret" in volume:
            obj = self.fake.store.objects[("secrets", namespace, volume["secret"]["secretName"])]
            data, mode = {k: base64.b64decode(v) for k, v in obj["data"].items()}, volume["secret"]["defaultMode"]
        else:
            obj = self.fake.store.objects[("configmaps", namespace, volume["configMap"]["name"])]
            data, mode = {k: v.encode() for k, v in obj["data"].items()}, volume["configMap"]["defaultMode"]
        for key, content in data.items():
            (directory / key).write_bytes(content)
            os.chmod(directory / key, mode)
        return str(directory)

    def kwargs(self, namespace: str, name: str, pod: dict) -> dict:
        import docker.types

        c, spec = pod["spec"]["containers"][0], pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts, tmpfs, shm = [], {}, None
        for m in c.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "emptyDir" in v and v["emptyDir"].get("medium") == "Memory":
                size = int(quantity(v["emptyDir"].get("sizeLimit", "64Mi")))
                if m["mountPath"] == "/dev/shm":
                    shm = size
                else:
                    tmpfs[m["mountPath"]] = f"rw,exec,nosuid,nodev,size={size},mode=1777"
            elif "emptyDir" in v:
                mounts.append(docker.types.Mount(m["mountPath"], None, type="volume", no_copy=True))
            elif "hostPath" in v:
                mounts.append(docker.types.Mount(m["mountPath"], v["hostPath"]["path"], type="bind", read_only=True))
            else:
                mounts.append(docker.types.Mount(m["mountPath"], self._volume_files(namespace, name, v),
                                                 type="bind", read_only=True))
        sc = c.get("securityContext", {})
        limits = c.get("resources", {}).get("limits", {})
        memory = int(quantity(limits["memory"])) if "memory" in limits else None
        security = [] if sc.get("allowPrivilegeEscalation", True) else ["no-new-privileges"]
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            security.append("apparmor=unconfined")
        kwargs = dict(
            image=c["image"], command=c["command"], name=f"k8s-fake-{self.id}-{name}"[:120], detach=True,
            network=self.network, working_dir=c.get("workingDir", "/"), user=str(sc.get("runAsUser", 0)),
            environment={e["name"]: e["value"] for e in c.get("env", [])},
            # As a kubelet's containers carry their pod's labels (here under Docker-style names, air.run and the
            # like, so that tests which find a sandbox's container by its run find a pod's), never an owner's.
            labels={FAKE_LABEL: self.id, f"{FAKE_LABEL}-pod": f"{namespace}.{name}",
                    f"{FAKE_LABEL}-pid": str(os.getpid()),
                    **{k.replace("/", "."): v for k, v in {**pod["metadata"].get("labels", {}),
                                                           **pod["metadata"].get("annotations", {})}.items()
                       if k.startswith("air/") and k != "air/owner"}},
            cap_drop=sc.get("capabilities", {}).get("drop", []), cap_add=sc.get("capabilities", {}).get("add", []),
            privileged=bool(sc.get("privileged")), read_only=bool(sc.get("readOnlyRootFilesystem")),
            security_opt=security, mounts=mounts, tmpfs=tmpfs, pids_limit=self.fake.args.pod_pids_limit,
            nano_cpus=int(quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
            mem_limit=memory, memswap_limit=memory, stop_signal="SIGKILL",
        )
        if shm:
            kwargs["shm_size"] = shm
        return kwargs

    async def start(self, namespace: str, name: str, pod: dict) -> str:
        def run() -> str:
            container = self.client.containers.run(**self.kwargs(namespace, name, pod))
            self.containers[(namespace, name)] = container.id
            self.alive.add((namespace, name))
            container.reload()
            return container.attrs["NetworkSettings"]["Networks"][self.network]["IPAddress"]

        return await self.loop.run_in_executor(self.pool, run)

    def _events(self) -> None:
        """Docker's event stream (one for all pods): a container that died ends its pod."""
        for event in self.client.events(decode=True, filters={"label": f"{FAKE_LABEL}={self.id}",
                                                              "event": ["die"]}):
            pod = (event.get("Actor", {}).get("Attributes", {}) or {}).get(f"{FAKE_LABEL}-pod", "")
            namespace, _, name = pod.partition(".")
            code = int(event["Actor"]["Attributes"].get("exitCode", 1))
            try:
                oom = self.client.api.inspect_container(event["id"])["State"].get("OOMKilled", False)
            except Exception:  # noqa: BLE001 - gone already
                oom = False
            try:
                self.loop.call_soon_threadsafe(self.alive.discard, (namespace, name))
                self.loop.call_soon_threadsafe(self.fake.container_ended, namespace, name, code, oom)
            except RuntimeError:  # the fake is shutting down
                return

    def stop(self, namespace: str, name: str) -> None:
        self.alive.discard((namespace, name))
        cid = self.containers.pop((namespace, name), None)
        if cid is not None:
            self.loop.run_in_executor(self.pool, self._remove, cid, self.files / namespace / name)

    async def logs(self, namespace: str, name: str) -> str:
        cid = self.containers.get((namespace, name))
        if cid is None:
            return ""

        def read() -> str:
            try:
                return self.client.api.logs(cid, stdout=True, stderr=True, tail=20).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - gone already
                return ""

        return await self.loop.run_in_executor(self.pool, read)

    def kill(self, namespace: str, name: str) -> None:
        cid = self.containers.get((namespace, name))
        if cid is not None:
            self.client.api.kill(cid)

    def _remove(self, cid: str, files: Path) -> None:
        try:
            self.client.api.remove_container(cid, force=True, v=True)
        except Exception:  # noqa: BLE001 - gone already
            pass
        shutil.rmtree(files, ignore_errors=True)

    async def close(self) -> None:
        for c in self.client.api.containers(all=True, filters={"label": f"{FAKE_LABEL}={self.id}"}):
            try:
                self.client.api.remove_container(c["Id"], force=True, v=True)
            except Exception:  # noqa: BLE001 - gone already, or a removal in progress
                pass
        self.containers.clear()
        self.alive.clear()
        try:
            self.client.networks.get(self.network).remove()
        except Exception:  # noqa: BLE001
            pass
        shutil.rmtree(self.files, ignore_errors=True)


def kubeconfig(url: str, namespace: str = "air") -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "air-fake",
        "clusters": [{"name": "air-fake", "cluster": {"server": url}}],
        "users": [{"name": "air-fake", "user": {"token": TOKEN}}],
        "contexts": [{"name": "air-fake", "context": {"cluster": "air-fake", "user": "air-fake",
                                                        "namespace": namespace}}]})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="a FAKE Kubernetes API server for air's tests (see the docstring)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--kubelet", choices=["docker", "stub"], default="stub")
    ap.add_argument("--kubeconfig", required=True, help="where to write a kubeconfig for it")
    ap.add_argument("--history", type=int, default=10000, help="watch events kept (older versions are 410 Gone)")
    ap.add_argument("--qps", type=float, default=0, help="requests per second past which the fake answers 429")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--node-cpus", type=float, default=1000)
    ap.add_argument("--node-memory-gb", type=int, default=4096)
    ap.add_argument("--node-gpus", type=int, default=0)
    ap.add_argument("--pod-pids-limit", type=int, default=1024, help="the fake kubelet's podPidsLimit")
    ap.add_argument("--unpullable", action="append", default=[], help="an image whose pull fails (ErrImagePull)")
    ap.add_argument("--agent-sandbox", action="store_true", help="serve agent-sandbox's kinds (CRDs installed)")
    return ap


async def main(args: argparse.Namespace) -> None:
    fake = Fake(args)
    app = web.Application(middlewares=[fake.middleware], client_max_size=8 << 20)
    app.router.add_route("*", "/fake/{what}", fake.control)
    app.router.add_route("*", "/{tail:.*}", fake.api)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    Path(args.kubeconfig).write_text(kubeconfig(url))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(json.dumps({"url": url, "kubeconfig": args.kubeconfig, "pid": os.getpid()}), flush=True)
    await stop.wait()
    await fake.close()
    await runner.cleanup()


class FakeCluster:
    """The fake as a process of its own (so its CPU is not the env server's): `with FakeCluster(kubelet="docker") as
    fake:` gives `fake.kubeconfig`, `fake.control(what, **body)` and `fake.stats()`; leaving stops it (its containers
    and network go)."""

    def __init__(self, *, kubelet: str = "stub", **options: object):
        self.kubelet, self.options = kubelet, options
        self.process = None

    def __enter__(self) -> FakeCluster:
        import subprocess

        self.dir = tempfile.mkdtemp(prefix="air-k8s-fake-cfg-")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        argv = [sys.executable, __file__, "--kubelet", self.kubelet, "--kubeconfig", self.kubeconfig]
        for key, value in self.options.items():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                argv += [f"--{key.replace('_', '-')}"] + ([] if item is True else [str(item)])
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fake Kubernetes API server did not start (exit {self.process.wait()})")
        self.url = json.loads(line)["url"]
        return self

    def control(self, what: str, **body: object) -> dict:
        import urllib.request

        request = urllib.request.Request(f"{self.url}/fake/{what}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def stats(self) -> dict:
        return self.control("stats")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except Exception:  # noqa: BLE001
                self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the warden's protocol, for the stub kubelet
    asyncio.run(main(parser().parse_args()))
