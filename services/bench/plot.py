"""Latency CDFs of every run, one panel per metric, as a PNG."""

from pathlib import Path

PANELS = (
    ("ttft", "time to first token"),
    ("tpot", "time per output token"),
    ("itl", "inter-token latency"),
    ("e2e", "end-to-end latency"),
)


def plot_cdfs(
    samples: dict[str, dict[str, list[float]]], notes: dict[str, str], path: Path, title: str
) -> None:
    """samples: run label -> metric -> values in seconds; notes: run label -> legend suffix."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, ever
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    for axis, (metric, name) in zip(axes.flat, PANELS, strict=True):
        for label, metrics in samples.items():
            values = sorted(metrics.get(metric, []))
            if not values:
                continue
            share = [(i + 1) / len(values) for i in range(len(values))]
            axis.step(values, share, where="post", label=f"{label} {notes.get(label, '')}".strip())
        axis.set_title(name)
        axis.set_xlabel("seconds")
        axis.set_ylabel("share of requests" if metric != "itl" else "share of gaps")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
