"""The repro's pure pieces: line maps across edits, probe settings, and the messages that name
the setting to change. No server, no torch."""

from __future__ import annotations

from tests.reports import schema_report
from torchls.lsp.repro_diagnostics import probe_span
from torchls.lsp.repro_messages import limit_problem, sandbox_problem, setup_failure, usage_failure
from torchls.lsp.repro_state import LineMap, ReproStore, build_result
from torchls.lsp.settings import ProbeSettings, Settings, apply_settings

BASELINE = ["a = 1", "b = 2", "c = 3", "d = 4"]


def test_identical_text_maps_every_line_to_itself() -> None:
    mapping = LineMap(BASELINE, list(BASELINE))
    assert [mapping.new_row(row) for row in range(1, 5)] == [1, 2, 3, 4]
    assert mapping.old_row(3) == (3, False)
    assert mapping.new_row(5) is None


def test_inserted_lines_move_traces_and_edited_lines_are_stale() -> None:
    current = ["# header", "a = 1", "b = 20", "c = 3", "d = 4"]
    mapping = LineMap(BASELINE, current)
    assert mapping.new_row(1) == 2  # moved down by the inserted line
    assert mapping.new_row(2) is None  # edited: no fresh place
    assert mapping.old_row(3) == (2, True)  # ...but the hover still finds its old trace
    assert mapping.new_row(4) == 5
    assert mapping.old_row(1) is None  # the run never saw the new line
    assert not mapping.fresh(range(1, 3))


def test_deleted_lines_have_no_place() -> None:
    mapping = LineMap(BASELINE, ["a = 1", "d = 4"])
    assert mapping.new_row(2) is None and mapping.new_row(3) is None
    assert mapping.new_row(4) == 2


def test_probe_positions_become_spans_only_on_unchanged_lines() -> None:
    item = {"line": 2, "column": 1, "end_line": 2, "end_column": 6}
    moved = LineMap(BASELINE, ["# new", *BASELINE])
    span = probe_span(item, moved)
    assert span is not None and (span.start.row, span.start.column, span.end.column) == (3, 0, 5)
    assert probe_span(item, LineMap(BASELINE, ["a = 1", "b = 22", "c = 3", "d = 4"])) is None


def test_store_replaces_per_document_and_clears(tmp_path) -> None:
    path = tmp_path / "train.py"
    path.write_text("\n".join(BASELINE), encoding="utf-8")
    finding = {"code": "TL901", "filename": str(path), "line": 1, "column": 1}
    store = ReproStore()
    store.put(build_result("file:///t", 1, schema_report(findings=[finding]), {}))
    store.put(build_result("file:///t", 2, schema_report(findings=[]), {}))
    assert store.newest_for(str(path)) is None  # the re-run found nothing in this file
    store.put(build_result("file:///t", 3, schema_report(findings=[finding]), {}))
    found = store.newest_for(str(path))
    assert found is not None and found[0].run_id == 3
    assert store.clear("file:///t") == {str(path.resolve())}
    assert not store


def test_probe_settings_nested_and_dotted() -> None:
    settings, problems = apply_settings(Settings(), {"probe": {"steps": 3, "device": "cuda:1"}})
    assert problems == [] and settings.probe == ProbeSettings(device="cuda:1", steps=3)
    settings, problems = apply_settings(settings, {"probe.timeout": 5, "probe.python": ""})
    assert problems == []
    assert settings.probe == ProbeSettings(device="cuda:1", steps=3, timeout=5.0)
    _, problems = apply_settings(Settings(), {"probe": {"steps": 0, "memory": True, "device": "x"}})
    assert len(problems) == 3 and all("torchls.probe." in p for p in problems)


def test_no_torch_names_the_python_setting() -> None:
    data = {
        "exception": {
            "kind": "setup",
            "message": "torch cannot be imported by /usr/bin/python3: No module named 'torch' "
            "(choose the interpreter that has your torch with --python)",
        }
    }
    message = setup_failure(data, "/usr/bin/python3", "`python3` on PATH, the default")
    assert "torch cannot be imported by /usr/bin/python3" in message
    assert "`torchls.probe.python`" in message and "--python" not in message


def test_unavailable_device_names_the_device_setting() -> None:
    data = {"exception": {"kind": "device", "message": "device 'cuda' is not available"}}
    assert "`torchls.probe.device`" in setup_failure(data, "python", "x")


def test_bad_interpreter_setting_is_named() -> None:
    message = usage_failure("--python /nope: no executable interpreter there", "/nope", "setting")
    assert "/nope" in message and "torchls.probe.python" in message


def test_limits_name_their_setting() -> None:
    bounds = {"timeout_s": 60.0, "memory_mb": 4096}
    timeout = limit_problem({"stopped_by": "timeout", "bounds": bounds}, "/p/train.py")
    assert timeout is not None and "60 s" in timeout and "torchls.probe.timeout" in timeout
    memory = limit_problem(
        {"status": "memory", "stopped_by": "memory", "bounds": bounds}, "/p/train.py"
    )
    assert memory is not None and "4096 MB" in memory and "torchls.probe.memory" in memory
    assert limit_problem({"status": "ok", "stopped_by": "steps", "bounds": bounds}, "x") is None


def test_missing_sandbox_layers_say_how_to_get_them() -> None:
    message = sandbox_problem({"sandbox": {"degraded": ["bubblewrap", "filesystem"]}})
    assert message is not None and "bubblewrap" in message and "Install" in message
    assert sandbox_problem({"sandbox": {"degraded": []}}) is None
