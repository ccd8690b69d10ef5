"""`air debug` at the keyboard, from the outside: in a real pseudo-terminal (line editing and history, local
commands that cost no turn, Ctrl-C that interrupts the command and not the session) and through a plain pipe
with --json. Only behaviour is asserted, never how long something took: the test machine is busy."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pexpect
import pytest

pytestmark = pytest.mark.docker

BANNER = re.compile(r"in container [0-9a-f]+ \((air-prisoners-dilemma-[0-9a-f]+)\)")
UP = "\x1b[A"  # what the Up arrow key sends


def spawn(env: dict[str, str]) -> tuple[pexpect.spawn, io.StringIO, str]:
    """`air debug prisoners-dilemma` in a pty; returns the child, its transcript and its container's name."""
    child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "debug", "prisoners-dilemma"], encoding="utf-8",
                          timeout=120, dimensions=(40, 200), env={**os.environ, **env})
    transcript = io.StringIO()
    child.logfile_read = transcript
    child.expect(BANNER)
    return child, transcript, child.match.group(1)


def container_names(docker_client) -> set[str]:
    """Every container's name, from one listing: the SDK's list inspects each container after, and one that another
    test's worker removes in between is a 404."""
    return {name.lstrip("/") for row in docker_client.api.containers(all=True) for name in row.get("Names") or []}


def finish(child: pexpect.spawn, docker_client, name: str) -> None:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert name not in container_names(docker_client), "air debug left its container"


def test_up_arrow_recalls_lines_of_this_and_earlier_sessions(images, docker_client, tmp_path):
    history = tmp_path / ".air_debug_history"
    history.write_text("echo from-history-$((6*7))\n")  # an earlier session's line
    child, transcript, name = spawn({"HOME": str(tmp_path)})
    try:
        child.expect(r"\[1\]\$ ")
        child.send(UP + "\r")
        child.expect("from-history-42")  # the shell's output, not the typed text: the line really ran
        child.expect(r"exit code 0")
        child.expect(r"\[2\]\$ ")
        child.sendline("echo marker-$((40+2))")
        child.expect("marker-42")
        child.expect(r"\[3\]\$ ")
        child.send(UP + "\r")
        child.expect("marker-42")
        child.expect(r"exit code 0")
        child.expect(r"\[4\]\$ ")
        child.sendline(":quit")
        finish(child, docker_client, name)
    finally:
        child.close(force=True)
    assert "^[[A" not in transcript.getvalue(), "the Up key was echoed instead of recalling a line"
    assert "echo marker-$((40+2))" in history.read_text().splitlines(), "the history was not saved"


def test_help_and_unknown_debug_commands_are_local_and_cost_no_turn(images, docker_client):
    child, _, name = spawn({})
    try:
        child.expect(r"\[1\]\$ ")
        child.sendline(":help")
        child.expect(r"validate")
        child.expect(r":raw REPLY")
        child.expect(r"Ctrl-C interrupts the running command")
        child.expect(r"\[1\]\$ ")  # still turn 1: nothing went to the sandbox
        child.sendline(":nope")
        child.expect(r"unknown debug command :nope; :help lists them")
        child.expect(r"\[1\]\$ ")
        child.sendline("echo turn-$((0+1))")
        child.expect(r"turn-1")
        child.expect(r"\[2\]\$ ")
        child.sendeof()  # Ctrl-D leaves
        finish(child, docker_client, name)
    finally:
        child.close(force=True)


