"""Harbor's `[[verifier.collect]]` and `artifacts`: what of the agent's work a verifier is given.

`[[verifier.collect]]`: commands that gather what the agent left into /logs/artifacts before the tests.

Harbor runs each in the agent's environment once the agent is done (as its default user, root), then hands the
verifier the declared artifacts (`/logs/artifacts` always). A typical one is file-derived: `cd /app && git diff
BASE HEAD > /logs/artifacts/model.patch`. air runs them in the scoring cell, on the copy of the workspace, just before
tests/test.sh: what a command reads there is what the agent left in its working directory. It runs them as the
agent's user, not root: the files it reads are the agent's (a repository's config can make `git diff` run a program
of the agent's), so whatever they make it do is the agent's own doing, with the agent's rights. /logs/artifacts is
the agent's while they run; then every process they left is killed and it becomes root's, read-only to the tests'
others. 
A hook with `service = "db"` (a service of the task's compose file) snapshots that service's state, and an artifact
with `service` and an absolute `source` is copied out of it (Harbor's per-service exec and copy): air runs such a
hook in the rollout's own service container before each evaluation (`from_services`), as the hook's user or the
service's, and copies each such artifact out of it to /logs/artifacts/<destination> in the scoring cell. What a
service holds is the rollout's doing (the agent talks to it): only regular files and folders are taken, each
under its destination, root's, FROM_SERVICES_LIMIT bytes in all at most; a link, a device, a name with `..` is
left out.
"""

from __future__ import annotations

import io
import logging
import posixpath
import shlex
import tarfile

from air.images.dockerfile import HARBOR_DIR
from air.sandbox import BASE_PATH, WORKSPACE, Sandbox
from air.tasks.spec import TaskSpec

log = logging.getLogger("air.scoring")
ARTIFACTS = f"{HARBOR_DIR}/logs/artifacts"
FROM_SERVICES_LIMIT = 64 << 20
"""Bytes of service artifacts a test is given at most (each artifact's tar is read no further)."""
HOME = "/tmp/air-collect-home"
"""The commands' HOME (`git config --global` writes there): the scoring cell's home is the workspace copy's, root's."""
GITCONFIG = "[safe]\n\tdirectory = *\n"
"""Their git's global configuration: the copy is root's, and git refuses a repository its user does not own
("dubious ownership"; `git diff` outside a repository is then a usage error, exit 129, and the patch empty). The
repository's config is the agent's, and these commands run as the agent: trusting it gives the agent nothing."""


async def run_collect(scorer: Sandbox, spec: TaskSpec) -> None:
    """Each collect command, in order, as the agent in the scorer's cell (a failed one is logged; as in Harbor, the
    tests then run on what was gathered); then a separate verifier's view of the workspace (`keep_artifacts`)."""
    await _collect(scorer, spec)
    await keep_artifacts(scorer, spec)


async def keep_artifacts(scorer: Sandbox, spec: TaskSpec) -> None:
    """A separate verifier sees its image's own working directory with the declared artifacts over it, as Harbor
    uploads them, not the agent's whole copy: a test that applies /logs/artifacts/model.patch to a pristine /app gets
    one. `spec.verifier_artifacts` names what of the copy stays (workspace-relative; "." all of it)."""
    kept = spec.verifier_artifacts
    if kept is None or "." in kept:
        return
    image = spec.image_workspace or "/opt/air/workspace"
    copy = "/tmp/air-agent-copy"
    steps = [f"rm -rf {copy} && mkdir -p {copy} && cp -a {WORKSPACE}/. {copy}/",
             f"find {WORKSPACE} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +",
             f"if [ -d {image} ]; then cp -a {image}/. {WORKSPACE}/; fi"]
    for rel in kept:
        source, dest = shlex.quote(f"{copy}/{rel}"), shlex.quote(f"{WORKSPACE}/{rel}")
        steps.append(f"if [ -e {source} ] || [ -L {source} ]; then rm -rf {dest} && mkdir -p \"$(dirname {dest})\" "
                     f"&& cp -a --no-dereference {source} {dest}; fi")
    steps.append(f"rm -rf {copy}")
    result = await scorer.session.run_untrusted(["bash", "-c", " && ".join(steps)], user="root", cwd="/",
                                                env={"PATH": BASE_PATH}, timeout=300, whole_env=True)
    if result.exit_code != 0:
        log.warning("task %s: the separate verifier's workspace could not be laid out: %s", spec.id,
                    (result.stderr or result.stdout).strip()[-400:])


