"""Which images and Secrets a ModelDeployment may put into the pods it asks for.

The operator creates engine pods with its own rights, so whoever may write a
ModelDeployment could otherwise run any image there, or hand any Secret of the
namespace (the Redis password, a service token) to a container of their
choosing. The spec's images (`image`, `canary.image`, `model.source.fetchImage`,
`engine.vllm.image`) must match the allow-list, and
`model.source.credentialsSecret` the name pattern; a spec that does not is
refused whole and nothing is created for it. So is a spec whose
`engine.vllm.args` or `engine.vllm.env` go beyond tuning (vllm_allowlist.py).

The operator's own defaults (its --engine-image and --vllm-image, the curl and
AWS CLI fetch images) are its configuration, not the spec's, and are not
checked. Image patterns are shell-style and case-sensitive (fnmatch); `*` crosses `/`, so
`registry.example.com/team/*` allows a whole tree and `repo:*` any tag.
"""

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from maas_operator.modeldeployment.vllm_allowlist import refused_arg, refused_env


@dataclass(frozen=True)
class Refusal:
    reason: str  # CamelCase, for the Ready condition and the Event
    message: str


@dataclass(frozen=True)
class AdmissionPolicy:
    allowed_images: tuple[str, ...]
    credentials_secret_pattern: str  # must match the whole name

    def image_allowed(self, image: str) -> bool:
        return any(fnmatchcase(image, pattern) for pattern in self.allowed_images)

    def refusal(self, spec: dict) -> Refusal | None:
        """Why spec may not run, or None; spec is defaulted."""
        source = spec["model"].get("source") or {}
        named = {
            "spec.image": spec.get("image"),
            "spec.canary.image": spec["canary"].get("image"),
            "spec.model.source.fetchImage": source.get("fetchImage"),
            "spec.engine.vllm.image": spec["engine"]["vllm"].get("image"),
        }
        for field, image in named.items():
            if image and not self.image_allowed(image):
                return Refusal(
                    "ImageNotAllowed",
                    f"{field} {image!r} matches none of the operator's allowed images "
                    f"{list(self.allowed_images)}",
                )
        secret = source.get("credentialsSecret")
        if secret and not re.fullmatch(self.credentials_secret_pattern, secret):
            return Refusal(
                "SecretNotAllowed",
                f"spec.model.source.credentialsSecret {secret!r} does not match the "
                f"operator's pattern {self.credentials_secret_pattern!r}",
            )
        return _vllm_refusal(spec["engine"]["vllm"])


def _vllm_refusal(vllm: dict) -> Refusal | None:
    why = refused_arg(list(vllm.get("args") or []))
    if why is not None:
        return Refusal(
            "VllmArgNotAllowed", f"spec.engine.vllm.args {why} (allowed: see docs/operator.md)"
        )
    for name in vllm.get("env") or {}:
        if refused_env(name):
            return Refusal(
                "VllmEnvNotAllowed",
                f"spec.engine.vllm.env {name!r} is not a variable a ModelDeployment may set "
                "for vLLM (allowed: see docs/operator.md)",
            )
    return None
