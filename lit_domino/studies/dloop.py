"""The DLoop study: the gate's threshold × depth grid and the DLoop table, end to end.

Stages (each printed as it runs, each cached):

1. the target (``load_target``);
2. per drafter (backbone, Domino, DSpark, DFlash 2, EAGLE-3): the base drafter (``experiment.train_variant``,
   the same cache as the ablation's), then its loop-aware fine-tunes
   (:class:`lit_domino.lit.loop.LoopModule`, ``train_variant`` again, so each is cached under
   a key of its own config, which names the base drafter): one per ``detach_stage_context``
   setting, plus a control fine-tuned with ``max_stages = 1`` (the same extra optimizer steps,
   no loop) that separates "loop-aware" from "trained longer";
3. real speculative decoding with :func:`lit_domino.decoding.harness.benchmark` on the
   embedded eval prompts per domain: every drafter with DLoop off and with every
   ``DLoopConfig(g, N)`` of the grid (N = 1 is DLoop off: plain speculative decoding, round for
   round) and every gate of ``gates`` it can use (the predictor gates ``conf``, ``cost`` and truncation read
   the parallel drafters' calibrated acceptance predictors, :func:`lit_domino.studies.acceptance.attach_predictors`;
   EAGLE-3 skips them, the reason printed), all methods interleaved per prompt against our AR baseline, Domino
   with the preset's candidate pool (``pool_size``, the ablation's); then the block-size sweep (``block_sizes``:
   each plain drafter decoded at smaller B, DLoop off and ``sweep_gates``); every row must reproduce the AR
   baseline at T = 0 (:class:`NotLosslessError` otherwise); the rows are cached under a key of the drafters and
   the evaluation settings;
4. tables (Markdown + JSON in ``results/dloop/``), MLflow (experiment ``dloop-<preset>``: the
   training runs and a ``tables`` run with every cell as a metric and the tables as artifacts).

Tables:

* **grid**: per drafter (plain / loop-trained) × g × N and domain: τ per verification, target
  verification forwards per output token (prefill excluded; 1.0 for AR decoding) and speedup;
* **DLoop table** (the papers' shape), per gate (``table_dloop`` first, then ``gates``): each drafter × {plain,
  loop only, loop-aware training only, both} with τ and speedup per domain and on average;
* **gates**: each drafter (plain / loop-trained) × gate: τ, stages per verification, draft and verify ms per round,
  speedup and its change against DLoop off;
* **gain** (and ``gain-vs-acceptance-<preset>.png``): DLoop's gain (speedup with the gate / without − 1) against
  the drafter's whole-stage acceptance rate (the DLoop-off row's stages accepted whole), one point per plain
  drafter × domain × block size, per figure gate, with a fitted line and where it crosses 0;
* **detach**: ``detach_stage_context`` on/off (validation loss per stage, τ and speedup with the
  table gate) and the ``max_stages = 1`` control.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from pathlib import Path

import mlflow
import yaml
from lit_domino.runtime import cache
from lit_domino.data.benchmarks import load_benchmark
from lit_domino.decoding.dloop import (GATES, REFERENCE_STAGE_TOKENS, DLoopConfig, check_grid, check_table_gate,
                                      dloop_label, parse_list)  # noqa: F401 (parse_list: the study API)
from lit_domino.decoding.harness import benchmark, check_repeats
from lit_domino.decoding.metrics import paired_change
from lit_domino.training.configs import (CONFIG_DIR, available_variants, check_preset, compose, load_config,
                                         method_feature_rule, module_class, set_dotted)
from lit_domino.training.experiment import drafter_artifact, train_variant
from lit_domino.interop import load_drafter
from lit_domino.models.sessions import check_pool_size
from lit_domino.studies.tables import decode_pool_size
from lit_domino.runtime.paths import project_root
from lit_domino.studies.common import (NotLosslessError, cached_rows, check_lossless,  # noqa: F401 (the API)
                                       flat_verify_speedup, log_metrics, mlflow_name)
from lit_domino.runtime.jsonio import finite, write_json
from lit_domino.runtime.threads import pinned_threads
from lit_domino.decoding.metric_names import row_metrics
from lit_domino.target.load import load_target
from lit_domino.runtime.tracking import default_tracking_uri, mlflow_run, open_client

STUDY_FILE = CONFIG_DIR / "loop" / "study.yaml"
LOOP_CLASS = "lit_domino.lit.loop.LoopModule"
PROJECTION = ("GPU projection: the measured τ, stages and draft times, every round verified as fast as the same "
              "drafter's one-stage rounds (a GPU verifies the stages' few dozen tokens in about the time of one block).")
PUBLISHED = "DLoop papers: +5 % to +41 % speedup over each drafter (EAGLE-3, DFlash, Domino), τ +12 % to +102 %"


# --------------------------------------------------------------------------- plan


def table_gate(cfg: DLoopConfig) -> dict:
    """The DLoop table's gate as the plan holds it: threshold and max_stages, plus ``gate`` unless it is the papers'
    ``sum`` (so a plan with the default gate keeps the cache key of its decoded rows)."""
    out = {"threshold": None if cfg.threshold is None else float(cfg.threshold), "max_stages": int(cfg.max_stages)}
    if cfg.gate != "sum":
        out["gate"] = cfg.gate
    if cfg.truncate is not None:
        out["truncate"] = float(cfg.truncate)
    return out


def log_threshold(plan: dict) -> float:
    """The table gate's g where it is a log gate, else the papers' -0.5: the log gates' calibration table reads it."""
    td = plan["table_dloop"]
    return float(td["threshold"]) if td.get("gate", "sum") in GATES else -0.5


