"""The model half of a two-file project: its forward ends in a softmax (see train.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SentimentClassifier(nn.Module):
    def __init__(self, vocab_size: int = 5000, embedding_dim: int = 64, classes: int = 3) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embedding_dim)
        self.classifier = nn.Linear(embedding_dim, classes)

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.embedding(tokens, offsets))
        return F.softmax(logits, dim=-1)
