"""The training half: the loss is computed here on what models.py returns.

torchls follows `SentimentClassifier` into models.py and reports the softmax-before-
cross-entropy bug here, with a related location pointing at the softmax in models.py.
"""

import torch
import torch.nn as nn
from models import SentimentClassifier


def train(batches, epochs: int = 2) -> None:
    model = SentimentClassifier()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for tokens, offsets, labels in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(tokens, offsets), labels)  # planted: TL101
            loss.backward()
            optimizer.step()