def loop_trainable(variant: str) -> bool:
    """Whether ``variant`` (a config name) trains a drafter whose method supports DLoop's loop-aware training."""
    if variant not in available_variants():
        return False
    return module_class(compose(variant)).drafter_class.supports_loop_training


PRESET_OVERRIDES = ("thresholds", "stages", "table_dloop", "gates", "block_sizes", "sweep_gates")
"""Study-file keys a preset section may set for itself (the top-level value otherwise; a CLI value beats both)."""


def study_plan(preset: str, drafters=None, thresholds=None, stages=None, table_dloop=None,
               study_file: Path = STUDY_FILE, gates=None, block_sizes=None) -> dict:
    """The merged study settings of ``preset`` (CLI values override the preset's, which override the file's)."""
    study = yaml.safe_load(Path(study_file).read_text())
    check_preset(preset)  # the presets are the config files' (one place)
    if preset not in study["presets"]:
        raise ValueError(f"the DLoop study ({Path(study_file).name}) has no plan for preset {preset!r}; add a "
                         f"presets.{preset} section (it plans {', '.join(study['presets'])})")
    plan = copy.deepcopy(study["presets"][preset])

    def setting(key, cli):
        return cli if cli is not None else plan.get(key, study.get(key))

    plan["preset"] = preset
    plan["drafters"] = list(drafters or study["drafters"])
    bad = [d for d in plan["drafters"] if not loop_trainable(d)]
    if bad:
        raise ValueError(f"drafters {bad} cannot be loop-trained; DLoop's loop-aware training covers the variants "
                         f"whose method supports it: {[v for v in available_variants() if loop_trainable(v)]}")
    plan["thresholds"] = [float(g) for g in setting("thresholds", thresholds)]
    plan["stages"] = [int(n) for n in setting("stages", stages)]
    check_grid(plan["thresholds"], plan["stages"])
    plan["table_dloop"] = gate_setting(setting("table_dloop", table_dloop), "the DLoop table's gate")
    td = plan["table_dloop"]
    check_table_gate(td["threshold"], td["max_stages"], td.get("gate", "sum"), td.get("truncate"))
    plan["detach_stage_context"] = [bool(x) for x in plan.get("detach_stage_context", [True])]
    unknown = sorted(set(plan.get("loop_trainer_by_drafter") or {}) - set(available_variants()))
    if unknown:
        raise ValueError(f"presets.{preset}.loop_trainer_by_drafter names {unknown}, which are no drafter variants")
    if "pool_size" in plan:
        raise ValueError(f"presets.{preset}.pool_size: the DLoop study decodes with the ablation's pool "
                         "(studies/ablation.yaml); set it there")
    plan["pool_size"] = check_pool_size(decode_pool_size(preset), None)  # V is checked against the target later
    plan["repeats"] = check_repeats(plan.get("repeats", 1))
    # a gate that can never open (g > 0) or an unknown gate: refused before any training
    plan["gates"] = [gate_setting(g, "a DLoop gate setting") for g in (setting("gates", gates) or [])]
    plan["sweep_gates"] = [gate_setting(g, "a block-size sweep gate") for g in
                           (plan.get("sweep_gates") or [plan["table_dloop"]])]
    plan["block_sizes"] = [check_block_size(b) for b in (setting("block_sizes", block_sizes) or [])]
    plan["skipped"] = [{"drafter": kind, "gate": dloop_label(cfg), "why": why} for kind in plan["drafters"]
                       for cfg in dloop_settings(plan) if (why := unusable(cfg, kind))]
    for cfg in (DLoopConfig(**plan["table_dloop"]),):  # the table's loop rows need one drafter that can use it
        if all(unusable(cfg, kind) for kind in plan["drafters"]):
            raise ValueError(f"no drafter of {plan['drafters']} can use the DLoop table's gate {dloop_label(cfg)}: "
                             f"{unusable(cfg, plan['drafters'][0])}; add a parallel drafter or use a log gate")
    return plan


GATE_KEYS = ("gate", "threshold", "max_stages", "truncate")
"""What a DLoop gate setting of the study file (or the table's gate) may name (``DLoopConfig``'s fields)."""


def gate_setting(spec: dict, what: str) -> dict:
    """A gate setting of the study file -> the plan's dict (:func:`table_gate`), checked by ``DLoopConfig``."""
    if not isinstance(spec, dict):
        raise ValueError(f"{what} is a mapping of {', '.join(GATE_KEYS)}; got {spec!r}")
    unknown = set(spec) - set(GATE_KEYS)
    if unknown:
        raise ValueError(f"{what} takes {', '.join(GATE_KEYS)}; got {sorted(unknown)} in {spec}")
    thr = None if spec.get("threshold") is None else float(spec["threshold"])
    trunc = None if spec.get("truncate") is None else float(spec["truncate"])
    return table_gate(DLoopConfig(threshold=thr, max_stages=int(spec.get("max_stages", 3)),
                                  gate=str(spec.get("gate", "sum")), truncate=trunc))


def check_block_size(b) -> int:
    if isinstance(b, bool) or not isinstance(b, int) or b < 2:
        raise ValueError(f"block_sizes: each decode block size B must be an integer >= 2 (B - 1 drafts), got {b!r}")
    return b


@functools.lru_cache(maxsize=None)  # composing a variant reads its YAML chain: the plan asks per gate
def parallel_variant(variant: str) -> bool:
    """Whether ``variant`` trains a parallel drafter (its sessions keep block hidden states: a predictor applies)."""
    from lit_domino.models.backbone import ParallelSession

    cls = module_class(compose(variant)).drafter_class.session_class
    return isinstance(cls, type) and issubclass(cls, ParallelSession)


