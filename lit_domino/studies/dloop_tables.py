"""The DLoop study's tables: the grid, the DLoop table (plain / loop only / control / loop-aware / both, paired Δ
and the GPU projection), the loop's own gain, the gates, detach and calibration tables, and their MLflow metrics."""

from __future__ import annotations

import math

from lit_domino.decoding.dloop import GATES, REFERENCE_STAGE_TOKENS, DLoopConfig, dloop_label
from lit_domino.decoding.metric_names import row_metrics
from lit_domino.decoding.metrics import paired_change
from lit_domino.runtime.jsonio import finite
from lit_domino.studies.common import finite_mean, flat_verify_speedup, fmt, mlflow_name
from lit_domino.studies.dloop_plan import DLoopPlan, gate_settings, log_threshold, skip_reason


PROJECTION = ("GPU projection: the measured τ, stages and draft times, every round verified as fast as the same "
              "drafter's one-stage rounds (a GPU verifies the stages' few dozen tokens in about the time of one block).")
PUBLISHED = "DLoop papers: +5 % to +41 % speedup over each drafter (EAGLE-3, DFlash, Domino), τ +12 % to +102 %"


def fwd_per_token(row: dict) -> float:
    """Target verification forwards per output token (prefill excluded): rounds / (tokens - first tokens)."""
    if row.get("kind") == "ar":
        return 1.0
    tokens = row.get("tokens") or 0
    rounds = row.get("rounds")
    n = tokens - int(row.get("num_prompts") or 0)
    return rounds / n if rounds is not None and n > 0 else float("nan")


def cell_index(rows: list[dict]) -> dict:
    """(drafter name, dloop label, domain) → the benchmark row (temperature 0, the drafters' trained block size:
    the block-size sweep's rows are left to :func:`gain_points`)."""
    return {(r["drafter"], r["dloop"], r["benchmark"]): r for r in rows
            if r.get("kind") == "drafter" and float(r.get("temperature", 0.0)) == 0.0 and not r.get("sweep")}


def grid_table(rows: list[dict], names: dict, plan: DLoopPlan) -> dict:
    """The threshold × depth grid: per drafter (plain / loop-trained) × (g, N), per domain τ, fwd/token, speedup."""
    idx = cell_index(rows)
    domains = list(plan.prompts)
    records, lines = [], []
    header = ["drafter", "training", "g", "N"] + [f"{d} τ / fwd·tok⁻¹ / speedup" for d in domains] + ["avg speedup",
                                                                                         "avg stages/verif."]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in plan.drafters:
        for training, name in (("plain", names[kind]["plain"]), ("loop-aware", names[kind]["loop"])):
            for n in plan.stages:
                for g in (plan.thresholds if n > 1 else [None]):
                    label = "off" if n == 1 else dloop_label(DLoopConfig(g, n))
                    cells, speeds, loops = [], [], []
                    for d in domains:
                        r = idx.get((name, label, d))
                        if r is None:
                            cells.append("–")
                            continue
                        rec = {"drafter": kind, "training": training, "threshold": g, "max_stages": n,
                               "domain": d, "tau": r["tau"], "fwd_per_token": fwd_per_token(r),
                               "speedup": r.get("speedup"), "stages_per_round": r.get("stages_per_round"),
                               "match_baseline": r.get("match_baseline")}
                        records.append(rec)
                        speeds.append(rec["speedup"])
                        loops.append(rec["stages_per_round"])
                        cells.append(f"{fmt(rec['tau'])} / {fmt(rec['fwd_per_token'])} / {fmt(rec['speedup'], suffix='x')}")
                    lines.append("| " + " | ".join([kind, training, "–" if g is None else f"{g:g}", str(n)] + cells
                                                    + [fmt(finite_mean(speeds), suffix="x"), fmt(finite_mean(loops))]) + " |")
    return {"name": "grid", "records": records, "markdown": "\n".join(lines)}


CONTROL = "control n1"
"""The fine-tune variant with ``max_stages = 1``: the loop-aware fine-tune's optimizer steps without the loop."""

