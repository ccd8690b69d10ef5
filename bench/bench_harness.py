"""Verifiers-side overhead per turn: air's in-process harness vs verifiers' `null` harness, in one run.

    python bench/bench_harness.py [--task prisoners-dilemma] [--action-format tools]

Both run the same episode through the real `vf-eval` against the scripted test-double server in --trivial mode
(an instant "model" answering 40 turns of `true`, then submit). Per turn we report the agent time of the trace
less its model time and less the env's own acting time (air's commands and evaluations, recorded on the trace):
what verifiers and the harness add around each model call. With `--action-format tools` the same in the tools
format (each `true` a tool call), for air's harness and verifiers' `null` and `bash` harnesses, whose calls go
through the taskset's MCP toolset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def start_server(port_file: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "air.policies.scripted_server", "--trivial", "--port", "0",
                             "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.1)
    return proc


def run(harness: str, base_url: str, task: str, out: Path, action_format: str = "text") -> dict:
    cmd = ["vf-eval", "air-mlgym", "-n", "1", "-r", "1", "-c", "1", "-m", "air-scripted", "--client.base-url",
           base_url, "--env.taskset.tasks", json.dumps([task]), "--env.taskset.max-turns", "60", "--no-push",
           "--no-rich", "-o", str(out)]
    if harness != "air":
        cmd += ["--env.agent.harness.id", harness]
    if action_format != "text":
        cmd += ["--env.taskset.action-format", action_format]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "CI": ""})
    wall = time.perf_counter() - started
    trace = json.loads(next(out.rglob("traces.jsonl")).read_text().splitlines()[0])["traces"][0]
    assert trace["ok"], trace["errors"]
    agent = trace["timing"]["agent"]
    turns = int(trace["metrics"]["turns"])
    agent_s, model_s, env_s = agent["end"] - agent["start"], agent["model"]["duration"], trace["info"]["env_seconds"]
    return {"harness": harness, "turns": turns, "overhead_ms_per_turn": 1000 * (agent_s - model_s - env_s) / turns,
            "env_ms_per_turn": 1000 * env_s / turns, "model_ms_per_turn": 1000 * model_s / turns,
            "vf_eval_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--action-format", choices=["text", "tools"], default="text")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    harnesses = ("air", "null", "bash") if args.action_format == "tools" else ("air", "null")
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "port")
        base_url = f"http://127.0.0.1:{(Path(tmp) / 'port').read_text()}/v1"
        try:
            rows = [run(h, base_url, args.task, Path(tmp) / h, args.action_format) for h in harnesses]
        finally:
            server.terminate()
    ratio = rows[1]["overhead_ms_per_turn"] / max(rows[0]["overhead_ms_per_turn"], 1e-6)
    if args.json:
        print(json.dumps({"rows": rows, "ratio": ratio}, indent=2))
        return
    for r in rows:
        print(f"{r['harness']:>5} harness: {r['turns']} turns, overhead {r['overhead_ms_per_turn']:8.2f} ms/turn "
              f"(model {r['model_ms_per_turn']:.1f}, env acting {r['env_ms_per_turn']:.1f}), "
              f"vf-eval wall {r['vf_eval_wall_s']:.1f} s")
    print(f"null / air overhead per turn: {ratio:.0f}x ({args.action_format} format)")


if __name__ == "__main__":
    main()
