"""The task's data: 32x32 grey-scale images of 10 kinds of shapes and patterns, drawn on the fly.

`make_batch(seed, n, device)` returns `(images, labels)`: images a float32 tensor of shape (n, 1, 32, 32),
labels an int64 tensor of shape (n,) with the classes 0-9 of CLASSES. Every random choice (class, position,
size, tilt, stripe frequency, background, contrast and its sign, a brightness gradient, the noise level and
the noise itself) comes from a CPU generator seeded with `seed`, so a seed gives the same images on any device;
the drawing itself runs on `device`. The hidden test set is made by this very function from a seed you never see.
"""
import math

import torch

SIZE = 32
CLASSES = ("disk", "ring", "square", "square outline", "triangle", "plus", "x", "stripes", "checkerboard",
           "diamond")


def _uniform(g, n, low, high):
    return low + (high - low) * torch.rand(n, generator=g)


def make_batch(seed, n, device="cpu"):
    g = torch.Generator().manual_seed(int(seed) % 2**63)
    labels = torch.randint(0, len(CLASSES), (n,), generator=g)
    cx, cy = _uniform(g, n, 9.0, 23.0), _uniform(g, n, 9.0, 23.0)
    radius = _uniform(g, n, 4.5, 9.0)
    tilt = _uniform(g, n, -0.35, 0.35)           # radians: small, so that a plus never turns into an x
    freq = _uniform(g, n, 2.2, 3.6)              # stripes and checks per radius
    background = _uniform(g, n, 0.0, 0.6)
    contrast = _uniform(g, n, 0.15, 0.7) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    gradient = torch.randn(n, 2, generator=g) * 0.2
    sigma = _uniform(g, n, 0.05, 0.3)
    noise = torch.randn(n, SIZE, SIZE, generator=g)

    def col(t):
        return t.to(device).view(n, 1, 1)

    ys, xs = torch.meshgrid(torch.arange(SIZE, device=device, dtype=torch.float32),
                            torch.arange(SIZE, device=device, dtype=torch.float32), indexing="ij")
    dx, dy = xs - col(cx), ys - col(cy)
    cos, sin, r = col(torch.cos(tilt)), col(torch.sin(tilt)), col(radius)
    u, v = (cos * dx + sin * dy) / r, (cos * dy - sin * dx) / r
    rad, cheb, l1 = torch.sqrt(u * u + v * v), torch.maximum(u.abs(), v.abs()), u.abs() + v.abs()
    wave = col(freq) * math.pi
    d = (u - v) / math.sqrt(2), (u + v) / math.sqrt(2)
    shapes = torch.stack([
        rad < 1.0,
        (rad - 0.75).abs() < 0.22,
        cheb < 0.8,
        (cheb - 0.75).abs() < 0.18,
        (v < 0.55) & (v > 1.6 * u.abs() - 0.9),
        ((u.abs() < 0.25) & (v.abs() < 1.0)) | ((v.abs() < 0.25) & (u.abs() < 1.0)),
        ((d[0].abs() < 0.22) & (d[1].abs() < 0.9)) | ((d[1].abs() < 0.22) & (d[0].abs() < 0.9)),
        (rad < 1.0) & (torch.sin(wave * u) > 0),
        (cheb < 0.9) & (torch.sin(wave * u) * torch.sin(wave * v) > 0),
        l1 < 1.0,
    ]).float()                                   # (10, n, 32, 32): every class drawn, the label's kept
    mask = shapes[labels.to(device), torch.arange(n, device=device)]
    ramp = col(gradient[:, 0]) * (xs - SIZE / 2) / SIZE + col(gradient[:, 1]) * (ys - SIZE / 2) / SIZE
    images = col(background) + ramp + col(contrast) * mask + col(sigma) * noise.to(device)
    return images.unsqueeze(1).contiguous(), labels.to(device)