SETTING_CELLS = {"plain": ("plain", False), "loop only": ("plain", True), "control fine-tune": (CONTROL, False),
                 "control + loop": (CONTROL, True), "loop-aware training only": ("loop", False), "both": ("loop", True)}
"""Each DLoop-table setting: (the drafter variant, whether it decodes with the section's gate)."""
SETTINGS = tuple(SETTING_CELLS)

REFERENCE = {"control + loop": "control fine-tune", "loop-aware training only": "control fine-tune",
             "both": "control fine-tune"}
"""The row each setting's own gain is measured against: what more training alone gives (the control) is not the
loop's, so the loop-aware rows are compared with the control fine-tune (the plain drafter without a control)."""


def paired_delta(idx: dict, base: tuple[str, str], other: tuple[str, str], domains: list[str]) -> tuple[float, float]:
    """``other`` (drafter name, gate label) against ``base`` prompt by prompt over ``domains`` (the two decoded the
    same tokens: lossless): :func:`~lit_domino.decoding.metrics.paired_change`'s (Δ %, standard error)."""
    pairs = []
    for d in domains:
        a = (idx.get((*base, d)) or {}).get("decode_s_by_prompt") or []
        b = (idx.get((*other, d)) or {}).get("decode_s_by_prompt") or []
        if len(a) == len(b):
            pairs += zip(a, b)
    return paired_change([a for a, _ in pairs], [b for _, b in pairs])


def projected(idx: dict, name: str, label: str, domain: str) -> float:
    """The cell's speedup had every round verified as fast as the same drafter's one-stage rounds (DLoop off):
    the GPU projection (a verify cost flat in the stages verified; :func:`flat_verify_speedup`)."""
    off = idx.get((name, "off", domain)) or {}
    return flat_verify_speedup(idx.get((name, label, domain)) or {}, off.get("verify_ms_per_round"))


def _pm(delta, se) -> str:
    return "–" if delta is None or not finite(delta) else f"{delta:+.1f} % (±{2 * se:.1f})"


