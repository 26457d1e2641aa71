"""shared.checks.check: prints the difference in scientific notation, passes equal inputs, fails different ones."""

import numpy as np
import pytest
import torch

from shared.checks import check


def test_equal_inputs_pass_and_print(capsys):
    assert check("same", [[1.0, 2.0]], np.array([[1.0, 2.0]])) is None
    assert capsys.readouterr().out == "same: max abs diff = 0 (< 1e-12: True)\n"


def test_tensor_vs_array_within_tolerance(capsys):
    check("t", torch.tensor([1.0, 2.5]), np.array([1.0, 2.5000001]), tol=1e-6)
    assert "max abs diff = 1.0e-07 (< 1e-06: True)" in capsys.readouterr().out


def test_difference_above_tolerance_fails_loudly(capsys):
    with pytest.raises(AssertionError, match="difference 0.5 is not below 0.001"):
        check("off", [1.0, 2.0], [1.0, 2.5], tol=1e-3)
    assert "max abs diff = 5.0e-01 (< 0.001: False)" in capsys.readouterr().out


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match=r"shapes differ, got \(2,\) and expected \(1, 2\)"):
        check("shape", [1.0, 2.0], [[1.0, 2.0]])


def test_tiny_difference_is_not_rounded_away(capsys):
    # 0.1 + 0.2 differs from 0.3 by one unit in the last place (2**-54 * 4 = 5.55e-17)
    check("ulp", [0.1 + 0.2], [0.3])
    assert capsys.readouterr().out == "ulp: max abs diff = 5.6e-17 (< 1e-12: True)\n"


def test_count_matmuls_counts_each_product_operator():
    from shared.checks import count_matmuls

    a, b, bias = torch.ones(4, 5), torch.ones(5, 3), torch.ones(3)
    batched = torch.ones(2, 4, 5)

    def three_products():
        a @ b  # one mm
        torch.addmm(bias, a, b)  # one addmm
        torch.bmm(batched, batched.transpose(1, 2))  # one bmm
        a @ b  # a second mm

    assert count_matmuls(three_products) == {"mm": 2, "addmm": 1, "bmm": 1}
    assert count_matmuls(torch.add, a, 1) == {"mm": 0, "addmm": 0, "bmm": 0}
    linear = torch.nn.Linear(5, 3)  # a 2-D input with a bias: one addmm
    assert count_matmuls(linear, a) == {"mm": 0, "addmm": 1, "bmm": 0}


def test_count_matmuls_rejects_a_non_function():
    from shared.checks import count_matmuls

    with pytest.raises(TypeError, match="a function .or module. and its arguments.*got a Tensor"):
        count_matmuls(torch.ones(2, 2))
