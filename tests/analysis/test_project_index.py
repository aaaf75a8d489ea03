"""The project index and function summaries: imports named without jedi, and rules reading a
helper's summary at its call site, across files (save wrappers, engines that step the
optimizer, loader wrappers, collectives in helpers)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchls.analysis import Workspace, analyze
from torchls.analysis.index import ProjectIndex
from torchls.analysis.source import parse_source
from torchls.analysis.summaries import _text_cache


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def found(root: Path, name: str, code: str | None = None) -> list[tuple[int, str]]:
    workspace = Workspace(root)
    path = root / name
    result = analyze(path.read_text(), str(path), workspace=workspace)
    assert workspace.jedi_calls == 0, "project imports are named by the index, not jedi"
    return [(f.span.start.row, f.code) for f in result.findings if code in (None, f.code)]


# ---------------------------------------------------------------------- the index
def test_index_names_modules_packages_src_layouts_and_relative_imports(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "src/proj/__init__.py": "",
            "src/proj/engine.py": "",
            "src/proj/models/__init__.py": "from .nets import Net\n",
            "src/proj/models/nets.py": "",
            "tools/train.py": "",
            "tools/helpers.py": "",
        },
    )
    index = ProjectIndex(tmp_path.resolve())
    engine = (tmp_path / "src/proj/engine.py").resolve()
    nets = (tmp_path / "src/proj/models/nets.py").resolve()
    train = tmp_path / "tools/train.py"
    assert index.locate(train, "proj.engine.train_one_epoch") == (engine, "train_one_epoch")
    assert index.locate(train, "helpers") == ((tmp_path / "tools/helpers.py").resolve(), None)
    assert index.locate(nets, "..engine.run") == (engine, "run")
    assert index.locate(nets.parent / "__init__.py", ".nets.Net") == (nets, "Net")
    assert index.locate(train, "torchvision.models.resnet18") is None


def test_reexported_class_is_followed_through_the_package_init(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from .heads import Classifier\n",
            "pkg/heads.py": (
                "import torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                "class Classifier(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n"
                "        self.fc = nn.Linear(4, 3)\n\n"
                "    def forward(self, x):\n        return F.softmax(self.fc(x), dim=1)\n"
            ),
            "train.py": (
                "import torch.nn as nn\nfrom pkg import Classifier\n\n\n"
                "def step(x, y):\n    model = Classifier()\n"
                "    return nn.CrossEntropyLoss()(model(x), y)\n"
            ),
        },
    )
    assert found(tmp_path, "train.py", "TL101") == [(7, "TL101")]


# ---------------------------------------------------------------------- TL301
UTILS = """\
import torch
import torch.distributed as dist


def is_main_process():
    return not dist.is_initialized() or dist.get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    save_on_master(state, filename)


def save_run(model, args, path):
    torch.save({"model": model.state_dict(), "args": args}, path)
"""
CONFIG = """\
from dataclasses import dataclass


@dataclass
class TrainConfig:
    lr: float = 0.1
"""


def test_config_objects_reach_checkpoints_through_wrappers_in_other_files(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "utils.py": UTILS,
            "config.py": CONFIG,
            "train.py": (
                "import argparse\n\nimport torch\n\nimport utils\n"
                "from config import TrainConfig\nfrom utils import save_on_master, save_run\n\n\n"
                "def main(model, cfg: TrainConfig):\n"
                "    args = argparse.ArgumentParser().parse_args()\n"
                '    utils.save_checkpoint({"model": model.state_dict(), "args": args}, True)\n'
                '    save_on_master({"model": model.state_dict(), "cfg": cfg}, "last.pt")\n'
                '    save_run(model, args, "run.pt")\n'
                '    utils.save_checkpoint({"model": model.state_dict(), "args": vars(args)}, 1)\n'
            ),
        },
    )
    assert found(tmp_path, "train.py", "TL301") == [(12, "TL301"), (13, "TL301"), (14, "TL301")]


# ---------------------------------------------------------------------- TL401 / TL402
ENGINE = """\
def train_step(model, batch, optimizer, criterion):
    x, y = batch
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def train_one_epoch(model, loader, optimizer, criterion):
    for batch in loader:
        train_step(model, batch, optimizer, criterion)
"""
TRAIN_WITH_ENGINE = """\
import torch
from torch.optim.lr_scheduler import StepLR

from engine import train_one_epoch, train_step


