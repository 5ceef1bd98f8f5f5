"""The tree study's plan: its study file (``configs/studies/trees.yaml``) read and checked once into
:class:`TreesPlan`, every check before any training (:mod:`lit_domino.studies.trees` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_domino.decoding.harness import check_repeats
from lit_domino.models.sessions import check_pool_size
from lit_domino.studies.skeleton import count, plan_dict, read_study_file, section_fields
from lit_domino.studies.tables import decode_pool_size
from lit_domino.training.configs import CONFIG_DIR, available_variants, compose, module_class

STUDY_FILE = CONFIG_DIR / "studies" / "trees.yaml"
TREE_BUILDERS = ("ddtree", "path", "eagle")
"""The builders the study compares with the chain (``chain``, the tree of one node per depth, is the tree-off row)."""


@dataclass(frozen=True)
class TreesPlan:
    """What the tree study trains and decodes under one preset."""

    prompts: dict[str, int]
    """Prompts decoded per domain, in the tables' order."""
    max_new_tokens: int
    """Tokens generated per prompt."""
    preset: str = ""
    """The training preset the ablation's drafters are trained with (the config files' ``presets`` section)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """The drafters asked for that have no tree builder, each with the note printed for it."""
    drafters: list[str] = field(default_factory=list)
    """The drafters decoded (those with a tree builder)."""
    builders: dict[str, list[str]] = field(default_factory=dict)
    """Per drafter, the tree builders it decodes (the chain, tree off, is always decoded)."""
    budgets: list[int] = field(default_factory=list)
    """Tree budgets (nodes per round), ascending."""
    cost_aware: bool = True
    """Whether each builder also decodes the cost-aware tree (on the measured verify-cost curve, up to ``cost_cap``
    nodes)."""
    cost_cap: int = 0
    """The cost-aware tree's node cap."""
    top_k: int = 4
    """Candidates per node the builders branch over."""
    repeats: int = 1
    """Decodes of every prompt per method (the timings' mean)."""
    pool_size: int | None = None
    """Domino's candidate pool at decode: the ablation's (None: the exact head)."""
    seed: int = 0
    """The drafters' training seed (the ablation's drafters of that seed) and the decode's."""
    curve_repeats: int = 3
    """Timings per width of the verify-cost curve."""
    threads: int | None = None
    """CPU threads the decode is pinned to (None: torch's default)."""
    given: tuple[str, ...] = ()
    """The preset section's keys in the file's order: :meth:`as_dict` lists them first, then :data:`ALWAYS`."""

    ALWAYS = ("preset", "skipped", "drafters", "builders", "budgets", "cost_aware", "cost_cap", "top_k",
              "max_new_tokens", "repeats", "pool_size", "seed", "curve_repeats")
    KEY = ("prompts", "max_new_tokens", "builders", "budgets", "cost_aware", "cost_cap", "top_k", "repeats",
           "pool_size", "seed", "threads", "curve_repeats")
    """The settings the decoded rows' cache key names (those the plan's dict holds)."""

    def as_dict(self) -> dict[str, Any]:
        """The plan as the study has always written it (``trees-<preset>.json``)."""
        return plan_dict(self, self.ALWAYS)

    def key_fields(self) -> dict[str, Any]:
        """The plan's part of the decoded rows' cache key."""
        d = self.as_dict()
        return {k: d[k] for k in self.KEY if k in d}


def builders_of(kind: str) -> tuple[str, ...]:
    """The tree builders the drafter a variant trains has (its class's ``tree_builders``, ``chain`` left out)."""
    return tuple(b for b in module_class(compose(kind)).drafter_class.tree_builders if b != "chain")


def study_plan(preset: str, drafters=None, builders=None, budgets=None, top_k=None,
               study_file: Path = STUDY_FILE) -> TreesPlan:
    """The merged settings of ``preset`` (arguments override the study file); every check before any training."""
    study = read_study_file(study_file, preset, "tree study")
    section = study["presets"][preset]
    fields = section_fields(TreesPlan, section, f"{Path(study_file).name}: presets.{preset}",
                            fixed=("preset", "skipped", "drafters", "builders", "budgets", "cost_aware", "cost_cap",
                                   "curve_repeats", "pool_size"))
    names = list(drafters or study["drafters"])
    unknown = [d for d in names if d not in available_variants()]
    if unknown or not names:
        raise ValueError(f"drafters: unknown {unknown or 'none given'}; choose from {available_variants()}")
    skipped = {d: f"{d}: no tree builder (it drafts token by token as a standalone LM): skipped"
               for d in names if not builders_of(d)}
    kept = [d for d in names if builders_of(d)]
    if not kept:
        raise ValueError(f"drafters {names}: none has a tree builder (the study needs a parallel or EAGLE-3 drafter)")
    chosen = list(builders or study["builders"])
    bad = [b for b in chosen if b not in TREE_BUILDERS]
    if bad or not chosen:
        raise ValueError(f"builders: unknown {bad or 'none given'}; choose from {', '.join(TREE_BUILDERS)} (the "
                         "chain, tree off, is always decoded)")
    per = {d: [b for b in chosen if b in builders_of(d)] for d in kept}
    unused = [b for b in chosen if not any(b in bs for bs in per.values())]
    if unused and builders:  # asked for by name (the study file's list serves whichever drafters are chosen)
        raise ValueError(f"builders {unused}: no drafter of {kept} builds them "
                         f"({', '.join(f'{d}: {builders_of(d)}' for d in kept)})")
    sizes = sorted({count(b, "budgets: a tree budget (nodes per round)")
                    for b in (budgets if budgets is not None else study["budgets"])})
    if not sizes:
        raise ValueError("budgets: at least one tree budget")
    fields.update(preset=preset, skipped=skipped, drafters=kept, builders=per, budgets=sizes,
                  cost_aware=bool(study.get("cost_aware", True)),
                  cost_cap=count(study.get("cost_cap", max(sizes)), "cost_cap"),
                  top_k=count(top_k if top_k is not None else section.get("top_k", study.get("top_k", 4)),
                                     "top_k"),
                  max_new_tokens=count(section.get("max_new_tokens"), f"presets.{preset}.max_new_tokens"))
    prompts = section.get("prompts") or {}
    if not prompts:
        raise ValueError(f"presets.{preset}.prompts: at least one domain")
    for name, n in prompts.items():
        count(n, f"presets.{preset}.prompts.{name}")
    fields.update(repeats=check_repeats(section.get("repeats", 1)),
                  pool_size=check_pool_size(decode_pool_size(preset), None),  # the ablation's; V checked by the engine
                  seed=int(section.get("seed", 0)),
                  curve_repeats=count(study.get("curve_repeats", 3), "curve_repeats"))
    return TreesPlan(**fields)
