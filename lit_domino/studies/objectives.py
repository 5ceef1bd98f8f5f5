"""The objectives study: the block drafters x the training objectives, trained, decoded and ranked in τ.

Stages (each printed as it runs, each cached):

1. the target and the training data (the features of every feature rule the trainings read, prepared once);
2. every drafter x objective x seed trained (``experiment.train_variant`` through the ablation's ``train_all``: two
   at a time on a CPU machine, cached, resumable); the row ``own`` names no objective, so it is the ablation's
   very drafter (one cache entry), the others set ``model.objective`` (``lit_domino.models.objectives``);
3. real speculative decoding of every drafter on the embedded eval prompts per domain (the ablation's
   ``evaluate``: every method interleaved per prompt against our AR baseline, Domino and DSpark with the
   ablation's candidate pool), every row token-identical to the AR baseline at T = 0 or the study stops; the rows
   cached under a key of the drafters and the evaluation settings;
4. tables (Markdown + JSON in ``results/objectives-<preset>/``): per drafter, each objective's τ per domain and
   speedup (mean ± spread over seeds), its change against the drafter's own loss with the verdict (a difference
   within the seeds' spread is no win), the domains it wins beyond the spread, the published delta beside it;
   a summary; the per-position acceptance curves per objective (the shape each trades: a figure); MLflow: a
   study run (experiment ``objectives-<preset>``) with the training runs nested under it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_domino.runtime.command import UsageError
from lit_domino.runtime.jsonio import write_json
from lit_domino.runtime.paths import project_root
from lit_domino.studies.skeleton import read_study_file
from lit_domino.training.configs import CONFIG_DIR, ConfigError, compose, did_you_mean, load_config

STUDY_FILE = CONFIG_DIR / "studies" / "objectives.yaml"
OWN = "own"
"""The row that names no objective: the drafter's own loss (its ablation drafter)."""


def _choose(what: str, given, known: list[str]) -> list[str]:
    chosen = list(given or known)
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise UsageError(f"unknown {what} " + ", ".join(f"{x!r}{did_you_mean(x, known)}" for x in unknown)
                         + f"; the study has {', '.join(known)}")
    return chosen


@dataclass(frozen=True)
class ObjectivesPlan:
    """What the objectives study trains and decodes under one preset (``configs/studies/objectives.yaml``)."""

    preset: str
    """The training preset (the config files' ``presets`` section) every drafter is trained with."""
    drafters: list[str]
    """The block drafters (variant names) trained under every objective."""
    objectives: list[str]
    """The objective rows, ``own`` (the drafter's own loss) first: every Δ is against it."""
    specs: dict[str, Any]
    """Each row's objective spec (``model.objective``; None for ``own``), checked by the registry."""
    seeds: list[int]
    """The seeds every drafter x objective is trained with (a win must be beyond their spread)."""
    prompts: dict[str, int]
    """Prompts decoded per domain, in the tables' column order."""
    max_new_tokens: int
    """Tokens generated per prompt."""
    threads: int | None = None
    """CPU threads the decode is pinned to (None: torch's default)."""
    pool_size: int | None = None
    """Domino's and DSpark's candidate pool at decode: the ablation's (None: the exact head)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Dotted training-config keys every training takes (the ablation's ``--set``; they change the cache keys)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Each row's label in the tables (the row's name otherwise)."""
    published: dict[str, str] = field(default_factory=dict)
    """Each row's published delta, shown beside the measured one."""
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    """Decode temperatures: greedy only (lossless is token identity there)."""
    peers: list[str] = field(default_factory=list)
    """Hugging Face peers: none (the ablation's decode reads the field)."""
    exact_head: list[str] = field(default_factory=list)
    """Variants also decoded with the exact head: none (the ablation's decode reads the field)."""
    inner_backbone: list[str] = field(default_factory=list)
    """Inner backbones decoded alone: none (the ablation's decode reads the field)."""
    compiled_baseline: bool = False
    """The compiled plain decoder is not timed (the ablation's decode reads the field)."""
    benchmark_files: dict[str, str] | None = None
    """Local benchmark copies: none, the embedded prompts (the ablation's decode reads the field)."""

    def key_fields(self) -> dict[str, Any]:
        """The plan's part of the decoded rows' cache key: the evaluation settings."""
        return {k: getattr(self, k) for k in ("prompts", "max_new_tokens", "threads", "temperatures", "pool_size")}


