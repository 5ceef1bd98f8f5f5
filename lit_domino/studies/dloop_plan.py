"""The DLoop study's plan: the study file read and checked once (drafters, gates, grid, block sizes, the
loop-aware fine-tunes' configs), and the settings each drafter is decoded with (:mod:`lit_domino.studies.dloop`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from lit_domino.decoding.dloop import GATES, DLoopConfig, check_grid, check_table_gate, dloop_label
from lit_domino.decoding.harness import check_repeats
from lit_domino.models.sessions import check_pool_size
from lit_domino.studies.skeleton import plan_dict, read_study_file, section_fields
from lit_domino.studies.tables import decode_pool_size
from lit_domino.training.configs import (CONFIG_DIR, available_variants, compose, load_config,
                                         method_feature_rule, module_class, set_dotted)


STUDY_FILE = CONFIG_DIR / "loop" / "study.yaml"
LOOP_CLASS = "lit_domino.lit.loop.LoopModule"



def table_gate(cfg: DLoopConfig) -> dict:
    """The DLoop table's gate as the plan holds it: threshold and max_stages, plus ``gate`` unless it is the papers'
    ``sum`` (so a plan with the default gate keeps the cache key of its decoded rows)."""
    out = {"threshold": None if cfg.threshold is None else float(cfg.threshold), "max_stages": int(cfg.max_stages)}
    if cfg.gate != "sum":
        out["gate"] = cfg.gate
    if cfg.truncate is not None:
        out["truncate"] = float(cfg.truncate)
    return out


def log_threshold(plan: DLoopPlan) -> float:
    """The table gate's g where it is a log gate, else the papers' -0.5: the log gates' calibration table reads it."""
    td = plan.table_dloop
    return float(td["threshold"]) if td.get("gate", "sum") in GATES else -0.5


def loop_trainable(variant: str) -> bool:
    """Whether ``variant`` (a config name) trains a drafter whose method supports DLoop's loop-aware training."""
    if variant not in available_variants():
        return False
    return module_class(compose(variant)).drafter_class.supports_loop_training


PRESET_OVERRIDES = ("thresholds", "stages", "table_dloop", "gates", "block_sizes", "sweep_gates")
"""Study-file keys a preset section may set for itself (the top-level value otherwise; a CLI value beats both)."""


@dataclass(frozen=True)
class DLoopPlan:
    """What the DLoop study trains and decodes under one preset (``configs/loop/study.yaml``)."""

    seed: int
    """The seed of every training (base drafters and fine-tunes) and of the decode."""
    prompts: dict[str, int]
    """Embedded eval prompts decoded per domain, in the tables' order."""
    max_new_tokens: int
    """Tokens generated per prompt."""
    preset: str = ""
    """The training preset (the config files' ``presets`` section)."""
    drafters: list[str] = field(default_factory=list)
    """The base drafters (variant names), each loop-trainable."""
    thresholds: list[float] = field(default_factory=list)
    """The grid's gate thresholds g."""
    stages: list[int] = field(default_factory=list)
    """The grid's depths N (N = 1: DLoop off)."""
    table_dloop: dict[str, Any] = field(default_factory=dict)
    """The DLoop table's gate (:func:`table_gate`'s dict)."""
    detach_stage_context: list[bool] = field(default_factory=lambda: [True])
    """The loop-aware fine-tunes' ``detach_stage_context`` settings (the first is the primary fine-tune)."""
    pool_size: int | None = None
    """Domino's candidate pool at decode: the ablation's (None: the exact head)."""
    repeats: int = 1
    """Decodes of every prompt per setting (the timings' mean)."""
    gates: list[dict[str, Any]] = field(default_factory=list)
    """The other gates decoded (gate table), as :func:`table_gate` dicts."""
    sweep_gates: list[dict[str, Any]] = field(default_factory=list)
    """The gates of the block-size sweep (the table's gate by default)."""
    block_sizes: list[int] = field(default_factory=list)
    """The block-size sweep's B (each plain drafter decoded below its trained block size)."""
    skipped: list[dict[str, str]] = field(default_factory=list)
    """``{"drafter", "gate", "why"}`` of every gate a drafter cannot use (planned, printed, in the tables)."""
    threads: int | None = None
    """CPU threads the decode is pinned to (None: torch's default)."""
    base_overrides: dict[str, dict] | None = None
    """Per drafter, dotted training-config keys of its base drafter."""
    loop: dict[str, Any] | None = None
    """``LoopModule`` settings of the loop-aware fine-tunes (stages, lr, warmup)."""
    loop_trainer: dict[str, Any] | None = None
    """Trainer settings of every fine-tune (its length)."""
    loop_trainer_by_drafter: dict[str, dict] | None = None
    """Per drafter, trainer settings over ``loop_trainer`` (a dearer drafter's shorter fine-tune)."""
    control: bool | None = None
    """Whether the ``max_stages = 1`` control fine-tune is trained and decoded."""
    given: tuple[str, ...] = ()
    """The preset section's keys in the file's order: :meth:`as_dict` lists them first, then :data:`ALWAYS`."""

    ALWAYS = ("preset", "drafters", "thresholds", "stages", "table_dloop", "detach_stage_context", "pool_size",
              "repeats", "gates", "sweep_gates", "block_sizes", "skipped")
    KEY = ("prompts", "max_new_tokens", "thresholds", "stages", "table_dloop", "gates", "pool_size", "repeats",
           "seed", "threads", "block_sizes", "sweep_gates", "control")
    """The settings the decoded rows' cache key names."""

    def as_dict(self) -> dict[str, Any]:
        """The plan as the study has always written it (``summary-<preset>.json``)."""
        return plan_dict(self, self.ALWAYS)

    def key_fields(self) -> dict[str, Any]:
        """The plan's part of the decoded rows' cache key (a setting the preset leaves out: None)."""
        return {k: getattr(self, k) for k in self.KEY}


