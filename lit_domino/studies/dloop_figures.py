"""The DLoop study's figures and the gain analysis: the gate's calibration plot, and DLoop's gain against the
drafter's whole-stage acceptance rate (points, a fitted line, where it crosses 0, the plot)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from lit_domino.decoding.dloop import GATES, DLoopConfig, dloop_label
from lit_domino.runtime.jsonio import finite
from lit_domino.studies.common import finite_mean, fmt
from lit_domino.studies.dloop_plan import DLoopPlan


def calibration_plot(calib: dict, path: Path, g_table: float) -> Path | None:
    """One panel per gate: P(whole stage accepted) against the gate's confidence per drafter (PNG)."""
    if not calib["records"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(GATES), figsize=(4.2 * len(GATES), 3.6), sharey=True)
    for ax, gate in zip(axes, GATES):
        for rec in (r for r in calib["records"] if r["gate"] == gate):
            xs = [b["confidence"] for b in rec["bins"]]
            ax.plot(xs, [b["accepted"] for b in rec["bins"]], marker="o", label=f"{rec['drafter']} ({rec['training']})")
        if gate == "sum":
            lo = min(b["confidence"] for r in calib["records"] if r["gate"] == gate for b in r["bins"])
            grid = [lo + (0 - lo) * i / 50 for i in range(51)]
            ax.plot(grid, [math.exp(x) for x in grid], "k:", label="exp(sum log q): calibrated q")
        ax.axvline(g_table, color="grey", ls="--", lw=1)
        ax.set_title(f"gate {gate}")
        ax.set_xlabel("stage confidence")
    axes[0].set_ylabel("P(whole stage accepted)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def whole_stage_rate(row: dict) -> float:
    """The fraction of a row's stages the target accepted whole (``stage_records``: [sum, last, K, accepted])."""
    recs = row.get("stage_records") or []
    return finite_mean(float(int(r[3]) == int(r[2])) for r in recs) if recs else float("nan")


def figure_gates(plan: DLoopPlan) -> list[DLoopConfig]:
    """The gates of the gain-vs-acceptance figure: the table's gate and the block-size sweep's."""
    return list(dict.fromkeys([DLoopConfig(**plan.table_dloop)] + [DLoopConfig(**g) for g in plan.sweep_gates]))


def gain_points(rows: list[dict], names: dict, plan: DLoopPlan) -> dict:
    """DLoop's gain against the drafter's whole-stage acceptance rate: per plain drafter × domain × block size ×
    figure gate, gain = speedup with the gate / speedup with DLoop off - 1 (the same decode run) and the rate of
    the DLoop-off row (stage 1 of every round). Per gate a least-squares line gain = a + b·rate and the rate at
    which it crosses 0 (where the loop starts to pay), when the points span one."""
    by = {}
    for r in rows:
        if r.get("kind") == "drafter" and float(r.get("temperature", 0.0)) == 0.0:
            by[(r["drafter"], r["dloop"], r["benchmark"], int(r["block_size"]))] = r
    points = []
    for cfg in figure_gates(plan):
        label = dloop_label(cfg)
        for kind in plan.drafters:
            name = names[kind]["plain"]
            for (dname, dl, bench, bs), off in sorted(by.items(), key=lambda kv: (kv[0][3], kv[0][2])):
                if dname != name or dl != "off" or (name, label, bench, bs) not in by:
                    continue
                on = by[(name, label, bench, bs)]
                gain = (100 * (on["speedup"] / off["speedup"] - 1) if finite(on.get("speedup"))
                        and finite(off.get("speedup")) and off["speedup"] else float("nan"))
                points.append({"gate": label, "drafter": kind, "domain": bench, "block_size": bs,
                               "whole_stage_rate": whole_stage_rate(off), "gain_pct": gain,
                               "speedup_off": off.get("speedup"), "speedup_gate": on.get("speedup"),
                               "tau_off": off.get("tau"), "tau_gate": on.get("tau"),
                               "stages_per_round": on.get("stages_per_round")})
    fits = {}
    for cfg in figure_gates(plan):
        label = dloop_label(cfg)
        xy = [(p["whole_stage_rate"], p["gain_pct"]) for p in points if p["gate"] == label
              and finite(p["whole_stage_rate"]) and finite(p["gain_pct"])]
        fits[label] = line_fit(xy)
    lines = ["| gate | drafter | domain | B | whole-stage rate (off) | stages/verif. | τ off → gate | "
             "speedup off → gate | gain |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['gate']} | {p['drafter']} | {p['domain']} | {p['block_size']} | "
                     f"{fmt(p['whole_stage_rate'], 3)} | {fmt(p['stages_per_round'])} | {fmt(p['tau_off'])} → "
                     f"{fmt(p['tau_gate'])} | {fmt(p['speedup_off'], suffix='x')} → {fmt(p['speedup_gate'], suffix='x')} | "
                     f"{fmt(p['gain_pct'], 1, ' %')} |")
    lines.append("")
    for label, fit in fits.items():
        lines.append(f"- gate {label}: {describe_fit(fit)}")
    return {"name": "gain", "points": points, "fits": fits, "markdown": "\n".join(lines)}


def line_fit(xy: list[tuple[float, float]]) -> dict:
    """Least squares y = a + b·x over ``xy`` -> {n, a, b, r, pays_from} (``pays_from``: the x where the line crosses
    y = 0 going up, None when it does not rise or the points have one x)."""
    n = len(xy)
    out = {"n": n, "a": None, "b": None, "r": None, "pays_from": None}
    if n < 2:
        return out
    mx, my = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    syy = sum((y - my) ** 2 for _, y in xy)
    if sxx <= 0:
        return out
    b = sum((x - mx) * (y - my) for x, y in xy) / sxx
    a = my - b * mx
    out.update(a=a, b=b, r=(b * math.sqrt(sxx / syy)) if syy > 0 else None)
    if b > 0:
        out["pays_from"] = -a / b
    return out


def describe_fit(fit: dict) -> str:
    if fit["b"] is None:
        return f"{fit['n']} points, too few (or one rate) for a line"
    text = f"{fit['n']} points, gain ≈ {fit['a']:+.1f} {fit['b']:+.1f}·rate % (r = {fmt(fit['r'])})"
    if fit["pays_from"] is not None:
        text += f"; the line crosses 0 at a whole-stage rate of {fit['pays_from']:.2f}"
    return text


def gain_plot(gain: dict, path: Path) -> Path | None:
    """One panel per figure gate: DLoop's gain (%) against the whole-stage acceptance rate, a point per drafter ×
    domain × block size (colour: drafter, marker: block size), with the fitted line (PNG)."""
    gates = list(gain["fits"])
    if not any(finite(p["gain_pct"]) and finite(p["whole_stage_rate"]) for p in gain["points"]):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = list(dict.fromkeys(p["drafter"] for p in gain["points"]))
    sizes = sorted({p["block_size"] for p in gain["points"]})
    colours = {d: f"C{i}" for i, d in enumerate(drafters)}
    markers = {b: "osD^v<>"[i % 7] for i, b in enumerate(sizes)}
    fig, axes = plt.subplots(1, len(gates), figsize=(4.6 * len(gates), 3.8), sharey=True, squeeze=False)
    for ax, label in zip(axes[0], gates):
        pts = [p for p in gain["points"] if p["gate"] == label and finite(p["gain_pct"])
               and finite(p["whole_stage_rate"])]
        for p in pts:  # hollow: the gate never drafted a second stage, so the gain is timing noise
            opened = finite(p["stages_per_round"]) and p["stages_per_round"] > 1.0 + 1e-9
            ax.scatter(p["whole_stage_rate"], p["gain_pct"], marker=markers[p["block_size"]], s=36,
                       c=colours[p["drafter"]] if opened else "none", edgecolors=colours[p["drafter"]] if not opened
                       else "k", linewidths=0.4 if opened else 1.2)
        fit = gain["fits"][label]
        if fit["b"] is not None and pts:
            xs = [min(p["whole_stage_rate"] for p in pts), max(p["whole_stage_rate"] for p in pts)]
            ax.plot(xs, [fit["a"] + fit["b"] * x for x in xs], "k--", lw=1,
                    label=f"fit, r = {fmt(fit['r'])}" + ("" if fit["pays_from"] is None
                                                        else f", 0 at {fit['pays_from']:.2f}"))
            ax.legend(fontsize=7, loc="lower right")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"gate {label}")
        ax.set_xlabel("whole-stage acceptance rate (DLoop off)")
    axes[0][0].set_ylabel("DLoop gain: speedup with / without − 1 (%)")
    axes[0][0].text(0.01, 0.01, "hollow: the gate never opened (timing noise)", transform=axes[0][0].transAxes,
                    fontsize=6, color="grey")
    handles = [plt.Line2D([], [], ls="", marker="o", color=colours[d], label=d) for d in drafters]
    handles += [plt.Line2D([], [], ls="", marker=markers[b], color="grey", label=f"B = {b}") for b in sizes]
    fig.legend(handles=handles, fontsize=7, loc="upper center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
