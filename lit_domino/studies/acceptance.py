"""The acceptance-predictor study: a calibrated confidence for every parallel drafter, and how well it predicts.

Per drafter of its plan (:class:`~lit_domino.studies.acceptance_plan.AcceptancePlan`: ``configs/studies/
acceptance.yaml`` and the command line, checked before any model loads; the ablation's cached base drafters:
backbone-only, Domino, DSpark, DFlash 2, any parallel method registered later): the add-on head trained on the frozen
drafter (DSpark: its own head, and the add-on one beside it; Domino: on its hidden states and, two more rows, on its
GRU state instead of and besides the previous token's embedding), calibrated per position on held-out rounds
(:mod:`lit_domino.training.acceptance`), each cached as its own artifact keyed by the drafter. Prompts: each
embedded benchmark's items after the ones the DLoop study evaluates on (disjoint).

Writes ``results/acceptance/calibration-<preset>.md|json`` (AUC and ECE before and after, per position, of the
conditional c_j and of the survival S_j) and one reliability diagram per drafter, and logs them to MLflow
(experiment ``acceptance-<preset>``, one ``calibration-<preset>`` run).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from lit_domino.data.benchmarks import load_benchmark
from lit_domino.decoding.acceptance import causal_state_size, own_predictor, supports_predictor
from lit_domino.interop import load_drafter
from lit_domino.runtime.jsonio import write_json
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.threads import pinned_threads
from lit_domino.studies.acceptance_plan import AcceptancePlan, study_plan
from lit_domino.studies.common import log_metrics
from lit_domino.studies.skeleton import Stages
from lit_domino.training.acceptance import MIN_REPORT_ROUNDS, acceptance_predictor, position_cells, prompt_ids
from lit_domino.training.configs import load_config
from lit_domino.training.experiment import train_variant


def predictor_settings(preset: str) -> dict:
    """What the predictors :func:`study_predictors` builds for ``preset`` are made by
    (:meth:`AcceptancePlan.predictor_settings`: part of the DLoop study's decoded rows' key)."""
    return study_plan(preset).predictor_settings()


def study_prompts(target, plan: AcceptancePlan) -> list[list[int]]:
    """The predictors' prompts: ``plan.prompts`` items of each domain after its first ``plan.skip``, as token ids."""
    out = []
    for name in plan.domains:
        items = load_benchmark(name, plan.skip + plan.prompts)[plan.skip:]
        out += prompt_ids(target, items)
    return out


