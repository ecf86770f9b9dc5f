"""What a ModelDeployment may not do to the cluster: pass vLLM flags or variables beyond
tuning, or run vLLM without a key (docs/security.md, "Trust in the cluster")."""

import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.defaults import defaulted_spec

OWNER = {"metadata": {"name": "qwen", "namespace": "ns", "uid": "u-1"}}
POLICY = AdmissionPolicy(allowed_images=(), credentials_secret_pattern="x")


def vllm_spec(**vllm) -> dict:
    return defaulted_spec(
        {
            "model": {"name": "qwen", "source": {"uri": "pvc://model-store/qwen"}},
            "engine": {"backend": "vllm", "vllm": vllm},
            "resources": {"gpus": 1},
        }
    )


@pytest.mark.parametrize(
    "args",
    [
        # What the platform itself sets, in both spellings vLLM's parser takes.
        ["--dtype=bfloat16", "--max-model-len", "32768", "--enforce-eager"],
        ["--enable-lora", "--max-loras", "4", "--max-lora-rank=64"],
        ["--lora-modules", "sql=/models/model-store/sql", "chat=/models/model-store/chat"],
        ["--tensor-parallel-size=2", "--pipeline_parallel_size", "2"],
        ["--gpu-memory-utilization=0.85", "--quantization", "fp8", "--kv-cache-dtype=fp8"],
        ["--max-num-seqs=128", "--max-num-batched-tokens", "8192", "--enable-prefix-caching"],
        ["--seed", "-1", "--speculative-config.method", "ngram"],
    ],
)
def test_tuning_flags_are_admitted(args):
    assert POLICY.refusal(vllm_spec(args=args)) is None


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--api-key", "mine"], "--api-key"),
        (["--api_key=mine"], "--api-key"),
        (["--api", "mine"], "--api"),  # argparse would take the abbreviation
        (["--host=0.0.0.0"], "--host"),
        (["--port", "9000"], "--port"),
        (["--allowed-local-media-path", "/"], "--allowed-local-media-path"),
        (["--trust-remote-code"], "--trust-remote-code"),
        (["--middleware", "evil.Middleware"], "--middleware"),
        (["--served-model-name", "other"], "--served-model-name"),
        (["--config", "/tmp/x.yaml"], "--config"),
        (["--enable-lora", "-tp", "2"], "'-tp'"),
        (["/models/other"], "'/models/other'"),
    ],
)
def test_other_flags_are_refused_naming_the_flag(args, named):
    found = POLICY.refusal(vllm_spec(args=args))
    assert found.reason == "VllmArgNotAllowed"
    assert found.message.startswith("spec.engine.vllm.args ") and named in found.message


def test_tuning_variables_are_admitted():
    env = {
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "OMP_NUM_THREADS": "8",
        "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "HF_HUB_OFFLINE": "1",
    }
    assert POLICY.refusal(vllm_spec(env=env)) is None


@pytest.mark.parametrize(
    "name",
    [
        "VLLM_API_KEY",
        "VLLM_SERVER_DEV_MODE",
        "VLLM_ALLOW_INSECURE_SERIALIZATION",
        "LD_PRELOAD",
        "PYTHONPATH",
        "HOME",
        "MAAS_SERVICE_TOKEN",
    ],
)
def test_other_variables_are_refused(name):
    found = POLICY.refusal(vllm_spec(env={name: "x"}))
    assert found.reason == "VllmEnvNotAllowed" and repr(name) in found.message


def _containers(token_secret: str) -> dict[str, dict]:
    deployment = resources.deployment(OWNER, vllm_spec(), "maas:1", 1, token_secret=token_secret)
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def test_vllm_and_its_adapter_alone_get_vllms_key_from_the_secret():
    found = _containers("maas-internal-auth")
    ref = {"secretKeyRef": {"name": "maas-internal-auth", "key": "vllm-api-key"}}
    for name in ("engine", "vllm"):
        env = {e["name"]: e for e in found[name]["env"]}
        assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": ref}, name
        # In the environment only: a flag would be in the pod spec and /proc/PID/cmdline.
        assert not any("api-key" in arg for arg in found[name]["args"]), name
    # The service token stays the adapter's: vLLM runs the model's code, not ours.
    assert "MAAS_SERVICE_TOKEN" not in {e["name"] for e in found["vllm"]["env"]}
    native = resources.deployment(
        OWNER, defaulted_spec({}), "maas:1", 1, token_secret="maas-internal-auth"
    )
    (engine,) = native["spec"]["template"]["spec"]["containers"]
    assert "VLLM_API_KEY" not in {e["name"] for e in engine["env"]}
