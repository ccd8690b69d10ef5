"""The `enroot` backend: air's sandboxes as enroot containers a non-root user starts on this machine (a Slurm node
without Docker; `PoolConfig(backend="enroot")`, AIR_BACKEND=enroot), with the same warden and cells as on Docker.
docs/hpc.md is the design note; this package:

| module | its job |
| --- | --- |
| launcher.py | the launcher interface, enroot with air's configuration, the user namespace of subordinate uids |
| cgroups.py | limits from cgroup folders the node delegated to the user, and which are missing |
| sandbox.py | `EnrootSandbox`: a container as `air.sandbox.interface.Sandbox`, its warden on a host socket |
| pool.py | `EnrootPool`: containers per key, leases, reset on release, the sweep of dead runs' leftovers |
| probe.py | what `air doctor` says about the node |

Images are squashfs files (air/squashfs.py names them; `air images export-squashfs` makes them where Docker is).
"""