def study_plan(preset: str, drafters=None, thresholds=None, stages=None, table_dloop=None,
               study_file: Path = STUDY_FILE, gates=None, block_sizes=None) -> DLoopPlan:
    """The merged study settings of ``preset`` (CLI values override the preset's, which override the file's)."""
    study = read_study_file(study_file, preset, "DLoop study")
    section = study["presets"][preset]
    if "pool_size" in section:
        raise ValueError(f"presets.{preset}.pool_size: the DLoop study decodes with the ablation's pool "
                         "(studies/ablation.yaml); set it there")
    fields = section_fields(DLoopPlan, section, f"{Path(study_file).name}: presets.{preset}",
                            fixed=("preset", "drafters", "pool_size", "skipped"))

    def setting(key, cli):
        return cli if cli is not None else fields.get(key, study.get(key))

    fields["preset"] = preset
    fields["drafters"] = list(drafters or study["drafters"])
    bad = [d for d in fields["drafters"] if not loop_trainable(d)]
    if bad:
        raise ValueError(f"drafters {bad} cannot be loop-trained; DLoop's loop-aware training covers the variants "
                         f"whose method supports it: {[v for v in available_variants() if loop_trainable(v)]}")
    fields["thresholds"] = [float(g) for g in setting("thresholds", thresholds)]
    fields["stages"] = [int(n) for n in setting("stages", stages)]
    check_grid(fields["thresholds"], fields["stages"])
    td = fields["table_dloop"] = gate_setting(setting("table_dloop", table_dloop), "the DLoop table's gate")
    check_table_gate(td["threshold"], td["max_stages"], td.get("gate", "sum"), td.get("truncate"))
    fields["detach_stage_context"] = [bool(x) for x in fields.get("detach_stage_context", [True])]
    unknown = sorted(set(fields.get("loop_trainer_by_drafter") or {}) - set(available_variants()))
    if unknown:
        raise ValueError(f"presets.{preset}.loop_trainer_by_drafter names {unknown}, which are no drafter variants")
    fields["pool_size"] = check_pool_size(decode_pool_size(preset), None)  # V is checked against the target later
    fields["repeats"] = check_repeats(fields.get("repeats", 1))
    # a gate that can never open (g > 0) or an unknown gate: refused before any training
    fields["gates"] = [gate_setting(g, "a DLoop gate setting") for g in (setting("gates", gates) or [])]
    fields["sweep_gates"] = [gate_setting(g, "a block-size sweep gate") for g in
                             (fields.get("sweep_gates") or [td])]
    fields["block_sizes"] = [check_block_size(b) for b in (setting("block_sizes", block_sizes) or [])]
    plan = DLoopPlan(**fields)
    plan = dataclasses.replace(plan, skipped=[
        {"drafter": kind, "gate": dloop_label(cfg), "why": why} for kind in plan.drafters
        for cfg in dloop_settings(plan) if (why := unusable(cfg, kind))])
    for cfg in (DLoopConfig(**plan.table_dloop),):  # the table's loop rows need one drafter that can use it
        if all(unusable(cfg, kind) for kind in plan.drafters):
            raise ValueError(f"no drafter of {plan.drafters} can use the DLoop table's gate {dloop_label(cfg)}: "
                             f"{unusable(cfg, plan.drafters[0])}; add a parallel drafter or use a log gate")
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
    from lit_domino.models.parallel_session import ParallelSession

    cls = module_class(compose(variant)).drafter_class.session_class
    return isinstance(cls, type) and issubclass(cls, ParallelSession)


