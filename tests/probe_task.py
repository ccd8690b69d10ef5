"""A task whose evaluation runs the agent's submission, `run.sh`, as the agent in the scoring sandbox (as the
evaluation kit runs a submission's code) and reports what it printed and the fingerprint it wrote beside its score:
how the tests act as code under evaluation."""

from __future__ import annotations

import json
from pathlib import Path

PROBE_TASK = '''
id = "cells-probe"
name = "Code under evaluation, probed"
version = 1
image = "cpu"
description = "The submission's run.sh runs as the agent in the scoring sandbox; the evaluation reports what it wrote."

[evaluation]
entry = "evaluate.py"
submission = ["run.sh"]
timeout = 300

[baseline]
scores = { score = 1.0 }

[[metrics]]
name = "score"
direction = "higher"
primary = true
'''
# The evaluation (root in the scoring sandbox, holding the hidden data) runs the submission as the agent, as the
# evaluation kit does, and reports the fingerprint its code wrote beside the score.
PROBE_EVALUATE = r'''
import json, os, shutil, subprocess
uid = int(os.environ.get("AIR_AGENT_UID", "1000"))  # 1000 before each sandbox had its own
work = "/tmp/work"
os.mkdir(work)
shutil.copy(os.path.join(os.environ["AIR_SUBMISSION_DIR"], "run.sh"), work)
os.chown(work, uid, uid)
def as_agent():
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
with open("/tmp/output.txt", "wb") as out:  # a file, not a pipe: daemons the code leaves may hold it open
    hidden = os.path.join(os.environ["AIR_SECRET_DIR"], "hidden.txt")
    subprocess.run(["bash", "run.sh"], cwd=work, preexec_fn=as_agent, stdout=out, stderr=subprocess.STDOUT,
                   timeout=280, env={"HOME": work, "PATH": os.environ["PATH"], "LANG": "C.UTF-8",
                                     "HIDDEN": open(hidden).read() if os.path.exists(hidden) else ""})
fp = os.path.join(work, "fp.json")
report = {"score": 1.0, "output": open("/tmp/output.txt", "rb").read().decode(errors="replace")[-3000:]}
if os.path.exists(fp):
    report["fingerprint"] = json.load(open(fp))
with open(os.environ["AIR_METRICS_FILE"], "w") as f:
    json.dump(report, f)
'''


def make_probe_task(root: Path, hidden: str | None = None):
    """The probe task; with `hidden`, a secret file (secret/hidden.txt) the evaluation reads, and gives the
    submission's code in $HIDDEN: code that saw hidden data."""
    task = root / "tasks" / "cells-probe"
    (task / "starter").mkdir(parents=True)
    (task / "task.toml").write_text(PROBE_TASK)
    (task / "evaluate.py").write_text(PROBE_EVALUATE)
    (task / "starter" / "run.sh").write_text("true\n")
    if hidden is not None:
        (task / "secret").mkdir()
        (task / "secret" / "hidden.txt").write_text(hidden)
    from air.tasks.air_format.loader import load_air_task

    return load_air_task(task)


def capture_reports(monkeypatch) -> list[str]:
    """Every raw metrics report the scorer reads from now on (the evaluation's own words, fingerprint included)."""
    from air.tasks.air_format import contract

    reports: list[str] = []
    real = contract.metrics_outcome  # an air task's reading (air/tasks/air_format/contract.py)
    monkeypatch.setattr(contract, "metrics_outcome", lambda spec, raw: reports.append(raw) or real(spec, raw))
    return reports


async def evaluated(env, sandbox, script: str, reports: list) -> dict:
    """The agent writes run.sh and validates; what the evaluation reported (read where the scorer reads metrics)."""
    r = await sandbox.session.run(f"cat > run.sh <<'AIR_RUN_EOF'\n{script}\nAIR_RUN_EOF")
    assert r.exit_code == 0, r.stderr
    reports.clear()
    outcome = await env.evaluate(sandbox)
    assert outcome.ok, outcome
    await env.pool.wait_idle()  # the scorer's reset (in the background) is done: the next evaluation gets it back
    return json.loads(reports[-1])