def unusable(cfg: DLoopConfig | None, kind: str) -> str | None:
    """Why drafter ``kind`` cannot decode with ``cfg`` (skipped, the reason printed), or None when it can."""
    if cfg is not None and cfg.needs_predictor and not parallel_variant(kind):
        return (f"the gate {dloop_label(cfg)} reads an acceptance predictor (calibrated stage survival), which "
                f"parallel drafters have; {kind} drafts token by token")
    return None


def dloop_settings(plan: dict) -> list:
    """The DLoop configurations decoded: off, the grid's (g, N > 1), the table's gate, the other gates and the
    block-size sweep's gates."""
    out = [None]
    for n in plan["stages"]:
        for g in plan["thresholds"]:
            if n > 1:
                out.append(DLoopConfig(threshold=g, max_stages=n))
    for spec in [plan["table_dloop"]] + list(plan.get("gates") or []) + list(plan.get("sweep_gates") or []):
        cfg = DLoopConfig(**spec)
        if cfg not in out:
            out.append(cfg)
    return out


def drafter_settings(plan: dict, kind: str) -> list:
    """The DLoop configurations drafter ``kind`` decodes (those it can use)."""
    return [cfg for cfg in dloop_settings(plan) if unusable(cfg, kind) is None]


def gate_settings(plan: dict) -> list[DLoopConfig]:
    """The gates of the gate table and of the DLoop table: the table's gate first, then ``plan["gates"]``."""
    return list(dict.fromkeys([DLoopConfig(**plan["table_dloop"])] + [DLoopConfig(**g) for g in plan["gates"]]))


def skip_reason(rows: list[dict], plan: dict, kind: str, name: str, label: str) -> str | None:
    """Why drafter ``kind`` (decoded as ``name``) has no rows with gate ``label``: the plan's reason, or the one
    recorded while decoding (a drafter the predictor could not be attached to)."""
    for s in plan.get("skipped") or []:
        if s["drafter"] == kind and s["gate"] == label:
            return s["why"]
    for r in rows:
        if r.get("kind") == "skipped" and r.get("drafter") == name and r.get("dloop") == label:
            return r["why"]
    return None


