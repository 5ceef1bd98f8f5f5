"""Reports of a calibrated acceptance predictor on test rounds: per position and per stage tables (dicts and
Markdown) and the reliability diagrams."""

from __future__ import annotations

import torch

from lit_domino.decoding.acceptance import Calibration
from lit_domino.training.calibration import calibrated, prefix_weights, stage_events, survival_of
from lit_domino.training.calibration_metrics import auc, ece, ece_floor


MIN_REPORT_ROUNDS = 10
"""Test rounds a position needs to be listed in the tables (and pooled in the survival ECE)."""


def calibration_report(z: torch.Tensor, hard: torch.Tensor, soft: torch.Tensor, cal: Calibration,
                       stage_tokens: int | None = None) -> dict:
    """Per round position j on test rounds: rounds reaching j, acceptance rate, AUC (raw logit vs the hard event,
    on the rounds whose drafts before j survived), ECE of c_j before / after calibration (same rounds), and the
    ECE of the survival S_j (:func:`survival_of`) against the event "drafts 1..j all accepted" (all rounds);
    ``ece_floor``: what a calibrated c_j would score by sampling alone on the same rows (:func:`ece_floor`).
    ``y`` for ECE is the calibration's label. With ``stage_tokens`` K, ``stages``: per stage boundary (where a DLoop
    gate decides) the test rounds, the observed survival, the mean S and P(whole | S), their ECE, and the next
    stage's yield on the test rounds against the calibration's (:func:`stage_rows`)."""
    y = hard if cal.label == "hard" else soft
    w = prefix_weights(hard)
    before, after = calibrated(z, None), calibrated(z, cal)
    S_after, S_before = survival_of(z, cal), torch.cumprod(before, 1)
    survived = torch.cumprod(hard, 1) if cal.label == "hard" else torch.cumprod(soft.double(), 1)
    rows = []
    for j in range(z.shape[1]):
        rows.append({"position": j + 1, "rounds": int(w[:, j].sum()), "accept": float((hard[:, j] * w[:, j]).sum()
                                                                                       / w[:, j].sum().clamp_min(1)),
                     "auc": auc(z[:, j], hard[:, j], w[:, j]), "ece_before": ece(before[:, j], y[:, j], w[:, j]),
                     "ece_after": ece(after[:, j], y[:, j], w[:, j]), "temperature": cal.temperatures[j],
                     "offset": 0.0 if cal.offsets is None else cal.offsets[j],
                     "survival_ece_before": ece(S_before[:, j], survived[:, j]),
                     "survival_ece_after": ece(S_after[:, j], survived[:, j]),
                     "ece_floor": ece_floor(after[:, j], w[:, j])})
    allw = w.reshape(-1)
    J = max(1, sum(1 for r in rows if r["rounds"] >= MIN_REPORT_ROUNDS))  # positions enough test rounds reached
    pooled = {"auc": auc(z, hard, w), "ece_before": ece(before, y, allw), "ece_after": ece(after, y, allw),
              "survival_ece_before": ece(S_before[:, :J], survived[:, :J]),
              "survival_ece_after": ece(S_after[:, :J], survived[:, :J]), "survival_positions": J,
              "ece_floor": ece_floor(after, allw), "survival_ece_floor": ece_floor(S_after[:, :J]),
              "rounds": int(z.shape[0])}
    out = {"positions": rows, "pooled": pooled, "label": cal.label}
    if stage_tokens is not None:
        out["stages"] = stage_rows(S_after, y, cal, stage_tokens)
    return out


def stage_rows(S: torch.Tensor, y: torch.Tensor, cal: Calibration, K: int) -> list[dict]:
    """Per stage boundary s (after s stages of K drafts) on these rounds: ``rounds``, ``alive`` (the mean survival:
    every draft so far accepted), ``S`` and ``whole`` (the mean S and P(whole | S) predicted), ``ece_S`` and
    ``ece_whole`` (against the survival), ``gain`` and ``gain_fit`` (the next stage's accepted drafts, 0 on a dead
    round, observed and predicted: :meth:`~lit_domino.decoding.acceptance.Calibration.next_gain`) and, on the rounds
    whose predicted gain is at least one draft (where a gate is likely to draft another stage), ``n_hopeful``,
    ``gain_hopeful`` and ``gain_fit_hopeful``."""
    S, alive, bounds = stage_events(S, y, K)
    out = []
    for s, b in enumerate(bounds, 1):
        P = torch.tensor([cal.whole_stage(float(v)) for v in S[:, b]], dtype=torch.float64)
        fit = torch.tensor([cal.next_gain(float(v), b + 1, K) for v in S[:, b]], dtype=torch.float64)
        gain = alive[:, b + 1: b + 1 + K].sum(1)
        hopeful = fit >= 1.0
        out.append({"stage": s, "rounds": int(S.shape[0]), "alive": float(alive[:, b].mean()),
                    "S": float(S[:, b].mean()), "whole": float(P.mean()), "ece_S": ece(S[:, b], alive[:, b]),
                    "ece_whole": ece(P, alive[:, b]), "gain": float(gain.mean()), "gain_fit": float(fit.mean()),
                    "n_hopeful": int(hopeful.sum()),
                    "gain_hopeful": float(gain[hopeful].mean()) if hopeful.any() else float("nan"),
                    "gain_fit_hopeful": float(fit[hopeful].mean()) if hopeful.any() else float("nan")})
    return out


