"""A small image classifier training script with planted bugs (see the `# planted:` markers).

Run `torchls check examples/` to see them reported; `clean_training.py` is the corrected form.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(0.3)
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features(images).flatten(1)
        logits = self.classifier(self.dropout(features))
        return F.softmax(logits, dim=1)


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
    return correct / len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    images = torch.randn(256, 3, 32, 32)
    labels = torch.randint(0, 10, (256,))
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True)
    val_loader = DataLoader(TensorDataset(images, labels), batch_size=64)

    model = ConvNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epoch_losses = []

    model.train()
    for epoch in range(args.epochs):
        for batch_images, batch_labels in train_loader:
            outputs = model(batch_images)
            loss = criterion(outputs, batch_labels)  # planted: TL101
            loss.backward()
            optimizer.step()  # planted: TL204
            epoch_losses.append(loss)  # planted: TL206
        accuracy = evaluate(model, val_loader)  # planted: TL203
        print(f"epoch {epoch}: accuracy {accuracy:.3f}")
        checkpoint = {"model": model.state_dict(), "args": args}  # planted: TL301
        torch.save(checkpoint, "classifier.pt")  # planted: TL304


if __name__ == "__main__":
    main()
