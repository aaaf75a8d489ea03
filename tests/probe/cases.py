"""Training scripts with planted bugs and attacks, as source text for the probe tests.

Each case is written into a fresh temporary folder by the tests (so the sandbox has to bind a
folder under /tmp back in, as it must for real projects there). The line a finding must land on
carries a `# <- name` marker; `marker_line(source, name)` finds it, so nothing hard-codes line
numbers.
"""

from __future__ import annotations


def marker_line(source: str, name: str) -> int:
    for number, line in enumerate(source.splitlines(), start=1):
        if f"# <- {name}" in line:
            return number
    raise AssertionError(f"no marker {name!r}")


NAN_LOG = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
for step in range(10):
    probs = F.softmax(model(x), dim=1) * (y[:, None] != 0)
    logp = torch.log(probs)  # <- log
    loss = -(logp * F.one_hot(y, 3)).sum() / len(y)  # <- loss
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# Both forms of the [N,1] vs [N] bug, feeding one loss.
BROADCAST = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 3)
y = torch.randn(16)
for step in range(10):
    pred = model(x)
    mse = nn.MSELoss()(pred, y)  # <- mse
    manual = ((pred - y) ** 2).mean()  # <- diff
    loss = mse + manual
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

CLEAN = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x = torch.randn(16, 3)
y = torch.randn(16, 1)
for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

UNUSED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)  # <- head
        self.aux = nn.Linear(8, 8)  # <- aux

    def forward(self, x):
        return self.head(F.relu(self.body(x)))


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD([*model.body.parameters(), *model.aux.parameters()], lr=0.1)
x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
for step in range(10):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()  # <- step
"""

EXPLODING = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e38)
x, y = torch.randn(8, 4) * 1000, torch.randn(8, 1)
for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()  # <- step
"""

EXCEPTION = """\
import torch


def reshape(t):
    return t.view(3, 7)  # <- raise


def main():
    data = torch.arange(12.0)
    return reshape(data)


main()
"""

HANG = """\
import time

import torch

x = torch.ones(3)
while True:
    time.sleep(0.05)  # <- hang
"""

# Blocks the probe's own alarm signal: only the server's hard kill can end it.
HANG_BLOCKING_SIGNALS = """\
import signal
import time

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGXCPU})
while True:
    time.sleep(0.05)
"""

# torch.empty reserves address space without touching it: the limit trips at once.
MEMORY_HOG = """\
import torch

hoard = []
while True:
    hoard.append(torch.empty(1 << 28))  # <- hog
"""

NETWORK = """\
import socket
import sys

port = int(sys.argv[1])
try:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(b"escaped")
    print("CONNECTED")
except OSError as error:
    print("BLOCKED", type(error).__name__)
"""

WRITES = """\
import sys

for target in sys.argv[1:]:
    try:
        with open(target, "w") as handle:
            handle.write("escaped")
        print("WROTE", target)
    except OSError as error:
        print("REFUSED", target, error.errno)
"""

FORK_BOMB = """\
import os
import time

while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""

FLOOD = """\
while True:
    print("x" * 1000)  # <- flood
"""

FLOOD_FD = """\
import os

while True:
    os.write(1, b"x" * 65536)  # <- flood
"""

FUNCTIONS = """\
import torch
import torch.nn as nn


def make(device, batch_size=4):
    torch.manual_seed(0)
    model = nn.Linear(2, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.zeros(batch_size, 2, device=device)
    return model, opt, x


def train_step(model, opt, x):
    out = model(x)
    ratio = out / out.detach().abs().sum().clamp(max=0.0)  # <- div
    loss = ratio.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# No optimizer: only the batch bound stops it. The first batch holds a NaN.
LOADER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

data = torch.randn(64, 3)
data[0, 1] = float("nan")
loader = DataLoader(TensorDataset(data), batch_size=8)
for epoch in range(100):
    for (batch,) in loader:  # <- batch
        total = batch.sum()
"""

SEGFAULT = """\
import ctypes

ctypes.string_at(0)
"""
