"""Local mode's vLLM replicas: their share of the cores and the engine flags in front."""

from pathlib import Path

from services.local.stack import Stack, StackConfig
from services.local.vllm_replicas import (
    VllmOptions,
    VllmRuntime,
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


def test_each_vllm_replica_is_a_child_to_wait_for():
    native = Stack(StackConfig(engine_replicas=2, redis_url="redis://x"))
    vllm = Stack(StackConfig(engine_replicas=2, redis_url="redis://x", engine_backend="vllm"))
    assert vllm.expected_children == native.expected_children + 2