def check_names(preset: str, drafters=None, objectives=None, study_file: Path = STUDY_FILE) -> tuple[list, list]:
    """The preset, drafters and objective rows named against the study file (YAML only: the command's checks before
    torch loads) -> the plan's drafters and objective rows (``own`` first); :class:`UsageError` (one line, with close
    matches) otherwise."""
    return _names(read_study_file(study_file, preset, "objectives study", UsageError), preset, drafters, objectives)


def _names(study: dict, preset: str, drafters, objectives) -> tuple[list, list]:
    """:func:`check_names` on a study file already read."""
    chosen = _choose("drafters", drafters, list(study["drafters"]))
    rows = _choose("objectives", objectives or study["presets"][preset].get("objectives"), list(study["objectives"]))
    if OWN not in rows:
        rows.insert(0, OWN)  # every Δ is against the drafter's own loss
    return chosen, rows


def study_plan(preset: str, drafters=None, objectives=None, seeds=None, study_file: Path = STUDY_FILE,
               overrides: dict | None = None) -> ObjectivesPlan:
    """The study's settings on ``preset`` (arguments over the preset's section over the file's): drafters, the
    objective rows and their specs (each checked by the registry: one line naming the row), seeds, evaluation,
    and ``overrides``: dotted training-config keys every training takes (the ablation's ``--set``; they change
    the drafters' cache keys). :class:`UsageError` for anything unknown; nothing heavy is built."""
    from lit_domino.models.objectives import build_objective
    from lit_domino.studies.tables import decode_pool_size

    study = read_study_file(study_file, preset, "objectives study", UsageError)
    chosen, rows = _names(study, preset, drafters, objectives)
    section = copy.deepcopy(study["presets"][preset])
    specs = {row: study["objectives"][row] for row in rows}
    for row, spec in specs.items():
        try:
            build_objective(spec)
        except ValueError as err:
            raise UsageError(f"{Path(study_file).name}: objectives.{row}: {err}") from None
    overrides = dict(overrides or {})
    if any(key.split(".")[0] == "model" and "objective" in key.split(".")[1:3] for key in overrides):
        raise UsageError("--set model.objective: the study sets each row's objective (choose rows with --objectives)")
    return ObjectivesPlan(preset=preset, drafters=chosen, objectives=rows, specs=specs,
                          seeds=[int(s) for s in (seeds if seeds else section["seeds"])],
                          prompts=dict(section["prompts"]), max_new_tokens=int(section["max_new_tokens"]),
                          threads=section.get("threads"), pool_size=decode_pool_size(preset), overrides=overrides,
                          labels=dict(study.get("labels") or {}), published=dict(study.get("published") or {}))


@functools.lru_cache(maxsize=None)
def own_is_ce(drafter: str) -> bool:
    """Whether ``drafter``'s own loss is the position-weighted CE (the backbone, Domino: then the ``ce`` row is its
    ``own`` row and is not trained twice); DSpark's and DFlash 2's distil the target's distribution."""
    from lit_domino.models.distill import DistilledDrafter
    from lit_domino.training.configs import module_class

    return not issubclass(module_class(compose(drafter)).drafter_class, DistilledDrafter)


def rows_of(plan: ObjectivesPlan, drafter: str) -> list[str]:
    """The objective rows ``drafter`` trains (``ce`` left out where it is its own loss)."""
    from lit_domino.models.objectives import build_objective

    out = []
    for row in plan.objectives:
        objective = build_objective(plan.specs[row])
        if objective is not None and objective.name == "ce" and own_is_ce(drafter):
            continue
        out.append(row)
    return out


