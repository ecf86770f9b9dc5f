"""How close a kernel run in the interpreter must come to its torch twin."""

import torch

# float32: only the order of summation differs. Half precision: the kernels
# compute in float32 and round where the twin rounds, but the interpreter
# rounds float32 -> bfloat16 by truncation where torch rounds to nearest, so
# a result can sit an ulp or two (2**-8 relative each) away.
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **TOLERANCES[expected.dtype])


def assert_rounds_like(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The kernel rounds to the model dtype where its twin does, not just once at the end.

    Checked in float16, which the interpreter rounds to nearest as torch does:
    then all but the odd element (float32 transcendentals or sums in another
    order, landing on the other side of a rounding boundary) are bit-identical,
    where a kernel that skips the twin's roundings matches only about 3 in 4.
    """
    assert actual.dtype == expected.dtype == torch.float16
    assert (actual == expected).float().mean() > 0.99
