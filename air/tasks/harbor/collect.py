"""Harbor's `[[verifier.collect]]` and `artifacts`: what of the agent's work a verifier is given.

`[[verifier.collect]]`: commands that gather what the agent left into /logs/artifacts before the tests.

Harbor runs each in the agent's environment once the agent is done (as its default user, root), then hands the
verifier the declared artifacts (`/logs/artifacts` always). A typical one is file-derived: `cd /app && git diff
BASE HEAD > /logs/artifacts/model.patch`. air runs them in the scoring cell, on the copy of the workspace, just before
tests/test.sh: what a command reads there is what the agent left in its working directory. It runs them as the
agent's user, not root: the files it reads are the agent's (a repository's config can make `git diff` run a program
of the agent's), so whatever they make it do is the agent's own doing, with the agent's rights. /logs/artifacts is
the agent's while they run; then every process they left is killed and it becomes root's, read-only to the tests'
others. A command that needs the agent's live environment (a service's state) cannot be honoured: the loader refuses
one that names a service other than the main one.
"""

from __future__ import annotations

import logging
import shlex

from air.images.dockerfile import HARBOR_DIR
from air.sandbox import WORKSPACE, Sandbox
from air.tasks.spec import TaskSpec

log = logging.getLogger("air.scoring")
ARTIFACTS = f"{HARBOR_DIR}/logs/artifacts"
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
                                                timeout=300)
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


__all__ = ["keep_artifacts", "run_collect"]
