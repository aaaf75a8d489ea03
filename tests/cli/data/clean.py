"""A correct loss computation: nothing for torchls to report."""

import torch.nn.functional as F


def loss_of(logits, y):
    return F.cross_entropy(logits, y)
