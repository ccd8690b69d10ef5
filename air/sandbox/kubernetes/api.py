"""The one door to the Kubernetes API server: kubernetes_asyncio's client (its kubeconfig, in-cluster and exec-plugin
auth, TLS, connection pool) with air's rules on top, as docker_api.py does for Docker:

- every request has a deadline and runs under a bound on requests in flight (`api_concurrency`);
- engine failures are retried with bounds, and named when they stop: 429 (after its Retry-After), 5xx, timeouts and
  dropped connections (`api_attempts` tries in all), and a 409 Conflict, the API server's optimistic concurrency
  failing on some object the request touched (under many creates at once, the ResourceQuota's: 'Operation cannot be
  fulfilled on resourcequotas "air-slots": the object has been modified'): air sends no resourceVersion, so the
  same request again is right; a 409 AlreadyExists, and only that, of a create that a retry sent twice is the
  caller's own object (`create` answers it); 410 Gone ends a watch, which the caller lists anew;
- pod creations go through a token bucket (`create_rate`), so a GRPO step's burst does not meet the API server's
  fairness limits as a storm of 429s;
- every request is counted by verb and kind (`calls`): the figures of docs/kubernetes.md and bench/.

Bodies are the wire's JSON as dicts (manifests.py renders them): no model objects, so that a lease costs little CPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator

from air.errors import InfraError, SandboxUnavailable, UsageError
from air.sandbox.kubernetes.config import KubernetesConfig

log = logging.getLogger("air.kubernetes")

KINDS = {  # plural -> API prefix
    "pods": "/api/v1", "secrets": "/api/v1", "configmaps": "/api/v1", "resourcequotas": "/api/v1",
    "events": "/api/v1",
    "leases": "/apis/coordination.k8s.io/v1", "networkpolicies": "/apis/networking.k8s.io/v1",
    "sandboxtemplates": "/apis/extensions.agents.x-k8s.io/v1alpha1",
    "sandboxwarmpools": "/apis/extensions.agents.x-k8s.io/v1alpha1",
    "sandboxclaims": "/apis/extensions.agents.x-k8s.io/v1alpha1",
    "sandboxes": "/apis/agents.x-k8s.io/v1alpha1",
}
RETRIED = {429: "throttled (429)", 500: "server error (500)", 502: "bad gateway (502)", 503: "unavailable (503)",
           504: "gateway timeout (504)"}
CONFLICTED = "conflict (409)"
ALREADY_EXISTS = "AlreadyExists"


class ApiError(InfraError):
    """The API server refused or failed a request: infrastructure, never the agent's."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"Kubernetes API: {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 AlreadyExists: a create of a name that is taken (a 409 Conflict, reason "Conflict", is retried)."""


class Gone(ApiError):
    """410: the resourceVersion a watch or a list asked from is older than the server keeps: list anew."""


class QuotaExceeded(ApiError):
    """403 from the ResourceQuota admission: the namespace's slots are all taken (wait, as for a Docker slot)."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _check_kubeconfig(chosen: str, where: str) -> None:
    """UsageError, naming the file and where it was named, unless each kubeconfig file `chosen` names exists and
    is YAML (the client would raise its parser's error, or print "Config not found" and go on to a wrong fix)."""
    import yaml

    for path in (p for p in chosen.split(os.pathsep) if p):
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except FileNotFoundError:
            raise UsageError(f"{where}={chosen}: {path}: no such file; point {where} at your cluster's kubeconfig "
                             "(kubectl's ~/.kube/config)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{where}={chosen}: {path} cannot be read ({_first_line(exc)})") from None
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())[:200]
            raise UsageError(f"{where}={chosen}: {path} is not a kubeconfig: not YAML ({problem})") from None
        if not isinstance(data, dict):
            raise UsageError(f"{where}={chosen}: {path} is not a kubeconfig (not a YAML mapping)")


class ApiUnavailable(ApiError, SandboxUnavailable):
    """The API server did not answer within `api_attempts` tries (what was met is named)."""


def _reason(body: bytes) -> str:
    """A Status answer's reason ("" when the body is not one)."""
    try:
        return str(json.loads(body).get("reason") or "")
    except (ValueError, AttributeError):
        return ""


def _error(status: int, body: bytes) -> ApiError:
    try:
        status_obj = json.loads(body)
        reason, message = status_obj.get("reason") or "", status_obj.get("message") or ""
    except (ValueError, AttributeError):
        reason, message = "", body[:300].decode("utf-8", "replace")
    if status == 404:
        return NotFound(status, reason or "NotFound", message)
    if status == 409:
        return Conflict(status, reason or "Conflict", message)
    if status == 410:
        return Gone(status, reason or "Expired", message)
    if status == 403 and "exceeded quota" in message:
        return QuotaExceeded(status, reason or "Forbidden", message)
    return ApiError(status, reason, message)


