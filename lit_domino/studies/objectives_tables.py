"""The objectives study's tables and figures, from its decode records (one per drafter/objective, seed, domain).

Per drafter, each objective row: τ per domain and on average, speedup (mean ± spread over seeds:
``studies.tables.aggregate``), the change of average τ against the drafter's own loss with its verdict
(``studies.tables.compare``: a difference within the combined spread is no win), the domains where the objective's
τ beats the own loss's beyond their combined spread, and the papers' figure beside it. The recommendation per
drafter follows the issue's rule: an objective becomes the default only if it wins beyond the seed spread on at
least two domains (the most average τ among those), which needs two seeds or more.
"""

from __future__ import annotations

import math
from pathlib import Path

from lit_domino.runtime.jsonio import write_json
from lit_domino.studies.objectives import OWN, ObjectivesPlan, name_of, rows_of
from lit_domino.studies.tables import aggregate, compare, fmt

MIN_WINS = 2
"""Domains an objective must win beyond the seed spread to be recommended as a drafter's default."""


def wins(own: dict, mine: dict, domains: list[str]) -> list[str]:
    """The domains where ``mine``'s τ (mean, spread) beats ``own``'s by more than their combined spread."""
    out = []
    for d in domains:
        a, b = own.get(d), mine.get(d)
        if a and b and math.isfinite(a[0]) and math.isfinite(b[0]) and b[0] - a[0] > math.hypot(a[1], b[1]):
            out.append(d)
    return out