def calibration_table(reports: dict[str, dict]) -> str:
    """One row per drafter × position: AUC, ECE before → after of c_j and of the survival S_j, and the ECE a
    calibrated predictor would score by sampling alone on the same test rounds (the noise floor)."""
    lines = ["| drafter | j | rounds reaching j | accept | AUC | ECE c_j before | after | τ_j | ECE S_j before | after | "
             "noise floor (c_j; S_j) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    pct = lambda v: "–" if v is None else f"{100 * v:.1f} %"
    for name, rep in reports.items():
        p = rep["pooled"]
        lines.append(f"| **{name}** | all | {p['rounds']} | – | {p['auc']:.3f} | {100 * p['ece_before']:.1f} % | "
                     f"{100 * p['ece_after']:.1f} % | – | {100 * p['survival_ece_before']:.1f} % | "  # j <= J
                     f"{100 * p['survival_ece_after']:.1f} % | {pct(p.get('ece_floor'))}; "
                     f"{pct(p.get('survival_ece_floor'))} |")
        for r in rep["positions"]:
            if r["rounds"] < MIN_REPORT_ROUNDS:
                continue
            lines.append(f"| {name} | {position_cells(r)} |")
    return "\n".join(lines)


def predictor_variants(kind: str, drafter) -> list[tuple[str, str, dict]]:
    """The predictors the study builds for ``drafter`` -> (table name, artifact tag, settings fields): its own head
    (or the add-on head), the add-on head beside an own one, and for a drafter with a GRU the heads on
    ``[H ; S]`` and on ``[H ; E[prev] ; S]``."""
    out = [(kind, kind, {})]
    if own_predictor(drafter) is not None:
        out.append((f"{kind} (add-on head)", f"{kind}-addon", {"own_head": False}))
    if causal_state_size(drafter) is not None:
        out.append((f"{kind} (GRU state)", f"{kind}-gru", {"inputs": "gru"}))
        out.append((f"{kind} (hidden + GRU)", f"{kind}-hidden-gru", {"inputs": "hidden+gru"}))
    return out


def run_acceptance_study(plan: AcceptancePlan | str = "smoke", out_dir: Path | None = None,
                         mlflow_enabled: bool = True, progress: bool = True) -> dict:
    """Build (or reuse) the predictors of every drafter of ``plan`` (:func:`study_plan`; a preset: its plan as the
    study file gives it), then the tables, diagrams and MLflow run (module docstring)."""
    import json

    from lit_domino.target.load import load_target

    plan = study_plan(plan) if isinstance(plan, str) else plan
    preset, label = plan.preset, plan.label
    stages = Stages("acceptance")
    for note in plan.skipped.values():
        stages.log(note)
    out_dir = Path(out_dir or project_root() / "results" / "acceptance")
    out_dir.mkdir(parents=True, exist_ok=True)
    cfgs = {kind: load_config(kind, preset, 0, {}) for kind in plan.drafters}
    target = load_target(next(iter(cfgs.values()))["data"]["target"])
    prompts = study_prompts(target, plan)
    reports, files, predictors, tags = {}, [], {}, {}
    continued: dict = {}  # the target's continuations of the prompts, generated once for every predictor built
    with pinned_threads(plan.threads):
        for kind, cfg in cfgs.items():
            trained = train_variant(cfg, experiment=f"acceptance-{preset}", table="acceptance", progress=progress)
            drafter = load_drafter(trained.drafter_dir, target=target)
            pool = plan.pool_of(drafter)
            for name, tag, fields in predictor_variants(kind, drafter):
                settings = plan.settings(pool, **fields)
                stages.log(f"{name}: predictor ({settings})")
                pred, path = acceptance_predictor(target, drafter, prompts, settings, name=f"{tag}-{preset}",
                                                  continued=continued)
                tags[name] = tag.replace("-", "_")  # MLflow metric prefixes: backbone, dspark_addon, domino_gru
                reports[name] = json.loads((path / "report.json").read_text())
                png = out_dir / f"reliability-{tag}-{preset}.png"
                shutil.copyfile(path / "reliability.png", png)
                files.append(png)
                predictors[name] = path
    md = calibration_table(reports)
    (out_dir / f"calibration-{preset}.md").write_text(md + "\n")
    write_json({"reports": reports, "artifacts": {k: str(v) for k, v in predictors.items()}, "label": label},
               out_dir / f"calibration-{preset}.json")
    files += [out_dir / f"calibration-{preset}.md", out_dir / f"calibration-{preset}.json"]
    run_id = None
    if mlflow_enabled:
        import mlflow
        from lit_domino.runtime.tracking import mlflow_run, open_client

        with mlflow_run(f"acceptance-{preset}", f"calibration-{preset}", tags={"table": "acceptance"}) as run:
            mlflow.log_params({"drafters": ",".join(reports), "label": str(label or "auto"), "prompts": len(prompts)})
            metrics = {}
            for name, rep in reports.items():
                for k, v in rep["pooled"].items():
                    metrics[f"{tags[name]}.{k}"] = v
                for r in rep["positions"]:
                    for k in ("auc", "ece_before", "ece_after", "survival_ece_after", "accept"):
                        metrics[f"{tags[name]}.pos{r['position']:02d}.{k}"] = r[k]
            log_metrics(open_client(), run.info.run_id, metrics)
            for f in files:
                mlflow.log_artifact(str(f), "calibration")
            run_id = run.info.run_id
    print(f"\n## Acceptance predictors ({preset}; label {label}; held-out test rounds)\n\n{md}\n")
    seconds = time.time() - stages.t0
    print(f"written to {out_dir} in {seconds:.0f} s" + (f"; MLflow run {run_id}" if run_id else ""))
    stages.done(seconds)
    return {"reports": reports, "artifacts": predictors, "markdown": md, "run_id": run_id}


def study_predictors(target, drafters: dict, preset: str, label: str | None = None) -> dict:
    """The cached (or newly built) predictor of every drafter in ``drafters`` (name -> drafter) that can have one
    (the DLoop study's predictor gates; passed to ``generate`` as its ``predictor``), made as the acceptance study
    makes them under ``preset`` (:func:`study_plan`) -> name -> (predictor, artifact path)."""
    plan = study_plan(preset, label=label)
    prompts = study_prompts(target, plan)
    out, continued = {}, {}  # continued: the target's continuations, generated once for every predictor built
    for name, drafter in drafters.items():
        if not supports_predictor(drafter):
            continue
        settings = plan.settings(plan.pool_of(drafter))
        pred, path = acceptance_predictor(target, drafter, prompts, settings,
                                          name=f"{name.replace('/', '-')}-{preset}", continued=continued)
        out[name] = (pred, path)
    return out


GATE_SPECS = ("off", "-0.5:3", "conf@0.5:3", "conf@0.3:3", "cost:3", "trunc@0.3", "conf@0.5:3+trunc@0.3")
"""The gate study's settings: DLoop off, the papers' Σ log q gate (the reference), and the predictor gates."""


def run_gate_study(preset: str = "smoke", drafters=("backbone", "domino", "dspark"), gates=GATE_SPECS,
                   prompts_per_domain: int = 3, max_new_tokens: int = 64, repeats: int = 1,
                   out_dir: Path | None = None, threads: int | None = 1) -> dict:
    """Every drafter (with its cached predictor) x gate, decoded with :func:`~lit_domino.decoding.metrics.benchmark`
    on the eval prompts (the DLoop study's: each domain's first items) against our AR baseline, all interleaved:
    τ, stages per round, draft and verify ms per round, speedup, lossless match -> Markdown + JSON in
    ``results/acceptance/gates-<preset>``. A small-scale look at the gates, not the full DLoop study."""
    from lit_domino.decoding.dloop import DLoopConfig
    from lit_domino.decoding.harness import benchmark
    from lit_domino.target.load import load_target

    t0 = time.time()
    plan = study_plan(preset, drafters)  # the predictors' plan and the domains, checked before any model loads
    dloops = [DLoopConfig.parse(g) for g in gates]
    out_dir = Path(out_dir or project_root() / "results" / "acceptance")
    out_dir.mkdir(parents=True, exist_ok=True)
    cfgs = {kind: load_config(kind, preset, 0, {}) for kind in drafters}
    target = load_target(next(iter(cfgs.values()))["data"]["target"])
    loaded = {kind: load_drafter(train_variant(cfg, progress=False).drafter_dir, target=target)
              for kind, cfg in cfgs.items()}
    with pinned_threads(threads):
        built = study_predictors(target, loaded, preset)
        prompts = {name: load_benchmark(name, prompts_per_domain) for name in plan.domains}
        rows = benchmark(target, loaded, prompts, max_new_tokens=max_new_tokens, dloops=dloops,
                         pool_sizes={k: [plan.pool_size] for k in loaded if "pool_size" in loaded[k].draft_options},
                         hf_baseline=False, progress=False, repeats=repeats,
                         predictors={k: pred for k, (pred, _) in built.items()})
    lines = ["| drafter | gate | avg τ | stages/round | draft ms/round | verify ms/round | avg speedup | Δ vs off | "
             "lossless |", "|---|---|---|---|---|---|---|---|---|"]
    recs = []
    for kind in loaded:
        off = None
        for dl in dloops:
            label = "off" if dl is None else dl.label()
            cells = [r for r in rows if r.get("drafter") == kind and r.get("dloop") == label]
            mean = lambda key: (sum(c[key] for c in cells) / len(cells)) if cells and all(
                isinstance(c.get(key), (int, float)) for c in cells) else float("nan")
            rec = {"drafter": kind, "gate": label, "tau": mean("tau"), "speedup": mean("speedup"),
                   "stages_per_round": mean("stages_per_round"), "draft_ms": mean("draft_ms_per_round"),
                   "verify_ms": mean("verify_ms_per_round"),
                   "match": min((c.get("match_baseline", float("nan")) for c in cells), default=float("nan"))}
            off = rec["speedup"] if dl is None else off
            rec["delta_pct"] = 100 * (rec["speedup"] / off - 1) if off else float("nan")
            recs.append(rec)
            lines.append(f"| {kind} | {label} | {rec['tau']:.2f} | {rec['stages_per_round']:.2f} | "
                         f"{rec['draft_ms']:.2f} | {rec['verify_ms']:.2f} | {rec['speedup']:.2f}x | {rec['delta_pct']:+.1f} % | "
                         f"{rec['match']:.2f} |")
    md = "\n".join(lines)
    (out_dir / f"gates-{preset}.md").write_text(md + "\n")
    write_json({"rows": recs, "predictors": {k: str(path) for k, (_, path) in built.items()}},
               out_dir / f"gates-{preset}.json")
    print(f"\n## Gates ({preset}; {prompts_per_domain} prompts per domain, {max_new_tokens} tokens)\n\n{md}\n")
    print(f"written to {out_dir} in {time.time() - t0:.0f} s")
    return {"rows": recs, "markdown": md}
