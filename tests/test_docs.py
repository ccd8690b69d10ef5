"""The pages stay true: every command shown in README.md and docs/*.md (each line of a ```bash block) is run here,
or parsed against the command line it names, or listed in RULES as not run with the reason; a shown command no rule
covers fails the test, so a new one must be classified. Every `air ...` named in the pages' prose (an inline code
span) must name a real command and real flags of it. And the README stays a front door (at most 150 lines).

How a command is checked (RULES, first match wins; `a && b` is checked part by part):
- run: for real, through bash in a fresh folder with its own HOME (a fake MLGym checkout at ~/MLGym, the Harbor
  fixture dataset at ~/datasets/my-dataset, two finished episodes in runs/), exit 0 expected; a server started
  with `&` is started, seen listening, and stopped;
- parse: `air ...` against air's own click commands (every group, subcommand, option and argument must parse, as
  they would before the command runs); an example script with `--help` appended (argparse checks the flags before);
- not run: with the reason (a GPU node, the network, the suite itself); what runs it instead, where anything does.
"""

from __future__ import annotations

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

RUN, PARSE, HELP, NOT_RUN = "run", "parse", "help", "not run"
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
    (r"^AIR_BACKEND=enroot air (doctor|run)\b", NOT_RUN, "needs enroot, subordinate uids and squashfs images: "
                                                        "tests/test_enroot.py runs both as a non-root user"),
    (r"^scripts/slurm-local\.sh deps up$", NOT_RUN, "installs and starts a Slurm cluster as root; by hand"),
    (r"^eval \"\$\(scripts/slurm-local\.sh env\)\"$", NOT_RUN, "names the cluster above's slurm.conf"),
    (r"^sbatch examples/slurm/episode\.sbatch", NOT_RUN, "needs the cluster above and enroot; ran by hand "
                                                       "(docs/hpc.md), and tests/test_enroot.py runs it through srun"),
    (r"^git clone ", NOT_RUN, "the network (MLGym's checkout); the commands after it run on a fake checkout here"),
    (r"^uv run ", NOT_RUN, "prime-rl on a GPU node; its configs are validated by tests/test_configs.py"),
    (r"^vf-eval ", NOT_RUN, "starts Docker rollouts for minutes; tests/test_vf_eval.py runs vf-eval on air for real"),
    (r"^ruff check \.$", RUN, "lint, cheap"),
    (r"^python3 air/sandbox/gpus\.py cdi-spec ", NOT_RUN, "writes /etc/cdi on a GPU node, as root; "
                                                          "tests/test_gpu.py checks the spec it writes"),
    (r"^air tasks show mlgym:tasks/titanic\.yaml", PARSE, "needs a real MLGym checkout "
                                                          "(tests/test_mlgym_bench.py, with AIR_MLGYM_CHECKOUT)"),
    (r"^air serve model --port \d+ &$", NOT_RUN, "a real model's server: tests/test_model_server.py starts it and "
                                                 "judges its answers with OpenAI's client"),
    (r"^air (tasks (list|show)|view|--version)\b", RUN, "no Docker needed"),
    (r"^air ", PARSE, "starts sandboxes, images or a server (each run by its own tests)"),
    (r"^python -m air\.policies\.scripted_server --port \d+ &$", RUN, "a server: started, seen listening, stopped"),
    (r"^python examples/plot_trl_grpo\.py ", RUN, "draws the committed results"),
    (r"^python examples/grpo_real_model\.py .*--out runs/learning/\$task", NOT_RUN, "the loop above"),
    (r"^python examples/grpo_real_model\.py", HELP, "trains a real model for an hour with Docker "
                                                    "(tests/test_real_model_training.py runs a smoke of it)"),
    (r"^python examples/plot_learning\.py ", RUN, "draws the committed results"),
    (r"^for seed in 0 1 2; do for task in ", NOT_RUN, "twelve real-model runs, hours of CPU: examples/results/learning "
                                                      "holds their records"),
    (r"^for seed in ", NOT_RUN, "six 40-step trainings, about an hour of CPU: examples/results/ holds their records"),
    (r"^(python examples/trl_grpo_cpu\.py .*--out runs/seeds|done; done$|done; done; done$)", NOT_RUN,
     "the loop above"),
    (r"^python examples/trl_grpo_cpu\.py", HELP, "trains for minutes with Docker (tests/test_trl_grpo.py runs it)"),
    (r"^python examples/fork_grpo\.py", HELP, "forks rollouts with Docker (tests/test_fork.py runs it)"),
    (r"^scripts/gvisor-docker\.sh$", NOT_RUN, "installs runsc and gives it to dockerd, as root; "
                                              "the test set-up runs it"),
    (r"^AIR_DOCKER_RUNTIME=runsc air run ", NOT_RUN, "sandboxes under gVisor: tests/test_gvisor.py runs them"),
    (r"^PYTHONPATH=\$AIR harbor run ", NOT_RUN, "Harbor's runner in a Python 3.12 environment of its own; "
                                               "tests/test_harbor_environment.py runs exactly this for real"),
]


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


def parts(command: str) -> list[str]:
    return [part.strip() for part in command.split(" && ")]


def rule_of(part: str) -> tuple[str, str]:
    for pattern, how, why in RULES:
        if re.search(pattern, part):
            return how, why
    raise AssertionError(f"no rule in tests/test_docs.py covers `{part}`: run it, parse it or say why not")


COMMANDS = shown_commands()
PARTS = sorted({part for _, _, command in COMMANDS for part in parts(command)})


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
    for part in PARTS:
        rule_of(part)


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


@pytest.mark.parametrize("part", [p for p in PARTS if rule_of(p)[0] == PARSE])
def test_an_air_command_parses(part):
    args = [os.path.expanduser(arg) for arg in shlex.split(part)]
    assert args[0] == "air"
    air_context(args[1:])


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
    dataset at ~/datasets/my-dataset and two finished episodes in runs/ (no Docker)."""
    import shutil

    from airs_bench import write_suite
    from test_cli_round_three import episodes
    from test_mlgym import write_tree

    write_tree(tmp_path / "MLGym")
    write_suite(tmp_path / "airs-bench" / "airsbench" / "tasks")
    shutil.copytree(ROOT / "tests" / "fixtures" / "harbor", tmp_path / "datasets" / "my-dataset")
    episodes(tmp_path)
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("part", [p for p in PARTS if rule_of(p)[0] == RUN])
def test_a_cheap_command_runs(part, home):
    env = {**os.environ, "HOME": str(home), "AIR_HIDDEN_DRAW": "reference", "PYTHONPATH": str(ROOT),
           "COLUMNS": "100"}
    command = part.replace("python ", f"{sys.executable} ", 1) if part.startswith("python ") else part
    command = re.sub(r"^air ", f"{sys.executable} -m air.cli.main ", command)
    cwd = ROOT if part.startswith(("ruff", "python examples/")) else home
    command = re.sub(r" -o examples/\S+", f" -o {home}/drawn.png", command)  # the committed plot stays as it is
    if command.endswith("&"):  # a server: on a free port (the page's may be taken on a shared machine)
        port = free_port()
        command = re.sub(r"--port \d+", f"--port {port}", command[:-1])
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        return
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"`{part}` exited {proc.returncode}: {proc.stderr[-2000:]}"


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
