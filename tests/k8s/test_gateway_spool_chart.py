"""The gateway's usage spool in the chart: a volume that outlives the pod, one
folder per pod with the parent claimed by every replica, and a kill grace
longer than the shutdown grace, so the last replay is not cut by SIGKILL."""

from pathlib import PurePosixPath

import kubernetes_validate

from tests.k8s.test_chart import CHART, KUBERNETES_VERSION, helm, render_refused, render_set  # noqa: F401


def gateway_parts(docs) -> tuple[dict, dict[str, dict], dict]:
    """(pod spec, env by name, the spool volume)."""
    (gateway,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "maas-gateway"
    ]
    pod = gateway["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "spool"]
    return pod, env, volume


def claims(docs, name: str) -> list[dict]:
    """The chart's PersistentVolumeClaims of that name (the files volume has its own)."""
    return [
        d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == name
    ]


def test_spool_is_on_a_shared_claim_with_a_folder_per_pod(helm):  # noqa: F811
    docs = render_set(helm)
    pod, env, volume = gateway_parts(docs)
    (claim,) = claims(docs, "maas-gateway-spool")
    for doc in (claim, *[d for d in docs if d["kind"] == "Deployment"]):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    names = list(env)
    assert names.index("POD_NAME") < names.index("MAAS_USAGE_SPOOL_DIR")  # for $(POD_NAME)
    own = PurePosixPath(env["MAAS_USAGE_SPOOL_DIR"]["value"])
    assert own.name == "$(POD_NAME)"
    assert str(own.parent) == env["MAAS_USAGE_SPOOL_CLAIM_DIR"]["value"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "spool"]
    assert mount["mountPath"] == str(own.parent)

    grace = float(env["MAAS_SHUTDOWN_GRACE_SECONDS"]["value"])
    assert pod["terminationGracePeriodSeconds"] > grace


def test_an_existing_claim_or_an_empty_dir_instead(helm):  # noqa: F811
    docs = render_set(helm, "gateway.spool.persistence.existingClaim=spools")
    assert not claims(docs, "maas-gateway-spool")
    assert gateway_parts(docs)[2]["persistentVolumeClaim"] == {"claimName": "spools"}

    docs = render_set(helm, "gateway.spool.persistence.enabled=false")
    assert not claims(docs, "maas-gateway-spool")
    assert gateway_parts(docs)[2]["emptyDir"] == {}


def test_a_kill_grace_not_above_the_shutdown_grace_is_refused(helm):  # noqa: F811
    refusal = render_refused(helm, "gateway.terminationGracePeriodSeconds=30")
    assert "terminationGracePeriodSeconds must exceed" in refusal
