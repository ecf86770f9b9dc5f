"""Ready: the admission verdict, else Available; kept when the autoscaler merges its own."""

from maas_operator.modeldeployment.admission import Refusal
from maas_operator.modeldeployment.status import Condition, merge_conditions, ready


def test_a_refusal_wins_over_available_replicas():
    cond = ready(Refusal("ImageNotAllowed", "spec.image 'x' ..."), True)
    assert (cond.status, cond.reason) == (False, "ImageNotAllowed")


def test_an_admitted_spec_is_ready_when_available():
    assert ready(None, None).reason == "Reconciling" and not ready(None, None).status
    assert ready(None, True).status and not ready(None, False).status


def test_merging_other_conditions_keeps_ready_and_its_transition_time():
    before = merge_conditions([], [ready(Refusal("SecretNotAllowed", "m"), None)], 1, 100.0)
    after = merge_conditions(
        before, [Condition("Available", True, "MinimumReplicasReady", "")], 2, 200.0
    )
    by_type = {c["type"]: c for c in after}
    assert by_type["Ready"] == before[0]
    assert by_type["Available"]["observedGeneration"] == 2