def report_markdown(name: str, report: dict) -> str:
    lines = [f"**{name}** (label {report['label']}, {report['pooled']['rounds']} test rounds; pooled AUC "
             f"{report['pooled']['auc']:.3f}, ECE {100 * report['pooled']['ece_before']:.1f} % → "
             f"{100 * report['pooled']['ece_after']:.1f} %, survival ECE "
             f"{100 * report['pooled']['survival_ece_before']:.1f} % → {100 * report['pooled']['survival_ece_after']:.1f} %)",
             "", "| j | rounds | accept | AUC | ECE before | ECE after | τ_j | S_j ECE before | S_j ECE after | "
             "ECE noise floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["positions"]:
        if r["rounds"] < MIN_REPORT_ROUNDS:
            continue
        lines.append(f"| {position_cells(r)} |")
    if report.get("stages"):
        lines += ["", stage_markdown(report["stages"])]
    return "\n".join(lines)


def stage_markdown(stages: list[dict]) -> str:
    """:func:`stage_rows` as a Markdown table."""
    lines = [r"| after stage | rounds | survived | mean S | mean P(whole \| S) | ECE of S | ECE of P(whole \| S) | "
             "next stage's drafts accepted: observed / predicted | rounds predicted ≥ 1: n, observed / predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in stages:
        lines.append(f"| {r['stage']} | {r['rounds']} | {r['alive']:.3f} | {r['S']:.3f} | {r['whole']:.3f} | "
                     f"{100 * r['ece_S']:.1f} % | {100 * r['ece_whole']:.1f} % | {r['gain']:.2f} / "
                     f"{r['gain_fit']:.2f} | {r['n_hopeful']}: {r['gain_hopeful']:.2f} / {r['gain_fit_hopeful']:.2f} |")
    return "\n".join(lines)


def position_cells(r: dict) -> str:
    """One calibration report position as Markdown cells: j, rounds, accept rate, AUC, ECE before/after, τ_j,
    survival ECE before/after, the c_j ECE's noise floor (the per-drafter report and the study's table print the
    same columns; reports without a floor, built before it, print –)."""
    floor = r.get("ece_floor")
    return (f"{r['position']} | {r['rounds']} | {r['accept']:.2f} | {r['auc']:.3f} | "
            f"{100 * r['ece_before']:.1f} % | {100 * r['ece_after']:.1f} % | {r['temperature']:.2f} | "
            f"{100 * r['survival_ece_before']:.1f} % | {100 * r['survival_ece_after']:.1f} % | "
            + ("–" if floor is None else f"{100 * floor:.1f} %"))


def reliability_figure(z: torch.Tensor, hard: torch.Tensor, soft: torch.Tensor, cal: Calibration, title: str,
                       bins: int = 10):
    """Reliability diagrams (a matplotlib ``Figure``, Agg): per-position c_j (pooled over positions, on the rounds
    that reached j) and the survival S_j, before and after calibration."""
    from matplotlib.figure import Figure

    y = hard if cal.label == "hard" else soft
    w = prefix_weights(hard)
    survived = torch.cumprod(hard, 1) if cal.label == "hard" else torch.cumprod(soft.double(), 1)
    fig = Figure(figsize=(9, 4))
    for ax, (name, pre, post, yy, ww) in zip(fig.subplots(1, 2), [
            ("c_j (conditional)", calibrated(z, None), calibrated(z, cal), y, w),
            ("survival S_j", torch.cumprod(calibrated(z, None), 1), survival_of(z, cal), survived,
             torch.ones_like(w))]):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for label, p in (("before", pre), ("after", post)):
            p, t, wt = p.reshape(-1), yy.double().reshape(-1), ww.double().reshape(-1)
            idx = (p * bins).long().clamp(0, bins - 1)
            xs, ys = [], []
            for b in range(bins):
                m = (idx == b) & (wt > 0)
                if m.any():
                    xs.append(float((p[m] * wt[m]).sum() / wt[m].sum()))
                    ys.append(float((t[m] * wt[m]).sum() / wt[m].sum()))
            ax.plot(xs, ys, marker="o", label=f"{label} (ECE {100 * ece(pre if label == 'before' else post, yy, ww):.1f} %)")
        ax.set_xlabel("predicted"), ax.set_ylabel("observed"), ax.set_title(name), ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
