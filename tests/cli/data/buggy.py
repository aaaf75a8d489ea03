"""A training script with one bug of each kind the CLI tests rely on."""

import torch
import torch.nn.functional as F
from torch import nn

criterion = nn.CrossEntropyLoss()


def loss_of(logits, y):
    probs = F.softmax(logits, dim=1)
    return F.cross_entropy(probs, y)  # TL101: softmax before cross-entropy (safe fix)


def train(model, loader):
    for x, y in loader:
        loss = criterion(model(x), y.float())  # TL106: float class targets (safe fix)
        loss.backward()


def resume(path):
    return torch.load(path)  # TL302: no map_location (unsafe fix)


def load_trusted(path):
    return torch.load(path, map_location="cpu", weights_only=False)  # TL303 (no fix)
