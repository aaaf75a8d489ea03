"""A generated corpus of realistic PyTorch training code for the benchmarks.

In: a seed and a size. Out: Python files (classifiers, GANs, AMP loops, fine-tuning with
schedulers, checkpointing, evaluation helpers) with varied names and a few planted bugs, so
the analysis does its real work. Nothing here is copied from other projects.
"""

from __future__ import annotations

import random
from pathlib import Path

HEADER = '''"""Generated training module {index}."""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
'''

MODEL = """

class {Model}(nn.Module):
    def __init__(self, in_features: int = {width}, num_classes: int = {classes}) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(in_features, {hidden}),
            nn.LayerNorm({hidden}),
            nn.GELU(),
            nn.Dropout({dropout}),
            nn.Linear({hidden}, {hidden}),
            nn.ReLU(),
        )
        self.head = nn.Linear({hidden}, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        features = self.encoder(inputs)
        if self.training:
            features = features + 0.01 * torch.randn_like(features)
        return self.head(features)
"""

TRAIN = """

def train_{name}(model, {loader}, {optimizer}, scheduler, epochs: int = {epochs}):
    criterion = nn.CrossEntropyLoss(label_smoothing={smoothing})
    history = []
    for epoch in range(epochs):
        model.train()
        running_loss = 0.0
        for step, ({inputs}, {targets}) in enumerate({loader}):
            {optimizer}.zero_grad(set_to_none=True)
            logits = model({inputs})
            loss = criterion(logits, {targets})
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={clip})
            {optimizer}.step()
            scheduler.step()
            running_loss += loss.item()
            if step % {log_every} == 0:
                probabilities = F.softmax(logits.detach(), dim=-1)
                confidence = probabilities.max(dim=-1).values.mean().item()
                history.append((epoch, step, running_loss / (step + 1), confidence))
    return history
"""

EVAL = """

@torch.no_grad()
def evaluate_{name}(model, {val_loader}):
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    for {inputs}, {targets} in {val_loader}:
        logits = model({inputs})
        loss_sum += F.cross_entropy(logits, {targets}, reduction="sum").item()
        correct += (logits.argmax(dim=-1) == {targets}).sum().item()
        total += {targets}.numel()
    model.train()
    return loss_sum / max(total, 1), correct / max(total, 1)
"""

AMP = """

def train_amp_{name}(model, {loader}, {optimizer}, device: str = "cpu"):
    scaler = torch.amp.GradScaler(enabled=device == "cuda")
    losses = []
    model.train()
    for {inputs}, {targets} in {loader}:
        {inputs}, {targets} = {inputs}.to(device), {targets}.to(device)
        {optimizer}.zero_grad()
        with torch.autocast(device_type=device, enabled=device == "cuda"):
            loss = F.cross_entropy(model({inputs}), {targets})
        scaler.scale(loss).backward()
        scaler.unscale_({optimizer})
        torch.nn.utils.clip_grad_norm_(model.parameters(), {clip})
        scaler.step({optimizer})
        scaler.update()
        losses.append(loss.detach())
    return torch.stack(losses).mean().item()
"""

GAN = """

def gan_step_{name}(generator, discriminator, real, opt_g, opt_d, latent: int = {width}):
    noise = torch.randn(real.size(0), latent)
    fake = generator(noise)
    opt_d.zero_grad()
    d_real = discriminator(real)
    d_fake = discriminator(fake.detach())
    d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
    d_loss = d_loss + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_out = discriminator(fake)
    g_loss = F.binary_cross_entropy_with_logits(g_out, torch.ones_like(g_out))
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()
"""

CHECKPOINT = """

def save_checkpoint_{name}(model, {optimizer}, scheduler, args, epoch: int, path: str):
    torch.save(
        {{
            "model": model.state_dict(),
            "optimizer": {optimizer}.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
            "args": vars(args),
        }},
        path,
    )


def load_checkpoint_{name}(model, {optimizer}, path: str, device: str = "cpu"):
    checkpoint = torch.load(path, map_location=device)
    model.load_state_dict(checkpoint["model"])
    {optimizer}.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
"""

BUGGY = """

def quick_train_{name}(model, {loader}, {optimizer}):
    criterion = nn.CrossEntropyLoss()
    epoch_losses = []
    for {inputs}, {targets} in {loader}:
        probs = F.softmax(model({inputs}), dim=1)
        loss = criterion(probs, {targets})
        loss.backward()
        {optimizer}.step()
        epoch_losses.append(loss)
    state = torch.load("last.pt")
    return epoch_losses, state
"""

MAIN = """

def main_{name}():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default={epochs})
    parser.add_argument("--lr", type=float, default={lr})
    args = parser.parse_args()
    data = TensorDataset(torch.randn({samples}, {width}), torch.randint(0, {classes}, ({samples},)))
    {loader} = DataLoader(data, batch_size={batch}, shuffle=True)
    {val_loader} = DataLoader(data, batch_size={batch})
    model = {Model}()
    {optimizer} = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total = args.epochs * len({loader})
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        {optimizer}, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    )
    history = train_{name}(model, {loader}, {optimizer}, scheduler, args.epochs)
    print(evaluate_{name}(model, {val_loader}), len(history))
    save_checkpoint_{name}(model, {optimizer}, scheduler, args, args.epochs, "run.pt")
"""

NAMES = {
    "loader": ["train_loader", "loader", "train_dl", "dataloader"],
    "val_loader": ["val_loader", "valid_loader", "test_loader", "eval_loader"],
    "optimizer": ["optimizer", "opt", "optim"],
    "inputs": ["inputs", "x", "images", "features", "batch_x"],
    "targets": ["targets", "y", "labels", "batch_y"],
    "Model": ["Classifier", "MLP", "Net", "Encoder", "Tagger"],
}


def module_source(index: int, rng: random.Random, sections: int = 1) -> str:
    parts = [HEADER.format(index=index)]
    for section in range(sections):
        values = {key: rng.choice(options) for key, options in NAMES.items()}
        values["Model"] = f"{values['Model']}{index}_{section}"
        values.update(
            name=f"m{index}_{section}",
            width=rng.choice([16, 32, 64, 128]),
            hidden=rng.choice([64, 128, 256, 512]),
            classes=rng.choice([2, 5, 10, 100]),
            dropout=rng.choice([0.0, 0.1, 0.3]),
            epochs=rng.choice([3, 10, 30]),
            smoothing=rng.choice([0.0, 0.1]),
            clip=rng.choice([0.5, 1.0, 5.0]),
            log_every=rng.choice([10, 50, 100]),
            lr=rng.choice([1e-3, 3e-4, 0.1]),
            samples=rng.choice([128, 512]),
            batch=rng.choice([16, 32, 64]),
        )
        templates = [MODEL, TRAIN, EVAL, AMP, GAN, CHECKPOINT, MAIN]
        if rng.random() < 0.3:
            templates.append(BUGGY)
        parts.extend(template.format(**values) for template in templates)
    return "".join(parts)


def write_corpus(folder: Path, files: int = 40, seed: int = 7) -> list[Path]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(files):
        path = folder / f"train_{index:03d}.py"
        path.write_text(module_source(index, rng))
        paths.append(path)
    return paths


def large_module(lines: int = 2000, seed: int = 11) -> str:
    """One module of about `lines` lines (the size used by the LSP latency benchmark)."""
    rng = random.Random(seed)
    sections = 1
    while True:
        source = module_source(0, rng, sections)
        if source.count("\n") >= lines:
            return source
        sections += 1
