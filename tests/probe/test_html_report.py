"""The repro's HTML report (issue #18) for a real CPU run: a model with an unused layer and a
dead ReLU block. Checked from the page itself: one bar per layer named like the model's modules,
the unused layer marked, the dead block at 1.0 in the zero-fraction chart, no script and no
remote resource, run data escaped; and a real headless Chromium screenshot that is not blank.
"""

from __future__ import annotations

import html
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchls.probe.html_report import render_html

pytest.importorskip("torch")

MODEL = """\
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.dead = nn.Linear(16, 16)
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3)
        with torch.no_grad():
            self.dead.bias.fill_(-100.0)  # every pre-activation negative: the ReLU is dead
        self.add_module("<img src=x onerror=alert(1)>", nn.Identity())

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = self.act(self.dead(h))
        return getattr(self, "<img src=x onerror=alert(1)>")(self.head(h + 0.1))

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def series(svg: str) -> dict[str, list[tuple[str, float]]]:
    """Per legend title, the (x label, value) of each bar or point pygal drew."""
    legend = dict(
        re.findall(r'<g id="activate-serie-(\d+)"[^>]*>.*?<text[^>]*>([^<]*)</text>', svg)
    )
    groups = re.split(r'<g class="series serie-(\d+)[^"]*">', svg)
    found: dict[str, list[tuple[str, float]]] = {}
    for index in range(1, len(groups) - 1, 2):
        points = re.findall(
            r'<desc class="value">([^<]*)</desc>.*?<desc class="x_label">([^<]*)</desc>',
            groups[index + 1],
        )
        title = html.unescape(legend.get(groups[index], groups[index]))
        found.setdefault(title, []).extend((html.unescape(x), float(v)) for v, x in points)
    return found


def charts(page: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", page, re.S)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    from torchls.probe import ReproOptions, run_repro

    folder = tmp_path_factory.mktemp("report")
    script = folder / "train.py"
    script.write_text(MODEL)
    report = run_repro(script, ReproOptions(python=sys.executable, timeout_s=60.0))
    assert report.status == "ok", report.data.get("findings")
    out = folder / "report.html"
    out.write_text(render_html(report), encoding="utf-8")
    return out.read_text(encoding="utf-8"), out


def test_the_gradient_flow_has_a_bar_per_layer_and_marks_the_unused_one(page) -> None:
    flow = series(charts(page[0])[0])
    labels = [label for label, _ in flow["gradient norm"] + flow["all-zero gradient"]]
    everything = labels + [label for label, _ in flow["NO GRADIENT (unused or detached)"]]
    assert sorted(everything) == ["Net.dead", "Net.head", "Net.stem", "Net.unused"]
    assert [label for label, _ in flow["NO GRADIENT (unused or detached)"]] == ["Net.unused"]
    assert [label for label, _ in flow["gradient norm"]] == ["Net.head"]  # nothing flows past


def test_the_dead_block_is_visible_in_the_zero_fraction_chart(page) -> None:
    zeros = dict(series(charts(page[0])[1])["zeros (1.0: dead)"])
    assert zeros["Net.act (ReLU)"] == 1.0
    assert zeros["Net.stem (Linear)"] < 0.2


def test_the_page_is_self_contained_and_escapes_run_data(page) -> None:
    text = page[0]
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert "<script" not in text
    remote = set(re.findall(r'(?:src|href)="(https?:[^"]+)"', text))
    assert remote == set()
    assert "<img" not in text and "&lt;img" in text  # the hostile module name, as text


def test_the_cli_writes_the_report(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(MODEL)
    out = tmp_path / "out.html"
    command = [sys.executable, "-m", "torchls", "repro", str(script), "--report", str(out)]
    done = subprocess.run(
        [*command, "--python", sys.executable],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # TL902 warnings for the unused and dead layers
    assert out.is_file() and "Gradient flow" in out.read_text()


def test_a_headless_chromium_screenshot_is_not_blank(page, tmp_path: Path) -> None:
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is needed (scripts/apt.d lists it; ./scripts/test installs it)")
    shot = tmp_path / "report.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
    flags += ["--disable-background-networking", "--disable-component-update"]
    flags += [f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
    subprocess.run(
        [browser, *flags, "--window-size=1200,1400", f"--screenshot={shot}", page[1].as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20) or []
    assert len(colors) > 50, len(colors)  # text, axes and bars, not one flat colour
    white = sum(count for count, rgb in colors if rgb == (255, 255, 255))
    assert white < image.width * image.height * 0.97


def test_a_run_whose_loss_is_never_finite_still_gets_a_report(tmp_path: Path) -> None:
    from torchls.probe import ReproOptions, run_repro

    script = tmp_path / "nan.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 3)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(5):\n"
        "    loss = torch.log(torch.softmax(model(torch.randn(8, 4)), 1) * 0).sum()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    report = run_repro(script, ReproOptions(python=sys.executable, timeout_s=60.0))
    assert any(f["code"] == "TL901" for f in report.data["findings"])
    page = render_html(report)
    assert "loss (this run): never finite" in page and "TL901" in page
