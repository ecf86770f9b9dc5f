"""Where the engine finds its weights: volumes, an init container, and --model-path.

file:///PATH      baked into the image: nothing to mount.
pvc://CLAIM/PATH  the claim mounted read-only at /models/CLAIM.
https://URL       fetched by curl into an emptyDir before the engine starts;
                  a .tar/.tar.gz/.tgz is unpacked (a safetensors folder).
s3://BUCKET/KEY   fetched by the AWS CLI (a KEY ending in / is a folder).
omitted           the SmolLM2 GGUF bundled in the image.

LoRA adapters (spec.adapters) come from file:// or pvc:// sources only: they
are loaded into running pods, where no init container runs any more. An
adapter's claim is mounted as a model's is, once per claim.
"""

import posixpath
from dataclasses import dataclass, field
from urllib.parse import urlparse

MODELS_DIR = "/models"
DEFAULT_HTTP_FETCH_IMAGE = "curlimages/curl:8.11.1"
DEFAULT_S3_FETCH_IMAGE = "amazon/aws-cli:2.22.35"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


@dataclass
class ModelMount:
    model_path: str = ""  # empty: the engine's bundled default
    volumes: list[dict] = field(default_factory=list)
    volume_mounts: list[dict] = field(default_factory=list)
    init_containers: list[dict] = field(default_factory=list)


def _fetch_container(image: str, script: str, url: str, secret: str | None) -> dict:
    container = {
        "name": "fetch-model",
        "image": image,
        "command": ["sh", "-c", script],
        # The URL travels as an environment variable so the shell never parses it.
        "env": [{"name": "MODEL_URL", "value": url}, {"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS_DIR},
            {"name": "fetch-tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if secret:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    return container


def _fetched(uri: str, source: dict) -> ModelMount:
    parsed = urlparse(uri)
    name = posixpath.basename(parsed.path.rstrip("/"))
    secret = source.get("credentialsSecret")
    if parsed.scheme == "s3":
        image = source.get("fetchImage") or DEFAULT_S3_FETCH_IMAGE
        recursive = " --recursive" if parsed.path.endswith("/") else ""
        script = f'aws s3 cp{recursive} "$MODEL_URL" {MODELS_DIR}/{name}'
        path = f"{MODELS_DIR}/{name}"
    else:
        image = source.get("fetchImage") or DEFAULT_HTTP_FETCH_IMAGE
        curl = 'curl -fsSL --retry 5 "$MODEL_URL"'
        archive = next((s for s in ARCHIVE_SUFFIXES if name.endswith(s)), None)
        if archive:
            unpack = "tar -xzf -" if archive != ".tar" else "tar -xf -"
            script = f"mkdir -p {MODELS_DIR}/model && {curl} | {unpack} -C {MODELS_DIR}/model"
            path = f"{MODELS_DIR}/model"
        else:
            script = f"{curl} -o {MODELS_DIR}/{name}"
            path = f"{MODELS_DIR}/{name}"
    return ModelMount(
        model_path=path,
        volumes=[{"name": "models", "emptyDir": {}}, {"name": "fetch-tmp", "emptyDir": {}}],
        volume_mounts=[{"name": "models", "mountPath": MODELS_DIR, "readOnly": True}],
        init_containers=[_fetch_container(image, script, uri, secret)],
    )


def _claim_volume(name: str, claim: str) -> tuple[dict, dict]:
    """A claim's volume, read-only, and its mount at /models/CLAIM."""
    return (
        {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
        {"name": name, "mountPath": f"{MODELS_DIR}/{claim}", "readOnly": True},
    )


def local_path(uri: str) -> str:
    """Where a file:// or pvc:// source is inside the engine's container."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "pvc":
        return f"{MODELS_DIR}/{parsed.netloc}{parsed.path}"
    raise ValueError(f"not a file:// or pvc:// source: {uri!r}")


def model_mount(source: dict) -> ModelMount:
    uri = source.get("uri") or ""
    if not uri:
        return ModelMount()
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return ModelMount(model_path=local_path(uri))
    if parsed.scheme == "pvc":
        volume, mount = _claim_volume("models", parsed.netloc)
        return ModelMount(model_path=local_path(uri), volumes=[volume], volume_mounts=[mount])
    if parsed.scheme in ("http", "https", "s3"):
        return _fetched(uri, source)
    raise ValueError(f"unsupported model source {uri!r}")


def with_adapter_claims(mount: ModelMount, uris: list[str]) -> ModelMount:
    """mount plus the model-store claims of adapter sources that it does not mount yet.

    Named by their order among the claims, so the same spec gives the same pod.
    """
    mounted = {m["mountPath"] for m in mount.volume_mounts}
    claims = sorted(
        {urlparse(u).netloc for u in uris if urlparse(u).scheme == "pvc"}
        - {path.removeprefix(f"{MODELS_DIR}/") for path in mounted}
    )
    pairs = [_claim_volume(f"adapters-{i}", claim) for i, claim in enumerate(claims)]
    return ModelMount(
        model_path=mount.model_path,
        volumes=[*mount.volumes, *(v for v, _ in pairs)],
        volume_mounts=[*mount.volume_mounts, *(m for _, m in pairs)],
        init_containers=mount.init_containers,
    )
