"""Pareto frontiers and their plots, shared by evaluate.py (kvsift-bench driver) and pyeval.py
(Python-module driver).

A sweep of one index gives (cost, recall) points; only the non-dominated ones are worth drawing:
a point is dominated when another point of the same index costs no more and recalls at least as
much (one of the two strictly). Costs are "lower is better" (keys scanned, latency); QPS plots
use 1 / latency as the x axis but the frontier is taken on latency.
"""
import os


def pareto(points):
    """Non-dominated (cost, recall, *rest) tuples, cheapest first; lower cost and higher recall
    are better. Points whose cost is None (not measured) are dropped. O(p log p)."""
    pts = sorted((p for p in points if p[0] is not None), key=lambda p: (p[0], -p[1]))
    out = []
    for p in pts:
        # Sorted by cost (ties: best recall first), so p is dominated exactly when some
        # cheaper-or-equal point already recalls at least as much.
        if not out or p[1] > out[-1][1]:
            out.append(p)
    return out


def have_matplotlib():
    """True when matplotlib imports; otherwise prints why plots are skipped and returns False."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)", flush=True)
        return False
    return True


def plot_frontiers(path, title, panels):
    """One PNG of Pareto curves. panels: list of (subtitle, xlabel, xscale, curves), curves a
    dict name -> list of (x, recall) frontier points already chosen by pareto()."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"flat": "k*", "roargraph": "C0o-", "hnswlib": "C1s-", "hnsw": "C1s-",
             "faiss-hnsw": "C4D-", "faiss-ivf": "C2^-", "ivf": "C2^-",
             # the GQA-group variants (pyeval.py): their method's colour, dashed
             "roargraph-gqa": "C0o--", "faiss-ivf-gqa": "C2^--",
             # warm starts in decode order (pyeval.py): dotted
             "roargraph-warm": "C5d:", "roargraph-gqa-warm": "C5d-.",
             # cold starts at routed seeds (pyeval.py)
             "roargraph-routed": "C6v:", "roargraph-gqa-routed": "C6v-."}
    cols = min(len(panels), 2)
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, (subtitle, xlabel, xscale, curves) in zip(axes.flat, panels):
        for name, pts in curves.items():
            if pts:
                ax.plot(*zip(*pts), style.get(name, "o-"), label=name, ms=4)
        ax.set_xscale(xscale)
        ax.set_title(subtitle, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("recall")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return os.path.basename(path)
