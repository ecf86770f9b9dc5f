"""Local mode's vLLM replicas: their share of the cores and the engine flags in front."""

from pathlib import Path

from maas_tools.local.stack import Stack, StackConfig
from maas_tools.local.vllm_replicas import (
    VllmOptions,
    VllmRuntime,
    engine_env,
    engine_flags,
    replica_config,
    replica_cpus,
)


def test_replicas_split_the_cores():
    assert replica_cpus(0, 1, [0, 1]) == ""  # alone: vLLM's own choice
    assert [replica_cpus(i, 2, [0, 1]) for i in range(2)] == ["0", "1"]
    assert [replica_cpus(i, 2, [0, 1, 2, 3]) for i in range(2)] == ["0,1", "2,3"]
    # More replicas than cores: they share, one core each.
    assert [replica_cpus(i, 3, [4, 5]) for i in range(3)] == ["4", "5", "4"]


def test_engine_in_front_gets_vllms_addresses_and_batch_size():
    runtime = VllmRuntime(python=Path("/venv/bin/python"), model=Path("/models/smol"))
    options = VllmOptions(kv_cache_gib=2, max_num_seqs=16, args=["--seed", "1"])
    config = replica_config(runtime, options, "smol", 1, 2, "127.0.0.1")
    assert config.served_model_name == "smol" and config.kv_events_port
    assert config.argv()[-2:] == ["--seed", "1"]
    assert engine_flags(config) == {
        "backend": "vllm",
        "vllm-url": config.url,
        "vllm-kv-events-endpoint": config.kv_events_endpoint,
        "max-num-seqs": "16",
    }


def test_each_vllm_server_demands_its_own_key_known_only_by_environment():
    runtime = VllmRuntime(python=Path("/venv/bin/python"), model=Path("/models/smol"))
    configs = [replica_config(runtime, VllmOptions(), "smol", i, 2, "127.0.0.1") for i in (0, 1)]
    keys = [config.env()["VLLM_API_KEY"] for config in configs]
    assert len(set(keys)) == 2 and all(len(key) >= 32 for key in keys)
    for config, key in zip(configs, keys, strict=True):
        # The engine in front shows the same key; neither command line carries it
        # (/proc/PID/cmdline is readable by every user of the host).
        assert engine_env(config) == {"VLLM_API_KEY": key}
        assert not any(key in arg for arg in config.argv())
        assert not any(key in str(value) for value in engine_flags(config).values())


def test_each_vllm_replica_is_a_child_to_wait_for():
    native = Stack(StackConfig(engine_replicas=2, redis_url="redis://x"))
    vllm = Stack(StackConfig(engine_replicas=2, redis_url="redis://x", engine_backend="vllm"))
    assert vllm.expected_children == native.expected_children + 2
