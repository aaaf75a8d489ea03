"""Each registered exemption protects the negative fixture it names, and is documented.

An exemption (`@exemption(code, fixture)` in `torchls.analysis.registry`) is a predicate that
keeps a rule quiet on correct code. For each one: the fixture exists beside the rule's other
fixtures, it is quiet under its rule, it becomes reported when the predicate is replaced by one
that exempts nothing (so the predicate, not some other check, is what keeps it quiet), and the
rule's documentation lists the exemption under "Not reported".
"""

from __future__ import annotations

import sys

import pytest

from tests.rules.golden import FIXTURES, findings_for
from torchls.analysis import all_rules, get_rule
from torchls.analysis.registry import EXEMPTIONS, Exemption


def _exemptions() -> list[Exemption]:
    all_rules()  # imports every rule module, which registers the exemptions
    return [exempt for code in sorted(EXEMPTIONS) for exempt in EXEMPTIONS[code]]


def _id(exempt: Exemption) -> str:
    return f"{exempt.code}-{exempt.name}"


def test_rules_register_exemptions() -> None:
    assert len(_exemptions()) >= 10
    assert all(get_rule(exempt.code) is not None for exempt in _exemptions())


@pytest.mark.parametrize("exempt", _exemptions(), ids=_id)
def test_exemption_protects_its_fixture(exempt: Exemption, monkeypatch) -> None:
    fixture = FIXTURES / exempt.code / exempt.fixture
    assert fixture.is_file(), f"{exempt.name} names {fixture}, which does not exist"
    assert [f.code for f in findings_for(fixture, only=exempt.code)] == []
    predicate = getattr(sys.modules[exempt.module], exempt.name)
    # Replaced wherever it is bound, also in modules that imported it by name.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("torchls.analysis"):
            if getattr(module, exempt.name, None) is predicate:
                monkeypatch.setattr(module, exempt.name, lambda *args, **kwargs: False)
    reported = [f.code for f in findings_for(fixture, only=exempt.code)]
    assert exempt.code in reported, (
        f"without {exempt.name}, {fixture.name} is still quiet: the exemption protects nothing"
    )


@pytest.mark.parametrize("exempt", _exemptions(), ids=_id)
def test_exemption_is_in_the_rules_not_reported_section(exempt: Exemption) -> None:
    rule = get_rule(exempt.code)
    assert rule is not None
    section = rule.doc.split("## Not reported", 1)
    assert len(section) == 2, f"{exempt.code} doc lacks its Not reported section"
    assert f"`{exempt.name}`, fixture `{exempt.fixture}`" in section[1]


def test_an_exemption_must_name_a_negative_fixture_and_say_what_it_recognises() -> None:
    from torchls.analysis.registry import exemption

    def quiet(*args: object) -> bool:
        """Recognises nothing."""
        return False

    with pytest.raises(ValueError, match="not a negative fixture"):
        exemption("TL101", "pos_softmax.py")(quiet)
    with pytest.raises(ValueError, match="needs a docstring"):
        exemption("TL101", "neg_softmax.py")(lambda: False)
