"""Rule selection semantics (prefixes, ignore, extend-select, per-file-ignores)."""

from __future__ import annotations

from torchls.analysis.noqa import add_code_to_line
from torchls.analysis.selection import RuleSelection


def test_default_selects_everything() -> None:
    assert RuleSelection.from_lists().enabled("TL101")


def test_prefixes_and_most_specific_wins() -> None:
    selection = RuleSelection.from_lists(select=["TL"], ignore=["TL2"], extend_select=["TL203"])
    assert selection.enabled("TL101")
    assert not selection.enabled("TL201")
    assert selection.enabled("TL203")


def test_select_all_keyword_and_case() -> None:
    selection = RuleSelection.from_lists(select=["all"], ignore=["tl3"])
    assert selection.enabled("TL101") and not selection.enabled("TL301")


def test_per_file_ignores_match_relative_paths_and_names() -> None:
    selection = RuleSelection.from_lists(per_file_ignores={"tests/*.py": ["TL1"]})
    assert not selection.enabled("TL101", "tests/test_model.py")
    assert selection.enabled("TL101", "train.py")
    assert selection.enabled("TL201", "tests/test_model.py")


def test_enabled_codes_answer_as_enabled_does_file_by_file() -> None:
    codes = ("TL101", "TL102", "TL201", "TL301")
    plain = RuleSelection.from_lists(select=["TL1", "TL3"], ignore=["TL102"])
    assert plain.enabled_codes(codes) == ("TL101", "TL301")
    # Without per-file ignores the file does not matter; with them, it does, each time.
    assert plain.enabled_codes(codes, "tests/x.py") == ("TL101", "TL301")
    per_file = RuleSelection.from_lists(per_file_ignores={"tests/*.py": ["TL1"]})
    assert per_file.enabled_codes(codes, "tests/x.py") == ("TL201", "TL301")
    assert per_file.enabled_codes(codes, "train.py") == codes
    assert per_file.enabled_codes(codes, "tests/x.py") == tuple(
        code for code in codes if per_file.enabled(code, "tests/x.py")
    )


def test_add_code_to_noqa_line() -> None:
    assert add_code_to_line("x = f(y)", "TL101") == "x = f(y)  # noqa: TL101"
    assert add_code_to_line("x = f(y)  # noqa: TL302", "TL101") == "x = f(y)  # noqa: TL302, TL101"
    assert add_code_to_line("x = f(y)  # noqa", "TL101") == "x = f(y)  # noqa"
    assert add_code_to_line("x = f(y)  # noqa: TL101", "TL101") == "x = f(y)  # noqa: TL101"


def test_broken_pyproject_that_configures_torchls_is_an_error(tmp_path) -> None:
    import pytest

    from torchls.config import ConfigError, load_config

    (tmp_path / "pyproject.toml").write_text('[tool.torchls]\nselect = ["TL1"\n')
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "train.py")


def test_named_config_file_without_table_gives_defaults(tmp_path) -> None:
    from torchls.config import load_config_file

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    config = load_config_file(tmp_path / "pyproject.toml")
    assert config.select is None and config.selection().enabled("TL101")


def test_noqa_inside_a_string_does_not_silence() -> None:
    from torchls.analysis import analyze

    source = (
        "import torch.nn.functional as F\n"
        "def step(logits, y):\n"
        "    probs = F.softmax(logits, dim=1)\n"
        '    tag = "# noqa"; return F.cross_entropy(probs, y)\n'
    )
    assert [f.code for f in analyze(source).findings] == ["TL101"]
    commented = source.replace("(probs, y)\n", "(probs, y)  # note # noqa: TL101\n")
    assert analyze(commented).findings == []


def test_noqa_is_not_added_after_a_line_continuation() -> None:
    line = "    loss = F.cross_entropy(probs, y) + \\"
    assert add_code_to_line(line, "TL101") == line


def test_scheduler_cadence_reads_constructor_arguments() -> None:
    from torchls.analysis.facts import build_facts
    from torchls.analysis.source import parse_source

    source = (
        "import torch\n"
        "opt = torch.optim.SGD([], lr=0.1)\n"
        "a = torch.optim.lr_scheduler.StepLR(opt, step_size=30)\n"
        "b = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, epochs=10, steps_per_epoch=100)\n"
        "c = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)\n"
        "d = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=num_epochs)\n"
        "a, b, c, d\n"
    )
    facts = build_facts(parse_source(source), "x.py")
    names = facts.tree.body[-1].value.elts
    assert [facts.scheduler_cadence(name) for name in names] == ["epoch", "batch", None, "epoch"]


def test_loops_are_classified_as_epoch_batch_and_training() -> None:
    from torchls.analysis.facts import build_facts
    from torchls.analysis.source import parse_source

    source = (
        "def train_one_epoch(model, train_loader, opt):\n"
        "    for x, y in train_loader:\n"
        "        model(x).sum().backward()\n"
        "        opt.step()\n"
        "def fit(model, train_loader, val_loader, opt):\n"
        "    for e in range(10):\n"
        "        train_one_epoch(model, train_loader, opt)\n"
        "        for x, y in val_loader:\n"
        "            model(x)\n"
        "    for i in range(3):\n"
        "        print(i)\n"
    )
    facts = build_facts(parse_source(source), "x.py")
    rows = lambda loops: sorted(loop.lineno for loop in loops)  # noqa: E731
    assert rows(facts.batch_loops) == [2, 8]
    assert {facts.batch_loops[loop] for loop in facts.batch_loops} == {"train", "eval"}
    assert rows(facts.epoch_loops) == [6]
    assert rows(facts.training_loops) == [2, 6]