def name_of(drafter: str, row: str) -> str:
    """The study's name of a drafter x objective (tables, decode rows): ``domino/kl``."""
    return f"{drafter}/{row}"


def study_configs(plan: ObjectivesPlan) -> list[tuple[str, str, dict]]:
    """``(drafter, row, training config)`` of every drafter x objective x seed, each config parsed by the training
    parser (a bad value fails here, naming the drafter and the row, before anything trains). The ``own`` row's
    config is the ablation's, artifact name included; the others are the variant's with ``model.objective``."""
    from lit_domino.training.cli import check_config

    out = []
    for drafter in plan.drafters:
        for row in rows_of(plan, drafter):
            spec = plan.specs[row]
            overrides = {**plan.overrides, **({} if spec is None else {"model.objective": copy.deepcopy(spec)})}
            configs = [load_config(drafter, plan.preset, seed, overrides) for seed in plan.seeds]
            for cfg in configs:
                if spec is not None:
                    cfg["tracking"]["variant"] = f"{drafter}+{row}"  # the artifact's name: its own, beside the ablation's
            try:
                check_config(configs[0], trainer=False)
            except ConfigError as err:
                raise ConfigError(f"{name_of(drafter, row)}: {err}") from None
            out += [(drafter, row, cfg) for cfg in configs]
    return out


def eval_key(plan: ObjectivesPlan, trained: list, target) -> dict:
    """The decoded rows' cache key: every drafter, the evaluation settings and the target."""
    return {"drafters": [(t.variant, t.seed, str(t.drafter_dir)) for t in trained], "plan": plan.key_fields(),
            "target": target.fingerprint()}


def default_out_dir(preset: str) -> Path:
    return project_root() / "results" / f"objectives-{preset}"


def run_objectives_study(preset: str = "smoke", drafters=None, objectives=None, seeds=None,
                         out_dir: Path | None = None, progress: bool = True, mlflow_enabled: bool = True,
                         jobs: int | str = "auto", overrides: dict | None = None) -> dict:
    """The whole study (the module docstring) -> ``{"tables", "rows", "records", "trained", "plan", "seconds"}``.
    ``overrides``: dotted training-config keys for every training (:func:`study_plan`)."""
    from lit_domino.studies.study_runs import StudyRun

    plan = study_plan(preset, drafters, objectives, seeds, overrides=overrides)
    with (StudyRun() if mlflow_enabled else nullcontext()) as study:
        return _run(plan, Path(out_dir or default_out_dir(preset)), progress, study, jobs)


