"""The `kubernetes` backend: air's sandboxes as pods of a cluster (`PoolConfig(backend="kubernetes")`), with the same
warden, cells, limits and cleanup as on Docker. docs/kubernetes.md is the design note; this package:

| module | its job |
| --- | --- |
| config.py | `KubernetesConfig`, what `PoolConfig.kubernetes` holds (pydantic only) |
| manifests.py | every object air renders (the run's Lease, a pod and its Secret, the NetworkPolicy, ...) |
| api.py | the API client: kubeconfig, bounded and named retries (429, 5xx, timeouts), a create rate, calls counted |
| watch.py | one watch of the run's pods, shared by every sandbox: readiness and loss without polling per pod |
| sandbox.py | `PodSandbox`: a pod as `air.sandbox.interface.Sandbox`, its warden on the pod's own port |
| pool.py | `KubernetesPool`: warm pods per key, leases, reset on release, pods the cluster takes away replaced |
| sweep.py | the run's Lease kept alive, and the sweep of runs whose Lease expired |
| probe.py | what `air doctor` says about the cluster |

Importing this package (or config.py) imports no Kubernetes client: a config validates anywhere.
"""
