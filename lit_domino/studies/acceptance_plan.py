"""The acceptance study's plan: its study file (``configs/studies/acceptance.yaml``) and the command line read and
checked once into :class:`AcceptancePlan`, every check before any model loads (:mod:`lit_domino.studies.acceptance`
runs it; the DLoop study builds its predictor gates' predictors from the same plan)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lit_domino.decoding.acceptance import LABELS
from lit_domino.studies.skeleton import count, read_study_file, section_fields
from lit_domino.studies.tables import STUDY_FILE as ABLATION_FILE
from lit_domino.studies.tables import decode_pool_size
from lit_domino.training.acceptance_settings import AcceptanceSettings
from lit_domino.training.config_keys import module_class
from lit_domino.training.configs import CONFIG_DIR, ConfigError, available_variants, compose

STUDY_FILE = CONFIG_DIR / "studies" / "acceptance.yaml"
SETTINGS = ("max_new_tokens", "anchors_per_sequence", "stages")
"""The plan's fields that are the predictors' :class:`AcceptanceSettings` fields (the rest of those: their defaults,
the drafter's pool, the label and each predictor variant's own)."""


@dataclass(frozen=True)
class AcceptancePlan:
    """What the acceptance study builds under one preset: which drafters' predictors, on which prompts, made how."""

    prompts: int
    """Prompts per domain the predictors' rounds are collected on (split into head training, calibration and test)."""
    max_new_tokens: int
    """Tokens of the target's own continuation of each prompt (:attr:`AcceptanceSettings.max_new_tokens`)."""
    anchors_per_sequence: int
    """Rounds collected per sequence (:attr:`AcceptanceSettings.anchors_per_sequence`)."""
    stages: int
    """Stages drafted per collected round (:attr:`AcceptanceSettings.stages`: positions 1..stages·K calibrated)."""
    preset: str = ""
    """The training preset the ablation's base drafters and the target come from (the config files' ``presets``)."""
    drafters: tuple[str, ...] = ()
    """The drafters (variant names) whose predictors are built, each one that keeps block hidden states (the study
    file's list, or the subset asked for)."""
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    """The drafters asked for that keep no block hidden states (they draft token by token), each with the note
    printed for it; never trained."""
    domains: tuple[str, ...] = ()
    """The benchmarks the prompts come from (the study file's ``domains``), in order."""
    skip: int = 0
    """Each benchmark's first items left out: the DLoop study's and the ablation's eval prompts (disjoint data)."""
    pool_size: int | None = None
    """The candidate pool a drafter with one (Domino, DSpark) drafts the rounds with, as it decodes in the studies:
    the ablation's (``studies/ablation.yaml``; None: the exact head)."""
    label: str | None = None
    """The heads' training label (:data:`~lit_domino.decoding.acceptance.LABELS`); None: ``hard`` for the greedy
    rounds the study collects (:attr:`AcceptanceSettings.label`)."""
    threads: int | None = 1
    """CPU threads the builds are pinned to (None: torch's default)."""
    given: tuple[str, ...] = ()
    """The preset section's keys in the file's order (:func:`~lit_domino.studies.skeleton.section_fields`)."""

    def settings(self, pool_size: int | None = None, **fields) -> AcceptanceSettings:
        """The :class:`AcceptanceSettings` of a predictor the plan builds: the plan's label and :data:`SETTINGS`,
        the drafter's decode pool ``pool_size`` and a predictor variant's own ``fields`` (``inputs``, ``own_head``)."""
        return AcceptanceSettings(label=self.label, **{k: getattr(self, k) for k in SETTINGS}, pool_size=pool_size,
                                  **fields)

    def pool_of(self, drafter) -> int | None:
        """The pool ``drafter`` drafts the rounds with: :attr:`pool_size` where it has a candidate pool, else None."""
        return self.pool_size if "pool_size" in drafter.draft_options else None

    def predictor_settings(self) -> dict[str, Any]:
        """What every predictor the plan builds is made by: the prompts per domain and every
        :class:`AcceptanceSettings` field but the drafter's own pool (part of the DLoop study's decoded rows' key,
        so that rows decoded with other predictors are not reused)."""
        return {"prompts": self.prompts, **asdict(self.settings())}


def keeps_block_hidden(variant: str) -> bool:
    """Whether the drafter a variant trains keeps each stage's block hidden states (what a predictor reads)."""
    return bool(module_class(compose(variant)).drafter_class.keeps_block_hidden)


def study_plan(preset: str, drafters=None, label: str | None = None, study_file: Path = STUDY_FILE) -> AcceptancePlan:
    """The acceptance study under ``preset`` (``drafters`` and ``label`` override the study file); every check
    before any model loads, each failure one line (:class:`ConfigError`)."""
    study = read_study_file(study_file, preset, "acceptance study", ConfigError)
    if label not in (None, *LABELS):
        raise ConfigError(f"label must be one of {', '.join(LABELS)} (None: hard, as the rounds are greedy), "
                          f"got {label!r}")
    where = f"{Path(study_file).name}: presets.{preset}"
    fields = section_fields(AcceptancePlan, study["presets"][preset], where, ConfigError,
                            fixed=("preset", "drafters", "skipped", "domains", "skip", "pool_size", "label"))
    missing = [k for k in ("prompts", *SETTINGS) if k not in fields]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    for name in ("prompts", *SETTINGS):
        count(fields[name], f"{where}.{name}", error=ConfigError)
    threads = fields.get("threads", 1)
    if threads is not None:
        count(threads, f"{where}.threads", error=ConfigError)
    names = list(drafters if drafters is not None else study["drafters"])
    unknown = [d for d in names if d not in available_variants()]
    if unknown or not names:
        raise ConfigError(f"drafters: unknown {unknown or 'none given'}; choose from {available_variants()}")
    skipped = {d: f"{d}: drafts token by token, no acceptance predictor" for d in names if not keeps_block_hidden(d)}
    kept = tuple(d for d in names if d not in skipped)
    if not kept:
        raise ConfigError(f"drafters {names}: none keeps block hidden states (the study needs a parallel drafter)")
    from lit_domino.data.benchmarks import BENCHMARKS  # imports datasets: only once the cheap checks pass

    domains = tuple(study.get("domains") or ())
    bad = [d for d in domains if d not in BENCHMARKS]
    if bad or not domains:
        raise ConfigError(f"{Path(study_file).name}: domains: unknown {bad or 'none given'}; choose from "
                          f"{', '.join(BENCHMARKS)}")
    pool = decode_pool_size(preset)
    if pool is not None:
        count(pool, f"{ABLATION_FILE.name}: presets.{preset}.pool_size", error=ConfigError)
    plan = AcceptancePlan(**fields, preset=preset, drafters=kept, skipped=skipped, domains=domains,
                          skip=count(study.get("skip", 0), f"{Path(study_file).name}: skip", 0, ConfigError),
                          pool_size=pool, label=label)
    try:  # the settings' own checks (the label, ...), before any model loads
        plan.settings()
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return plan