def main(model, train_loader, criterion, epochs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = StepLR(optimizer, step_size=30)
    for epoch in range(epochs):
        scheduler.step()
        train_one_epoch(model, train_loader, optimizer, criterion)
    for epoch in range(epochs):
        for batch in train_loader:
            train_step(model, batch, optimizer, criterion)
            scheduler.step()
"""


def test_optimizer_stepped_in_another_module(tmp_path: Path) -> None:
    write(tmp_path, {"engine.py": ENGINE, "train.py": TRAIN_WITH_ENGINE})
    assert found(tmp_path, "train.py") == [(11, "TL401"), (16, "TL402")]


def test_scheduler_after_the_engine_is_quiet(tmp_path: Path) -> None:
    one_epoch = "        train_one_epoch(model, train_loader, optimizer, criterion)"
    one_step = "            train_step(model, batch, optimizer, criterion)\n"
    fixed = TRAIN_WITH_ENGINE.replace(
        f"        scheduler.step()\n{one_epoch}", f"{one_epoch}\n        scheduler.step()"
    ).replace(f"{one_step}            scheduler.step()\n", one_step)
    write(tmp_path, {"engine.py": ENGINE, "train.py": fixed})
    assert found(tmp_path, "train.py") == []


# ---------------------------------------------------------------------- TL801 / TL802
BACKEND = """\
import torch.distributed as dist


class Backend:
    def __init__(self, rank):
        self.rank = rank

    def distribute(self, loader):
        return loader


def synchronize():
    dist.barrier()
"""
TRAIN_DISTRIBUTED = """\
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from backend import Backend, synchronize


def main(dataset, model, optimizer, rank, epochs):
    backend = Backend(rank)
    loader = backend.distribute(DataLoader(dataset, sampler=DistributedSampler(dataset)))
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        synchronize()
        if rank == 0:
            torch.save(model.state_dict(), "last.pt")
            synchronize()
"""


def test_helpers_from_another_file_distribute_and_synchronize(tmp_path: Path) -> None:
    write(tmp_path, {"backend.py": BACKEND, "train.py": TRAIN_DISTRIBUTED})
    assert found(tmp_path, "train.py") == [(10, "TL802"), (19, "TL801")]


def test_helper_barrier_called_by_every_rank_is_quiet(tmp_path: Path) -> None:
    quiet = TRAIN_DISTRIBUTED.replace(
        '            torch.save(model.state_dict(), "last.pt")\n            synchronize()\n',
        '            torch.save(model.state_dict(), "last.pt")\n        synchronize()\n',
    ).replace(
        "        for x, y in loader:",
        "        loader.sampler.set_epoch(epoch)\n        for x, y in loader:",
    )
    write(tmp_path, {"backend.py": BACKEND, "train.py": quiet})
    assert found(tmp_path, "train.py") == []


LOADERS = """\
from torch.utils.data import DataLoader


class PaddedLoader(DataLoader):
    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, collate_fn=list, **kwargs)
"""
TRAIN_WITH_PROJECT_LOADER = """\
from torch.utils.data.distributed import DistributedSampler

from loaders import PaddedLoader


def main(dataset, model, optimizer, epochs):
    order = DistributedSampler(dataset)
    batches = PaddedLoader(dataset, sampler=order)
    for epoch in range(epochs):
        for x in batches:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
"""


def test_loader_subclass_from_another_file_carries_the_sampler(tmp_path: Path) -> None:
    write(tmp_path, {"loaders.py": LOADERS, "train.py": TRAIN_WITH_PROJECT_LOADER})
    assert found(tmp_path, "train.py") == [(7, "TL802")]


def test_a_project_class_that_is_not_a_loader_stays_unknown(tmp_path: Path) -> None:
    not_a_loader = LOADERS.replace("(DataLoader)", "").replace(
        "        super().__init__(dataset, collate_fn=list, **kwargs)",
        "        self.dataset = dataset",
    )
    write(tmp_path, {"loaders.py": not_a_loader, "train.py": TRAIN_WITH_PROJECT_LOADER})
    assert found(tmp_path, "train.py") == []


STAR_MODELS = """\
import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return torch.softmax(self.head(x), dim=-1)
"""
TRAIN_FROM_STAR = """\
import torch.nn as nn

from models import *


def fit(loader, optimizer):
    net = Classifier()
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        optimizer.zero_grad()
        criterion(net(x), y).backward()
        optimizer.step()
