"""The Docker backend (`PoolConfig.backend = "docker"`, the default): a sandbox is a Docker container of the task's
image, its warden the container's main process, on one Docker host or several.

container.py (the sandbox: a container's birth and death), pool.py (`DockerPool`: hosts, host-wide claims, page-cache
pins), docker_api.py (the SDK's calls, bounded and mapped to air's errors), claims.py (host-wide slots and GPUs as
containers), pagecache.py (the pins), services.py (a Harbor compose task's services on a private network), cleanup.py
(sweeps of dead runs). Everything else a sandbox is lies in the shared parts above (air/sandbox/): the interface, the
base sandbox and pool, the warden and its link, the spec.
"""
