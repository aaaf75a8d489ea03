"""Bad repro specs are refused before anything runs, with a message naming the key."""

from __future__ import annotations

import sys

import pytest

from torchls.probe import ReproOptions, ReproUsageError, SpecError, load_spec, run_repro


def write(tmp_path, text):
    path = tmp_path / "repro.yaml"
    path.write_text(text)
    return path


def test_valid_spec(tmp_path):
    spec = load_spec(write(tmp_path, "step: train_step\nsetup: make\nsteps: 1\nseed: 3\n"))
    assert (spec.step, spec.setup, spec.steps, spec.seed) == ("train_step", "make", 1, 3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stpe: train_step\n", "unknown key 'stpe'; did you mean 'step'?"),
        ("step: train_step\nsteps: two\n", "key 'steps' must be a positive integer, got 'two'"),
        ("step: train_step\nsteps: 0\n", "key 'steps' must be positive"),
        ("step: train_step\ndeterministic: 1\n", "key 'deterministic' must be true or false"),
        ("step: [1, 2\n", "invalid YAML"),
        ("setup: make\n", "missing key 'step'"),
        ("- step\n", "must be a mapping"),
        ("step: s\nsetup_args: {1: 2}\n", "setup_args key 1 must be a Python identifier"),
        ("step: s\nsetup_args: {when: 2024-01-01}\n", "must hold plain values"),
    ],
)
def test_bad_spec_names_the_problem(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert expected in str(caught.value)
    assert str(path) in str(caught.value)


def test_invalid_yaml_reports_the_position(tmp_path):
    with pytest.raises(SpecError, match=r"repro\.yaml:\d+:\d+: invalid YAML"):
        load_spec(write(tmp_path, "step: train\n  bad: indent\n"))


def test_run_repro_refuses_a_bad_spec_without_starting_anything(tmp_path):
    target = tmp_path / "train.py"
    target.write_text("raise SystemExit('must not run')\n")
    spec = write(tmp_path, "stpe: x\n")
    with pytest.raises(ReproUsageError, match="unknown key 'stpe'"):
        run_repro(target, ReproOptions(python=sys.executable, spec=str(spec)))


def test_missing_function_in_spec_is_a_setup_error(repro, project):
    spec = project / "repro.yaml"
    spec.write_text("step: no_such_function\n")
    report, _ = repro("x = 1\n", spec=str(spec))
    assert report.status == "error"
    assert "no_such_function" in report.setup_error
    assert report.findings == []