def _run(plan: ObjectivesPlan, out_dir: Path, progress: bool, study, jobs) -> dict:
    from lit_domino.runtime.jobclock import JobClock
    from lit_domino.studies import ablation
    from lit_domino.studies.objectives_tables import report
    from lit_domino.studies.skeleton import Stages
    from lit_domino.studies.tables import records_from_rows
    from lit_domino.target.load import load_target

    stages = Stages("objectives")
    preset = plan.preset
    entries = study_configs(plan)
    configs = [cfg for _, _, cfg in entries]
    stages.log(f"preset {preset}: {len(plan.drafters)} drafters x {len(plan.objectives)} objectives "
               f"({', '.join(plan.objectives)}) x seeds {plan.seeds}: {len(configs)} trainings")
    spec = configs[0]["data"]["target"]
    stages.log(f"stage 1/4 target {spec} and the training data")
    target = load_target(spec)
    modules = ablation.data_modules(configs)
    modules[0][1].regenerate(progress=progress)
    for name, dm in modules:  # every feature set the trainings read, once, before they fan out
        stages.log(f"stage 1/4 {name}")
        dm.prepare_data()
    out_dir.mkdir(parents=True, exist_ok=True)
    parent = None
    if study is not None:
        parent = study.open(f"objectives-{preset}", out_dir.name, {"preset": preset, "table": "objectives"},
                            list(plan.prompts))
    clock = JobClock(jobs=ablation.training_jobs(jobs, configs))
    trained = ablation.train_all(configs, f"objectives-{preset}", clock, {}, progress, parent_run_id=parent)
    trained = [dataclasses.replace(t, variant=name_of(drafter, row)) for (drafter, row, _), t in zip(entries, trained)]

    def decode() -> list[dict]:
        stages.log(f"stage 3/4 decode {len(trained)} drafters on {plan.prompts} x {plan.max_new_tokens} tokens")
        return ablation.evaluate(target, trained, plan, progress=progress)

    rows = stages.decode(eval_key(plan, trained, target), f"objectives-{preset}", decode,
                         lossless=out_dir / "rows-not-lossless.json", what="objectives study")
    stages.log("stage 4/4 tables")
    records = [r for r in records_from_rows(rows) if r["kind"] == "drafter"]
    tables, files, plots = report(records, plan, out_dir)
    write_json(rows, out_dir / "rows.json")
    write_json([{"drafter": d, "objective": row, **t.report} for (d, row, _), t in zip(entries, trained)],
               out_dir / "training.json")
    seconds = time.time() - stages.t0
    write_json({"preset": preset, "seconds": round(seconds, 1), "drafters": plan.drafters,
                "objectives": plan.specs, "seeds": plan.seeds, "overrides": plan.overrides, "lossless": True},
               out_dir / "summary.json")
    files += [out_dir / "rows.json", out_dir / "training.json", out_dir / "summary.json"]
    if study is not None:
        log_to_mlflow(plan, trained, records, study, files, plots)
    print(f"\n{tables['markdown']}\n\nevery row lossless (token identity with the AR baseline at T = 0)\n"
          f"written to {out_dir}" + (f"; MLflow experiment objectives-{preset}" if study is not None else ""))
    stages.done(seconds)
    return {"tables": tables, "rows": rows, "records": records, "trained": trained, "plan": plan,
            "seconds": seconds, "run_id": getattr(study, "run_id", None)}


def log_to_mlflow(plan: ObjectivesPlan, trained: list, records: list[dict], study, files: list[Path],
                  plots: list[Path]) -> None:
    """Each training run: nested under the study run, tagged with its objective, its decoding metrics logged; the
    study run: the seed-aggregated τ and speedup of every drafter x objective, the tables and the figures."""
    from lit_domino.decoding.metric_names import drafter_metrics
    from lit_domino.runtime.tracking import default_tracking_uri, ensure_run, open_client, run_tags
    from lit_domino.studies.common import log_metrics

    preset, uri = plan.preset, default_tracking_uri()
    client = open_client(uri)
    for t in trained:
        drafter, row = t.variant.split("/", 1)
        t.run_id = ensure_run(t.run_id, f"objectives-{preset}", f"{drafter}+{row}-{preset}-s{t.seed}",
                              tags=run_tags(t.variant, preset, t.seed, table="objectives"), tracking_uri=uri)
        study.adopt([t.run_id])
        client.set_tag(t.run_id, "objective", row)
        mine = [r for r in records if r["variant"] == t.variant and r["seed"] == t.seed]
        if mine:
            log_metrics(client, t.run_id, drafter_metrics(mine))
    study.log(records, list(plan.prompts), files, plots)


def check_plan(preset: str, drafters=None, objectives=None, seeds=None,
               overrides: dict | None = None) -> ObjectivesPlan:
    """:func:`study_plan` with every training config parsed (the command's checks before anything is built)."""
    plan = study_plan(preset, drafters, objectives, seeds, overrides=overrides)
    study_configs(plan)
    return plan


__all__ = ["OWN", "STUDY_FILE", "ObjectivesPlan", "check_plan", "name_of", "rows_of", "run_objectives_study", "study_configs",
           "study_plan"]
