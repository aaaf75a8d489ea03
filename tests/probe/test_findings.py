"""The probe finds each planted bug on the right line with the right code (real torch, CPU)."""

from __future__ import annotations

from tests.probe import cases
from tests.probe.support import codes


def by_code(report, code):
    return [f for f in report.findings if f.code == code]


def test_nan_from_log_zero_is_tl901_on_the_log_line(warm_repro):
    report, path = warm_repro(cases.NAN_LOG)
    assert report.status == "ok"
    assert report.data["stopped_by"] == "steps"
    [first] = by_code(report, "TL901")
    assert (first.filename, first.line) == (str(path), cases.marker_line(cases.NAN_LOG, "log"))
    line = path.read_text().splitlines()[first.line - 1]
    assert line[first.column - 1 : first.end_column - 1] == "torch.log(probs)"
    assert "torch.log" in first.message and "-inf" in first.message
    events = report.data["nonfinite"]["events"]
    assert events[0]["origin"] == "op" and events[0]["phase"] == "forward"
    chain = [events[i] for i in report.data["nonfinite"]["chain"]]
    assert chain[-1]["line"] == cases.marker_line(cases.NAN_LOG, "loss")
    assert chain[-1]["phase"] == "loss" and chain[-1]["origin"] == "propagated"
    backward = [e for e in events if e["phase"] == "backward"]
    assert backward and backward[0]["origin"] == "op"
    assert backward[0]["line"] == first.line


def test_column_vs_vector_in_mse_loss_and_in_a_difference_is_tl903(warm_repro):
    report, _ = warm_repro(cases.BROADCAST)
    found = {f.line: f for f in by_code(report, "TL903")}
    mse = found[cases.marker_line(cases.BROADCAST, "mse")]
    diff = found[cases.marker_line(cases.BROADCAST, "diff")]
    for finding in (mse, diff):
        assert "[16, 1]" in finding.message and "[16]" in finding.message
        assert "[16, 16]" in finding.message
        assert finding.severity == "error"
    assert "squeeze(-1)" in mse.message
    # MSELoss also warns; that warning lands on the same user line as TL904.
    assert any(f.line == mse.line for f in by_code(report, "TL904"))


def test_clean_script_has_no_findings(warm_repro):
    report, _ = warm_repro(cases.CLEAN)
    assert report.status == "ok"
    assert report.findings == []
    assert report.data["progress"]["optimizer_steps"] == 2
    # Ops inside a library module land on the user line that called it, with the module path.
    [line] = [record for record in report.lines if record["line"] == 10]
    entries = {(e["op"], e["module"]): e for e in line["entries"]}
    assert entries[("F.linear", "Sequential.0")]["outputs"][0]["shape"] == [16, 8]
    assert entries[("F.linear", "Sequential.2")]["outputs"][0]["shape"] == [16, 1]
    assert entries[("F.mse_loss", None)]["phase"] == "loss"
    assert entries[("F.mse_loss", None)]["grad"]["shape"] == []


def test_unused_layer_and_parameter_missing_from_optimizer_are_tl902(warm_repro):
    report, _ = warm_repro(cases.UNUSED)
    found = by_code(report, "TL902")
    aux = [f for f in found if "Net.aux.weight" in f.message]
    head = [f for f in found if "Net.head.weight" in f.message]
    assert aux and "no gradient" in aux[0].message
    assert aux[0].line == cases.marker_line(cases.UNUSED, "aux")
    assert head and "no optimizer" in head[0].message
    assert head[0].line == cases.marker_line(cases.UNUSED, "head")
    assert head[0].related[0].line == cases.marker_line(cases.UNUSED, "step")
    params = report.data["parameters"]
    assert params["without_grad"] == ["Net.aux.weight", "Net.aux.bias"]
    assert params["not_in_optimizer"] == ["Net.head.weight", "Net.head.bias"]


def test_exploding_learning_rate_is_non_finite_after_the_step(warm_repro):
    report, _ = warm_repro(cases.EXPLODING)
    [first] = by_code(report, "TL901")
    assert first.line == cases.marker_line(cases.EXPLODING, "step")
    assert "(step)" in first.message and "gradients were finite" in first.message
    assert report.data["nonfinite"]["events"][0]["phase"] == "step"


def test_exception_lands_on_the_innermost_user_line(warm_repro):
    report, path = warm_repro(cases.EXCEPTION)
    assert report.status == "error"
    [error] = by_code(report, "TL905")
    assert error.line == cases.marker_line(cases.EXCEPTION, "raise")
    line = path.read_text().splitlines()[error.line - 1]
    assert line[error.column - 1 : error.end_column - 1] == "t.view(3, 7)"
    assert error.message.startswith("RuntimeError:")
    assert "Tensor.view" in error.message
    functions = [frame["function"] for frame in report.data["exception"]["traceback"]]
    assert functions[-2:] == ["main", "reshape"]


def test_function_mode_from_a_spec(warm_repro, warm_project):
    spec = warm_project / "repro.yaml"
    spec.write_text("step: train_step\nsetup: make\nsetup_args: {batch_size: 3}\nsteps: 1\n")
    report, _ = warm_repro(cases.FUNCTIONS, spec=str(spec))
    assert report.data["mode"] == "function"
    assert report.data["progress"]["optimizer_steps"] == 1
    [first] = by_code(report, "TL901")
    assert first.line == cases.marker_line(cases.FUNCTIONS, "div")
    shapes = {r["line"]: r["entries"][0]["outputs"][0]["shape"] for r in report.lines}
    assert shapes[cases.marker_line(cases.FUNCTIONS, "div")] == [3, 1]


def test_two_runs_give_the_same_report_apart_from_timing(warm_repro):
    first, _ = warm_repro(cases.NAN_LOG)
    second, _ = warm_repro(cases.NAN_LOG)
    assert first.without_timing() == second.without_timing()
    assert "timing" in first.data


def test_report_is_strict_json_with_the_documented_top_level(warm_repro, device):
    import json

    report, _ = warm_repro(cases.NAN_LOG)

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    data = json.loads(report.to_json(), parse_constant=refuse)
    for key in ("schema_version", "status", "device", "environment", "sandbox", "findings"):
        assert key in data
    for key in ("lines", "timing", "truncated"):
        assert key in data
    assert data["device"]["requested"] == (device or "auto")
    assert data["device"]["observed"] == ["cpu"]  # the case never moves its tensors
    assert data["environment"]["torch"] and data["environment"]["python"]
    assert data["environment"]["determinism"]["seed"] == 0
    assert set(codes(report)) <= {"TL901", "TL902", "TL903", "TL904", "TL905", "TL906"}


def test_dataloader_batches_bound_the_run_and_bad_inputs_are_reported(warm_repro):
    report, _ = warm_repro(cases.LOADER, steps=3)
    assert report.status == "ok"
    assert report.data["stopped_by"] == "batches"
    assert report.data["progress"]["batches"] == 3
    [first] = by_code(report, "TL901")
    assert first.line == cases.marker_line(cases.LOADER, "batch")
    assert "(input)" in first.message and "1 NaN" in first.message
