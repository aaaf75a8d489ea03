"""Resuming a checkpoint and fine-tuning a binary classifier, with planted bugs.

Each `# planted:` marker names the rule torchls reports on that line.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1))


def resume(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> int:
    checkpoint = torch.load(path, weights_only=False)  # planted: TL302, TL303
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]


def finetune(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> None:
    criterion = nn.BCEWithLogitsLoss()
    model.train()
    for features, targets in loader:
        optimizer.zero_grad()
        logits = model(features).squeeze(1)
        loss = criterion(torch.sigmoid(logits), targets.float())  # planted: TL102
        loss.backward()
        optimizer.step()


def validate(model: nn.Module, val_loader: DataLoader) -> float:
    model.eval()
    total = 0.0
    for features, targets in val_loader:
        scores = model(features).squeeze(1)  # planted: TL202
        total += nn.functional.binary_cross_entropy_with_logits(scores, targets).item()
    return total / len(val_loader)


def train_classes(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> None:
    criterion = nn.CrossEntropyLoss()
    for inputs, labels in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels.float())  # planted: TL106
        loss.backward()
        optimizer.zero_grad()  # planted: TL205
        optimizer.step()


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 20), torch.randint(0, 2, (64,)).float())
    net = build_model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    finetune(net, DataLoader(data, batch_size=16), opt)
    print(validate(net, DataLoader(data, batch_size=32)))
