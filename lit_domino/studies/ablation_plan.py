"""The ablation study's plan: its study file's preset section read and checked once into :class:`AblationPlan`
(YAML only: no torch, so the command refuses bad input quickly)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lit_domino.studies.skeleton import plan_dict, read_study_file, section_fields
from lit_domino.studies.tables import EXACT_HEAD, STUDY_FILE
from lit_domino.training.configs import ConfigError, did_you_mean


@dataclass(frozen=True)
class AblationPlan:
    """What the ablation trains and decodes under one preset (``configs/studies/ablation.yaml``)."""

    seeds: list[int]
    """The seeds every variant is trained with (the tables report mean ± spread over them)."""
    prompts: dict[str, int]
    """Prompts decoded per benchmark, in the tables' column order."""
    max_new_tokens: int
    """Tokens generated per prompt."""
    variants: list[str] = field(default_factory=list)
    """The variants trained and decoded (the study file's, or the subset asked for)."""
    tables: dict[str, list[str]] = field(default_factory=dict)
    """The study file's table membership ``{"main": [...], "ablations": [...]}`` (the main table's rows in order),
    whatever subset runs."""
    inner_backbone: list[str] = field(default_factory=list)
    """Domino variants whose inner backbone is decoded alone too (those an ablation row reports)."""
    pool_size: int | None = None
    """Domino's candidate pool K at decode (None: the exact full-vocabulary head)."""
    exact_head: list[str] = field(default_factory=list)
    """Variants also decoded with the exact head (an ablation row names them ``<variant>@full``)."""
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    """Sampling temperatures decoded (0: greedy, where lossless means token identity)."""
    peers: list[str] = field(default_factory=list)
    """Hugging Face peers decoded beside the drafters (``prompt_lookup``, ``assisted``)."""
    compiled_baseline: bool = False
    """Whether the compiled plain decoder is timed too (a second speedup column)."""
    threads: int | None = None
    """CPU threads the decode is pinned to (None: torch's default)."""
    benchmark_files: dict[str, str] | None = None
    """``{benchmark: local copy in the hub schema}`` (paths relative to the checkout) read instead of the hub."""
    reference_seconds: dict[str, Any] | None = None
    """Each stage's time on a reference machine: the job clock's ETA (not part of the rows' key)."""
    overrides: dict[str, Any] | None = None
    """The ``--set`` dotted training-config keys (None: none); they change the drafters' cache keys."""
    given: tuple[str, ...] = ()
    """The preset section's keys in the file's order: :meth:`as_dict` lists them first, then :data:`ALWAYS`."""

    ALWAYS = ("variants", "seeds", "tables", "inner_backbone", "pool_size", "exact_head")

    def as_dict(self) -> dict[str, Any]:
        """The plan as the study has always written it (``overrides`` only when there are some)."""
        out = plan_dict(self, self.ALWAYS)
        if self.overrides:
            out["overrides"] = self.overrides
        return out

    def key_fields(self) -> dict[str, Any]:
        """The plan's part of the rows' cache key: everything but the table membership and the reference times."""
        return {k: v for k, v in self.as_dict().items() if k not in ("tables", "reference_seconds")}


def study_file_plan(preset: str, variants: list[str] | None = None) -> tuple[dict, dict, list[str]]:
    """The study file, the table membership and the variants to run; :class:`ConfigError` (one line on the
    command line) for a preset or a variant that the study does not have. YAML only: no heavy import."""
    study = read_study_file(STUDY_FILE, preset, "ablation study", ConfigError)
    tables = {name: list(study["variants"][name]) for name in ("main", "ablations")}
    known = tables["main"] + tables["ablations"]
    unknown = [v for v in variants or () if v not in known]
    if unknown:
        raise ConfigError("unknown variants " + ", ".join(f"{v!r}{did_you_mean(v, known)}" for v in unknown)
                          + f"; the study has {', '.join(known)}")
    return study, tables, list(variants or known)


def study_plan(preset: str, variants: list[str] | None = None, seeds: list[int] | None = None,
               overrides: dict | None = None) -> AblationPlan:
    """Variants, seeds and evaluation settings of the ablation under ``preset``, every check before any training."""
    from lit_domino.models.sessions import check_pool_size

    study, tables, chosen = study_file_plan(preset, variants)
    section = section_fields(AblationPlan, study["presets"][preset], f"{STUDY_FILE.name}: presets.{preset}",
                             ConfigError, fixed=("variants", "tables", "inner_backbone", "exact_head", "overrides"))
    plan = AblationPlan(**section)
    # Domino variants whose inner backbone is decoded alone too: only those an ablation row reports
    # (``inner_backbone: true``), each extra row costs a full decode of every prompt
    inner = sorted({v for ab in study.get("ablations") or () if ab.get("inner_backbone")
                    for v in (ab["from"], ab["to"]) if v in chosen})
    # Domino's candidate pool K at decode (None: the exact full-vocabulary head), checked here, before any
    # training; the variants an ablation row names as ``<variant>@full`` are decoded with the exact head too
    try:
        check_pool_size(plan.pool_size, None)  # V is checked once the target is loaded
    except ValueError:
        raise ValueError(f"{STUDY_FILE}: presets.{preset}.pool_size must be null (the full vocabulary) or an "
                         f"integer >= 1, got {plan.pool_size!r}") from None
    named = {v for ab in study.get("ablations") or () for v in (ab["from"], ab["to"])}
    exact = [] if plan.pool_size is None else sorted(v for v in chosen if f"{v}{EXACT_HEAD}" in named)
    return dataclasses.replace(plan, variants=chosen, seeds=[int(s) for s in (seeds if seeds else plan.seeds)],
                               tables=tables, inner_backbone=inner, exact_head=exact,
                               overrides=dict(overrides) if overrides else None)
