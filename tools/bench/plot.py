"""One PNG per report: latency CDFs, one panel per metric, and throughput over time."""

from pathlib import Path

PANELS = (
    ("ttft", "time to first token"),
    ("tpot", "time per output token"),
    ("itl", "inter-token latency"),
    ("e2e", "end-to-end latency"),
)


def plot_run(
    samples: dict[str, dict[str, list[float]]],
    timelines: dict[str, list[float]],
    notes: dict[str, str],
    styles: dict[str, dict],
    path: Path,
    title: str,
    bucket_s: float = 1.0,
) -> None:
    """samples: label -> metric -> seconds; timelines: label -> output tokens/s per bucket;
    notes: label -> legend suffix; styles: label -> matplotlib line keywords."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, ever
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(12, 11))
    grid = figure.add_gridspec(3, 2)
    for index, (metric, name) in enumerate(PANELS):
        axis = figure.add_subplot(grid[index // 2, index % 2])
        for label, metrics in samples.items():
            values = sorted(metrics.get(metric, []))
            if not values:
                continue
            share = [(i + 1) / len(values) for i in range(len(values))]
            legend = f"{label} {notes.get(label, '')}".strip()
            axis.step(values, share, where="post", label=legend, **styles.get(label, {}))
        axis.set_title(name)
        axis.set_xlabel("seconds")
        axis.set_ylabel("share of requests" if metric != "itl" else "share of gaps")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    # Across the bottom: a stall (a long prefill, a growing queue) shows only over time.
    axis = figure.add_subplot(grid[2, :])
    for label, values in timelines.items():
        if values:
            # One more point, so the last bucket is drawn across its whole second.
            edges = [i * bucket_s for i in range(len(values) + 1)]
            style = styles.get(label, {})
            axis.step(edges, [*values, values[-1]], where="post", label=label, **style)
    axis.set_title(f"output tokens/s ({bucket_s:g} s buckets)")
    axis.set_xlabel("seconds since the run started")
    axis.set_ylabel("tokens/s")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper right")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