def test_ctrl_c_interrupts_the_command_and_the_session_goes_on(images, docker_client, tmp_path):
    home = tmp_path / "not-a-directory"
    home.write_text("")  # HOME where no history can be read or written: the session must not mind
    child, transcript, name = spawn({"HOME": str(home)})
    try:
        child.expect(r"\[1\]\$ ")
        child.send("echo half-typed")
        child.expect("half-typed")  # readline has the line
        # At the prompt Ctrl-C clears the line and does not leave. Sent again if missed: readline notices a
        # signal only while it waits for a key, not while it is still drawing the last one (as in Python's REPL).
        for _ in range(12):
            child.sendintr()
            if child.expect([r"\^C\r\n\[1\]\$ ", pexpect.TIMEOUT], timeout=10) == 0:
                break
        else:
            pytest.fail("Ctrl-C at the prompt did not clear the line")
        child.sendline("sleep 100")
        # Ctrl-C once the command runs (not while it is still on its way to the shell).
        container = docker_client.containers.get(name)
        deadline = time.monotonic() + 120
        while not any("sleep 100" in " ".join(p) for p in container.top()["Processes"] or []):
            assert time.monotonic() < deadline, "sleep 100 never started in the container"
            time.sleep(0.2)
        child.sendintr()
        child.expect(r"exit code 130")
        child.expect(r"\[2\]\$ ")  # the interrupted command was turn 1; the session goes on
        child.sendline("echo alive-$((1+1))")
        child.expect(r"alive-2")
        child.expect(r"exit code 0")
        child.expect(r"\[3\]\$ ")
        child.sendline(":quit")
        finish(child, docker_client, name)
    finally:
        child.close(force=True)
    assert "half-typed" not in transcript.getvalue().split("sleep 100", 1)[1], "the cleared line ran"


def test_json_through_a_pipe_gives_one_json_line_per_step(images, docker_client):
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "debug", "prisoners-dilemma", "--json"],
                          input="echo hi-$((1+1))\n:help\nvalidate\nsubmit\n", capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(line) for line in proc.stdout.splitlines()]  # nothing but JSON lines on stdout
    assert [set(s) for s in steps] == [{"turn", "action", "observation", "reward", "return", "score", "done"}] * 3
    assert [(s["turn"], s["action"], s["done"]) for s in steps] == [(1, "command", False), (2, "validate", False),
                                                                     (3, "submit", True)]
    assert "hi-2" in steps[0]["observation"] and steps[0]["score"] is None
    assert steps[1]["score"] == pytest.approx(2.6122, abs=1e-3) and steps[1]["reward"] == pytest.approx(0.0)
    assert steps[2]["return"] == pytest.approx(sum(s["reward"] for s in steps))
    assert "Local commands" in proc.stderr  # :help answered locally, on stderr, without a turn
    name = BANNER.search(proc.stderr).group(1)
    assert name not in container_names(docker_client), "air debug left its container"


def test_tool_calls_typed_as_json(images, docker_client):
    """--action-format tools: a plain line is the call that runs it; a line of JSON is one call or several, in
    order, each answered; a call that cannot run, or a reply without a call, is a format error and the episode
    goes on; JSON that does not parse is answered locally, without a turn."""
    lines = ['echo hi-$((1+1))',
             '[{"name": "bash", "arguments": {"command": "echo a"}}, {"name": "nope"}, {"name": "validate"}]',
             '{"name": "bash", "arguments": "{\\"command\\": "}',
             '{broken',
             ':raw only talking',
             'submit']
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "debug", "prisoners-dilemma", "--action-format",
                           "tools", "--json"], input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [s["action"] for s in steps] == ["tool_calls", "tool_calls", "tool_calls", "format_error", "tool_calls"]
    assert "hi-2" in steps[0]["observation"]
    assert [c["action"] for c in steps[1]["calls"]] == ["command", "format_error", "validate"]
    assert steps[1]["calls"][0]["result"].startswith("a\n") and "no tool 'nope'" in steps[1]["calls"][1]["result"]
    assert steps[1]["score"] == pytest.approx(2.6122, abs=1e-3)
    assert "not JSON" in steps[2]["calls"][0]["result"] and "called no tool" in steps[3]["observation"]
    assert steps[-1]["done"] and [s["turn"] for s in steps] == [1, 2, 3, 4, 5]
    assert "not JSON" in proc.stderr  # `{broken`, answered locally