def drafter_table(records: list[dict], plan: ObjectivesPlan, drafter: str, domains: list[str]) -> dict:
    """One drafter's rows (see the module docstring) -> ``{"drafter", "columns", "rows", "recommended",
    "markdown"}``."""
    tau, speed = aggregate(records, "tau"), aggregate(records, "speedup")
    cols = [*domains, "avg"]
    own = {d: tau.get((name_of(drafter, OWN), d)) for d in cols}
    rows = []
    for row in rows_of(plan, drafter):
        name = name_of(drafter, row)
        if (name, "avg") not in tau:
            continue
        cells = {d: tau.get((name, d)) for d in cols}
        entry = {"objective": row, "label": plan.labels.get(row, row), "spec": plan.specs[row],
                 "tau": cells, "speedup": {d: speed.get((name, d)) for d in cols},
                 "published": plan.published.get(row, "")}
        if row != OWN and own["avg"]:
            entry["delta_pct"] = 100.0 * (cells["avg"][0] / own["avg"][0] - 1.0) if own["avg"][0] else float("nan")
            entry["verdict"] = compare(own["avg"], cells["avg"])
            entry["wins"] = wins(own, cells, domains)
        rows.append(entry)
    seeds = len(plan.seeds)
    eligible = [r for r in rows if len(r.get("wins", ())) >= MIN_WINS]
    if seeds < 2:
        recommended = f"n/a: {seeds} seed, no spread to win beyond"
    elif eligible:
        best = max(eligible, key=lambda r: r["tau"]["avg"][0])
        recommended = f"{best['objective']} (wins {', '.join(best['wins'])})"
    else:
        recommended = f"{OWN}: no objective wins beyond the seed spread on {MIN_WINS} domains"
    header = (["objective"] + [f"{d} τ" for d in cols] + ["Δ avg τ vs own", "domains won", "avg speedup",
                                                          "published (their drafter, their target)"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        delta = "" if "delta_pct" not in r else f"{r['delta_pct']:+.1f} % ({r['verdict']})"
        won = "" if "wins" not in r else f"{len(r['wins'])}/{len(domains)}"
        lines.append("| " + " | ".join([r["label"]] + [fmt(r["tau"][d]) for d in cols]
                                         + [delta, won, fmt(r["speedup"]["avg"], suffix="x"), r["published"]]) + " |")
    lines.append(f"\nrecommended default for {drafter}: {recommended}")
    return {"drafter": drafter, "columns": cols, "rows": rows, "recommended": recommended,
            "markdown": "\n".join(lines)}


def summary_table(tables: list[dict], plan: ObjectivesPlan) -> str:
    """Markdown: objective rows x drafters, the change of average τ against each drafter's own loss (domains won)."""
    header = ["objective"] + [t["drafter"] for t in tables]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in plan.objectives:
        if row == OWN:
            continue
        cells = []
        for t in tables:
            found = [r for r in t["rows"] if r["objective"] == row]
            cells.append(f"{found[0]['delta_pct']:+.1f} % ({len(found[0]['wins'])})"
                         if found and "delta_pct" in found[0] else "–")
        lines.append("| " + " | ".join([plan.labels.get(row, row), *cells]) + " |")
    return "\n".join(lines)


def position_curves(records: list[dict], plan: ObjectivesPlan, drafter: str) -> dict[str, list[float]]:
    """Row -> the per-position acceptance rates P(k accepted | < k accepted), k = 1.., mean over seeds and
    domains."""
    out = {}
    keys = sorted({k for r in records for k in r if k.startswith("acc_rate_pos_")})
    for row in rows_of(plan, drafter):
        name = name_of(drafter, row)
        rates = [aggregate([r for r in records if r["variant"] == name], k).get((name, "avg"), (float("nan"),))[0]
                 for k in keys]
        if any(math.isfinite(x) for x in rates):
            out[row] = rates
    return out


def acceptance_figure(records: list[dict], plan: ObjectivesPlan, path: Path) -> Path:
    """Per drafter, the per-position acceptance curve of every objective (the shape each trades): a PNG."""
    from matplotlib.figure import Figure

    from matplotlib.ticker import MaxNLocator

    drafters = plan.drafters
    fig = Figure(figsize=(4.2 * len(drafters) + 2.6, 3.8))
    axes = fig.subplots(1, len(drafters), squeeze=False)[0]
    for ax, drafter in zip(axes, drafters):
        for row, rates in position_curves(records, plan, drafter).items():
            ax.plot(range(1, len(rates) + 1), rates, marker="o", markersize=3, label=plan.labels.get(row, row),
                    linewidth=2.2 if row == OWN else 1.2, color="black" if row == OWN else None)
        ax.set_title(drafter)
        ax.set_xlabel("draft position k")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("P(k accepted | < k accepted)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"per-position acceptance by training objective ({plan.preset}; mean over seeds and domains)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def report(records: list[dict], plan: ObjectivesPlan, out_dir: Path) -> tuple[dict, list[Path], list[Path]]:
    """Write the tables (Markdown + JSON) and figures into ``out_dir`` -> (tables, table files, figure files)."""
    from lit_domino.studies.study_runs import plot_study

    preset, domains = plan.preset, list(plan.prompts)
    per = [drafter_table(records, plan, d, domains) for d in plan.drafters]
    summary = summary_table(per, plan)
    parts = [f"## Objectives study ({preset}; τ per domain, mean ± spread over seeds {plan.seeds}; speedup = our "
             f"AR time per token / speculative, prefill excluded)\n", "### Δ avg τ against each drafter's own loss "
             "(domains won beyond the seed spread)\n", summary]
    for t in per:
        parts += [f"\n### {t['drafter']}\n", t["markdown"]]
    markdown = "\n".join(parts)
    md, js = out_dir / f"objectives-{preset}.md", out_dir / f"objectives-{preset}.json"
    md.write_text(markdown + "\n")
    curves = {t["drafter"]: position_curves(records, plan, t["drafter"]) for t in per}
    write_json({"preset": preset, "seeds": plan.seeds, "domains": domains, "drafters": per,
                "position_acceptance": curves}, js)
    figure = acceptance_figure(records, plan, out_dir / f"acceptance-per-position-{preset}.png")
    order = [name_of(d, row) for d in plan.drafters for row in rows_of(plan, d)]
    labels = {name_of(d, row): f"{d}: {plan.labels.get(row, row)}" for d in plan.drafters
              for row in rows_of(plan, d)}
    bars = out_dir / f"study-tau-speedup-{preset}.png"
    plot_study(records, order, labels).savefig(bars, dpi=100)
    return {"drafters": per, "summary": summary, "markdown": markdown}, [md, js], [figure, bars]
