"""The shapes editors wrap torchls settings in are all understood."""

from __future__ import annotations

from torchls.lsp.settings import split_initialization_options, unwrap_section


def test_payload_wrappers_are_unwrapped() -> None:
    flat = {"ignore": ["TL101"]}
    assert unwrap_section(flat) == flat
    assert unwrap_section({"torchls": flat}) == flat
    assert unwrap_section({"settings": flat}) == flat
    assert unwrap_section({"settings": {"torchls": flat}}) == flat


def test_initialization_options_carry_trust() -> None:
    assert split_initialization_options({"settings": {"run": "onSave"}, "trusted": True}) == (
        {"run": "onSave"},
        True,
    )
    assert split_initialization_options({"run": "onSave"}) == ({"run": "onSave"}, True)
    # Trusted unless the client says otherwise: Neovim and Helix send nothing about trust.
    assert split_initialization_options(None)[1] is True
    assert split_initialization_options({"trusted": False})[1] is False
    assert split_initialization_options({"settings": {"trusted": False}})[1] is False
