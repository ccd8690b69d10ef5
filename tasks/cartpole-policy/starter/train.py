"""Baseline trainer for the cartpole-policy task.

REINFORCE with a linear softmax policy, trained for a small number of episodes (a few seconds of
CPU). Saves the parameters to policy/weights.json; the policy package acts greedily with them.
Usage: python train.py [--episodes 150] [--seed 0]
"""
import argparse
import json
import os

import gymnasium as gym
import numpy as np


def softmax(z):
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def run_episode(env, W, b, rng, seed=None, greedy=False):
    obs, _ = env.reset(seed=seed)
    traj, total, done = [], 0.0, False
    while not done:
        p = softmax(obs @ W + b)
        a = int(np.argmax(p)) if greedy else int(rng.choice(2, p=p))
        traj.append((obs, a, p))
        obs, r, terminated, truncated, _ = env.step(a)
        total += r
        done = terminated or truncated
    return traj, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=150)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    env.reset(seed=args.seed)
    W = rng.normal(0, 0.01, (4, 2))
    b = np.zeros(2)
    for ep in range(args.episodes):
        traj, total = run_episode(env, W, b, rng)
        g, returns = 0.0, []
        for _ in reversed(traj):
            g = 1.0 + args.gamma * g
            returns.append(g)
        returns = np.array(returns[::-1])
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        for (obs, a, p), G in zip(traj, returns):
            grad = -p
            grad[a] += 1.0  # d log pi(a|s) / d logits
            W += args.lr * G * np.outer(obs, grad)
            b += args.lr * G * grad
        if (ep + 1) % 50 == 0:
            print(f"episode {ep + 1}: return {total:.0f}")

    scores = [run_episode(env, W, b, rng, seed=10_000 + i, greedy=True)[1] for i in range(10)]
    print(f"greedy policy, 10 local test episodes: mean return {np.mean(scores):.1f}")
    os.makedirs("policy", exist_ok=True)
    with open(os.path.join("policy", "weights.json"), "w") as fh:
        json.dump({"W": W.tolist(), "b": b.tolist()}, fh)
    print("saved policy/weights.json")


if __name__ == "__main__":
    main()
