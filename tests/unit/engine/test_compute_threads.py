"""The core's compute threads per step: every thread from wide_rows rows, one fewer below."""

import pytest
import torch

from maas_services.engine.core.compute_threads import ComputeThreads


def test_a_narrow_step_leaves_a_core_and_a_wide_one_takes_them_all():
    two = ComputeThreads(wide=2, wide_rows=16)
    assert [two.for_rows(rows) for rows in (1, 8, 15, 16, 64, 2048)] == [1, 1, 1, 2, 2, 2]
    # A 16-core machine keeps 15 threads for narrow steps, as its old default did.
    assert ComputeThreads(wide=16, wide_rows=16).for_rows(1) == 15


def test_one_thread_or_a_threshold_of_one_never_switches():
    assert {ComputeThreads(1, 16).for_rows(rows) for rows in (1, 16, 64)} == {1}
    assert {ComputeThreads(2, 1).for_rows(rows) for rows in (1, 16, 64)} == {2}


@pytest.mark.parametrize("wide, wide_rows", [(0, 16), (2, 0)])
def test_unresolved_settings_are_refused(wide, wide_rows):
    with pytest.raises(ValueError, match="unresolved"):
        ComputeThreads(wide, wide_rows)


def test_apply_sets_torchs_threads_for_the_step():
    before = torch.get_num_threads()
    policy = ComputeThreads(wide=2, wide_rows=16)
    try:
        policy.apply(64)
        assert torch.get_num_threads() == 2
        policy.apply(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
