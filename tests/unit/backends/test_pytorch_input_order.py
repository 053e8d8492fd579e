"""Which forward() argument each configured input of a TorchScript model feeds, as Triton's PyTorch backend decides:
forward()'s argument names, else `<name>__<index>`, else the configuration's order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nereid.backends.pytorch_backend import _input_order
from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError


def _context(*names: str) -> SimpleNamespace:
    inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in names)
    return SimpleNamespace(name="m", config=parse_pbtxt(f'name: "m" backend: "pytorch" input [ {inputs} ]', "m"))


def test_inputs_named_after_forward_arguments_follow_the_arguments() -> None:
    assert _input_order(_context("b", "a"), ["a", "b"]) == ["a", "b"]  # type: ignore[arg-type]


def test_indexed_names_give_the_argument_position() -> None:
    assert _input_order(_context("X__1", "Y__0"), ["a", "b"]) == ["Y__0", "X__1"]  # type: ignore[arg-type]
    with pytest.raises(NereidError, match="out of range or used twice"):
        _input_order(_context("X__0", "Y__0"), ["a", "b"])  # type: ignore[arg-type]


def test_other_names_go_in_the_configurations_order_as_triton_takes_them() -> None:
    """qa/L0_input_validation: torch.nn.Identity scripted (forward(input)) served with an input named INPUT0."""
    assert _input_order(_context("INPUT0"), ["input"]) == ["INPUT0"]  # type: ignore[arg-type]
    assert _input_order(_context("B", "A__0"), ["x", "y"]) == ["B", "A__0"]  # type: ignore[arg-type]
