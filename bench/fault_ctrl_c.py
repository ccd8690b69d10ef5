"""Fault injection: Ctrl-C, SIGTERM and SIGHUP at a random moment of `air eval -n <many>`.

    python bench/fault_ctrl_c.py [--trials 30] [--signals INT,TERM,HUP] [--seed 7] [--busy 2] [--max-delay 3]

Each trial starts `air eval prisoners-dilemma -n 999999 -c 1`, waits for the first rollout to end, sends the signal
after a random delay, and expects, within 60 s: exit 128 + the signal's number (130, 143, 129), `summary.json` saying
`"interrupted": true`, and no container of the trial's run left. `--trials` runs per signal. A trial that hangs is
dumped with `py-spy dump` when py-spy is installed, then killed. `--busy N` runs N busy loops meanwhile (a shared CI
machine). What a trial left is counted, then removed. Prints one line per trial and, per signal, how many of the
trials ended as they should.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from air.sandbox import connect, list_air_containers, remove_containers


def trial(folder: Path, run_id: str, sig: signal.Signals, delay: float) -> tuple[bool, str]:
    """(ended as it should, what happened)."""
    first = folder / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "-n", "999999",
                                 "-c", "1", "--out", "run"], cwd=folder, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env={**os.environ, "AIR_RUN_ID": run_id})
        while not (first.is_file() and '"type": "end"' in first.read_text()):
            if proc.poll() is not None:
                return False, f"ended before its first rollout (exit {proc.returncode})"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(sig)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            if shutil.which("py-spy"):
                print(subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True,
                                     text=True).stdout, flush=True)
            proc.kill()
            return False, f"HANG (no exit 60 s after {sig.name})"
    client = connect()
    left = list_air_containers(client, run=run_id)
    remove_containers(client, [c.id for c in left])
    try:
        interrupted = json.loads((folder / "run" / "summary.json").read_text()).get("interrupted") is True
    except (OSError, ValueError):
        interrupted = False
    ok = code == 128 + sig and not left and interrupted
    summary = "interrupted" if interrupted else "NOT interrupted"
    return ok, f"exit {code}, {len(left)} container(s) left, summary {summary}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="trials per signal")
    parser.add_argument("--signals", default="INT,TERM,HUP")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--busy", type=int, default=2, help="busy loops competing for the cores")
    parser.add_argument("--max-delay", type=float, default=3.0)
    args = parser.parse_args()
    signals = [signal.Signals[f"SIG{name.strip().upper()}"] for name in args.signals.split(",")]
    rng = random.Random(args.seed)
    # Ctrl-C as a terminal sends it: a bench started as a background job (`... &`) inherits SIGINT ignored, and an
    # ignored signal survives exec, so every trial would hang for the launcher's sake.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    tag = f"ctrl-c-{os.getpid()}"
    good = {sig: 0 for sig in signals}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.trials):
                for sig in signals:
                    folder = Path(tmp) / f"trial-{n}-{sig.name}"
                    folder.mkdir()
                    delay = rng.uniform(0, args.max_delay)
                    ok, what = trial(folder, f"{tag}-{n}-{sig.name.lower()}", sig, delay)
                    good[sig] += ok
                    print(f"trial {n} {sig.name}: {delay:.2f} s after the first rollout: {what}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
        client = connect()
        remove_containers(client, [c.id for c in list_air_containers(client) if c.run.startswith(tag)])
    for sig in signals:
        print(f"{sig.name}: {good[sig]} of {args.trials} trials exited {128 + sig}, left no container and wrote an "
              "interrupted summary.json")


if __name__ == "__main__":
    main()