def gates_table(rows: list[dict], names: dict, plan: dict) -> dict:
    """Each drafter (plain / loop-trained) × gate setting (the table's gate first, then ``plan["gates"]``):
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
    domains = list(plan["prompts"])
    lines = ["| drafter | training | gate | avg τ | avg stages/verif. | draft ms/round | verify ms/round | avg speedup | "
             "Δ vs off | noise of Δ | Δ throughput vs off | paired Δ (±2 SE) | avg speedup, GPU projection |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out = []
    for kind in plan["drafters"]:
        for training, variant in (("plain", "plain"), ("control", CONTROL), ("loop-aware", "loop")):
            if variant not in names[kind]:
                continue
            name = names[kind][variant]
            off = [idx.get((name, "off", d)) or {} for d in domains]
            off_speed = _mean(c.get("speedup") for c in off)
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
                       "tau": _mean(c.get("tau") for c in cells), "speedup": _mean(c.get("speedup") for c in cells),
                       "stages_per_round": _mean(c.get("stages_per_round") for c in cells),
                       "draft_ms_per_round": _mean(c.get("draft_ms_per_round") for c in cells),
                       "verify_ms_per_round": _mean(c.get("verify_ms_per_round") for c in cells),
                       "projected_speedup": _mean(projected(idx, name, label, d) for d in domains)}
                rec["delta_pct"] = (100 * (rec["speedup"] / off_speed - 1) if finite(off_speed) and off_speed
                                    and finite(rec["speedup"]) else None)
                rec["noise_pct"] = 100 * math.hypot(mean_noise(cells), off_noise) if cfg is not None else None
                rec["throughput_delta_pct"] = (100 * (_mean(decode_seconds(o) / decode_seconds(c)
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
                lines.append(f"| {kind} | {training} | {label} | {_f(rec['tau'])} | {_f(rec['stages_per_round'])} | "
                             f"{_f(rec['draft_ms_per_round'])} | {_f(rec['verify_ms_per_round'])} | "
                             f"{_f(rec['speedup'], suffix='x')} | {delta} | {noise} | {thr} | {paired} | "
                             f"{_f(rec['projected_speedup'], suffix='x')} |")
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


def base_config(kind: str, plan: dict) -> dict:
    """The base drafter's training config (variant YAML + preset + the study's overrides)."""
    overrides = (plan.get("base_overrides") or {}).get(kind) or {}
    return load_config(kind, plan["preset"], int(plan["seed"]), overrides)


def loop_config(base_cfg: dict, drafter_dir, plan: dict, detach: bool, max_stages: int | None = None) -> dict:
    """The training config of the loop-aware fine-tune of the drafter in ``drafter_dir``.

    Same data (and so the same features, anchors and block size) as the base; the model is a
    :class:`~lit_domino.lit.loop.LoopModule` started from ``drafter_dir``; ``max_stages=1`` gives
    the no-loop control. The artifact-cache key covers all of it (including the base drafter's
    directory, itself named by the base config's hash).
    """
    cfg = copy.deepcopy(base_cfg)
    kind = base_cfg["tracking"]["variant"]
    base = dict(base_cfg["model"].get("init_args") or {})
    init = {k: base[k] for k in ("target", "block_size", "feature_layers", "gamma", "betas", "weight_decay",
                                 "min_lr_ratio") if k in base}
    # the base's method-specific loss settings that the fine-tune shares (Domino's GRU inputs, EAGLE-3's step
    # decay); λ is LoopModule's default, 0: the base finished its curriculum there
    init.update({k: base[k] for k in ("causal_inputs", "step_decay") if k in base})
    init.update(copy.deepcopy(plan.get("loop") or {}))
    init.update(init_from=str(drafter_dir), detach_stage_context=bool(detach), seed=int(plan["seed"]))
    if max_stages is not None:
        init["max_stages"], init["min_stages"] = int(max_stages), 1
    cfg["model"] = {"class_path": LOOP_CLASS, "init_args": init}
    if method_feature_rule(module_class(base_cfg)) != "dflash" and cfg["data"].get("feature_layers") is None:
        # the DataModule picks layers by the trained module's rule, and LoopModule's is the default (dflash): name
        # the base's own layers (DSpark's, EAGLE-3's) so its features are the ones it was trained on
        from lit_domino.models import read_config

        cfg["data"]["feature_layers"] = [int(j) for j in read_config(drafter_dir).feature_layers]
    trainer = {**(plan.get("loop_trainer") or {}), **((plan.get("loop_trainer_by_drafter") or {}).get(kind) or {})}
    for key, value in trainer.items():  # the preset's fine-tune length, then the drafter's own (DSpark's is dearer)
        set_dotted(cfg, f"trainer.{key}", value)
    suffix = "n1" if max_stages == 1 else ("detach" if detach else "grad")
    cfg["tracking"]["variant"] = f"{kind}_loop_{suffix}"
    cfg["tracking"]["table"] = "dloop"
    return cfg


# --------------------------------------------------------------------------- tables


def _mean(values) -> float:
    vals = [float(v) for v in values if finite(v)]
    return statistics.fmean(vals) if vals else float("nan")


def _f(x, digits=2, suffix="") -> str:
    return f"{x:.{digits}f}{suffix}" if finite(x) else "–"


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


def grid_table(rows: list[dict], names: dict, plan: dict) -> dict:
    """The threshold × depth grid: per drafter (plain / loop-trained) × (g, N), per domain τ, fwd/token, speedup."""
    idx = cell_index(rows)
    domains = list(plan["prompts"])
    records, lines = [], []
    header = ["drafter", "training", "g", "N"] + [f"{d} τ / fwd·tok⁻¹ / speedup" for d in domains] + ["avg speedup",
                                                                                         "avg stages/verif."]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in plan["drafters"]:
        for training, name in (("plain", names[kind]["plain"]), ("loop-aware", names[kind]["loop"])):
            for n in plan["stages"]:
                for g in (plan["thresholds"] if n > 1 else [None]):
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
                        cells.append(f"{_f(rec['tau'])} / {_f(rec['fwd_per_token'])} / {_f(rec['speedup'], suffix='x')}")
                    lines.append("| " + " | ".join([kind, training, "–" if g is None else f"{g:g}", str(n)] + cells
                                                    + [_f(_mean(speeds), suffix="x"), _f(_mean(loops))]) + " |")
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


def dloop_table(rows: list[dict], names: dict, plan: dict) -> dict:
    """Per gate (the table's gate first, then ``plan["gates"]``), each drafter × {plain, loop only, control
    fine-tune, control + loop, loop-aware training only, both} (the control rows where the plan fine-tunes one):
    τ and speedup per domain and on average, the Δ against the plain drafter, the paired Δ (prompt by prompt,
    ± 2 standard errors) against the plain drafter and against the control fine-tune (what the loop-aware rows owe
    to the loop rather than to more training), and the GPU projection of the average speedup (measured τ, stages
    and draft times; every round verified as fast as a one-stage round). A gate the drafter cannot use is a line
    with the reason."""
    idx = cell_index(rows)
    domains = list(plan["prompts"])
    table_label = dloop_label(DLoopConfig(**plan["table_dloop"]))
    cols = domains + ["avg"]
    header = (["drafter", "setting"] + [f"{d} τ" for d in cols] + [f"{d} speedup" for d in cols]
              + ["Δ speedup vs plain", "paired Δ vs plain (±2 SE)", "paired Δ vs control (±2 SE)",
                 "avg speedup, GPU projection", "projected Δ vs control"])
    all_rows, lines = [], []
    for cfg in gate_settings(plan):
        gate = dloop_label(cfg)
        lines += [f"### gate {gate}" + (" (the table's gate)" if gate == table_label else ""), "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for kind in plan["drafters"]:
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
                    row[f"avg/{key}"] = _mean(row[f"{d}/{key}"] for d in domains)
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
                cells = [kind, setting] + [_f(row[f"{d}/tau"]) for d in cols]
                cells += [_f(row[f"{d}/speedup"], suffix="x") for d in cols]
                cells += ["–" if setting == "plain" or row["delta_speedup_pct"] is None
                          else f"{row['delta_speedup_pct']:+.1f} %",
                          "–" if setting == "plain" else _pm(row["paired_vs_plain_pct"], row["paired_vs_plain_se"]),
                          _pm(row["paired_vs_control_pct"], row["paired_vs_control_se"]),
                          _f(row["avg/projected_speedup"], suffix="x"),
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


def loop_gain_table(dloop: dict, rows: list[dict], plan: dict) -> dict:
    """The loop's own gain per drafter, gate and domain: loop-aware training with the loop ("both") against the
    control fine-tune decoded plainly, measured (paired over the domain's prompts, ± 2 SE) and GPU-projected;
    drafters without a control fine-tune are compared with the plain drafter (said in the row)."""
    idx = cell_index(rows)
    domains = list(plan["prompts"])
    header = (["drafter", "gate", "against"] + [f"{d} Δ (±2 SE)" for d in domains + ["all prompts"]]
              + [f"{d} Δ, GPU projection" for d in domains + ["avg"]])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out = []
    by = {(r["gate"], r["drafter"], r["setting"]): r for r in dloop["gate_rows"]}
    for cfg in gate_settings(plan):
        gate = dloop_label(cfg)
        for kind in plan["drafters"]:
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


def detach_table(rows: list[dict], names: dict, reports: dict, plan: dict) -> dict:
    """``detach_stage_context`` on/off and the no-loop control: validation loss per stage, τ and speedup."""
    idx = cell_index(rows)
    domains = list(plan["prompts"])
    gate = dloop_label(DLoopConfig(**plan["table_dloop"]))
    n = int((plan.get("loop") or {}).get("max_stages", 3))
    header = ["drafter", "fine-tune", "val loss stage 1", f"val loss stage {n}", "avg τ (off)", f"avg τ ({gate})",
              "avg speedup (off)", f"avg speedup ({gate})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out = []
    for kind in plan["drafters"]:
        for variant, name in names[kind].items():
            if variant == "loop":
                continue  # listed under its own detach label
            rep = reports.get(name, {})
            rec = {"drafter": kind, "fine_tune": variant, "drafter_name": name,
                   "val_loss_stage1": rep.get("val/loss_stage1"), f"val_loss_stage{n}": rep.get(f"val/loss_stage{n}")}
            for label, key in (("off", "off"), (gate, "gate")):
                rec[f"tau_{key}"] = _mean((idx.get((name, label, d)) or {}).get("tau") for d in domains)
                rec[f"speedup_{key}"] = _mean((idx.get((name, label, d)) or {}).get("speedup") for d in domains)
            out.append(rec)
            lines.append("| " + " | ".join([kind, variant, _f(rec["val_loss_stage1"], 3),
                                             _f(rec[f"val_loss_stage{n}"], 3), _f(rec["tau_off"]),
                                             _f(rec["tau_gate"]), _f(rec["speedup_off"], suffix="x"),
                                             _f(rec["speedup_gate"], suffix="x")]) + " |")
    verdicts = []
    for kind in plan["drafters"]:
        recs = {r["fine_tune"]: r for r in out if r["drafter"] == kind}
        a, b = recs.get("loop detach"), recs.get("loop grad")
        if a and b and finite(a["tau_gate"]) and finite(b["tau_gate"]):
            better = "detach" if a["tau_gate"] > b["tau_gate"] else "gradient" if b["tau_gate"] > a["tau_gate"] else "tie"
            verdicts.append(f"{kind}: τ with the gate {_f(a['tau_gate'])} (detach) vs {_f(b['tau_gate'])} "
                            f"(gradient) → {better}")
    lines += [""] + [f"- {v}" for v in verdicts]
    return {"name": "detach", "rows": out, "verdicts": verdicts, "markdown": "\n".join(lines)}


def stage_confidence(record, gate: str) -> float:
    """A stage record ``[sum log q, last log q, K, accepted]`` -> the ``gate``'s confidence (``DLoopConfig``'s)."""
    total, last, k = float(record[0]), float(record[1]), int(record[2])
    return {"sum": total, "mean": total / k, "scaled": total * REFERENCE_STAGE_TOKENS / k, "last": last}[gate]


def calibration(rows: list[dict], names: dict, plan: dict, bins: int = 8) -> dict:
    """DLoop's calibration: per drafter and gate, the stages of the DLoop-off rows (stage 1 of every round: an
    unbiased sample) binned by the gate's confidence (quantile bins) against the fraction whose whole stage the
    target then accepted, and how often each gate would open at the table's threshold and at its own best one.

    -> ``{"records": [...], "markdown": ...}``; each record: drafter, training, gate, bins (mean confidence,
    P(whole stage accepted), stages), open_rate_at_table_g, n_stages."""
    idx = cell_index(rows)
    g_table = log_threshold(plan)
    out, lines = [], ["| drafter | training | gate | stages | P(whole stage accepted) | opens at g = "
                      f"{g_table:g} | P(accepted \| opens) | confidence range |", "|---|---|---|---|---|---|---|---|"]
    for kind in plan["drafters"]:
        for training, variant in (("plain", "plain"), ("loop-aware", "loop")):
            name = names[kind][variant]
            recs = [rec for d in plan["prompts"] for rec in (idx.get((name, "off", d)) or {}).get("stage_records", [])]
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
                        binned.append({"confidence": _mean(c for c, _ in sel),
                                       "accepted": _mean(float(a) for _, a in sel), "stages": len(sel)})
                opens = [a for c, a in pairs if c >= g_table]
                rec = {"drafter": kind, "training": training, "gate": gate, "n_stages": n, "bins": binned,
                       "whole_stage_rate": _mean(float(a) for _, a in pairs),
                       "open_rate_at_table_g": len(opens) / n, "accepted_when_open": _mean(float(a) for a in opens),
                       "min_confidence": pairs[0][0], "max_confidence": pairs[-1][0]}
                out.append(rec)
                lines.append(f"| {kind} | {training} | {gate} | {n} | {_f(rec['whole_stage_rate'])} | "
                             f"{_f(rec['open_rate_at_table_g'])} | {_f(rec['accepted_when_open'])} | "
                             f"{_f(rec['min_confidence'])} .. {_f(rec['max_confidence'])} |")
    lines += ["", "Stage 1 of every DLoop-off round; a stage is accepted when the target accepted all its tokens. "
              "A gate pays when it opens often and P(accepted | opens) is high."]
    return {"name": "calibration", "records": out, "markdown": "\n".join(lines)}


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
    return _mean(float(int(r[3]) == int(r[2])) for r in recs) if recs else float("nan")


def figure_gates(plan: dict) -> list[DLoopConfig]:
    """The gates of the gain-vs-acceptance figure: the table's gate and the block-size sweep's."""
    return list(dict.fromkeys([DLoopConfig(**plan["table_dloop"])] + [DLoopConfig(**g) for g in plan["sweep_gates"]]))


def gain_points(rows: list[dict], names: dict, plan: dict) -> dict:
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
        for kind in plan["drafters"]:
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
                     f"{_f(p['whole_stage_rate'], 3)} | {_f(p['stages_per_round'])} | {_f(p['tau_off'])} → "
                     f"{_f(p['tau_gate'])} | {_f(p['speedup_off'], suffix='x')} → {_f(p['speedup_gate'], suffix='x')} | "
                     f"{_f(p['gain_pct'], 1, ' %')} |")
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
    text = f"{fit['n']} points, gain ≈ {fit['a']:+.1f} {fit['b']:+.1f}·rate % (r = {_f(fit['r'])})"
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
                    label=f"fit, r = {_f(fit['r'])}" + ("" if fit["pays_from"] is None
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


# --------------------------------------------------------------------------- the study


def _log(msg: str, t0: float) -> None:
    print(f"[dloop {time.time() - t0:6.0f}s] {msg}", flush=True)


def train_all(plan: dict, t0: float, progress: bool = True) -> tuple[dict, dict, dict]:
    """Base drafters and their fine-tunes → (names, trained, reports): ``names[kind][variant]`` is the
    benchmark name of each drafter, ``trained[name]`` its TrainedDrafter."""
    names, trained = {}, {}
    experiment = f"dloop-{plan['preset']}"
    for i, kind in enumerate(plan["drafters"]):
        cfg = base_config(kind, plan)
        cached = cache.is_complete(drafter_artifact(cfg))
        _log(f"stage 2/4 [{i + 1}/{len(plan['drafters'])}] {kind}: base drafter{' (cached)' if cached else ''}", t0)
        base = train_variant(cfg, experiment=experiment, table="dloop", progress=progress)
        names[kind] = {"plain": f"{kind}/plain"}
        trained[f"{kind}/plain"] = base
        jobs = [(f"loop {'detach' if d else 'grad'}", d, None) for d in plan["detach_stage_context"]]
        if plan.get("control"):
            jobs.append(("control n1", plan["detach_stage_context"][0], 1))
        for j, (variant, detach, n) in enumerate(jobs):
            lcfg = loop_config(cfg, base.drafter_dir, plan, detach, max_stages=n)
            cached = cache.is_complete(drafter_artifact(lcfg))
            stages = n or lcfg["model"]["init_args"].get("max_stages")
            _log(f"stage 2/4 [{i + 1}/{len(plan['drafters'])}] {kind}: loop-aware fine-tune {variant} "
                 f"(up to {stages} stages){' (cached)' if cached else ''}", t0)
            name = f"{kind}/{variant.replace(' ', '-')}"
            trained[name] = train_variant(lcfg, experiment=experiment, table="dloop", progress=progress)
            names[kind][variant] = name
            if j == 0:
                names[kind]["loop"] = name
    reports = {name: t.report for name, t in trained.items()}
    return names, trained, reports


def skipped_row(name: str, label: str, why: str, block_size=None) -> dict:
    """A row saying a drafter did not decode with a gate (or block size), and why (kept with the cached rows)."""
    print(f"[dloop] {name}: {label} skipped: {why}", flush=True)
    return {"kind": "skipped", "drafter": name, "dloop": label, "block_size": block_size, "why": why}


def attach_needed(target, drafters: dict, dloops: dict, plan: dict) -> list[dict]:
    """Attach the cached (or newly built) acceptance predictor to every drafter whose gates read one
    (:func:`lit_domino.studies.acceptance.attach_predictors`: DSpark its own head, the others the add-on head);
    a drafter that gets none decodes without those gates (a skipped row each). Edits ``dloops`` in place."""
    need = {n: d for n, d in drafters.items() if any(c is not None and c.needs_predictor for c in dloops[n])}
    if not need:
        return []
    from lit_domino.studies.acceptance import attach_predictors

    # a plain drafter under its kind's name: the acceptance study's artifact (acceptance/<kind>-<preset>-<key>), so a
    # predictor it built is reused; the fine-tunes under their own names
    alias = {name: name.split("/")[0] if name.endswith("/plain") else name for name in need}
    built = attach_predictors(target, {alias[n]: d for n, d in need.items()}, plan["preset"])
    attached = {name for name, a in alias.items() if a in built}
    out = []
    for name in need:
        if name in attached:
            continue
        for cfg in [c for c in dloops[name] if c is not None and c.needs_predictor]:
            out.append(skipped_row(name, dloop_label(cfg), "no acceptance predictor could be attached to it"))
            dloops[name].remove(cfg)
    return out


def evaluate(target, trained: dict, names: dict, plan: dict, progress: bool = True) -> list[dict]:
    """Decode on the eval prompts: the plain, primary loop-trained and control drafters with every DLoop setting
    each can use (one interleaved benchmark), the other fine-tunes (the other detach setting) with DLoop off and the
    table's gate (a second benchmark with its own AR baseline), then the block-size sweep: each plain drafter at
    every ``plan["block_sizes"]`` below its trained one with DLoop off and the sweep's gates (a benchmark per
    block size, rows marked ``sweep``). A setting a drafter cannot use leaves a ``skipped`` row with the reason."""

    prompts = {name: load_benchmark(name, int(n)) for name, n in plan["prompts"].items()}
    kind_of = {name: kind for kind, variants in names.items() for name in variants.values()}
    # the control fine-tune decodes every setting beside the plain and loop-aware drafters (one interleaved
    # benchmark, one AR baseline): each table compares the loop with more training alone
    grid_names = [names[k][v] for k in plan["drafters"] for v in ("plain", "loop", CONTROL) if v in names[k]]
    extra_names = [n for n in trained if n not in grid_names]
    table = DLoopConfig(**plan["table_dloop"])
    sweep_cfgs = [None] + [DLoopConfig(**g) for g in plan["sweep_gates"]]
    rows, loaded = [], {}
    common = dict(max_new_tokens=int(plan["max_new_tokens"]), pool_sizes=[plan.get("pool_size")],  # Domino's kinds
                  repeats=plan.get("repeats", 1), hf_baseline=False, progress=progress, seed=int(plan["seed"]),
                  record_stages=True)
    with pinned_threads(plan.get("threads") or None):  # 1: tiny models, and far less timing jitter
        for group, settings_of in ((grid_names, lambda k: drafter_settings(plan, k)),
                                   (extra_names, lambda k: [c for c in (None, table) if unusable(c, k) is None])):
            if not group:
                continue
            drafters = {name: load_drafter(trained[name].drafter_dir, target=target) for name in group}
            loaded.update(drafters)
            dloops = {name: settings_of(kind_of[name]) for name in group}
            t = time.time()
            rows += attach_needed(target, drafters, dloops, plan)  # conf, cost, +trunc: each its predictor
            t = _timed(f"acceptance predictors of {len(group)} drafters", t)
            rows += benchmark(target, drafters, prompts, dloops=dloops, **common)
            _timed(f"decoded {sum(len(v) for v in dloops.values())} drafter settings", t)
        for bs in plan["block_sizes"]:
            drafters, dloops = {}, {}
            for kind in plan["drafters"]:
                name = names[kind]["plain"]
                drafter = loaded.get(name) or load_drafter(trained[name].drafter_dir, target=target)
                trained_bs = int(drafter.config.block_size)
                if bs == trained_bs:
                    continue  # decoded above
                if bs > trained_bs:
                    rows.append(skipped_row(name, "off", f"block size {bs} > its trained block size {trained_bs} "
                                            "(a drafter drafts at most its trained block; train one at "
                                            f"data.block_size {bs} through base_overrides)", bs))
                    continue
                usable = [c for c in sweep_cfgs if unusable(c, kind) is None]
                if not _has_predictor(drafter):  # the main decode attached none (its skipped row says why)
                    usable = [c for c in usable if c is None or not c.needs_predictor]
                drafters[name], dloops[name] = drafter, usable
            if drafters:
                t = time.time()
                rows += [dict(r, sweep=bs) for r in benchmark(target, drafters, prompts, dloops=dloops,
                                                              block_size=bs, **common)]
                _timed(f"decoded {sum(len(v) for v in dloops.values())} drafter settings at B = {bs}", t)
    return rows


def _timed(what: str, t: float) -> float:
    now = time.time()
    print(f"[dloop] {what} in {now - t:.0f} s", flush=True)
    return now


def _has_predictor(drafter) -> bool:
    from lit_domino.decoding.acceptance import predictor_of

    return predictor_of(drafter) is not None


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


def log_to_mlflow(plan: dict, tables: dict, files: list[Path]) -> str:
    """A ``tables-<preset>`` run in experiment ``dloop-<preset>``: every table cell as a metric, files as artifacts."""
    preset = plan["preset"]
    with mlflow_run(f"dloop-{preset}", f"tables-{preset}", tags={"table": "dloop", "preset": preset}) as run:
        mlflow.log_params({"thresholds": ",".join(f"{g:g}" for g in plan["thresholds"]),
                           "stages": ",".join(map(str, plan["stages"])), "drafters": ",".join(plan["drafters"]),
                           "table_dloop": dloop_label(DLoopConfig(**plan["table_dloop"])),
                           "pool_size": "full" if plan.get("pool_size") is None else plan["pool_size"],
                           "repeats": plan.get("repeats", 1),
                           "gates": ",".join(dloop_label(c) for c in gate_settings(plan)),
                           "block_sizes": ",".join(map(str, plan.get("block_sizes") or [])) or "trained",
                           "sweep_gates": ",".join(dloop_label(c) for c in figure_gates(plan))})
        log_metrics(open_client(), run.info.run_id, table_metrics(tables))
        for path in files:
            mlflow.log_artifact(str(path), "tables")
        return run.info.run_id


def run_dloop_study(preset: str = "smoke", drafters=None, thresholds=None, stages=None, table_dloop=None,
                    out_dir: Path | None = None, progress: bool = True, mlflow_enabled: bool = True,
                    block_sizes=None) -> dict:
    """The whole study → ``{"tables", "rows", "names", "plan", "seconds"}`` (see the module docstring)."""

    t0 = time.time()
    plan = study_plan(preset, drafters, thresholds, stages, table_dloop, block_sizes=block_sizes)
    out_dir = Path(out_dir or project_root() / "results" / "dloop")
    out_dir.mkdir(parents=True, exist_ok=True)
    target_spec = base_config(plan["drafters"][0], plan)["data"]["target"]
    _log(f"preset {preset}: drafters {plan['drafters']}, g {plan['thresholds']}, N {plan['stages']}, "
         f"table gate {dloop_label(DLoopConfig(**plan['table_dloop']))}, gates "
         f"{[dloop_label(c) for c in gate_settings(plan)]}, block-size sweep {plan['block_sizes'] or 'none'} with "
         f"{[dloop_label(c) for c in figure_gates(plan)]}", t0)
    for s in plan["skipped"]:
        _log(f"{s['drafter']}: gate {s['gate']} skipped: {s['why']}", t0)
    _log(f"stage 1/4 target {target_spec}", t0)
    target = load_target(target_spec)
    names, trained, reports = train_all(plan, t0, progress)

    eval_plan = {k: plan.get(k) for k in ("prompts", "max_new_tokens", "thresholds", "stages", "table_dloop", "gates",
                                          "pool_size", "repeats", "seed", "threads", "block_sizes", "sweep_gates",
                                          "control")}
    eval_key = {"drafters": {n: str(t.drafter_dir) for n, t in trained.items()}, "plan": eval_plan,
                "target": target.fingerprint()}  # everything evaluate() decodes by
    if any(c.needs_predictor for c in gate_settings(plan) + figure_gates(plan)):  # and the predictors they read
        from lit_domino.studies.acceptance import predictor_settings

        eval_key["predictors"] = predictor_settings(preset)

    def decode() -> list[dict]:
        n_grid = sum(1 for k in plan["drafters"] for v in ("plain", "loop", CONTROL) if v in names[k])
        _log(f"stage 3/4 decode {n_grid} drafters x up to {len(dloop_settings(plan))} DLoop settings, "
             f"{len(trained) - n_grid} more x 2 (off, table gate), on {plan['prompts']} x {plan['repeats']} repeats, "
             f"then the plain drafters at B = {plan['block_sizes'] or 'their trained'}", t0)
        rows = evaluate(target, trained, names, plan, progress)
        check_lossless(rows, out_dir / f"rows-{preset}-not-lossless.json", "DLoop study")  # before the rows are cached
        return rows

    rows = cached_rows(eval_key, f"dloop-{preset}", decode,
                       on_reuse=lambda: _log("stage 3/4 decode: nothing changed, reusing the measured rows", t0))
    check_lossless(rows, out_dir / f"rows-{preset}-not-lossless.json", "DLoop study")

    _log("stage 4/4 tables", t0)
    tables = {"grid": grid_table(rows, names, plan), "dloop": dloop_table(rows, names, plan),
              "detach": detach_table(rows, names, reports, plan), "calibration": calibration(rows, names, plan),
              "gates": gates_table(rows, names, plan), "gain": gain_points(rows, names, plan)}
    tables["loop_gain"] = loop_gain_table(tables["dloop"], rows, plan)
    files = []
    for name, table in tables.items():
        md = out_dir / f"{name}-{preset}.md"
        md.write_text(table["markdown"] + "\n")
        js = out_dir / f"{name}-{preset}.json"
        write_json({k: v for k, v in table.items() if k != "markdown"}, js)
        files += [md, js]
    plot = calibration_plot(tables["calibration"], out_dir / f"calibration-{preset}.png", log_threshold(plan))
    files += [plot] if plot else []
    figure = gain_plot(tables["gain"], out_dir / f"gain-vs-acceptance-{preset}.png")
    files += [figure] if figure else []
    seconds = time.time() - t0
    skipped = plan["skipped"] + [r for r in rows if r.get("kind") == "skipped"]
    summary = {"preset": preset, "seconds": round(seconds, 1), "plan": plan, "names": names,
               "training": reports, "skipped": skipped, "lossless": True}
    write_json(summary, out_dir / f"summary-{preset}.json")
    write_json(rows, out_dir / f"rows-{preset}.json")
    files += [out_dir / f"summary-{preset}.json"]
    run_id = log_to_mlflow(plan, tables, files) if mlflow_enabled else None

    pool = "the exact head" if plan.get("pool_size") is None else f"a {plan['pool_size']}-token candidate pool"
    print(f"\n## DLoop table ({preset}; Domino decoded with {pool}; speedup = our AR time per token / speculative, "
          "prefill excluded)\n")
    print(tables["dloop"]["markdown"])
    print(f"\n## The loop's own gain: loop-aware training + loop against the control fine-tune ({preset})\n")
    print(tables["loop_gain"]["markdown"])
    print(f"\n## detach_stage_context and the no-loop control ({preset})\n")
    print(tables["detach"]["markdown"])
    print(f"\n## Threshold x depth grid ({preset})\n")
    print(tables["grid"]["markdown"])
    print(f"\n## Gates ({preset}; sum = the papers' reference; draft/verify ms per round: what a gate costs)\n")
    print(tables["gates"]["markdown"])
    print(f"\n## Gate calibration ({preset}; plot: {plot})\n")
    print(tables["calibration"]["markdown"])
    print(f"\n## DLoop's gain against the whole-stage acceptance rate ({preset}; figure: {figure})\n")
    print(tables["gain"]["markdown"])
    if skipped:
        print(f"\nskipped ({len(skipped)}): " + "; ".join(f"{s['drafter']} {s.get('gate') or s.get('dloop')}"
                                                         + (f" B = {s['block_size']}" if s.get("block_size") else "")
                                                         + f": {s['why']}" for s in skipped))
    print("\nevery row lossless (token identity with the AR baseline at T = 0)")
    where = f"; MLflow experiment dloop-{preset} at {default_tracking_uri()}" if run_id else ""
    print(f"\nwritten to {out_dir}{where}")
    _log(f"done in {seconds / 60:.1f} min", t0)
    return {"tables": tables, "rows": rows, "names": names, "plan": plan, "seconds": seconds, "run_id": run_id}
