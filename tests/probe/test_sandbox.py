"""Real escape attempts against the sandbox: network, writes, fork bombs, secrets in the env;
and the plan's two halves, deciding which layers hold and wording them for the report."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest

from tests.probe import cases
from tests.probe.support import bwrap_usable, layer, leftovers
from torchls.probe.cgroup import PidsCgroup
from torchls.probe.sandbox import (
    Decisions,
    PlanInputs,
    describe_layers,
    limit_layers,
    limits_for,
    plan,
)
from torchls.records import replace

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap is not usable here")


def test_connection_to_a_local_listener_never_arrives(repro):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        report, _ = repro(cases.NETWORK, argv=(str(port),))
        network = layer(report, "network")
        if not network["held"]:
            pytest.skip(f"no network isolation here: {network['detail']}")
        assert "BLOCKED" in report.data["output"]["head"]
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@needs_bwrap
def test_writes_outside_the_scratch_folder_do_not_reach_the_host(repro, project, tmp_path):
    inside_project = project / "escape.txt"
    host_tmp = Path("/tmp") / f"torchls-escape-{uuid.uuid4().hex}.txt"
    elsewhere = tmp_path / "elsewhere.txt"
    report, path = repro(cases.WRITES, argv=(str(inside_project), str(host_tmp), str(elsewhere)))
    assert report.status == "ok"
    assert layer(report, "filesystem")["held"]
    for target in (inside_project, host_tmp, elsewhere):
        assert not target.exists(), target
    output = report.data["output"]["head"]
    # The project is seen through a copy: the write succeeds there and is listed, never real.
    assert f"WROTE {inside_project}" in output
    written = report.data["written"]["files"]
    assert {"path": str(inside_project), "bytes": len("escaped"), "kind": "file"} in written
    assert path.read_text() == cases.WRITES  # the user's file is untouched


def _our_cgroups() -> set[Path]:
    groups = Path("/sys/fs/cgroup/pids")
    if not groups.is_dir():
        return set()
    return {p for p in groups.iterdir() if p.name.startswith(f"torchls-{os.getpid()}-")}


def test_fork_bomb_is_contained_and_leaves_nothing(repro):
    before = _our_cgroups()  # a warm worker of another test may hold one
    report, _ = repro(cases.FORK_BOMB, timeout_s=4.0, max_processes=64)
    assert report.status == "timeout"
    assert layer(report, "processes")["held"] or layer(report, "pid_namespace")["held"]
    assert leftovers("torchls_probe --request") == []
    assert _our_cgroups() == before


def test_secrets_are_not_passed_to_the_child(repro, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not_for_user_code")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-not")
    source = "import os\nprint(sorted(os.environ))\n"
    report, _ = repro(source, pass_env=("AWS_SECRET_ACCESS_KEY",))
    output = report.data["output"]["head"]
    assert "GITHUB_TOKEN" not in output and "AWS_SECRET_ACCESS_KEY" not in output
    assert "PYTHONHASHSEED" in output
    assert any("AWS_SECRET_ACCESS_KEY" in w for w in report.data["sandbox"]["warnings"])


def test_layers_that_do_not_hold_are_reported_as_such(repro):
    report, _ = repro("import torch\n", sandbox="none")
    assert not layer(report, "bubblewrap")["held"]
    assert not layer(report, "filesystem")["held"]
    assert "filesystem" in report.data["sandbox"]["degraded"]
    assert layer(report, "memory")["held"] and layer(report, "wall_clock")["held"]


def test_pids_cgroup_is_removed_after_use():
    group = PidsCgroup.create(8)
    if group is None:
        pytest.skip("no pids cgroup can be created here")
    path = group.path
    assert (path / "pids.max").read_text().strip() == "8"
    group.close()
    assert not path.exists()


def _decisions(**changes) -> Decisions:
    base = Decisions(
        bwrap=False,
        bwrap_detail="disabled by request",
        view=None,
        unshare_net=True,
        refused=("AWS_SECRET_ACCESS_KEY",),
        root=False,
        pids_cgroup=False,
        process_count=7,
        nproc=7 + 256,
        seccomp=True,
        outputs=True,
        results=False,
        own_namespaces=False,
    )
    return replace(base, **changes)


def test_layer_wording_is_a_function_of_the_decisions_alone():
    """`plan` decides, `describe_layers` words: the same decisions give the same report, and
    each decision shows in its own layer."""
    limits = limits_for(4096, 60.0, 256, 256, "cpu")
    layers = {layer.name: layer for layer in describe_layers(_decisions(), limits)}
    assert describe_layers(_decisions(), limits) == list(layers.values())
    assert list(layers)[-4:] == ["processes", "environment", "kernel_objects", "project"]
    assert layers["network"].held and "unshare(2)" in layers["network"].detail
    assert not layers["filesystem"].held
    assert layers["processes"].detail == "RLIMIT_NPROC 263 (this user's 7 processes + 256)"
    assert layers["environment"].detail.endswith("refused: AWS_SECRET_ACCESS_KEY")
    root = {
        layer.name: layer for layer in describe_layers(_decisions(root=True, nproc=None), limits)
    }
    assert not root["processes"].held and "root is exempt" in root["processes"].detail
    unfiltered = describe_layers(_decisions(seccomp=False), limits)
    assert not unfiltered[-2].held and unfiltered[-2].name == "kernel_objects"


def test_a_plan_reports_the_layers_its_decisions_describe(tmp_path):
    limits = limits_for(4096, 60.0, 256, 256, "cpu")
    launch = plan(
        PlanInputs(
            python=Path(sys.executable),
            probe_dir=tmp_path,
            scratch=tmp_path,
            cwd=tmp_path,
            read_paths=[],
            limits=limits,
            mode="none",
        )
    )
    try:
        names = [layer.name for layer in launch.layers]
        assert names[:7] == [
            "bubblewrap",
            "network",
            "filesystem",
            "home",
            "disk",
            "probe_code",
            "pid_namespace",
        ]
        # The rlimit layers are `limit_layers`, the wording the warm worker reuses for its runs.
        assert launch.layers[8:11] == limit_layers(limits)
    finally:
        launch.close()


def test_the_memory_limit_spares_the_cuda_driver_whatever_the_device(monkeypatch):
    """RLIMIT_AS breaks the CUDA driver's address-space reservations. On a machine with an
    NVIDIA driver a `--device cpu` run still loads it (a CUDA build of torch initialises it
    when the script asks `torch.cuda.is_available()`): there, as for CUDA runs, the memory
    limit is RLIMIT_DATA. Seen on an H200 machine: under RLIMIT_AS the cpu run died with a
    MemoryError at the optimizer's construction."""
    import torchls.probe.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_nvidia_driver_present", lambda: False)
    assert not limits_for(4096, 60.0, 256, 256, "cpu").use_data_limit
    assert not limits_for(4096, 60.0, 256, 256, "auto").use_data_limit
    assert limits_for(4096, 60.0, 256, 256, "cuda:1").use_data_limit
    monkeypatch.setattr(sandbox, "_nvidia_driver_present", lambda: True)
    for device in ("cpu", "auto", "mps", "cuda"):
        limits = limits_for(4096, 60.0, 256, 256, device)
        assert limits.use_data_limit
        layer = {layer.name: layer for layer in limit_layers(limits)}["memory"]
        assert layer.detail.startswith("RLIMIT_DATA 4096 MB")
