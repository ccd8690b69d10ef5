"""Draw and tabulate runs of examples/trl_grpo_cpu.py from their `steps.json` files: every run in one plot (the
share of the penalised, harmful reply per step, smoothed, and the mean return), trained runs against their lr-0
controls (the same seed: the same model, the same first samples, weights that never move), and a table by ten
steps with a test of the difference.

    python examples/plot_trl_grpo.py examples/results/trl_grpo_seed*.json -o examples/results/trl_grpo_seeds.png

Needs matplotlib (`pip install matplotlib`; air itself does not) and scipy for the test (the test extra has it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

WINDOWS = ((1, 10), (11, 20), (21, 30), (31, 40))


def smoothed(values: list[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def load(paths: list[Path]) -> list[dict]:
    runs = [json.loads(path.read_text()) | {"path": str(path)} for path in paths]
    return sorted(runs, key=lambda r: (r["seed"], r.get("lr", 3e-3) == 0))


def counts(run: dict, first: int, last: int) -> tuple[int, int]:
    """(harmful replies, all replies) over steps first..last."""
    rows = [r for r in run["rows"] if first <= r["step"] <= last]
    return sum(r["said"]["harmful"] for r in rows), sum(r["replies"] for r in rows)


def share(run: dict, first: int, last: int) -> float:
    harmful, replies = counts(run, first, last)
    return harmful / replies if replies else float("nan")


def mean_return(run: dict, first: int, last: int) -> float:
    return statistics.fmean(r["reward"] for r in run["rows"] if first <= r["step"] <= last and r["reward"] is not None)


def table(runs: list[dict]) -> str:
    """Markdown: each run's harmful share and mean return by ten steps; then trained against control over steps
    11-40, per seed and pooled (Fisher's exact test on the reply counts)."""
    head = "| seed | lr | " + " | ".join(f"steps {a}-{b}" for a, b in WINDOWS) + " | mean return 11-40 |"
    lines = [head, "| " + " | ".join(["---"] * (len(WINDOWS) + 3)) + " |"]
    for run in runs:
        cells = [f"{100 * share(run, a, b):.1f} %" for a, b in WINDOWS]
        lines.append(f"| {run['seed']} | {run.get('lr', 3e-3):g} | " + " | ".join(cells)
                     + f" | {mean_return(run, 11, 40):+.4f} |")
    lines += ["", "| seed | trained 11-40 | control 11-40 | difference | Fisher's exact p (one-sided) |",
              "| --- | --- | --- | --- | --- |"]
    pooled = [[0, 0], [0, 0]]
    for seed in sorted({r["seed"] for r in runs}):
        trained = [r for r in runs if r["seed"] == seed and r.get("lr", 3e-3) > 0]
        control = [r for r in runs if r["seed"] == seed and r.get("lr", 3e-3) == 0]
        if not trained or not control:
            continue
        (th, tn), (ch, cn) = counts(trained[0], 11, 40), counts(control[0], 11, 40)
        pooled[0][0] += th
        pooled[0][1] += tn - th
        pooled[1][0] += ch
        pooled[1][1] += cn - ch
        lines.append(f"| {seed} | {100 * th / tn:.1f} % ({th}/{tn}) | {100 * ch / cn:.1f} % ({ch}/{cn}) | "
                     f"{100 * (th / tn - ch / cn):+.1f} pts | {_fisher([[th, tn - th], [ch, cn - ch]]):.3g} |")
    (th, tr), (ch, cr) = pooled
    if th + tr and ch + cr:
        lines.append(f"| all | {100 * th / (th + tr):.1f} % ({th}/{th + tr}) | {100 * ch / (ch + cr):.1f} % "
                     f"({ch}/{ch + cr}) | {100 * (th / (th + tr) - ch / (ch + cr)):+.1f} pts | "
                     f"{_fisher(pooled):.3g} |")
    return "\n".join(lines) + "\n"


def _fisher(table_2x2: list[list[int]]) -> float:
    """One-sided: the trained runs said the harmful reply less often than the control."""
    from scipy.stats import fisher_exact

    return float(fisher_exact(table_2x2, alternative="less").pvalue)


def plot(runs: list[dict], out: Path, window: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6), height_ratios=(2, 3))
    styles = ("-", "--", ":", "-.")
    for run in runs:
        trained = run.get("lr", 3e-3) > 0
        color = "tab:blue" if trained else "tab:gray"
        style = styles[run["seed"] % len(styles)]
        label = f"seed {run['seed']}, " + (f"lr {run.get('lr', 3e-3):g}" if trained else "lr 0 (control)")
        steps = [r["step"] for r in run["rows"]]
        harmful = [r["harmful"] for r in run["rows"]]
        rewards = [r["reward"] if r["reward"] is not None else 0.0 for r in run["rows"]]
        bottom.plot(steps, smoothed(harmful, window), style, color=color, label=label)
        top.plot(steps, smoothed(rewards, window), style, color=color)
    top.axhline(0, color="#888", linewidth=0.8)
    top.set_ylabel(f"mean return\n(last {window} steps)")
    bottom.axhline(0.25, color="#888", linewidth=0.8, linestyle=":")
    bottom.set_ylabel(f"harmful share of replies\n(last {window} steps)")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right", fontsize=7, ncol=2)
    first = runs[0]
    top.set_title(f"GRPO on {first['task']} through air serve openenv, CPU: {first['steps']} steps x {first['group']} "
                  "rollouts;\nblue: trained, gray: lr-0 controls of the same seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps_json", type=Path, nargs="+")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    runs = load(args.steps_json)
    plot(runs, args.out, args.window)
    print(table(runs), end="")


if __name__ == "__main__":
    main()
