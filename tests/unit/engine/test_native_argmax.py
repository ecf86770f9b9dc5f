"""The native argmax (native/argmax.cpp) against torch.argmax, whose answer it must give."""

import pytest
import torch

from maas_kernels.native import bindings
from maas_services.engine import native_argmax

needs_library = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)


def rows_with_edges(vocab: int) -> torch.Tensor:
    torch.manual_seed(vocab)
    rows = torch.randn(6, vocab)
    rows[1, vocab // 3] = rows[1, vocab - 1] = 1e4  # a tie: the first wins
    rows[2] = float("-inf")
    rows[3, vocab - 1] = float("nan")
    rows[3, vocab // 2] = float("nan")  # the first NaN is the answer
    rows[4, vocab - 1] = float("inf")
    rows[5] = 0.0
    return rows


@needs_library
@pytest.mark.parametrize("vocab", [1, 5, 8, 13, 32, 45, 100, 49152])
def test_every_row_gets_torchs_argmax(vocab):
    rows = rows_with_edges(vocab)
    assert native_argmax.argmax(rows) == rows.argmax(-1).tolist()


@needs_library
def test_rows_of_a_wider_tensor_are_read_in_place():
    wide = rows_with_edges(200)
    view = wide[:, 10:150]
    assert native_argmax.argmax(view) == view.argmax(-1).tolist()


@needs_library
def test_two_threads_give_one_threads_answer():
    rows = torch.randn(64, 1000)
    before = torch.get_num_threads()
    try:
        answers = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            answers.append(native_argmax.argmax(rows))
    finally:
        torch.set_num_threads(before)
    assert answers[0] == answers[1] == rows.argmax(-1).tolist()


def test_what_the_native_pass_does_not_read_goes_to_torch():
    rows = rows_with_edges(45)
    for other in (rows.to(torch.bfloat16), rows.t().contiguous().t()):
        assert native_argmax.argmax(other) == other.argmax(-1).tolist()
