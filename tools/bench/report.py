"""What a finished run shows besides its JSON: the console lines and the plot's series.

A mixed workload (long-prefill-mix) is shown per class, "RUN chat" and
"RUN long", since pooling them hides the chat latency it is about.
"""

from maas_tools.bench.client import RequestResult


def series(results: list[RequestResult]) -> dict[str, list[float]]:
    ok = [r for r in results if r.ok]
    return {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2e": [r.e2e for r in ok],
    }


def views(runs: dict[str, dict]) -> dict[str, tuple[str, str, dict]]:
    """Plot/console key -> (run label, class or "", that summary)."""
    shown = {}
    for label, summary in runs.items():
        classes = summary.get("classes")
        if not classes:
            shown[label] = (label, "", summary)
        for kind, part in (classes or {}).items():
            shown[f"{label} {kind}"] = (label, kind, part)
    return shown


# A class keeps its line style across runs, a run its colour across classes.
LINE_STYLES = ("-", "--", ":", "-.")


def plot_inputs(runs: dict[str, dict], samples: dict[str, list[RequestResult]]):
    """(latency samples, tokens/s timelines, legend notes, line styles), each by view key."""
    latencies, timelines, notes, styles = {}, {}, {}, {}
    shown = views(runs)
    colours = {label: f"C{i}" for i, label in enumerate(runs)}
    kinds = sorted({kind for _, kind, _ in shown.values()})
    for key, (label, kind, summary) in shown.items():
        dash = LINE_STYLES[kinds.index(kind) % len(LINE_STYLES)]
        styles[key] = {"color": colours[label], "linestyle": dash}
        results = [r for r in samples[label] if not kind or r.kind == kind]
        latencies[key] = series(results)
        timelines[key] = (summary.get("throughput_over_time") or {}).get("output_tokens_per_s", [])
        cache = runs[label].get("prefix_cache")
        notes[key] = f"(hit rate {cache['hit_rate']:.0%})" if cache else ""
    return latencies, timelines, notes, styles


def _ms(distribution: dict, key: str) -> str:
    value = distribution.get(key)
    return "-" if value is None else f"{value * 1000:.0f}ms"


def print_summary(runs: dict[str, dict], verdict: dict) -> None:
    for key, (label, _, s) in views(runs).items():
        hit = (runs[label]["prefix_cache"] or {}).get("hit_rate")
        good = s.get("goodput")
        print(
            f"{key:>20}: TTFT p50 {_ms(s['ttft_s'], 'p50')} p99 {_ms(s['ttft_s'], 'p99')}"
            f" | ITL p50 {_ms(s['itl_s'], 'p50')} p99 {_ms(s['itl_s'], 'p99')}"
            f" | TPOT mean {_ms(s['tpot_s'], 'mean')}"
            f" | {s['throughput']['output_tokens_per_s']:.1f} output tok/s"
            + (f" | goodput {good['requests_per_s']} req/s ({good['share']:.0%})" if good else "")
            + f" | prefix-cache hit rate {'n/a' if hit is None else f'{hit:.1%}'}"
            f" | errors {sum(s['errors'].values())}"
        )
    for name, check in verdict.items():
        met = "met" if check["met"] else "NOT met"
        print(f"{name}: {check['value']} (target {check['target']}): {met}")
