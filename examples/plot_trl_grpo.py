"""Draw a run of examples/trl_grpo_cpu.py from its `steps.json`: the mean return per step with its spread over the
group, and how often the model said the penalised (harmful) reply.

    python examples/plot_trl_grpo.py runs/trl-grpo/steps.json -o examples/results/trl_grpo_40_steps.png

Needs matplotlib (`pip install matplotlib`; air itself does not).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def smoothed(values: list[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def plot(run: dict, out: Path, window: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run["rows"]
    steps = [row["step"] for row in rows]
    mean = [row["reward"] for row in rows]
    spread = [row["reward_std"] for row in rows]
    harmful = [row["harmful"] for row in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 5.2), height_ratios=(3, 2))
    top.fill_between(steps, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                     color="tab:blue", alpha=0.18, linewidth=0, label="± sd over the group")
    top.plot(steps, mean, "o", color="tab:blue", markersize=3, label="mean return of the step's group")
    top.plot(steps, smoothed(mean, window), color="tab:blue", label=f"mean of the last {window} steps")
    top.axhline(0, color="#888", linewidth=0.8)
    top.set_ylabel("return air paid")
    top.legend(loc="lower right", fontsize=8)
    bottom.plot(steps, harmful, "o", color="tab:red", markersize=3, label="share of the step's replies")
    bottom.plot(steps, smoothed(harmful, window), color="tab:red", label=f"mean of the last {window} steps")
    bottom.axhline(0.25, color="#888", linewidth=0.8, linestyle=":")
    bottom.axhline(0.1, color="#888", linewidth=0.8, linestyle="--")
    bottom.set_ylabel("harmful reply")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right", fontsize=8)
    top.set_title(f"GRPO on {run['task']} through air serve openenv, CPU: {run['steps']} steps x {run['group']} "
                  "rollouts", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps_json", type=Path)
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    plot(json.loads(args.steps_json.read_text()), args.out, args.window)


if __name__ == "__main__":
    main()
