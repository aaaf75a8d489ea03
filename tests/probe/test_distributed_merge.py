"""Merging the ranks' reports into one, without running anything (torchls.probe.distributed).

Hand-made rank reports stand for what two ranks would write: their findings are kept once each
and say which ranks had them, a rank without a report gets a finding built from torchrun's
failure summary, TL908 is built from a declared hang and the ranks' stacks with the branch
around the collective, `# noqa` silences the distributed codes, lines whose values differ are
marked with the other rank's values, and the options that cannot work are refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchls.config import ConfigError, load_config
from torchls.lsp.settings import Settings, apply_settings
from torchls.probe import ReproOptions, ReproUsageError
from torchls.probe.distributed import merge, torchrun_arguments, torchrun_failures
from torchls.probe.prepare import prepare
from torchls.records import replace

SCRIPT = """\
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()
model = make()  # noqa: TL909
"""

FAILURE_SUMMARY = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_14:20:00
  host      : sandbox
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 42)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 42
"""


def _finding(file: str, code: str, line: int, message: str, column: int = 5) -> dict:
    return {
        "code": code,
        "name": "x",
        "severity": "error",
        "filename": file,
        "line": line,
        "column": column,
        "end_line": line,
        "end_column": column + 14,
        "message": message,
        "related": [],
    }


def _report(rank: int, **fields: object) -> dict:
    data = {
        "status": "ok",
        "stopped_by": "steps",
        "findings": [],
        "lines": [],
        "notes": [],
        "exception": None,
        "progress": {"optimizer_steps": 2},
        "distributed": {"rank": rank, "world_size": 2, "initialized": True, "backend": {}},
    }
    data.update(fields)
    return data


@pytest.fixture
def prepared(tmp_path: Path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    return prepare(path, ReproOptions(python=sys.executable, nproc=2, device="cpu"))


def _merge(prepared, reports, stderr: str = "") -> dict:
    request = prepared.request(None, None)
    request["distributed"] = {"collective_timeout_s": 5.0}
    return merge(
        prepared,
        request,
        [(report, None) for report in reports],
        stderr=stderr,
        killed_for=None,
        started_ranks={0, 1},
        launcher="torch.distributed.run",
    )


def test_findings_are_kept_once_and_say_which_ranks_had_them(prepared):
    file = str(prepared.file)
    both = _finding(file, "TL904", 3, "UserWarning: the same on both")
    only = _finding(file, "TL905", 6, "RuntimeError: only on rank 1")
    merged = _merge(
        prepared,
        [
            _report(0, findings=[both]),
            _report(1, status="error", stopped_by="exception", findings=[both, only]),
        ],
    )

    assert [f["message"] for f in merged["findings"]] == [
        "UserWarning: the same on both",
        "rank 1: RuntimeError: only on rank 1",
    ]
    assert merged["findings"][0]["ranks"] == [0, 1]
    assert merged["status"] == "error" and merged["stopped_by"] == "exception"


def test_a_rank_without_a_report_is_named_from_torchruns_summary(prepared):
    assert torchrun_failures(FAILURE_SUMMARY) == {1: -9}
    merged = _merge(prepared, [_report(0, stopped_by="peer"), None], stderr=FAILURE_SUMMARY)

    [missing] = merged["findings"]
    assert missing["message"].startswith("rank 1 ended without a report")
    assert "SIGKILL" in missing["message"]
    assert merged["status"] == "crashed"
    assert [r["report"] for r in merged["distributed"]["ranks"]] == [True, False]
    assert merged["distributed"]["ranks"][1]["exit_code"] == -9


def test_a_declared_hang_becomes_tl908_with_the_branch_and_where_the_others_were(prepared):
    file = str(prepared.file)
    barrier = {"filename": file, "line": 5, "column": 5, "end_line": 5, "end_column": 19}
    hang = {"rank": 0, "op": "barrier()", "timeout_s": 5.0, "seq": 1, **barrier}
    waiting = {"state": "waiting in barrier()", "pending": {"op": "barrier()", **barrier}}
    finished = {
        "state": "finished",
        "steps": 2,
        "where": {"filename": file, "line": 6, "column": 1, "end_line": 6, "end_column": 8},
    }
    reports = [
        _report(
            0,
            status="error",
            stopped_by="hang",
            distributed={"rank": 0, "hang": hang, "snapshot": waiting},
        ),
        _report(1, distributed={"rank": 1, "hang": hang, "snapshot": finished}),
    ]
    merged = _merge(prepared, reports)

    [tl908] = [f for f in merged["findings"] if f["code"] == "TL908"]
    assert tl908["line"] == 5
    assert tl908["message"].startswith(
        "`dist.barrier()` on line 5 was reached by rank 0 but not by rank 1 within 5 s"
    )
    assert "`if dist.get_rank() == 0:`, line 4" in tl908["message"]
    assert "rank 1 had finished its bounded run (2 optimizer steps) at line 6" in tl908["message"]
    assert tl908["related"][0]["line"] == 6
    assert merged["stopped_by"] == "hang" and merged["status"] == "error"


def test_noqa_silences_a_distributed_finding_on_its_line(prepared):
    file = str(prepared.file)
    divergence = _finding(file, "TL909", 6, "Net.weight differs between ranks 0 and 1")
    merged = _merge(prepared, [_report(0, findings=[divergence]), _report(1)])

    assert merged["findings"] == []


def test_lines_whose_values_differ_between_ranks_are_marked(prepared):
    file = str(prepared.file)

    def line(mean: float) -> dict:
        output = {"shape": [4, 1], "dtype": "float32", "min": -1.0, "max": 1.0, "mean": mean}
        entry = {"op": "F.linear", "column": 9, "outputs": [output]}
        return {"filename": file, "line": 6, "source": "x", "entries": [entry]}

    same = _merge(prepared, [_report(0, lines=[line(0.5)]), _report(1, lines=[line(0.5)])])
    differ = _merge(prepared, [_report(0, lines=[line(0.5)]), _report(1, lines=[line(0.25)])])

    assert "ranks" not in same["lines"][0]
    marks = differ["lines"][0]["ranks"]
    assert marks["differ"] is True
    assert marks["values"][0]["rank"] == 1
    assert marks["values"][0]["entries"][0]["outputs"][0]["mean"] == 0.25


def test_torchrun_is_standalone_unless_a_rendezvous_is_named():
    standalone = torchrun_arguments(ReproOptions(nproc=2))
    assert standalone[:3] == ["--standalone", "--nproc-per-node", "2"]
    cluster = torchrun_arguments(ReproOptions(nproc=4, nnodes="2", rdzv_endpoint="10.0.0.1:29400"))
    assert "--standalone" not in cluster
    assert cluster[:6] == [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29400",
    ]


def test_nproc_in_the_project_file_and_the_editor_settings(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[tool.torchls.probe]\nnproc = 2\n", encoding="utf-8")
    assert load_config(tmp_path).probe["nproc"] == 2
    (tmp_path / "pyproject.toml").write_text("[tool.torchls.probe]\nnproc = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="nproc"):
        load_config(tmp_path)

    settings, problems = apply_settings(Settings(), {"probe": {"nproc": 2}})
    assert settings.probe.nproc == 2 and problems == []
    _, problems = apply_settings(Settings(), {"probe.nproc": 1.5})
    assert problems and "nproc" in problems[0]


def test_a_cuda_device_index_is_refused_with_ranks(prepared):
    with pytest.raises(ReproUsageError, match="--device cuda"):
        prepare(prepared.file, replace(prepared.resolved.options, device="cuda:0"))
