"""Baseline for gpu-cnn-speedrun: Net(width=32, depth=2) trained with plain SGD on freshly drawn batches.

Writes model.pt = {"config": {"width": .., "depth": ..}, "state_dict": ...}, the submission, and prints the
accuracy on a validation set drawn from a seed of its own (the hidden test set comes from a hidden seed).
Runs on the GPU when there is one, else (slowly) on the CPU. Training stops after --steps steps or --budget
seconds, whichever comes first.
Usage: python train.py [--steps 600] [--budget 90] [--width 32] [--depth 2] [--lr 0.05] [--batch 128]
"""
import argparse
import time

import torch
from torch import nn

from data.model import Net  # data/: the task's read-only files (the evaluation uses the same)
from data.shapes import make_batch

VALID_SEED = 999_999_999  # training uses seeds 0, 1, 2, ...: the validation images are none of them


def accuracy(net, seed, n, device, batch=1000):
    net.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, n, batch):
            x, y = make_batch(seed + start, min(batch, n - start), device)
            correct += (net(x).argmax(1) == y).sum().item()
    net.train()
    return correct / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--budget", type=float, default=90.0, help="seconds of training at most")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--valid", type=int, default=2000, help="validation images")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    net = Net(args.width, args.depth).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    start, step = time.monotonic(), 0
    while step < args.steps and time.monotonic() - start < args.budget:
        x, y = make_batch(step, args.batch, device)
        loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    seconds = time.monotonic() - start
    print(f"trained {step} steps in {seconds:.1f} s on {device}")
    print(f"validation accuracy: {accuracy(net, VALID_SEED, args.valid, device):.4f}")
    torch.save({"config": {"width": args.width, "depth": args.depth},
                "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()}}, "model.pt")
    print("wrote model.pt")


if __name__ == "__main__":
    main()
