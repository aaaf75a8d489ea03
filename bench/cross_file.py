"""Benchmark: the cost of cross-file resolution per file.

Writes a small project (a models.py with module classes and factories, and N training files
importing from it), then times, per training file: the in-file analysis (no workspace), the
first analysis with a workspace (jedi imported and asked: cold), and later ones (answers
cached per import, other files' facts cached per content: warm). Prints figures, no assertions.
Usage: python bench/cross_file.py [--files 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import module_source

from torchls.analysis import Workspace, analyze

MODELS = '''"""Shared models."""

import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=-1)


def build_head():
    return nn.Sequential(nn.Linear(32, 10), nn.Softmax(dim=-1))
'''

USES = """

from models import Classifier, build_head


def uses_shared_models_{index}(loader):
    model = Classifier()
    head = build_head()
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        loss = criterion(model(x), y) + criterion(head(x), y)
        loss.backward()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20)
    options = parser.parse_args()
    import random

    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "models.py").write_text(MODELS)
        paths = []
        for index in range(options.files):
            path = root / f"train_{index}.py"
            path.write_text(module_source(index, rng) + USES.format(index=index))
            paths.append(path)
        sources = [path.read_text() for path in paths]

        def timed(workspace_for) -> tuple[list[float], int]:
            times, findings = [], 0
            for path, source in zip(paths, sources, strict=True):
                start = time.perf_counter()
                result = analyze(source, str(path), workspace=workspace_for())
                times.append((time.perf_counter() - start) * 1000)
                findings += len(result.findings)
            return times, findings

        in_file, in_file_findings = timed(lambda: None)
        workspace = Workspace(root)
        cold_start = time.perf_counter()
        analyze(sources[0], str(paths[0]), workspace=workspace)
        cold = (time.perf_counter() - cold_start) * 1000
        first_visit, cross_findings = timed(lambda: workspace)
        again, _ = timed(lambda: workspace)
        base = statistics.median(in_file)
        print(f"project: {options.files} training files importing from models.py")
        print(f"in-file analysis: median {base:.1f} ms/file ({in_file_findings} findings)")
        print(f"with workspace, very first file (jedi cold): {cold:.0f} ms")
        print(
            f"with workspace, each file's first analysis (its imports asked of jedi): median "
            f"{statistics.median(first_visit):.1f} ms/file "
            f"(+{cross_findings - in_file_findings} cross-file findings)"
        )
        print(
            f"with workspace, re-analysis (answers cached): median "
            f"{statistics.median(again):.1f} ms/file ({statistics.median(again) / base:.2f}x "
            f"the in-file analysis); jedi queries in all: {workspace.jedi_calls}"
        )


if __name__ == "__main__":
    main()