class TokenBucket:
    """`rate` per second, bursts of `burst`: pods created no faster than the cluster is asked to take them."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, float(burst), time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)


class KubeApi:
    def __init__(self, config: KubernetesConfig):
        self.config = config
        self.namespace = config.namespace
        self.calls: Counter[str] = Counter()
        """Requests sent, by "VERB kind" (a retry is another request)."""
        self.retries: Counter[str] = Counter()
        """Retries, by what was met (throttled (429), timeout, ...)."""
        self._client = None
        self._gate = asyncio.Semaphore(config.api_concurrency)
        self.creates = TokenBucket(config.create_rate, config.api_concurrency)

    # ----- set-up -----------------------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Load the kubeconfig (or the pod's service account) and make the client; SandboxUnavailable with the reason
        when there is none."""
        if self._client is not None:
            return
        try:
            from kubernetes_asyncio import client, config
        except ImportError:
            raise ApiUnavailable(0, "NoClient", "the kubernetes backend needs kubernetes-asyncio: pip install "
                                 "'air-mlgym[kubernetes]'") from None

        configuration = client.Configuration()
        chosen = self.config.kubeconfig or os.environ.get("KUBECONFIG", "")
        where = "PoolConfig.kubernetes.kubeconfig" if self.config.kubeconfig else "KUBECONFIG"
        if chosen:
            _check_kubeconfig(chosen, where)
        elif not _in_cluster() and not os.path.exists(home := os.path.expanduser("~/.kube/config")):
            # Nothing to load: said as missing (the client would print "Config not found" on stdout, then call
            # the absent file an invalid one)
            raise ApiUnavailable(0, "NoConfig", f"no cluster to talk to (no kubeconfig: KUBECONFIG is unset and "
                                 f"{home} does not exist, and this is not a pod); set KUBECONFIG or "
                                 "PoolConfig.kubernetes.kubeconfig")
        try:
            if self.config.kubeconfig or not _in_cluster():
                # $KUBECONFIG read now: the client reads it once, when first imported (a single file; a list of
                # several is left to the client's own merging).
                await config.load_kube_config(config_file=None if not chosen or os.pathsep in chosen else chosen,
                                              context=self.config.context, client_configuration=configuration,
                                              persist_config=False)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except (config.ConfigException, OSError, TypeError, ValueError) as exc:
            if chosen:  # a file was named and read: what is wrong is in it, and setting KUBECONFIG is not the fix
                raise UsageError(f"the kubeconfig {chosen} ({where}) cannot be used: {_first_line(exc)}; fix it, or "
                                 f"point {where} at another") from None
            raise ApiUnavailable(0, "NoConfig", f"no cluster to talk to ({_first_line(exc)}); set KUBECONFIG or "
                                 "PoolConfig.kubernetes.kubeconfig") from None
        self._client = client.ApiClient(configuration)
        self.host = configuration.host

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ----- requests ---------------------------------------------------------------------------------------------------
    def path(self, kind: str, name: str | None = None, namespace: str | None = None, sub: str = "") -> str:
        ns = namespace or self.namespace
        path = f"{KINDS[kind]}/namespaces/{ns}/{kind}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    async def request(self, method: str, path: str, *, kind: str, query: dict | None = None, body: object = None,
                      content_type: str = "application/json", timeout: float | None = None, text: bool = False
                      ) -> dict | str:
        """One request, retried on what the engine may get over (see the module's docstring); the JSON answer (with
        `text`: the answer as text), or the ApiError of a refusal."""
        met: list[str] = []
        for attempt in range(1, self.config.api_attempts + 1):
            try:
                status, data, retry_after = await self._send(method, path, query, body, content_type, kind, timeout,
                                                             "*/*" if text else "application/json")
            except (asyncio.TimeoutError, OSError, _client_errors()) as exc:
                what = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"connection ({type(exc).__name__})"
                met.append(what)
                retry_after = None
            else:
                if 200 <= status < 300:
                    if text:
                        return data.decode("utf-8", "replace")
                    return json.loads(data) if data else {}
                if status == 409 and _reason(data) != ALREADY_EXISTS:
                    met.append(CONFLICTED)
                elif status not in RETRIED:
                    raise _error(status, data)
                else:
                    met.append(RETRIED[status])
            self.retries[met[-1]] += 1
            if attempt == self.config.api_attempts:
                break
            delay = retry_after if retry_after is not None else min(5.0, 0.2 * 2 ** (attempt - 1))
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        counts = Counter(met)
        raise ApiUnavailable(0, "Unavailable", f"{method} {path} failed {len(met)} times: "
                             + ", ".join(f"{n}x {what}" for what, n in counts.items()))

    async def _send(self, method: str, path: str, query: dict | None, body: object, content_type: str, kind: str,
                    timeout: float | None, accept: str = "application/json") -> tuple[int, bytes, float | None]:
        import aiohttp

        if self._client is None:
            raise ApiUnavailable(0, "Closed", "the Kubernetes client is closed")
        self.calls[f"{method} {kind}"] += 1
        async with self._gate:
            response = await self._client.call_api(
                path, method, query_params=list((query or {}).items()),
                header_params={"Accept": accept, "Content-Type": content_type}, body=body,
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=timeout or self.config.request_timeout))
            try:
                data = await response.read()
            finally:
                response.release()
        retry_after = response.headers.get("Retry-After")
        return response.status, data, float(retry_after) if retry_after and retry_after.isdigit() else None

    # ----- verbs ------------------------------------------------------------------------------------------------------
    async def create(self, kind: str, body: dict, *, mine: str | None = None) -> dict:
        """Create; a 409 AlreadyExists is this caller's own object when a retry sent the create twice and the object
        carries `mine` as its air/sandbox label (or `mine` is "*"): then it is read and returned. (A 409 Conflict
        on another object, the quota's, never reaches here: `request` retries it.)"""
        namespace = body["metadata"].get("namespace")
        try:
            return await self.request("POST", self.path(kind, namespace=namespace), kind=kind, body=body)
        except Conflict as exc:
            if mine is None or exc.reason != ALREADY_EXISTS:
                raise
            existing = await self.get(kind, body["metadata"]["name"], namespace=namespace)
            if mine != "*" and existing["metadata"].get("labels", {}).get("air/sandbox") != mine:
                raise
            return existing

    async def get(self, kind: str, name: str, *, namespace: str | None = None) -> dict:
        return await self.request("GET", self.path(kind, name, namespace), kind=kind)

    async def log(self, pod: str, *, tail: int = 20) -> str:
        """The last `tail` lines a pod's container wrote (the pod's log subresource)."""
        return await self.request("GET", self.path("pods", pod, sub="log"), kind="pods/log",
                                  query={"tailLines": str(tail)}, text=True)

    async def list(self, kind: str, selector: str = "", *, namespace: str | None = None) -> dict:
        query = {"labelSelector": selector} if selector else {}
        return await self.request("GET", self.path(kind, namespace=namespace), kind=kind, query=query)

    async def patch(self, kind: str, name: str, body: dict, *, namespace: str | None = None) -> dict:
        return await self.request("PATCH", self.path(kind, name, namespace), kind=kind, body=body,
                                  content_type="application/merge-patch+json")

    async def delete(self, kind: str, name: str, *, namespace: str | None = None, grace: int | None = 0,
                     propagation: str = "Background") -> None:
        """Delete; a 404 is fine (it is gone, which is what was asked)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            await self.request("DELETE", self.path(kind, name, namespace), kind=kind, body=body)
        except NotFound:
            pass

    async def delete_collection(self, kind: str, selector: str, *, namespace: str | None = None) -> None:
        await self.request("DELETE", self.path(kind, namespace=namespace), kind=kind,
                           query={"labelSelector": selector, "gracePeriodSeconds": "0",
                                  "propagationPolicy": "Background"})

    async def group_installed(self, group_version: str, resource: str) -> bool:
        """Discovery: whether the API server serves `resource` in `group_version` (an installed CRD)."""
        try:
            found = await self.request("GET", f"/apis/{group_version}", kind="discovery")
        except (NotFound, ApiError):
            return False
        return any(r.get("name") == resource for r in found.get("resources", []))

    async def watch(self, kind: str, selector: str, resource_version: str, *, seconds: int = 300
                    ) -> AsyncIterator[dict]:
        """The events of `kind` matching `selector` after `resource_version`, as the server sends them (ADDED,
        MODIFIED, DELETED, BOOKMARK), until the server ends the watch (`seconds`) or the connection drops. Gone when
        the version is too old (as a 410 answer, or an ERROR event carrying one)."""
        import aiohttp

        if self._client is None:
            raise ApiUnavailable(0, "Closed", "the Kubernetes client is closed")
        query = [("watch", "true"), ("labelSelector", selector), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(seconds))]
        self.calls[f"WATCH {kind}"] += 1
        response = await self._client.call_api(
            self.path(kind), "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=seconds + 30, sock_connect=self.config.request_timeout))
        try:
            if response.status != 200:
                raise _error(response.status, await response.read())
            while True:
                line = await response.content.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise _error(int(obj.get("code") or 500), json.dumps(obj).encode())
                yield event
        finally:
            response.release()


def _client_errors() -> type[BaseException]:
    import aiohttp

    return aiohttp.ClientError


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (
        os.environ.get("KUBECONFIG") or os.path.exists(os.path.expanduser("~/.kube/config")))
