"""The task's network: a small CNN whose only free choices are `width` and `depth` (bounded below).

`Net(width, depth)`: a 3x3 convolution stem with `width` channels, then `depth` stages, each a 2x2 max-pool and
a 3x3 convolution doubling the channels (each convolution followed by batch norm and ReLU), then global average
pooling and a linear layer to the 10 classes. The evaluation builds this very network from the task's own copy
of this file and loads your state_dict into it, so the architecture is fixed: what you choose is width, depth and
how you train.
"""
import torch
from torch import nn

WIDTH = (8, 128)   # allowed range of width, both ends included
DEPTH = (1, 4)     # allowed range of depth
CLASSES = 10


def check_config(width, depth):
    """The reason `width`/`depth` are not allowed, or None."""
    for name, value, (low, high) in (("width", width, WIDTH), ("depth", depth, DEPTH)):
        if type(value) is not int or not low <= value <= high:
            return f"{name} must be an integer from {low} to {high}, not {value!r}"
    return None


class Net(nn.Module):
    def __init__(self, width=32, depth=2):
        super().__init__()
        problem = check_config(width, depth)
        if problem:
            raise ValueError(problem)
        layers = [nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
        for _ in range(depth):
            layers += [nn.MaxPool2d(2), nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
                       nn.BatchNorm2d(2 * channels), nn.ReLU()]
            channels *= 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, CLASSES)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))
