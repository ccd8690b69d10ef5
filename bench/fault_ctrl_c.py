"""Fault injection: Ctrl-C at a random moment of `air eval -n <many>`.

    python bench/fault_ctrl_c.py [--trials 30] [--seed 7] [--busy 2] [--max-delay 3]

Each trial starts `air eval prisoners-dilemma -n 999999 -c 1`, waits for the first rollout to end, sends SIGINT
after a random delay, and expects exit 130 within 60 s. A trial that hangs is dumped with `py-spy dump` when
py-spy is installed, then killed. `--busy N` runs N busy loops meanwhile (a shared CI machine). Containers of
every trial's run are removed at the end. Prints one line per trial and the count of hangs.
"""

from __future__ import annotations

import argparse
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


def trial(folder: Path, run_id: str, delay: float) -> str:
    first = folder / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "-n", "999999",
                                 "-c", "1", "--out", "run"], cwd=folder, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env={**os.environ, "AIR_RUN_ID": run_id})
        while not (first.is_file() and '"type": "end"' in first.read_text()):
            if proc.poll() is not None:
                return f"ended before its first rollout (exit {proc.returncode})"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:
            return f"exit {proc.wait(60)}"
        except subprocess.TimeoutExpired:
            if shutil.which("py-spy"):
                print(subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True,
                                     text=True).stdout, flush=True)
            proc.kill()
            return "HANG (no exit 60 s after Ctrl-C)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--busy", type=int, default=2, help="busy loops competing for the cores")
    parser.add_argument("--max-delay", type=float, default=3.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    # Ctrl-C as a terminal sends it: a bench started as a background job (`... &`) inherits SIGINT ignored, and an
    # ignored signal survives exec, so every trial would hang for the launcher's sake.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    tag = f"ctrl-c-{os.getpid()}"
    outcomes = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.trials):
                folder = Path(tmp) / f"trial-{n}"
                folder.mkdir()
                delay = rng.uniform(0, args.max_delay)
                outcomes.append(trial(folder, f"{tag}-{n}", delay))
                print(f"trial {n}: Ctrl-C {delay:.2f} s after the first rollout: {outcomes[-1]}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
        client = connect()
        left = remove_containers(client, [c.id for c in list_air_containers(client) if c.run.startswith(tag)])
    hangs = sum(o.startswith("HANG") for o in outcomes)
    print(f"{args.trials} trials: {hangs} hang(s), {sum(o == 'exit 130' for o in outcomes)} exited 130, "
          f"{len(left)} container(s) left behind (removed)")


if __name__ == "__main__":
    main()
