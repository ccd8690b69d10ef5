"""Draw and tabulate the real-model learning runs (examples/grpo_real_model.py's steps.jsonl files).

    python examples/plot_learning.py examples/results/learning/*.jsonl -o examples/results/learning/curves.png

One row of panels per task: the mean return per step, the format errors per episode, the validations per episode
(validate, submit and the final evaluation at the turn limit, failed ones included) and the share of episodes
that scored (a validation that produced a score), each smoothed over 5 steps; trained runs solid, their lr-0
controls (same seeds) dashed in the seed's colour. The table compares each trained run with its control over the
second half of the steps, episode by episode (one-sided Mann-Whitney U on the episodes' returns: the trained run's
are higher), and, where a task has more than one seed, every seed's episodes pooled."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

PANELS = [("return", "mean return"), ("format_errors", "format errors / episode"),
          ("validations", "validations / episode"), ("scored", "episodes that scored")]


def read(path: Path) -> tuple[dict, list[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0])["settings"], [json.loads(line) for line in lines[1:]]


def per_step(rows: list[dict]) -> dict[str, list[float]]:
    out = defaultdict(list)
    for row in rows:
        kept = [i for i, r in enumerate(row["returns"]) if r is not None]
        out["return"].append(statistics.mean(row["returns"][i] for i in kept) if kept else float("nan"))
        for key in ("format_errors", "validations"):
            out[key].append(statistics.mean(row[key][i] for i in kept) if kept else float("nan"))
        out["scored"].append(statistics.mean(row["best_scores"][i] is not None for i in kept) if kept else 0.0)
    return out


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.mean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def episodes(rows: list[dict], first: int) -> list[float]:
    return [r for row in rows if row["step"] >= first for r in row["returns"] if r is not None]


def table(runs: dict[tuple[str, int, bool], list[dict]], steps: int) -> list[str]:
    from scipy.stats import mannwhitneyu

    half = steps // 2 + 1
    lines = [f"| task | seed | trained: mean return, steps {half}-{steps} | control | format errors / episode, "
             "trained / control | p (one-sided) |", "| --- | --- | --- | --- | --- | --- |"]
    pairs = defaultdict(list)  # task: (trained, control) row lists, a pair a seed
    for (task, seed, trained), rows in sorted(runs.items()):
        control = runs.get((task, seed, False))
        if trained and control is not None and episodes(rows, half) and episodes(control, half):
            pairs[task].append((seed, rows, control))
    for task, seeds in pairs.items():
        rows_of = [(str(seed), [(rows, control)]) for seed, rows, control in seeds]
        if len(seeds) > 1:
            rows_of.append((f"{len(seeds)} seeds pooled", [(rows, control) for _, rows, control in seeds]))
        for label, both in rows_of:
            ours = [r for rows, _ in both for r in episodes(rows, half)]
            theirs = [r for _, control in both for r in episodes(control, half)]
            errors = [statistics.mean(e for x in xs for e in
                                      per_step([r for r in x if r["step"] >= half])["format_errors"])
                      for xs in ([rows for rows, _ in both], [control for _, control in both])]
            p = mannwhitneyu(ours, theirs, alternative="greater").pvalue if len(set(ours) | set(theirs)) > 1 else 1.0
            lines.append(f"| {task} | {label} | {statistics.mean(ours):+.4f} | {statistics.mean(theirs):+.4f} | "
                         f"{errors[0]:.2f} / {errors[1]:.2f} | {p:.3g} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("-o", "--out", type=Path, default=Path("learning.png"))
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[tuple[str, int, bool], list[dict]] = {}
    steps = 0
    for path in args.files:
        settings, rows = read(path)
        runs[(settings["task"], settings["seed"], settings["lr"] > 0)] = rows
        steps = max(steps, settings["steps"])
    tasks = sorted({task for task, _, _ in runs})
    fig, axes = plt.subplots(len(tasks), len(PANELS), figsize=(4 * len(PANELS), 3.2 * len(tasks)), squeeze=False)
    for row_axes, task in zip(axes, tasks):
        for (name, seed, trained), rows in sorted(runs.items()):
            if name != task:
                continue
            series = per_step(rows)
            x = [r["step"] for r in rows]
            for ax, (key, label) in zip(row_axes, PANELS):
                ax.plot(x, smooth(series[key]), color=f"C{seed}", alpha=1.0 if trained else 0.6,
                        linestyle="-" if trained else "--", label=f"seed {seed}{'' if trained else ', lr 0'}")
                ax.set_title(f"{task}: {label}", fontsize=9)
                ax.set_xlabel("step")
        row_axes[0].legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print("\n".join(table(runs, steps)))
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