"""


def test_a_class_reached_through_a_star_import_is_followed(tmp_path: Path) -> None:
    write(tmp_path, {"models.py": STAR_MODELS, "train.py": TRAIN_FROM_STAR})
    assert found(tmp_path, "train.py") == [(11, "TL101")]


def test_a_star_import_that_leaves_the_class_out_of_all_is_not_followed(tmp_path: Path) -> None:
    hidden = '__all__ = ["torch"]\n' + STAR_MODELS
    write(tmp_path, {"models.py": hidden, "train.py": TRAIN_FROM_STAR})
    assert found(tmp_path, "train.py") == []


EPOCH_LOOP = """\
def run_epochs(loader, model, optimizer, epochs):
    for epoch in range(epochs):
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
"""
TRAIN_THROUGH_PACKAGE = """\
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import pkg


def main(dataset, model):
    torch.distributed.init_process_group("nccl")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    pkg.engine.run_epochs(loader, model, optimizer, 10)
"""
PACKAGE = {
    "pkg/__init__.py": "from pkg import engine\n",
    "pkg/engine/__init__.py": "from pkg.engine.loop import run_epochs\n",
    "pkg/engine/loop.py": EPOCH_LOOP,
}


@pytest.mark.parametrize(
    "train",
    [
        TRAIN_THROUGH_PACKAGE,
        TRAIN_THROUGH_PACKAGE.replace(
            "import pkg\n", "from pkg.engine import run_epochs\n"
        ).replace("pkg.engine.run_epochs(", "run_epochs("),
    ],
    ids=["dotted-call", "imported-from-package"],
)
def test_a_caller_reaching_the_loop_through_package_reexports_is_found(
    tmp_path: Path, train: str
) -> None:
    write(tmp_path, {**PACKAGE, "train.py": train})
    assert found(tmp_path, "pkg/engine/loop.py") == [(3, "TL802")]


def test_files_naming_only_the_package_are_not_searched_unless_it_reexports(
    tmp_path: Path,
) -> None:
    # `runner.run_epochs()` on an object nobody can name would stop the caller search;
    # the file names the package, not the module, and the package does not re-export it.
    other = "import pkg.engine\n\n\ndef go(runner):\n    runner.run_epochs()\n"
    train = TRAIN_THROUGH_PACKAGE.replace(
        "import pkg\n", "from pkg.engine.loop import run_epochs\n"
    ).replace("pkg.engine.run_epochs(", "run_epochs(")
    files = {**PACKAGE, "pkg/engine/__init__.py": "", "other.py": other, "train.py": train}
    write(tmp_path, files)
    assert found(tmp_path, "pkg/engine/loop.py") == [(3, "TL802")]


def test_a_package_caller_that_sets_the_epoch_is_quiet(tmp_path: Path) -> None:
    told = EPOCH_LOOP.replace(
        "        for x in loader:",
        "        loader.sampler.set_epoch(epoch)\n        for x in loader:",
    )
    write(tmp_path, {**PACKAGE, "pkg/engine/loop.py": told, "train.py": TRAIN_THROUGH_PACKAGE})
    assert found(tmp_path, "pkg/engine/loop.py") == []


LOADER_FACTORY = """\
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def make(dataset):
    return DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
"""
TRAIN_WITH_MODULE_FACTORY = """\
import torch

import data.loaders


def main(dataset, model, epochs):
    torch.distributed.init_process_group("nccl")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = data.loaders.make(dataset)
    for epoch in range(epochs):
        for x in batches:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
"""


def test_a_factory_called_through_its_module_returns_its_loader(tmp_path: Path) -> None:
    files = {"data/__init__.py": "", "data/loaders.py": LOADER_FACTORY}
    write(tmp_path, {**files, "train.py": TRAIN_WITH_MODULE_FACTORY})
    assert found(tmp_path, "train.py") == [(11, "TL802")]


# ---------------------------------------------------------------------- TL206
EPOCH_KEEPING_LOSSES = """\
from engine import train_step


def train_epoch(model, loader, optimizer, criterion):
    losses = []
    total = 0.0
    for batch in loader:
        loss = train_step(model, batch, optimizer, criterion)
        total += loss
        losses.append(train_step(model, batch, optimizer, criterion))
    return total, losses
