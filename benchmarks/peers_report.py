"""What `make bench-peers` reports: one row per server and level, the ratios
of each maas run against the peers, the issue's targets, and the plot.

The vLLM figure a ratio uses is the better of its measured dtypes at that
level (float32 and bf16 on a CPU without native bf16, where its default is
the slow one); llama.cpp's server decodes one request at a time, so it is
compared where it was measured (one stream).
"""

from pathlib import Path

VLLM_PREFIX = "vllm-"
LLAMACPP = "llama.cpp"

# maas / peer output tokens/s at least this, by streams (issue #32's, by default settings,
# against vLLM's better dtype: issue #13's were 1.2x at one stream and 1.5x above).
VLLM_TARGETS = {1: 1.5, 8: 1.5, 32: 2.0, 64: 2.0}
LLAMACPP_TARGETS = {1: 1.2}


def level_row(summary: dict, max_tokens: int) -> dict:
    """The numbers compared, from maas_tools.bench.stats.summarize's summary (seconds -> ms)."""

    def ms(name: str, percentile: str) -> float | None:
        value = summary[name].get(percentile)
        return None if value is None else round(value * 1000, 2)

    completion = summary["tokens"]["completion"]
    return {
        "output_tokens_per_s": summary["throughput"]["output_tokens_per_s"],
        "ttft_ms": {"p50": ms("ttft_s", "p50"), "p99": ms("ttft_s", "p99")},
        "itl_ms": {"p50": ms("itl_s", "p50"), "p99": ms("itl_s", "p99")},
        "requests": summary["requests"],
        "succeeded": summary["succeeded"],
        "errors": summary["errors"],
        # Below max_tokens means the server stopped early (ignore_eos not honoured).
        "completion_tokens_mean": round(completion / summary["succeeded"], 1)
        if summary["succeeded"]
        else 0.0,
        "max_tokens": max_tokens,
        "wall_seconds": summary["wall_seconds"],
    }


def _tokens_per_s(servers: dict[str, dict], name: str, level: int) -> float | None:
    row = servers.get(name, {}).get("levels", {}).get(str(level))
    return row["output_tokens_per_s"] if row and row["succeeded"] else None


def best_vllm(servers: dict[str, dict], level: int) -> tuple[str, float] | None:
    measured = [
        (name, rate)
        for name in servers
        if name.startswith(VLLM_PREFIX) and (rate := _tokens_per_s(servers, name, level))
    ]
    return max(measured, key=lambda pair: pair[1]) if measured else None


def _ratio(ours: float, peer_name: str, theirs: float, target: float | None) -> dict:
    ratio = round(ours / theirs, 3)
    return {
        "peer": peer_name,
        "peer_output_tokens_per_s": theirs,
        "ratio": ratio,
        "target": target,
        "met": None if target is None else ratio >= target,
    }


def ratios(servers: dict[str, dict], maas_runs: list[str], levels: list[int]) -> dict:
    """maas run -> level -> {"vs_vllm": ..., "vs_llamacpp": ...}, where both sides ran."""
    result = {}
    for run in maas_runs:
        per_level = {}
        for level in levels:
            ours = _tokens_per_s(servers, run, level)
            if not ours:
                continue
            entry = {}
            vllm = best_vllm(servers, level)
            if vllm:
                entry["vs_vllm"] = _ratio(ours, *vllm, VLLM_TARGETS.get(level))
            llama = _tokens_per_s(servers, LLAMACPP, level)
            if llama:
                entry["vs_llamacpp"] = _ratio(ours, LLAMACPP, llama, LLAMACPP_TARGETS.get(level))
            if entry:
                per_level[str(level)] = entry
        result[run] = per_level
    return result


def plot(report: dict, path: Path) -> None:
    """Output tokens/s, TTFT and ITL (p50 solid, p99 dashed) against streams, a line per server."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, ever
    import matplotlib.pyplot as plt

    panels = (
        ("output_tokens_per_s", None, "output tokens/s"),
        ("ttft_ms", "p50", "time to first token (ms)"),
        ("itl_ms", "p50", "inter-token latency (ms)"),
    )
    figure, axes = plt.subplots(1, 3, figsize=(16, 5))
    for axis, (metric, percentile, title) in zip(axes, panels, strict=True):
        for index, (name, server) in enumerate(report["servers"].items()):
            if not server.get("levels"):
                continue  # it failed to start: its error is in the JSON
            levels = sorted(int(level) for level in server["levels"])
            rows = [server["levels"][str(level)] for level in levels]
            for p, dash in ((percentile, "-"), ("p99", "--")) if percentile else ((None, "-"),):
                values = [row[metric][p] if p else row[metric] for row in rows]
                label = f"{name} {p}" if p else name
                axis.plot(levels, values, dash, marker="o", color=f"C{index}", label=label)
        axis.set_xscale("log", base=2)
        if percentile:
            # Latencies span orders of magnitude between servers and levels.
            axis.set_yscale("log")
        axis.set_xticks(report["params"]["levels"], [str(n) for n in report["params"]["levels"]])
        axis.set_xlabel("concurrent streams")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    machine = report["machine"]
    figure.suptitle(
        f"make bench-peers: {machine['cpu_model']}, {machine['cpu_count']} cores, "
        f"SIMD {' '.join(machine['simd_flags']) or 'none'}, "
        f"load {machine['load_average_1m']} at start; "
        f"{report['params']['max_tokens']} output tokens, ignore_eos, streaming /v1/completions"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
