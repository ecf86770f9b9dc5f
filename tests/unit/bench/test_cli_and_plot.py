import json

import httpx
import pytest

from maas_tools.bench.client import ChatClient
from maas_tools.bench.main import build_parser, engine_variants, run_labels, size_kv_cache
from maas_tools.bench.report import plot_inputs
from maas_tools.bench.runner import sender
from maas_tools.bench.scenarios import SCENARIOS
from maas_tools.bench.stats import summarize


def scenario_for(*flags: str):
    args, _ = build_parser().parse_known_args(flags)
    return SCENARIOS[args.scenario].from_args(args), args


def test_shared_flags_override_only_what_is_given():
    assert scenario_for("--scenario", "concurrency")[0].concurrency == 8
    assert scenario_for("--scenario", "uniform-random")[0].concurrency == 16
    chosen, _ = scenario_for("--scenario", "concurrency", "--concurrency", "3", "--max-tokens", "5")
    assert (chosen.concurrency, chosen.max_tokens) == (3, 5)
    mix, _ = scenario_for(
        "--scenario", "long-prefill-mix", "--request-rate", "0.5", "--long-prompt-range", "9", "12"
    )
    assert mix.request_rate == 0.5 and mix.long_prompt_range == (9, 12)


def test_new_scenarios_keep_the_engines_default_kv_cache():
    scenario, args = scenario_for("--scenario", "chat")
    engine_args, setup = size_kv_cache(args, scenario, ["--torch-threads=1"])
    assert engine_args == ["--torch-threads=1"] and "kv_cache_memory_bytes" not in setup
    assert SCENARIOS["shared-prefix"].kv_cache_fraction == pytest.approx(1 / 3)


def test_engine_variants_name_the_runs():
    variants = engine_variants(["chunked=--max-num-batched-tokens 256", "whole=--foo=1"])
    assert variants == {"chunked": ["--max-num-batched-tokens", "256"], "whole": ["--foo=1"]}
    assert [label for label, _, _ in run_labels(("prefix_affinity",), variants)] == [
        "chunked",
        "whole",
    ]
    assert [label for label, _, _ in run_labels(("a", "b"), {"": []})] == ["a", "b"]
    assert [label for label, _, _ in run_labels(("a", "b"), {"x": []})] == ["a/x", "b/x"]
    with pytest.raises(SystemExit):
        engine_variants(["no-equals-sign"])


def sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


async def test_client_records_chunk_times_and_the_runner_per_request_max_tokens():
    bodies = []

    def reply(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        delta = [{"choices": [{"delta": {"content": w}}]} for w in ("a", "b", "c")]
        done = {"choices": [{"delta": {}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
        return httpx.Response(200, content=sse(*delta, done, usage))

    client = ChatClient("http://x/v1", "k", "m", 5.0, transport=httpx.MockTransport(reply))
    send = sender(client, default_max_tokens=16)
    result = await send([{"role": "user", "content": "hi"}], max_tokens=3, kind="chat")
    await send([{"role": "user", "content": "hi"}])
    await client.close()
    assert result.ok and result.text == "abc" and result.kind == "chat"
    assert [b["max_tokens"] for b in bodies] == [3, 16]
    assert len(result.chunk_times) == 3 and result.sent_at <= result.chunk_times[0]
    assert result.chunk_times[0] - result.sent_at == pytest.approx(result.ttft)


def test_plot_writes_a_png_with_a_line_per_class(tmp_path):
    pytest.importorskip("matplotlib")
    from maas_tools.bench.client import RequestResult
    from maas_tools.bench.plot import plot_run

    results = [
        RequestResult(
            ttft=0.1,
            e2e=1.0,
            completion_tokens=3,
            itl=[0.2, 0.3],
            kind="chat",
            chunk_times=[0.2, 0.5, 1.0],
        ),
        RequestResult(
            ttft=2.0, e2e=2.5, completion_tokens=2, itl=[0.4], kind="long", chunk_times=[2.0, 2.5]
        ),
    ]
    runs = {"chunked": summarize(results, 3.0, origin=0.0) | {"prefix_cache": None}}
    latencies, timelines, notes, styles = plot_inputs(runs, {"chunked": results})
    assert set(latencies) == {"chunked chat", "chunked long"}
    assert timelines["chunked chat"] == [2.0, 1.0]
    path = tmp_path / "run.png"
    assert styles["chunked chat"]["color"] == styles["chunked long"]["color"]
    assert styles["chunked chat"]["linestyle"] != styles["chunked long"]["linestyle"]
    plot_run(latencies, timelines, notes, styles, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