async def _collect(scorer: Sandbox, spec: TaskSpec) -> None:
    if not spec.verifier_collect:
        return
    uid = scorer.agent_uid
    await scorer.harness_sh(f"mkdir -p {ARTIFACTS} && chown {uid}:{uid} {ARTIFACTS}")
    for hook in spec.verifier_collect:
        script = f"mkdir -p {HOME} && export HOME={HOME} && printf {shlex.quote(GITCONFIG)} > {HOME}/.gitconfig && " \
                 f"{hook.command}"
        result = await scorer.session.run_untrusted(["bash", "-c", script], user="agent", cwd=WORKSPACE,
                                                    timeout=hook.timeout, reap=True)
        if result.timed_out or result.exit_code != 0:
            log.warning("task %s: [[verifier.collect]] `%s` %s: %s", spec.id, hook.command[:120],
                        "timed out" if result.timed_out else f"exited with {result.exit_code}",
                        (result.stderr or result.stdout).strip()[-400:])
    # Every process of theirs is gone (reap); what they gathered is data now, root's, as the tests' inputs are.
    await scorer.harness_sh(f"chown -hR 0:0 {shlex.quote(ARTIFACTS)} && chmod -R go-w {shlex.quote(ARTIFACTS)}")


async def from_services(services, spec: TaskSpec) -> bytes | None:
    """Each service collect hook in its service of this rollout, then each service artifact copied out of it: a
    tar of what the test finds under /logs/artifacts (None: the task has neither). A hook that fails is logged,
    as Harbor's are (best effort); an artifact that is missing or over the limit is left out, logged."""
    if not (spec.service_collect or spec.service_artifacts):
        return None
    for hook in spec.service_collect:
        code, output = await services.exec(hook.service, hook.command, user=hook.user, timeout=hook.timeout)
        if code != 0:
            log.warning("task %s: [[verifier.collect]] in service %s `%s` %s: %s", spec.id, hook.service,
                        hook.command[:120], "timed out" if code is None else f"exited with {code}", output[-400:])
    out, left = io.BytesIO(), FROM_SERVICES_LIMIT
    with tarfile.open(fileobj=out, mode="w") as tar:
        for artifact in spec.service_artifacts:
            got = await services.archive(artifact.service, artifact.source, left)
            if got is None:
                log.warning("task %s: artifact %s of service %s is missing or over %d MB in all", spec.id,
                            artifact.source, artifact.service, FROM_SERVICES_LIMIT >> 20)
                continue
            left -= _take(got, artifact.destination, tar)
    return out.getvalue()


def _take(archive: bytes, destination: str, into: tarfile.TarFile) -> int:
    """Docker's tar of a service's path, its regular files and folders put under `destination` (its top entry is the
    source's own name, which becomes the destination), root's; the bytes taken."""
    taken = 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            parts = member.name.split("/")
            if not (member.isfile() or member.isdir()) or ".." in parts or member.name.startswith("/"):
                continue
            name = posixpath.normpath(posixpath.join(destination, *parts[1:]))
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.mtime = (0o755 if member.isdir() else 0o644), 0, 0, member.mtime
            if member.isdir():
                info.type = tarfile.DIRTYPE
                into.addfile(info)
                continue
            data = tar.extractfile(member).read()
            info.size = len(data)
            into.addfile(info, io.BytesIO(data))
            taken += len(data)
    return taken


__all__ = ["FROM_SERVICES_LIMIT", "from_services", "keep_artifacts", "run_collect"]
