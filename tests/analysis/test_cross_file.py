"""Cross-file understanding: imported model classes, factories and loss wrappers are followed
into the files that define them, and edits to those files are seen on the next analysis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchls.analysis import Workspace, analyze

MODELS_SOFTMAX = """\
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)


def build_classifier():
    return nn.Sequential(nn.Linear(10, 3), nn.Softmax(dim=1))
"""
MODELS_LOGITS = MODELS_SOFTMAX.replace("F.softmax(self.fc(x), dim=1)", "self.fc(x)")
LOSSES = """\
import torch.nn as nn


def make_criterion():
    return nn.CrossEntropyLoss(label_smoothing=0.1)
"""
TRAIN = """\
import torch
import torch.nn as nn
from models import Net, build_classifier
from pkg.losses import make_criterion


def train(loader):
    model = Net()
    other = build_classifier()
    criterion = nn.CrossEntropyLoss()
    wrapped = make_criterion()
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss = loss + wrapped(other(x), y)
        loss.backward()
        optimizer.step()
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS_SOFTMAX)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "losses.py").write_text(LOSSES)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def findings(project: Path, workspace: Workspace | None):
    train = project / "train.py"
    return analyze(train.read_text(), str(train), workspace=workspace).findings


def test_softmax_in_imported_model_class_is_found_with_related_location(project: Path) -> None:
    found = [f for f in findings(project, Workspace(project)) if f.code == "TL101"]
    assert [(f.span.start.row, f.span.start.column) for f in found] == [(15, 25), (16, 30)]
    first = found[0]
    assert "models.py" in first.message
    assert first.related[0].filename == str((project / "models.py").resolve())
    assert first.related[0].span.start.row == 11
    # The factory's nn.Softmax is found too, through a loss built by an imported wrapper.
    assert found[1].related[0].span.start.row == 15


def test_without_a_workspace_nothing_is_guessed(project: Path) -> None:
    assert findings(project, None) == []


def test_editing_the_model_file_clears_the_finding(project: Path) -> None:
    workspace = Workspace(project)
    assert any(f.code == "TL101" for f in findings(project, workspace))
    (project / "models.py").write_text(MODELS_LOGITS)
    codes = [(f.span.start.row, f.code) for f in findings(project, workspace)]
    assert codes == [(16, "TL101")]  # only the factory's softmax is left


def test_overlay_text_wins_over_the_file_on_disk(project: Path) -> None:
    models = (project / "models.py").resolve()
    workspace = Workspace(project, overlay=lambda path: MODELS_LOGITS if path == models else None)
    assert [f.span.start.row for f in findings(project, workspace)] == [16]


def test_library_imports_are_not_resolved(project: Path) -> None:
    workspace = Workspace(project)
    findings(project, workspace)
    # Net, build_classifier and make_criterion are named by the project index (models.py,
    # pkg/losses.py): jedi is never asked, and never about torch / torch.nn.
    assert workspace.jedi_calls == 0
    assert workspace.index.lookups >= 3
    findings(project, workspace)
    assert workspace.jedi_calls == 0


def test_a_module_no_project_file_holds_is_not_asked_of_jedi(project: Path) -> None:
    # The index walked the whole project: an import it finds no file for (an installed or
    # generated module) can name no project file, so jedi is not asked about it.
    (project / "train.py").write_text(TRAIN.replace("from models import", "from vendored import"))
    workspace = Workspace(project)
    assert not [f for f in findings(project, workspace) if f.code == "TL101"]
    assert workspace.jedi_calls == 0


def test_jedi_is_the_fallback_where_the_index_cannot_walk(project: Path) -> None:
    # No root folder: the index knows only the script's own folder, so what it cannot name
    # still goes to jedi (Net and build_classifier).
    (project / "train.py").write_text(TRAIN.replace("from models import", "from vendored import"))
    workspace = Workspace(None)
    findings(project, workspace)
    assert workspace.jedi_calls == 2


