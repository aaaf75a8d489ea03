"""Real-world scripts in the sandbox: the project seen through a copy, a terminal, caches,
the launch folder, the network opt-in, and failures the sandbox causes named as such.

Each test runs real scripts under the real sandbox (bubblewrap here, and the fallback without
it via `sandbox="none"`), cold and, where the editor would, warm.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.probe.support import layer
from torchls.probe import ReproOptions, run_repro
from torchls.probe.prepare import prepare
from torchls.probe.warm import ReproSession
from torchls.repro_cli import join_dashed_values

WRITER = """\
import os
import torch

os.makedirs("out", exist_ok=True)
with open("out/log.txt", "w") as handle:
    handle.write("step log")
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.save(model.state_dict(), os.path.join("out", "ckpt.pt"))
"""

TERMINAL = """\
import os
import torch

_, width = os.popen("stty size", "r").read().split()
print("WIDTH", width, os.get_terminal_size().columns)
try:
    input()
except EOFError:
    print("EOF")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 2)).sum().backward()
    optimizer.step()
"""


def _options(**extra: object) -> ReproOptions:
    extra.setdefault("python", sys.executable)
    extra.setdefault("timeout_s", 30.0)
    extra.setdefault("device", "cpu")
    return ReproOptions(**extra)  # type: ignore[arg-type]


def _written(report) -> dict[str, int]:
    return {item["path"]: item["bytes"] for item in report.data["written"]["files"]}


def test_writes_succeed_in_the_copy_are_listed_and_never_reach_the_project(project: Path):
    script = project / "train.py"
    script.write_text(WRITER)
    report = run_repro(script, _options())
    assert report.status == "ok" and report.data["stopped_by"] == "steps", report.data
    assert not (project / "out").exists()
    written = _written(report)
    assert written[str(project / "out" / "log.txt")] == len("step log")
    assert written[str(project / "out" / "ckpt.pt")] > 0
    assert layer(report, "project")["held"]
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]


def test_keep_outputs_copies_what_the_run_wrote(project: Path, tmp_path: Path):
    script = project / "train.py"
    script.write_text(WRITER)
    kept = tmp_path / "kept"
    report = run_repro(script, _options(keep_outputs=str(kept)))
    assert report.data["written"]["kept_in"] == str(kept)
    assert (kept / project.name / "out" / "log.txt").read_text() == "step log"
    assert not (project / "out").exists()


def test_without_bubblewrap_relative_writes_land_in_a_scratch_copy(project: Path):
    script = project / "train.py"
    script.write_text(WRITER)
    report = run_repro(script, _options(sandbox="none"))
    assert report.status == "ok", report.data
    assert not (project / "out").exists()
    assert str(project / "out" / "ckpt.pt") in _written(report)
    project_layer = layer(report, "project")
    assert not project_layer["held"] and "absolute path" in project_layer["detail"]


def test_a_warm_worker_starts_each_run_from_a_fresh_copy(project: Path):
    marker = project / "marker.py"
    marker.write_text("import os\nprint('SEEN', os.path.exists('out'))\n" + WRITER)
    session = ReproSession()
    try:
        options = _options()
        session.prewarm_prepared(prepare(marker, options), wait=True)
        first = session.run(marker, options)
        second = session.run(marker, options)
        for report in (first, second):
            assert report.data["timing"]["runner"] == "warm"
            assert "SEEN False" in report.data["output"]["head"]  # the first run's out/ is gone
            assert str(project / "out" / "ckpt.pt") in _written(report)
        assert not (project / "out").exists()
    finally:
        session.close()


def test_terminal_size_and_stdin_work_like_a_terminal(project: Path):
    script = project / "train.py"
    script.write_text(TERMINAL)
    report = run_repro(script, _options())
    output = report.data["output"]["head"]
    assert report.status == "ok", output
    assert "WIDTH 80 80" in output and "EOF" in output


def test_the_script_runs_from_the_given_folder(project: Path):
    data = project / "data"
    data.mkdir()
    (data / "input.txt").write_text("hello")
    script = project / "train.py"
    script.write_text("print('READ', open('input.txt').read())\n")
    report = run_repro(script, _options(cwd=str(data)))
    assert "READ hello" in report.data["output"]["head"], report.data
    missing = run_repro(script, _options())
    finding = next(f for f in missing.findings if f.code == "TL905")
    assert "relative paths are read from where the script runs" in finding.message
    assert "--cwd" in finding.message
    assert missing.data["exception"]["sandbox_cause"] == "missing_relative"


def test_a_write_the_sandbox_refuses_names_the_option(project: Path, tmp_path: Path):
    outside = tmp_path / "runs"
    outside.mkdir()
    script = project / "train.py"
    script.write_text(f"open({str(outside / 'log.txt')!r}, 'w').write('x')\n")
    refused = run_repro(script, _options())
    finding = next(f for f in refused.findings if f.code == "TL905")
    assert "the sandbox did it" in finding.message and "--writable" in finding.message
    assert refused.data["exception"]["sandbox_cause"] == "hidden_file"
    (project / "ro.py").write_text("open('/opt/torchls-never.txt', 'w')\n")
    read_only = run_repro(project / "ro.py", _options())
    assert read_only.data["exception"]["sandbox_cause"] == "write_refused"
    assert "--writable FOLDER" in next(f for f in read_only.findings if f.code == "TL905").message
    allowed = run_repro(script, _options(writable=(str(outside),)))
    assert allowed.status == "ok", allowed.data
    assert str(outside / "log.txt") in _written(allowed)
    assert list(outside.iterdir()) == []


def test_a_refused_connection_names_the_network_option(project: Path):
    script = project / "train.py"
    script.write_text("import socket\nsocket.getaddrinfo('example.com', 80)\n")
    report = run_repro(script, _options())
    finding = next(f for f in report.findings if f.code == "TL905")
    assert "--network" in finding.message
    assert report.data["exception"]["sandbox_cause"] == "network_refused"
    opened = run_repro(script, _options(network=True))
    network = layer(opened, "network")
    assert not network["held"] and "--network" in network["detail"]


def test_caches_are_bound_read_only_without_their_tokens(
    project: Path, tmp_path: Path, monkeypatch
):
    home = tmp_path / "cachehome"
    (home / ".cache" / "torch" / "hub").mkdir(parents=True)
    (home / ".cache" / "torch" / "hub" / "weights.txt").write_text("weights")
    (home / ".cache" / "huggingface").mkdir()
    (home / ".cache" / "huggingface" / "token").write_text("hf_secret")
    monkeypatch.setenv("HOME", str(home))
    script = project / "train.py"
    script.write_text(
        "import os\n"
        "torch_home = os.environ['TORCH_HOME']\n"
        "print('W', open(os.path.join(torch_home, 'hub', 'weights.txt')).read())\n"
        "print('T', repr(open(os.path.join(os.environ['HF_HOME'], 'token')).read()))\n"
        "try:\n"
        "    open(os.path.join(torch_home, 'new.txt'), 'w')\n"
        "except OSError as error:\n"
        "    print('RO', error.errno)\n"
    )
    report = run_repro(script, _options())
    output = report.data["output"]["head"]
    assert "W weights" in output and "T ''" in output and "RO 30" in output, output
    assert "hf_secret" not in output


def test_dashed_script_arguments_reach_the_script(project: Path):
    script = project / "train.py"
    script.write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--fast', action='store_true')\n"
        "print('FAST', parser.parse_args().fast)\n"
    )
    assert join_dashed_values(["x.py", "--args", "--fast"]) == ["x.py", "--args=--fast"]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torchls", "repro", "train.py", "--args", "--fast"),
            *("--python", sys.executable, "--device", "cpu", "--output-format", "json"),
        ],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "FAST True" in done.stdout


def test_a_temporary_folder_inside_the_project_is_not_copied_into_itself(tmp_path: Path):
    # TMPDIR=./tmp inside the project: the copy is written below a folder the copy would
    # otherwise include, which once copied the copy into itself until the budget ran out.
    from torchls.probe.view import ProjectView

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "rows.txt").write_text("1,2\n")
    (project / "train.py").write_text("print('hi')\n")
    scratch_root = project / "tmp"
    scratch_root.mkdir()
    view = ProjectView.create([project], scratch_root / "view", linked=False)
    copy = view.copy_of(project)
    assert (copy / "data" / "rows.txt").read_text() == "1,2\n"
    assert (copy / "train.py").exists()
    assert not any((copy / "tmp").iterdir())  # a stand-in only, nothing copied into it
    assert view.excluded_entry(project / "tmp")[1] == "holds the sandbox's own scratch files"


def test_a_module_above_the_project_that_the_sandbox_hides_names_the_root_option(
    tmp_path: Path,
):
    """`sys.path.append("..")` and a module beside the script's folder (an `example/` folder
    next to the package, say): the file exists, but above the project the run sees, under
    /tmp that the sandbox hides. The finding says so and names --root; with it the run works.
    A module that exists nowhere, or above the script in a folder the script never put on its
    search path, stays the user's own error."""
    repository = tmp_path / "repository"
    example = repository / "example"
    example.mkdir(parents=True)
    (repository / "helpers_above.py").write_text("SCALE = 2\n")
    script = example / "train.py"
    script.write_text(
        "import sys\n"
        "sys.path.append('..')\n"
        "import helpers_above\n"
        "print('SCALE', helpers_above.SCALE)\n"
    )
    hidden = run_repro(script, _options(cwd=str(example)))
    finding = next(f for f in hidden.findings if f.code == "TL905")
    assert hidden.data["exception"]["sandbox_cause"] == "hidden_module", hidden.data
    assert "the sandbox did it" in finding.message
    assert f"--root {repository}" in finding.message, finding.message
    assert str(repository / "helpers_above.py") in finding.message
    widened = run_repro(script, _options(cwd=str(example), root=str(repository)))
    assert widened.status == "ok", widened.data
    assert "SCALE 2" in widened.data["output"]["head"]
    (example / "nowhere.py").write_text("import module_that_exists_nowhere\n")
    own = run_repro(example / "nowhere.py", _options(cwd=str(example)))
    assert own.data["exception"]["type"] == "ModuleNotFoundError"
    assert "sandbox_cause" not in own.data["exception"]
    # Above the script but never put on the search path: a plain run fails the same way.
    (example / "unlisted.py").write_text("import helpers_above\n")
    unlisted = run_repro(example / "unlisted.py", _options(cwd=str(example)))
    assert unlisted.data["exception"]["type"] == "ModuleNotFoundError"
    assert "sandbox_cause" not in unlisted.data["exception"], unlisted.data["exception"]


def test_a_script_that_needs_cuda_on_a_torch_without_it_says_so(project: Path):
    """`.cuda()` on a CPU-only torch is neither the sandbox's doing nor a slip in the script's
    logic: the TL905 says the interpreter has no CUDA and what to do. A script that asks
    `torch.cuda.is_available()` first runs on the CPU and gets no such remark."""
    import torch

    needs = project / "needs_cuda.py"
    needs.write_text("import torch\nmodel = torch.nn.Linear(3, 1).cuda()\n")
    report = run_repro(needs, _options())
    if torch.cuda.is_available():  # a machine with CUDA runs it: nothing to explain
        assert report.status == "ok", report.data
        return
    finding = next(f for f in report.findings if f.code == "TL905")
    assert report.data["exception"]["environment_cause"] == "no_cuda"
    assert "has no usable CUDA" in finding.message and "--python" in finding.message
    assert "sandbox_cause" not in report.data["exception"]
    chooses = project / "chooses.py"
    chooses.write_text(
        "import torch\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "model = torch.nn.Linear(3, 1).to(device)\n"
        "raise RuntimeError('the script itself fails')\n"
    )
    own = run_repro(chooses, _options())
    assert "environment_cause" not in own.data["exception"]
