"""A correct training script: the idioms torchls must stay quiet on.

Logits into cross-entropy (softmax only for metrics), train/eval switched every epoch,
evaluation under no_grad, gradient accumulation, a warmup schedule stepped per batch, losses
logged as numbers, and a checkpoint of plain data loaded with map_location.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )
        self.dropout = nn.Dropout(0.3)
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.features(images).flatten(1)))


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    model.eval()
    total_loss, correct = 0.0, 0
    for images, labels in loader:
        logits = model(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        probabilities = F.softmax(logits, dim=1)
        correct += (probabilities.argmax(dim=1) == labels).sum().item()
    model.train()
    size = len(loader.dataset)
    return total_loss / size, correct / size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accumulation", type=int, default=2)
    args = parser.parse_args()

    images = torch.randn(256, 3, 32, 32)
    labels = torch.randint(0, 10, (256,))
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True)
    val_loader = DataLoader(TensorDataset(images, labels), batch_size=64)

    model = ConvNet()
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
    total_steps = args.epochs * math.ceil(len(train_loader) / args.accumulation)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, total_steps // 10))
    )
    history = []

    for epoch in range(args.epochs):
        model.train()
        running = 0.0
        optimizer.zero_grad(set_to_none=True)
        for step, (batch_images, batch_labels) in enumerate(train_loader):
            loss = criterion(model(batch_images), batch_labels) / args.accumulation
            loss.backward()
            running += loss.item()
            if (step + 1) % args.accumulation == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        val_loss, accuracy = evaluate(model, val_loader)
        history.append({"epoch": epoch, "train": running, "val": val_loss, "acc": accuracy})

    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "args": vars(args),
            "history": history,
        },
        "clean.pt",
    )
    checkpoint = torch.load("clean.pt", map_location="cpu")
    model.load_state_dict(checkpoint["model"])


if __name__ == "__main__":
    main()