def test_a_module_on_a_folder_the_script_adds_to_sys_path(project: Path) -> None:
    # `tools/train.py` runs with `lib/` put on sys.path by hand: `models` is `lib/models.py`,
    # the one project file whose dotted path ends in `models`.
    (project / "lib").mkdir()
    (project / "models.py").rename(project / "lib" / "models.py")
    (project / "tools").mkdir()
    script = "import sys\nsys.path.insert(0, '../lib')\n" + TRAIN
    (project / "tools" / "train.py").write_text(script)
    (project / "train.py").unlink()
    workspace = Workspace(project)
    path = project / "tools" / "train.py"
    found = [
        f for f in analyze(script, str(path), workspace=workspace).findings if f.code == "TL101"
    ]
    assert [f.related[0].filename for f in found[:1]] == [
        str((project / "lib" / "models.py").resolve())
    ]
    assert workspace.jedi_calls == 0


def test_two_files_with_the_same_dotted_tail_are_not_guessed_between(project: Path) -> None:
    (project / "tools" / "sub").mkdir(parents=True)
    for folder in ("a", "b"):
        (project / folder).mkdir()
        (project / folder / "nets.py").write_text(MODELS_SOFTMAX)
    script = project / "tools" / "sub" / "train.py"
    script.write_text(TRAIN.replace("from models import", "from nets import"))
    workspace = Workspace(project)
    assert workspace.index.locate(script.resolve(), "nets.Net") is None
    found = analyze(script.read_text(), str(script), workspace=workspace).findings
    assert not [f for f in found if f.code == "TL101" and "nets.py" in f.message]
    # A copy in a folder above the script wins over the others: it is the nearer one.
    (project / "tools" / "nets.py").write_text(MODELS_SOFTMAX)
    workspace.invalidate()
    assert workspace.index.locate(script.resolve(), "nets.Net") == (
        (project / "tools" / "nets.py").resolve(),
        "Net",
    )