def unusable(cfg: DLoopConfig | None, kind: str) -> str | None:
    """Why drafter ``kind`` cannot decode with ``cfg`` (skipped, the reason printed), or None when it can."""
    if cfg is not None and cfg.needs_predictor and not parallel_variant(kind):
        return (f"the gate {dloop_label(cfg)} reads an acceptance predictor (calibrated stage survival), which "
                f"parallel drafters have; {kind} drafts token by token")
    return None


def dloop_settings(plan: DLoopPlan) -> list:
    """The DLoop configurations decoded: off, the grid's (g, N > 1), the table's gate, the other gates and the
    block-size sweep's gates."""
    out = [None]
    for n in plan.stages:
        for g in plan.thresholds:
            if n > 1:
                out.append(DLoopConfig(threshold=g, max_stages=n))
    for spec in [plan.table_dloop] + list(plan.gates) + list(plan.sweep_gates):
        cfg = DLoopConfig(**spec)
        if cfg not in out:
            out.append(cfg)
    return out


def drafter_settings(plan: DLoopPlan, kind: str) -> list:
    """The DLoop configurations drafter ``kind`` decodes (those it can use)."""
    return [cfg for cfg in dloop_settings(plan) if unusable(cfg, kind) is None]


def gate_settings(plan: DLoopPlan) -> list[DLoopConfig]:
    """The gates of the gate table and of the DLoop table: the table's gate first, then ``plan.gates``."""
    return list(dict.fromkeys([DLoopConfig(**plan.table_dloop)] + [DLoopConfig(**g) for g in plan.gates]))


def skip_reason(rows: list[dict], plan: DLoopPlan, kind: str, name: str, label: str) -> str | None:
    """Why drafter ``kind`` (decoded as ``name``) has no rows with gate ``label``: the plan's reason, or the one
    recorded while decoding (a drafter no predictor could be built for)."""
    for s in plan.skipped:
        if s["drafter"] == kind and s["gate"] == label:
            return s["why"]
    for r in rows:
        if r.get("kind") == "skipped" and r.get("drafter") == name and r.get("dloop") == label:
            return r["why"]
    return None


def base_config(kind: str, plan: DLoopPlan) -> dict:
    """The base drafter's training config (variant YAML + preset + the study's overrides)."""
    overrides = (plan.base_overrides or {}).get(kind) or {}
    return load_config(kind, plan.preset, int(plan.seed), overrides)


def loop_config(base_cfg: dict, drafter_dir, plan: DLoopPlan, detach: bool, max_stages: int | None = None) -> dict:
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
    init.update(copy.deepcopy(plan.loop or {}))
    init.update(init_from=str(drafter_dir), detach_stage_context=bool(detach), seed=int(plan.seed))
    if max_stages is not None:
        init["max_stages"], init["min_stages"] = int(max_stages), 1
    cfg["model"] = {"class_path": LOOP_CLASS, "init_args": init}
    if method_feature_rule(module_class(base_cfg)) != "dflash" and cfg["data"].get("feature_layers") is None:
        # the DataModule picks layers by the trained module's rule, and LoopModule's is the default (dflash): name
        # the base's own layers (DSpark's, EAGLE-3's) so its features are the ones it was trained on
        from lit_domino.models import read_config

        cfg["data"]["feature_layers"] = [int(j) for j in read_config(drafter_dir).feature_layers]
    trainer = {**(plan.loop_trainer or {}), **((plan.loop_trainer_by_drafter or {}).get(kind) or {})}
    for key, value in trainer.items():  # the preset's fine-tune length, then the drafter's own (DSpark's is dearer)
        set_dotted(cfg, f"trainer.{key}", value)
    suffix = "n1" if max_stages == 1 else ("detach" if detach else "grad")
    cfg["tracking"]["variant"] = f"{kind}_loop_{suffix}"
    cfg["tracking"]["table"] = "dloop"
    return cfg