def dloop_table(rows: list[dict], names: dict, plan: DLoopPlan) -> dict:
    """Per gate (the table's gate first, then ``plan.gates``), each drafter × {plain, loop only, control
    fine-tune, control + loop, loop-aware training only, both} (the control rows where the plan fine-tunes one):
    τ and speedup per domain and on average, the Δ against the plain drafter, the paired Δ (prompt by prompt,
    ± 2 standard errors) against the plain drafter and against the control fine-tune (what the loop-aware rows owe
    to the loop rather than to more training), and the GPU projection of the average speedup (measured τ, stages
    and draft times; every round verified as fast as a one-stage round). A gate the drafter cannot use is a line
    with the reason."""
    idx = cell_index(rows)
    domains = list(plan.prompts)
    table_label = dloop_label(DLoopConfig(**plan.table_dloop))
    cols = domains + ["avg"]
    header = (["drafter", "setting"] + [f"{d} τ" for d in cols] + [f"{d} speedup" for d in cols]
              + ["Δ speedup vs plain", "paired Δ vs plain (±2 SE)", "paired Δ vs control (±2 SE)",
                 "avg speedup, GPU projection", "projected Δ vs control"])
    all_rows, lines = [], []
    for cfg in gate_settings(plan):
        gate = dloop_label(cfg)
        lines += [f"### gate {gate}" + (" (the table's gate)" if gate == table_label else ""), "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for kind in plan.drafters:
            recs = {}
            for setting, (variant, gated) in SETTING_CELLS.items():
                if variant not in names[kind]:
                    continue  # no control fine-tune in this plan
                name, label = names[kind][variant], gate if gated else "off"
                row = {"drafter": kind, "setting": setting, "drafter_name": name, "dloop": label, "gate": gate}
                why = skip_reason(rows, plan, kind, name, label) if gated else None
                if why:
                    row["skipped"] = why
                    all_rows.append(row)
                    lines.append(f"| {kind} | {setting} | skipped: {why} |" + "|" * (len(header) - 3))
                    continue
                for d in domains:
                    r = idx.get((name, label, d)) or {}
                    row[f"{d}/tau"], row[f"{d}/speedup"] = r.get("tau"), r.get("speedup")
                    row[f"{d}/projected_speedup"] = projected(idx, name, label, d)
                for key in ("tau", "speedup", "projected_speedup"):
                    row[f"avg/{key}"] = finite_mean(row[f"{d}/{key}"] for d in domains)
                plain = recs.get("plain")
                row["delta_speedup_pct"] = (100.0 * (row["avg/speedup"] / plain["avg/speedup"] - 1.0)
                                            if plain and finite(plain["avg/speedup"]) and plain["avg/speedup"]
                                            and finite(row["avg/speedup"]) else None)
                cell = (name, label)
                row["paired_vs_plain_pct"], row["paired_vs_plain_se"] = (
                    paired_delta(idx, (plain["drafter_name"], plain["dloop"]), cell, domains) if plain else (None, None))
                ref = recs.get(REFERENCE.get(setting, ""))
                row["paired_vs_control_pct"], row["paired_vs_control_se"] = (
                    paired_delta(idx, (ref["drafter_name"], ref["dloop"]), cell, domains) if ref else (None, None))
                row["projected_vs_control_pct"] = (
                    100.0 * (row["avg/projected_speedup"] / ref["avg/projected_speedup"] - 1.0)
                    if ref and finite(ref["avg/projected_speedup"]) and finite(row["avg/projected_speedup"]) else None)
                recs[setting] = row
                all_rows.append(row)
                cells = [kind, setting] + [fmt(row[f"{d}/tau"]) for d in cols]
                cells += [fmt(row[f"{d}/speedup"], suffix="x") for d in cols]
                cells += ["–" if setting == "plain" or row["delta_speedup_pct"] is None
                          else f"{row['delta_speedup_pct']:+.1f} %",
                          "–" if setting == "plain" else _pm(row["paired_vs_plain_pct"], row["paired_vs_plain_se"]),
                          _pm(row["paired_vs_control_pct"], row["paired_vs_control_se"]),
                          fmt(row["avg/projected_speedup"], suffix="x"),
                          "–" if row["projected_vs_control_pct"] is None else f"{row['projected_vs_control_pct']:+.1f} %"]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(f"loop = the DLoop gate of each section ([GATE@]threshold:max_stages; trunc@p: DSpark's stage "
                 f"truncation, one stage); control fine-tune = the loop-aware fine-tune's steps with max_stages = 1 "
                 f"(no loop): the loop-aware rows' gain over it is the loop's, not more training's. Paired Δ: each "
                 f"prompt's decode time against the same prompt's (the same tokens: lossless), ± twice its standard "
                 f"error. {PROJECTION} Published: {PUBLISHED}.")
    return {"name": "dloop", "gate": table_label, "columns": cols,
            "rows": [r for r in all_rows if r["gate"] == table_label], "gate_rows": all_rows,
            "markdown": "\n".join(lines)}


def loop_gain_table(dloop: dict, rows: list[dict], plan: DLoopPlan) -> dict:
    """The loop's own gain per drafter, gate and domain: loop-aware training with the loop ("both") against the
    control fine-tune decoded plainly, measured (paired over the domain's prompts, ± 2 SE) and GPU-projected;
    drafters without a control fine-tune are compared with the plain drafter (said in the row)."""
    idx = cell_index(rows)
    domains = list(plan.prompts)
    header = (["drafter", "gate", "against"] + [f"{d} Δ (±2 SE)" for d in domains + ["all prompts"]]
              + [f"{d} Δ, GPU projection" for d in domains + ["avg"]])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out = []
    by = {(r["gate"], r["drafter"], r["setting"]): r for r in dloop["gate_rows"]}
    for cfg in gate_settings(plan):
        gate = dloop_label(cfg)
        for kind in plan.drafters:
            both = by.get((gate, kind, "both"))
            ref = by.get((gate, kind, "control fine-tune")) or by.get((gate, kind, "plain"))
            if not both or not ref or both.get("skipped"):
                continue
            base, cell = (ref["drafter_name"], "off"), (both["drafter_name"], both["dloop"])
            rec = {"drafter": kind, "gate": gate, "against": ref["setting"]}
            cells = []
            for d in domains + [None]:
                delta, se = paired_delta(idx, base, cell, domains if d is None else [d])
                rec[f"{d or 'all'}/delta_pct"], rec[f"{d or 'all'}/se_pct"] = delta, se
                cells.append(_pm(delta, se))
            for d in domains + ["avg"]:
                a, b = ref[f"{d}/projected_speedup"], both[f"{d}/projected_speedup"]
                rec[f"{d}/projected_delta_pct"] = 100.0 * (b / a - 1.0) if finite(a) and finite(b) and a else None
                cells.append("–" if rec[f"{d}/projected_delta_pct"] is None
                             else f"{rec[f'{d}/projected_delta_pct']:+.1f} %")
            out.append(rec)
            lines.append("| " + " | ".join([kind, gate, ref["setting"]] + cells) + " |")
    lines += ["", f"Δ: the loop-aware fine-tune decoded with the gate against the control fine-tune decoded plainly "
                  f"(the same optimizer steps without the loop), prompt by prompt. {PROJECTION}"]
    return {"name": "loop_gain", "rows": out, "markdown": "\n".join(lines)}


def detach_table(rows: list[dict], names: dict, reports: dict, plan: DLoopPlan) -> dict:
    """``detach_stage_context`` on/off and the no-loop control: validation loss per stage, τ and speedup."""
    idx = cell_index(rows)
    domains = list(plan.prompts)
    gate = dloop_label(DLoopConfig(**plan.table_dloop))
    n = int((plan.loop or {}).get("max_stages", 3))
    header = ["drafter", "fine-tune", "val loss stage 1", f"val loss stage {n}", "avg τ (off)", f"avg τ ({gate})",
              "avg speedup (off)", f"avg speedup ({gate})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out = []
    for kind in plan.drafters:
        for variant, name in names[kind].items():
            if variant == "loop":
                continue  # listed under its own detach label
            rep = reports.get(name, {})
            rec = {"drafter": kind, "fine_tune": variant, "drafter_name": name,
                   "val_loss_stage1": rep.get("val/loss_stage1"), f"val_loss_stage{n}": rep.get(f"val/loss_stage{n}")}
            for label, key in (("off", "off"), (gate, "gate")):
                rec[f"tau_{key}"] = finite_mean((idx.get((name, label, d)) or {}).get("tau") for d in domains)
                rec[f"speedup_{key}"] = finite_mean((idx.get((name, label, d)) or {}).get("speedup") for d in domains)
            out.append(rec)
            lines.append("| " + " | ".join([kind, variant, fmt(rec["val_loss_stage1"], 3),
                                             fmt(rec[f"val_loss_stage{n}"], 3), fmt(rec["tau_off"]),
                                             fmt(rec["tau_gate"]), fmt(rec["speedup_off"], suffix="x"),
                                             fmt(rec["speedup_gate"], suffix="x")]) + " |")
    verdicts = []
    for kind in plan.drafters:
        recs = {r["fine_tune"]: r for r in out if r["drafter"] == kind}
        a, b = recs.get("loop detach"), recs.get("loop grad")
        if a and b and finite(a["tau_gate"]) and finite(b["tau_gate"]):
            better = "detach" if a["tau_gate"] > b["tau_gate"] else "gradient" if b["tau_gate"] > a["tau_gate"] else "tie"
            verdicts.append(f"{kind}: τ with the gate {fmt(a['tau_gate'])} (detach) vs {fmt(b['tau_gate'])} "
                            f"(gradient) → {better}")
    lines += [""] + [f"- {v}" for v in verdicts]
    return {"name": "detach", "rows": out, "verdicts": verdicts, "markdown": "\n".join(lines)}


def stage_confidence(record, gate: str) -> float:
    """A stage record ``[sum log q, last log q, K, accepted]`` -> the ``gate``'s confidence (``DLoopConfig``'s)."""
    total, last, k = float(record[0]), float(record[1]), int(record[2])
    return {"sum": total, "mean": total / k, "scaled": total * REFERENCE_STAGE_TOKENS / k, "last": last}[gate]


def calibration(rows: list[dict], names: dict, plan: DLoopPlan, bins: int = 8) -> dict:
    """DLoop's calibration: per drafter and gate, the stages of the DLoop-off rows (stage 1 of every round: an
    unbiased sample) binned by the gate's confidence (quantile bins) against the fraction whose whole stage the
    target then accepted, and how often each gate would open at the table's threshold and at its own best one.

    -> ``{"records": [...], "markdown": ...}``; each record: drafter, training, gate, bins (mean confidence,
    P(whole stage accepted), stages), open_rate_at_table_g, n_stages."""
    idx = cell_index(rows)
    g_table = log_threshold(plan)
    out, lines = [], ["| drafter | training | gate | stages | P(whole stage accepted) | opens at g = "
                      f"{g_table:g} | P(accepted \| opens) | confidence range |", "|---|---|---|---|---|---|---|---|"]
    for kind in plan.drafters:
        for training, variant in (("plain", "plain"), ("loop-aware", "loop")):
            name = names[kind][variant]
            recs = [rec for d in plan.prompts for rec in (idx.get((name, "off", d)) or {}).get("stage_records", [])]
            if not recs:
                continue
            for gate in GATES:
                pairs = sorted((stage_confidence(r, gate), int(r[3]) == int(r[2])) for r in recs)
                n = len(pairs)
                edges = [pairs[min(n - 1, (n * i) // bins)][0] for i in range(bins)] + [math.inf]
                binned = []
                for lo, hi in zip(edges, edges[1:]):
                    sel = [(c, a) for c, a in pairs if lo <= c < hi]
                    if sel:
                        binned.append({"confidence": finite_mean(c for c, _ in sel),
                                       "accepted": finite_mean(float(a) for _, a in sel), "stages": len(sel)})
                opens = [a for c, a in pairs if c >= g_table]
                rec = {"drafter": kind, "training": training, "gate": gate, "n_stages": n, "bins": binned,
                       "whole_stage_rate": finite_mean(float(a) for _, a in pairs),
                       "open_rate_at_table_g": len(opens) / n, "accepted_when_open": finite_mean(float(a) for a in opens),
                       "min_confidence": pairs[0][0], "max_confidence": pairs[-1][0]}
                out.append(rec)
                lines.append(f"| {kind} | {training} | {gate} | {n} | {fmt(rec['whole_stage_rate'])} | "
                             f"{fmt(rec['open_rate_at_table_g'])} | {fmt(rec['accepted_when_open'])} | "
                             f"{fmt(rec['min_confidence'])} .. {fmt(rec['max_confidence'])} |")
    lines += ["", "Stage 1 of every DLoop-off round; a stage is accepted when the target accepted all its tokens. "
              "A gate pays when it opens often and P(accepted | opens) is high."]
    return {"name": "calibration", "records": out, "markdown": "\n".join(lines)}


def gates_table(rows: list[dict], names: dict, plan: DLoopPlan) -> dict:
    """Each drafter (plain / loop-trained) × gate setting (the table's gate first, then ``plan.gates``):
    τ, stages per verification, draft and verify time per round (what the gate costs) and speedup, averaged over
    the domains; a gate the drafter cannot use is listed with the reason. ``noise``: the timing noise of Δ (the
    repeats' spread of both rows' mean speedups, :func:`~lit_domino.decoding.metrics.repeat_noise`, combined), in
    percentage points; a |Δ| within twice it is not a measured difference. ``Δ throughput``: the same comparison on
    each domain's total decode time (:func:`decode_seconds`; the tokens are the same, decoding being lossless),
    averaged over the domains: the speedup averages each prompt's time per token, so a 2-round prompt counts as
    much as a 30-round one, and a gate that wins on long sequences and loses on short ones can lose on the speedup
    and win on the throughput (the default preset's cost gate did). ``paired Δ``: the throughput change measured
    prompt by prompt (:func:`~lit_domino.decoding.metrics.paired_change` over every domain's prompts, each against
    the same prompt decoded off), with twice its standard error: the spread of the per-prompt effects, which is
    small where a gate changes little and wide where it helps some prompts and costs others."""
    idx = cell_index(rows)
    domains = list(plan.prompts)
    lines = ["| drafter | training | gate | avg τ | avg stages/verif. | draft ms/round | verify ms/round | avg speedup | "
             "Δ vs off | noise of Δ | Δ throughput vs off | paired Δ (±2 SE) | avg speedup, GPU projection |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out = []
    for kind in plan.drafters:
        for training, variant in (("plain", "plain"), ("control", CONTROL), ("loop-aware", "loop")):
            if variant not in names[kind]:
                continue
            name = names[kind][variant]
            off = [idx.get((name, "off", d)) or {} for d in domains]
            off_speed = finite_mean(c.get("speedup") for c in off)
            off_noise = mean_noise(off)
            for cfg in [None] + gate_settings(plan):
                label = dloop_label(cfg)
                why = skip_reason(rows, plan, kind, name, label)
                if why:
                    out.append({"drafter": kind, "training": training, "gate": label, "skipped": why})
                    lines.append(f"| {kind} | {training} | {label} | skipped: {why} ||||||||||")
                    continue
                cells = off if cfg is None else [idx.get((name, label, d)) or {} for d in domains]
                rec = {"drafter": kind, "training": training, "gate": label,
                       "tau": finite_mean(c.get("tau") for c in cells), "speedup": finite_mean(c.get("speedup") for c in cells),
                       "stages_per_round": finite_mean(c.get("stages_per_round") for c in cells),
                       "draft_ms_per_round": finite_mean(c.get("draft_ms_per_round") for c in cells),
                       "verify_ms_per_round": finite_mean(c.get("verify_ms_per_round") for c in cells),
                       "projected_speedup": finite_mean(projected(idx, name, label, d) for d in domains)}
                rec["delta_pct"] = (100 * (rec["speedup"] / off_speed - 1) if finite(off_speed) and off_speed
                                    and finite(rec["speedup"]) else None)
                rec["noise_pct"] = 100 * math.hypot(mean_noise(cells), off_noise) if cfg is not None else None
                rec["throughput_delta_pct"] = (100 * (finite_mean(decode_seconds(o) / decode_seconds(c)
                                                             for o, c in zip(off, cells)) - 1)
                                               if cfg is not None else None)
                by_prompt = [(o.get("decode_s_by_prompt") or [], c.get("decode_s_by_prompt") or [])
                             for o, c in zip(off, cells)]  # each domain's prompts, paired (none: rows without them)
                pairs = [p for a, b in by_prompt if len(a) == len(b) for p in zip(a, b)]
                rec["paired_delta_pct"], rec["paired_se_pct"] = (
                    paired_change([a for a, _ in pairs], [b for _, b in pairs]) if cfg is not None else (None, None))
                out.append(rec)
                delta = "–" if rec["delta_pct"] is None or cfg is None else f"{rec['delta_pct']:+.1f} %"
                noise = "–" if rec["noise_pct"] is None or not finite(rec["noise_pct"]) else f"±{rec['noise_pct']:.1f}"
                thr = rec["throughput_delta_pct"]
                thr = "–" if thr is None or not finite(thr) else f"{thr:+.1f} %"
                pd, se = rec["paired_delta_pct"], rec["paired_se_pct"]
                paired = "–" if pd is None or not finite(pd) else f"{pd:+.1f} % (±{2 * se:.1f})"
                lines.append(f"| {kind} | {training} | {label} | {fmt(rec['tau'])} | {fmt(rec['stages_per_round'])} | "
                             f"{fmt(rec['draft_ms_per_round'])} | {fmt(rec['verify_ms_per_round'])} | "
                             f"{fmt(rec['speedup'], suffix='x')} | {delta} | {noise} | {thr} | {paired} | "
                             f"{fmt(rec['projected_speedup'], suffix='x')} |")
    lines += ["", PROJECTION]
    return {"name": "gates", "rows": out, "markdown": "\n".join(lines)}


def decode_seconds(cell: dict) -> float:
    """A row's total decode time over its prompts (its rounds times their draft, verify and other time per round:
    what ``generate`` times, prefill excluded); NaN for a row without rounds."""
    rounds = cell.get("rounds")
    parts = [cell.get(k) for k in ("draft_ms_per_round", "verify_ms_per_round", "other_ms_per_round")]
    if not rounds or not all(finite(x) for x in parts) or sum(parts) <= 0:
        return float("nan")
    return rounds * sum(parts) / 1e3


def mean_noise(cells: list[dict]) -> float:
    """The relative repeat noise of the mean over domains of the cells' speedups (independent domains: the root of
    the summed squares over their count); NaN when a cell has none (one repeat)."""
    noise = [c.get("speedup_noise") for c in cells]
    if not noise or not all(finite(x) for x in noise):
        return float("nan")
    return math.sqrt(sum(x * x for x in noise)) / len(noise)


def table_metrics(tables: dict) -> dict[str, float]:
    """Every finite cell of the DLoop table (``{drafter}.{setting}.{domain}.{tau|speedup}`` for the table's gate,
    ``gate.{gate}.{drafter}.{setting}.{domain}.{tau|speedup}`` for the other gates), of the grid
    (``grid.{drafter}.{training}.{g<threshold>|off}.N{max_stages}.{domain}.{tau|fwd_per_token|speedup}``) and of
    the gain figure (``gain.{gate}.{drafter}.B{block size}.{domain}.{gain_pct|whole_stage_rate}``); names made
    MLflow-safe (``conf@0.5:3`` -> ``conf_0.5:3``)."""
    table = tables["dloop"]
    cells = [{"name": (() if r["gate"] == table["gate"] else ("gate", r["gate"])) + (
        r["drafter"], r["setting"].replace(" ", "_"), d), "tau": r.get(f"{d}/tau"), "speedup": r.get(f"{d}/speedup"),
        "projected_speedup": r.get(f"{d}/projected_speedup")}
        for r in table.get("gate_rows", table["rows"]) for d in table["columns"]]
    metrics = row_metrics(cells, ("tau", "speedup", "projected_speedup"), by=lambda c: c["name"], sep=".")
    if "loop_gain" in tables:  # the loop's own gain: measured (paired, its standard error) and projected
        domains = [c for c in table["columns"] if c != "avg"]
        gains = [{"name": ("loop_gain", r["gate"], r["drafter"], d), "delta_pct": r.get(f"{d}/delta_pct"),
                  "se_pct": r.get(f"{d}/se_pct"), "projected_delta_pct": r.get(f"{'avg' if d == 'all' else d}"
                                                                               "/projected_delta_pct")}
                 for r in tables["loop_gain"]["rows"] for d in domains + ["all"]]
        metrics.update(row_metrics(gains, ("delta_pct", "se_pct", "projected_delta_pct"), by=lambda c: c["name"],
                                   sep="."))
    metrics.update(row_metrics(tables["grid"]["records"], ("tau", "fwd_per_token", "speedup"), sep=".", by=lambda r: (
        "grid", r["drafter"], r["training"], "off" if r["threshold"] is None else f"g{r['threshold']:g}",
        f"N{r['max_stages']}", r["domain"])))
    if "gain" in tables:
        metrics.update(row_metrics(tables["gain"]["points"], ("gain_pct", "whole_stage_rate"), sep=".", by=lambda p: (
            "gain", p["gate"], p["drafter"], f"B{p['block_size']}", p["domain"])))
    return {mlflow_name(k): v for k, v in metrics.items()}