def test_files_outside_the_workspace_root_are_ignored(project: Path, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    assert findings(project, Workspace(elsewhere)) == []


def test_cli_reports_cross_file_finding(project: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torchls", "check", "train.py"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "train.py:15:26: TL101" in result.stdout
    assert "in models.py, line 11" in result.stdout


ARCHITECTURES = """\
import torch.nn as nn
import torch.nn.functional as F


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 16)
        self.out = nn.Linear(16, 50)

    def forward(self, tokens, state):
        hidden, state = self.rnn(tokens, state)
        return self.out(hidden), state


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(8, 2)
        self.out = nn.Linear(8, 50)

    def forward(self, tokens):
        return F.log_softmax(self.out(self.block(tokens)), dim=-1)
"""
LANGUAGE_MODEL = """\
import argparse
import torch
import torch.nn as nn
import architectures

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="attention")
options = parser.parse_args()
if options.arch == "attention":
    net = architectures.Attention()
else:
    net = architectures.Recurrent()
loss_fn = nn.CrossEntropyLoss()


def epoch(batches, state=None):
    for tokens, targets in batches:
        if options.arch == "attention":
            scores = net(tokens)
        else:
            scores, state = net(tokens, state)
        loss = loss_fn(scores.view(-1, 50), targets.view(-1))
        loss.backward()


for _ in range(3):
    epoch([])
net = torch.load("best.pt")
"""


def test_a_model_chosen_by_a_flag_is_followed_on_each_path(tmp_path: Path) -> None:
    # One choice of architecture ends its forward in log_softmax, in another file; the name
    # is rebound after training, which is not what the training function sees.
    (tmp_path / "architectures.py").write_text(ARCHITECTURES)
    train = tmp_path / "lm.py"
    train.write_text(LANGUAGE_MODEL)
    found = [
        f
        for f in analyze(train.read_text(), str(train), workspace=Workspace(tmp_path)).findings
        if f.code == "TL101"
    ]
    assert [f.span.start.row for f in found] == [22]
    assert "in architectures.py, line 23" in found[0].message
    assert "on the path through line 10" in found[0].message
    assert found[0].related[0].span.start.row == 23
    # With the softmax gone from that branch, nothing is left to report.
    (tmp_path / "architectures.py").write_text(
        ARCHITECTURES.replace("F.log_softmax(self.out(self.block(tokens)), dim=-1)", "self.out(x)")
    )
    assert not [
        f
        for f in analyze(train.read_text(), str(train), workspace=Workspace(tmp_path)).findings
        if f.code == "TL101"
    ]


def test_a_re_export_is_followed_without_jedi_on_the_quick_pass(tmp_path: Path) -> None:
    # The package re-exports a name from a module outside the project: the quick (cached)
    # pass must not ask jedi about it on the way. The index has walked the project, so it
    # knows no project file holds that module: no answer is missing, no slower pass needed.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from vendored_models import Net\n")
    train = tmp_path / "train.py"
    train.write_text("from pkg import Net\n\nmodel = Net()\n")
    workspace = Workspace(tmp_path)
    view = workspace.cached_view()
    analyze(train.read_text(), str(train), workspace=view)
    assert workspace.jedi_calls == 0
    assert not view.missed
    # Where the index cannot walk (no root), the quick pass notes the missing answer.
    rootless = Workspace(None)
    view = rootless.cached_view()
    analyze(train.read_text(), str(train), workspace=view)
    assert rootless.jedi_calls == 0
    assert view.missed


STAR_HELPERS = """\
import torch


def batches(data, size):
    for start in range(0, len(data), size):
        yield data[start : start + size], data[start + 1 : start + size + 1]
"""
STAR_SCRIPT = """\
import torch.nn as nn
from helpers import *

model = nn.Sequential(nn.Embedding(50, 16), nn.Dropout(0.2), nn.Linear(16, 50))
criterion = nn.CrossEntropyLoss()


def evaluate(data):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in batches(data, 32):
            total += criterion(model(x), y).item()
    return total
"""


def test_torch_bound_by_a_star_import_of_a_project_module_is_resolved(tmp_path: Path) -> None:
    # `import torch.nn as nn` binds only `nn`: the `torch` of `torch.no_grad()` comes from
    # `from helpers import *`, whose module imports torch. Without a workspace to read
    # helpers.py, the star import is not followed.
    (tmp_path / "helpers.py").write_text(STAR_HELPERS)
    script = tmp_path / "eval_lm.py"
    script.write_text(STAR_SCRIPT)
    with_workspace = analyze(script.read_text(), str(script), workspace=Workspace(tmp_path))
    assert [f.code for f in with_workspace.findings if f.code == "TL202"] == []
    # A module with `__all__` exports only what it lists: its `torch` is not adopted.
    (tmp_path / "helpers.py").write_text('__all__ = ["batches"]\n' + STAR_HELPERS)
    assert "torch" not in _star_adopted(tmp_path, script)
    (tmp_path / "helpers.py").write_text(STAR_HELPERS)
    assert _star_adopted(tmp_path, script)["torch"] == "torch"


def _star_adopted(root: Path, script: Path) -> dict[str, str]:
    """The names the script's import table gained from its star imports."""
    from torchls.analysis.facts import build_facts
    from torchls.analysis.source import parse_source

    facts = build_facts(parse_source(script.read_text()), str(script), Workspace(root))
    try:
        return {k: v for k, v in facts.imports.items() if k not in ("nn", "batches", "helpers")}
    finally:
        facts.release()


def test_a_torch_the_file_reads_but_never_binds_is_torch() -> None:
    # A star import out of reach (no workspace here) or a file exec'd into a namespace that
    # holds torch: the free global `torch` is the torch module, so its no_grad counts.
    assert [f.code for f in analyze(STAR_SCRIPT).findings if f.code == "TL202"] == []
    # A `torch` the file binds itself is what it binds.
    rebound = STAR_SCRIPT.replace("import torch.nn as nn\n", "import torch.nn as nn\ntorch = nn\n")
    assert [f.code for f in analyze(rebound).findings if f.code == "TL202"] == ["TL202"]
    parameter = STAR_SCRIPT.replace("def evaluate(data):", "def evaluate(data, torch):")
    assert [f.code for f in analyze(parameter).findings if f.code == "TL202"] == ["TL202"]


EPOCH_LOOPS = """\
def fit_one_epoch(loader, net, criterion, opt):
    net.train()
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(net(x), y)
        loss.backward()
        opt.step()
"""
EPOCH_SCRIPT = """\
import torch
import torch.nn as nn

from loops import fit_one_epoch


def main(loader, epochs):
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        fit_one_epoch(loader, net, criterion, opt)
        torch.save({"epoch": epoch, "model": net.state_dict()}, "ckpt.pth")
    torch.save({"model": net.state_dict()}, "final.pth")
"""


def test_a_final_export_after_an_epoch_loop_training_in_another_file(tmp_path: Path) -> None:
    # The epoch loop's backward() runs in loops.py: the save after that loop is a one-off
    # export (quiet), the one inside it a periodic checkpoint without optimizer state.
    (tmp_path / "loops.py").write_text(EPOCH_LOOPS)
    script = tmp_path / "main.py"
    script.write_text(EPOCH_SCRIPT)
    found = analyze(script.read_text(), str(script), workspace=Workspace(tmp_path)).findings
    assert [f.span.start.row for f in found if f.code == "TL304"] == [13]


def test_a_check_and_the_modules_it_follows_share_one_summary_context(tmp_path) -> None:
    """A check's `ProjectView` answers as its workspace does, so the summaries of a function
    reached from a checked file and from a module it imports are the same entry; the
    editor's fast `CachedView`, which may miss names, keeps its own."""
    from torchls.analysis.facts import build_facts
    from torchls.analysis.resolver import Workspace
    from torchls.analysis.source import parse_source
    from torchls.analysis.summaries import _resolution_context
    from torchls.project import ProjectView

    workspace = Workspace(tmp_path)
    parsed = parse_source("def f(x):\n    return x\n")
    name = str(tmp_path / "a.py")
    on_workspace = _resolution_context(build_facts(parsed, name, workspace))
    on_view = _resolution_context(build_facts(parsed, name, ProjectView(workspace)))  # type: ignore[arg-type]
    on_cached = _resolution_context(build_facts(parsed, name, workspace.cached_view()))  # type: ignore[arg-type]
    assert on_view == on_workspace == ("project", str(tmp_path.resolve()))
    assert on_cached[0] == "view"


MODE_FREE_LIBRARY = """\
import torch
import torch.nn as nn


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Conv2d(3, 8, 3, padding=1)
        self.decode = nn.ConvTranspose2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.decode(torch.relu(self.encode(x)))


def training(model, batches, epochs):
    optimizer = torch.optim.Adam(model.parameters())
    model.train()
    for epoch in range(epochs):
        for images in batches:
            loss = (model(images) - images).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            print(epoch, (model(batches[0]) - batches[0]).pow(2).mean().item())
"""
MODE_FREE_SCRIPT = """\
import autoencoder as ae

model = ae.AutoEncoder()
ae.training(model, [], 10)
"""


def test_a_parameter_only_other_files_fill_is_judged_by_what_they_pass(tmp_path: Path) -> None:
    # training()'s model comes from start.py: an AutoEncoder of convolutions only, which
    # eval() cannot change, so the eval() left on in the epoch loop is no TL203 there. The
    # same class with a dropout layer is.
    (tmp_path / "autoencoder.py").write_text(MODE_FREE_LIBRARY)
    (tmp_path / "start.py").write_text(MODE_FREE_SCRIPT)
    library = tmp_path / "autoencoder.py"
    found = analyze(library.read_text(), str(library), workspace=Workspace(tmp_path))
    assert [f.code for f in found.findings if f.code == "TL203"] == []
    with_dropout = MODE_FREE_LIBRARY.replace(
        "self.decode(torch.relu(self.encode(x)))",
        "self.decode(self.drop(torch.relu(self.encode(x))))",
    ).replace(
        "        self.decode = nn.ConvTranspose2d(8, 3, 3, padding=1)\n",
        "        self.decode = nn.ConvTranspose2d(8, 3, 3, padding=1)\n"
        "        self.drop = nn.Dropout(0.2)\n",
    )
    library.write_text(with_dropout)
    found = analyze(library.read_text(), str(library), workspace=Workspace(tmp_path))
    assert [f.code for f in found.findings if f.code == "TL203"] == ["TL203"]


RANKING = """\
def hit_rate(scorer, pairs, k):
    hits = 0
    for users, items in pairs:
        scores = scorer(users, items)
        hits += int(items[0] in items[scores.topk(k).indices])
    return hits / max(len(pairs), 1)
"""
RANKING_SCRIPT = """\
import torch
import torch.nn as nn
import ranking

scorer = nn.Sequential(nn.Embedding(50, 8), nn.Dropout(0.2), nn.Flatten(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(scorer.parameters())
for epoch in range(3):
    scorer.train()
    for users, labels in train_pairs:
        optimizer.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(scorer(users), labels).backward()
        optimizer.step()
    scorer.eval()
    print(ranking.hit_rate(scorer, test_pairs, 10))
"""


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (RANKING_SCRIPT, ["TL202"]),
        # the caller turns gradients off around the call: nothing is recorded
        (
            RANKING_SCRIPT.replace(
                "    print(ranking.hit_rate(scorer, test_pairs, 10))",
                "    with torch.no_grad():\n"
                "        print(ranking.hit_rate(scorer, test_pairs, 10))",
            ),
            [],
        ),
        # the caller never calls eval(): the model's mode there is training, not TL202's case
        (RANKING_SCRIPT.replace("    scorer.eval()\n", ""), []),
    ],
)
def test_a_helper_run_by_other_files_on_a_model_in_eval_mode(
    tmp_path: Path, script: str, expected: list[str]
) -> None:
    # hit_rate() never calls eval() and has no caller in its own file: the mode of what it
    # runs is the one its callers in other files leave the model in.
    (tmp_path / "ranking.py").write_text(RANKING)
    (tmp_path / "main.py").write_text(script)
    helper = tmp_path / "ranking.py"
    found = analyze(RANKING, str(helper), workspace=Workspace(tmp_path))
    assert [f.code for f in found.findings if f.code == "TL202"] == expected
    assert [f.code for f in analyze(RANKING).findings if f.code == "TL202"] == []  # no project


