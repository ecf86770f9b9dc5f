"""The admission policy: which images and credentials Secrets a spec may name."""

import pydantic
import pytest

from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.settings import OperatorSettings

POLICY = AdmissionPolicy(
    allowed_images=("ghcr.io/maas-dev/maas:*", "registry.example.com/team/*"),
    credentials_secret_pattern="model-credentials-[a-z0-9-]+",
)


def refusal(**spec):
    return POLICY.refusal(defaulted_spec(spec))


def test_a_spec_naming_no_image_or_secret_runs_on_the_operators_defaults():
    assert AdmissionPolicy((), "x").refusal(defaulted_spec({})) is None
    assert refusal(model={"source": {"uri": "https://example.com/m.gguf"}}) is None


@pytest.mark.parametrize(
    "spec",
    [
        {"image": "ghcr.io/maas-dev/maas:0.2.0"},
        {"image": "registry.example.com/team/sub/engine@sha256:" + "a" * 64},
        {"canary": {"version": "v2", "weight": 5, "image": "ghcr.io/maas-dev/maas:0.3.0"}},
        {"model": {"source": {"fetchImage": "registry.example.com/team/curl:8"}}},
    ],
)
def test_allowed_images_run(spec):
    assert refusal(**spec) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"image": "ghcr.io/maas-dev/maas-evil:1"}, "spec.image"),
        ({"image": "GHCR.io/maas-dev/maas:1"}, "spec.image"),
        ({"canary": {"version": "v2", "image": "docker.io/x/miner"}}, "spec.canary.image"),
        (
            {"model": {"source": {"fetchImage": "curlimages/curl:8"}}},
            "spec.model.source.fetchImage",
        ),
    ],
)
def test_other_images_are_refused_naming_the_field(spec, field):
    found = refusal(**spec)
    assert found.reason == "ImageNotAllowed" and found.message.startswith(field + " ")


@pytest.mark.parametrize("secret", ["maas-redis", "model-credentials-", "x-model-credentials-a"])
def test_secrets_outside_the_pattern_are_refused(secret):
    found = refusal(model={"source": {"credentialsSecret": secret}})
    assert found.reason == "SecretNotAllowed" and repr(secret) in found.message


def test_a_secret_matching_the_pattern_runs():
    assert refusal(model={"source": {"credentialsSecret": "model-credentials-s3"}}) is None


def test_settings_refuse_a_pattern_that_is_not_a_regular_expression():
    with pytest.raises(pydantic.ValidationError, match="not a regular expression"):
        OperatorSettings(credentials_secret_pattern="model-(")


def test_settings_default_to_admitting_nothing_a_spec_names_but_the_engine_image():
    settings = OperatorSettings()
    assert settings.allowed_images == [] and settings.service_token_secret == ""
    assert (
        AdmissionPolicy(
            (*settings.allowed_images, settings.engine_image), settings.credentials_secret_pattern
        ).refusal(defaulted_spec({"image": settings.engine_image}))
        is None
    )
