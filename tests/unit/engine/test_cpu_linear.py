"""Wide matmuls in row slices equal one F.linear bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from services.engine import cpu_linear


@pytest.mark.parametrize("rows", [1, 8, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_sliced_wide_weight_equals_one_matmul(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    # 3,100 rows: four full slices and a short last one.
    weight = torch.randn(3100, 576, generator=generator)
    bias = torch.randn(3100, generator=generator) if with_bias else None
    x = torch.randn(rows, 576, generator=generator)
    assert torch.equal(cpu_linear.linear(x, weight, bias), F.linear(x, weight, bias))