CALLABLE_UPDATES = """\
import torch


class BatchUpdate:
    def __init__(self, net, optimizer, criterion):
        self.net, self.optimizer, self.criterion = net, optimizer, criterion

    def __call__(self, inputs, labels):
        self.optimizer.zero_grad()
        loss = self.criterion(self.net(inputs), labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()


class BatchScore:
    def __init__(self, net):
        self.net = net

    def __call__(self, inputs, labels):
        with torch.no_grad():
            return (self.net(inputs).argmax(1) == labels).float().mean().item()
"""

CALLABLE_LOOP = """\
import torch
from torch import nn
from updates import BatchUpdate, BatchScore


def run_epoch(loader, apply_batch, schedule):
    for inputs, labels in loader:
        apply_batch(inputs, labels)
        schedule.step()


def main(loader, epochs):
    net = nn.Linear(8, 3)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    for _ in range(epochs):
        run_epoch(loader, BatchUpdate(net, optimizer, nn.CrossEntropyLoss()), schedule)
"""


CALLABLE_LOCAL = CALLABLE_LOOP.replace(
    "def run_epoch(loader, apply_batch, schedule):",
    "def run_epoch(loader, net, optimizer, schedule):\n"
    "    apply_batch = BatchUpdate(net, optimizer, nn.MSELoss())",
).replace(
    "BatchUpdate(net, optimizer, nn.CrossEntropyLoss()), schedule", "net, optimizer, schedule"
)
CALLABLE_SCORE = CALLABLE_LOOP.replace(
    "BatchUpdate(net, optimizer, nn.CrossEntropyLoss())", "BatchScore(net)"
)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        # every caller hands the loop an object whose `__call__` (in updates.py) trains
        (CALLABLE_LOOP, [(9, 8)]),
        # the object only scores batches: the loop does not train
        (CALLABLE_SCORE, []),
        # bound to a local name first
        (CALLABLE_LOCAL, [(10, 8)]),
    ],
)
def test_a_call_of_a_project_object_runs_its_class_call_method(
    tmp_path: Path, script: str, expected: list[tuple[int, int]]
) -> None:
    # `apply_batch(...)` runs `BatchUpdate.__call__` of another file: its summary (backward
    # and step) makes the loop a training loop, where an epoch schedule is stepped per batch.
    (tmp_path / "updates.py").write_text(CALLABLE_UPDATES)
    (tmp_path / "train.py").write_text(script)
    train = tmp_path / "train.py"
    found = analyze(script, str(train), workspace=Workspace(tmp_path)).findings
    assert [(f.span.start.row, f.span.start.column) for f in found if f.code == "TL402"] == expected