"""


def test_loss_returned_by_a_step_in_another_module_is_kept_alive(tmp_path: Path) -> None:
    # The engine's train_step hands back the loss it backward()-ed, graph and all: the
    # caller keeping it across the epoch holds every step's activations.
    live = ENGINE.replace("return loss.item()", "return loss")
    write(tmp_path, {"engine.py": live, "train.py": EPOCH_KEEPING_LOSSES})
    assert found(tmp_path, "train.py", "TL206") == [(9, "TL206"), (10, "TL206")]
    write(tmp_path, {"engine.py": ENGINE})
    assert found(tmp_path, "train.py", "TL206") == []


# ---------------------------------------------------------------------- caching
def test_summaries_are_cached_by_function_text(tmp_path: Path) -> None:
    write(tmp_path, {"engine.py": ENGINE, "train.py": TRAIN_WITH_ENGINE})
    workspace = Workspace(tmp_path)
    train = tmp_path / "train.py"
    analyze(train.read_text(), str(train), workspace=workspace)
    engine = workspace.facts_for(tmp_path / "engine.py")
    assert engine is not None
    step = engine.functions["train_step"]
    first = engine.summary(step)
    assert first.steps_optimizer and first.backwards and not first.returns_graph
    assert engine.summary(step) is first  # memoised per file version
    # A new parse of the same text finds the leaf summary in the text-keyed table.
    assert len(_text_cache) > 0
    again = type(engine)(parse_source(ENGINE), engine.filename, workspace)
    assert again.summary(again.functions["train_step"]) == first


def test_a_helper_summarised_without_the_project_does_not_answer_for_the_project(
    tmp_path: Path,
) -> None:
    # `engine.main` saves `args` through `utils.save_on_master`. Checked on its own (no
    # project), the call into utils cannot be followed, so the summary that its own
    # `main(...)` call asks for saves nothing. Keyed by text alone, that summary used to
    # answer the cross-file check after it in the same process: the launcher's TL301 was lost.
    engine = (
        "from utils import save_on_master\n\n\n"
        "def main(args, model):\n"
        '    save_on_master({"model": model.state_dict(), "args": args}, "last.pt")\n\n\n'
        'if __name__ == "__main__":\n'
        "    main(None, None)\n"
    )
    launcher = (
        "import argparse\n\nimport engine\n\n\n"
        "def run(model):\n"
        "    args = argparse.ArgumentParser().parse_args()\n"
        "    engine.main(args, model)\n"
    )
    write(tmp_path, {"utils.py": UTILS, "engine.py": engine, "launcher.py": launcher})
    assert found(tmp_path, "launcher.py", "TL301") == [(8, "TL301")]
    analyze(engine, str(tmp_path / "engine.py"))  # in-file only: the helper is not followed
    assert found(tmp_path, "launcher.py", "TL301") == [(8, "TL301")]


def test_a_module_changed_on_disk_is_read_again_and_an_unchanged_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, {"engine.py": ENGINE})
    engine = tmp_path / "engine.py"
    workspace = Workspace(tmp_path)
    first = workspace.facts_for(engine)
    assert first is not None
    reads: list[Path] = []
    real_read = Workspace.text_of

    def counting(self: Workspace, path: Path) -> str | None:
        reads.append(path)
        return real_read(self, path)

    monkeypatch.setattr(Workspace, "text_of", counting)
    assert workspace.facts_for(engine) is first
    assert reads == []  # same size, inode and modification time: not even read
    engine.write_text(ENGINE.replace("optimizer.step()", "optimizer.zero_grad()"))
    status = engine.stat()
    os.utime(engine, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    again = workspace.facts_for(engine)
    assert again is not None and again is not first and reads == [engine.resolve()]
    assert not again.summary(again.functions["train_step"]).steps_optimizer


def test_model_class_reached_as_a_module_attribute(tmp_path: Path) -> None:
    # `import seq_models as sm; decoder = sm.Decoder(...)`: the class is found through the
    # module the index names, and its forward's LogSoftmax reaches the cross-entropy.
    write(
        tmp_path,
        {
            "seq_models.py": (
                "import torch.nn as nn\n\n\nclass Decoder(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n"
                "        self.out = nn.Linear(8, 5)\n        self.norm = nn.LogSoftmax(dim=1)\n\n"
                "    def forward(self, x, h):\n        return self.norm(self.out(x)), h\n"
            ),
            "train.py": (
                "import torch.nn as nn\n\nimport seq_models as sm\n\n\n"
                "def step(x, h, y):\n    decoder = sm.Decoder()\n"
                "    output, h = decoder(x, h)\n    return nn.CrossEntropyLoss()(output, y)\n"
            ),
        },
    )
    assert found(tmp_path, "train.py", "TL101") == [(9, "TL101")]
