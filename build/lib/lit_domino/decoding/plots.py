"""Figures of decode metrics (matplotlib ``Figure``s on the Agg canvas, no pyplot state): per-position
acceptance curves and τ histograms, one series per domain. The eval callback logs them during training; the
ablation attaches them to its MLflow runs."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure


def plot_position_acceptance(per_domain: Mapping[str, dict], title: str = ""):
    """Per-position conditional acceptance curves, one line per domain (a matplotlib ``Figure``, Agg)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for domain, row in per_domain.items():
        ks = sorted(int(k.rsplit("_", 1)[1]) for k in row if k.startswith("acc_rate_pos_"))
        ax.plot(ks, [row[f"acc_rate_pos_{k:02d}"] for k in ks], marker="o", label=f"{domain} (τ={row['tau']:.2f})")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(k accepted | < k accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or "per-position acceptance")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_tau_histogram(per_domain: Mapping[str, dict], title: str = ""):
    """Histogram of tokens committed per round (τ), one bar group per domain."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    n = max(1, len(per_domain))
    width = 0.8 / n
    for j, (domain, row) in enumerate(per_domain.items()):
        counts = row.get("tau_histogram", [])
        total = max(1, sum(counts))
        xs = [t + (j - (n - 1) / 2) * width for t in range(len(counts))]
        ax.bar(xs, [c / total for c in counts], width=width, label=domain)
    ax.set_xlabel("τ (tokens committed per round, bonus included)")
    ax.set_ylabel("fraction of rounds")
    ax.set_title(title or "τ histogram")
    ax.legend()
    fig.tight_layout()
    return fig
