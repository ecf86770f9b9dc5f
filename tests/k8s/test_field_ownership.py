"""The emulator's server-side apply against the API server's documented examples.

https://kubernetes.io/docs/reference/using-api/server-side-apply/ ("Conflicts",
"Merge strategy", "Transferring ownership", "Reverting ownership").
"""

import pytest

from tests.k8s.field_ownership import ApplyConflict, Managed, leaves


def deployment(**spec) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": spec,
    }


CONTAINER = {"name": "engine", "image": "maas:1", "env": [{"name": "A", "value": "1"}]}
TEMPLATE = {"spec": {"containers": [CONTAINER]}}


def test_a_field_another_manager_set_differently_conflicts_unless_forced():
    managed = Managed()
    live = managed.applied(None, deployment(replicas=3), "alice", force=False)
    with pytest.raises(ApplyConflict, match='conflict with "alice": .spec.replicas'):
        managed.applied(live, deployment(replicas=5), "bob", force=False)
    live = managed.applied(live, deployment(replicas=5), "bob", force=True)
    assert live["spec"]["replicas"] == 5
    assert managed.owners(("f:spec", "f:replicas")) == ["bob"]


def test_the_same_value_is_shared_and_kept_while_one_owner_still_applies_it():
    managed = Managed()
    live = managed.applied(None, deployment(replicas=3, paused=False), "alice", force=False)
    live = managed.applied(live, deployment(replicas=3), "bob", force=False)
    assert sorted(managed.owners(("f:spec", "f:replicas"))) == ["alice", "bob"]
    # alice stops applying both: paused has no other owner and goes, replicas stays bob's.
    live = managed.applied(live, deployment(), "alice", force=False)
    assert live["spec"] == {"replicas": 3}


def test_an_update_takes_the_fields_it_changes_so_apply_no_longer_removes_them():
    """Transferring ownership: `kubectl scale` (an update), then apply without replicas."""
    managed = Managed()
    before = managed.applied(None, deployment(replicas=1, paused=False), "alice", force=False)
    scaled = {**before, "spec": {**before["spec"], "replicas": 4}}
    managed.updated(before, scaled, "kubectl-scale")
    assert managed.owners(("f:spec", "f:replicas")) == ["kubectl-scale"]
    live = managed.applied(scaled, deployment(paused=False), "alice", force=False)
    assert live["spec"]["replicas"] == 4
    with pytest.raises(ApplyConflict):
        managed.applied(live, deployment(replicas=1, paused=False), "alice", force=False)


def test_keyed_lists_merge_by_key_and_forced_apply_restores_only_its_own_fields():
    managed = Managed()
    live = managed.applied(None, deployment(template=TEMPLATE), "op", force=True)
    edited = deployment(
        template={
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "image": "evil:1",
                        "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "x"}],
                    }
                ]
            }
        }
    )
    managed.updated(live, edited, "kubectl-edit")
    with pytest.raises(ApplyConflict):
        managed.applied(edited, deployment(template=TEMPLATE), "op", force=False)
    live = managed.applied(edited, deployment(template=TEMPLATE), "op", force=True)
    (container,) = live["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "maas:1"
    # A is op's again; B was never op's, so op's apply leaves it.
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "x"}]


def test_an_item_a_manager_stops_applying_is_removed_whole():
    managed = Managed()
    two = {"spec": {"containers": [CONTAINER, {"name": "side", "image": "s:1"}]}}
    live = managed.applied(None, deployment(template=two), "op", force=False)
    live = managed.applied(live, deployment(template=TEMPLATE), "op", force=False)
    assert [c["name"] for c in live["spec"]["template"]["spec"]["containers"]] == ["engine"]


def test_managed_fields_read_as_the_api_writes_them():
    managed = Managed()
    managed.applied(None, deployment(replicas=2, template=TEMPLATE), "op", force=False)
    (entry,) = managed.fields_v1()
    assert entry["manager"] == "op" and entry["operation"] == "Apply"
    container = entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert set(container['k:{"name":"engine"}']) == {"f:name", "f:image", "f:env"}
    assert ("f:metadata", "f:name") not in leaves(deployment())
