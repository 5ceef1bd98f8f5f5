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
   the parallel drafters' calibrated acceptance predictors, :func:`lit_domino.studies.acceptance.study_predictors`;
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

import time
from pathlib import Path

import mlflow

from lit_domino.data.benchmarks import load_benchmark
from lit_domino.decoding.dloop import DLoopConfig, dloop_label, parse_list  # noqa: F401 (parse_list: the study API)
from lit_domino.decoding.harness import benchmark
from lit_domino.interop import load_drafter
from lit_domino.runtime import cache
from lit_domino.runtime.jsonio import write_json
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.threads import pinned_threads
from lit_domino.runtime.tracking import default_tracking_uri, mlflow_run, open_client
from lit_domino.target.load import load_target
from lit_domino.training.experiment import drafter_artifact, train_variant
from lit_domino.studies.common import NotLosslessError, check_lossless, log_metrics, stage_log  # noqa: F401
from lit_domino.studies.skeleton import Stages
# The study's plan, tables and figures live in their own modules; what the study and its callers use comes in here.
from lit_domino.studies.dloop_figures import (calibration_plot, figure_gates, gain_plot, gain_points,  # noqa: F401
                                              line_fit)
from lit_domino.studies.dloop_plan import (LOOP_CLASS, STUDY_FILE, DLoopPlan, base_config, dloop_settings,  # noqa: F401
                                           drafter_settings, gate_settings, log_threshold, loop_config,
                                           study_plan, table_gate, unusable)
from lit_domino.studies.dloop_tables import (CONTROL, SETTINGS, calibration, cell_index, detach_table,  # noqa: F401
                                             dloop_table, fwd_per_token, gates_table, grid_table,
                                             loop_gain_table, table_metrics)

_log = stage_log("dloop")
"""This study's log line: ``[dloop <seconds>s] msg``."""


def train_all(plan: DLoopPlan, t0: float, progress: bool = True) -> tuple[dict, dict, dict]:
    """Base drafters and their fine-tunes → (names, trained, reports): ``names[kind][variant]`` is the
    benchmark name of each drafter, ``trained[name]`` its TrainedDrafter."""
    names, trained = {}, {}
    experiment = f"dloop-{plan.preset}"
    for i, kind in enumerate(plan.drafters):
        cfg = base_config(kind, plan)
        cached = cache.is_complete(drafter_artifact(cfg))
        _log(f"stage 2/4 [{i + 1}/{len(plan.drafters)}] {kind}: base drafter{' (cached)' if cached else ''}", t0)
        base = train_variant(cfg, experiment=experiment, table="dloop", progress=progress)
        names[kind] = {"plain": f"{kind}/plain"}
        trained[f"{kind}/plain"] = base
        jobs = [(f"loop {'detach' if d else 'grad'}", d, None) for d in plan.detach_stage_context]
        if plan.control:
            jobs.append(("control n1", plan.detach_stage_context[0], 1))
        for j, (variant, detach, n) in enumerate(jobs):
            lcfg = loop_config(cfg, base.drafter_dir, plan, detach, max_stages=n)
            cached = cache.is_complete(drafter_artifact(lcfg))
            stages = n or lcfg["model"]["init_args"].get("max_stages")
            _log(f"stage 2/4 [{i + 1}/{len(plan.drafters)}] {kind}: loop-aware fine-tune {variant} "
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


def predictors_needed(target, drafters: dict, dloops: dict, plan: DLoopPlan) -> tuple[dict, list[dict]]:
    """The cached (or newly built) acceptance predictor of every drafter whose gates read one
    (:func:`lit_domino.studies.acceptance.study_predictors`: DSpark its own head, the others the add-on head) ->
    (name -> predictor, skipped rows): a drafter that gets none decodes without those gates (a skipped row each).
    Edits ``dloops`` in place."""
    need = {n: d for n, d in drafters.items() if any(c is not None and c.needs_predictor for c in dloops[n])}
    if not need:
        return {}, []
    from lit_domino.studies.acceptance import study_predictors

    # a plain drafter under its kind's name: the acceptance study's artifact (acceptance/<kind>-<preset>-<key>), so a
    # predictor it built is reused; the fine-tunes under their own names
    alias = {name: name.split("/")[0] if name.endswith("/plain") else name for name in need}
    built = study_predictors(target, {alias[n]: d for n, d in need.items()}, plan.preset)
    predictors = {name: built[a][0] for name, a in alias.items() if a in built}
    out = []
    for name in need:
        if name in predictors:
            continue
        for cfg in [c for c in dloops[name] if c is not None and c.needs_predictor]:
            out.append(skipped_row(name, dloop_label(cfg), "no acceptance predictor could be built for it"))
            dloops[name].remove(cfg)
    return predictors, out


def evaluate(target, trained: dict, names: dict, plan: DLoopPlan, progress: bool = True) -> list[dict]:
    """Decode on the eval prompts: the plain, primary loop-trained and control drafters with every DLoop setting
    each can use (one interleaved benchmark), the other fine-tunes (the other detach setting) with DLoop off and the
    table's gate (a second benchmark with its own AR baseline), then the block-size sweep: each plain drafter at
    every ``plan.block_sizes`` below its trained one with DLoop off and the sweep's gates (a benchmark per
    block size, rows marked ``sweep``). A setting a drafter cannot use leaves a ``skipped`` row with the reason."""

    prompts = {name: load_benchmark(name, int(n)) for name, n in plan.prompts.items()}
    kind_of = {name: kind for kind, variants in names.items() for name in variants.values()}
    # the control fine-tune decodes every setting beside the plain and loop-aware drafters (one interleaved
    # benchmark, one AR baseline): each table compares the loop with more training alone
    grid_names = [names[k][v] for k in plan.drafters for v in ("plain", "loop", CONTROL) if v in names[k]]
    extra_names = [n for n in trained if n not in grid_names]
    table = DLoopConfig(**plan.table_dloop)
    sweep_cfgs = [None] + [DLoopConfig(**g) for g in plan.sweep_gates]
    rows, loaded, predictors = [], {}, {}
    common = dict(max_new_tokens=int(plan.max_new_tokens), pool_sizes=[plan.pool_size],  # Domino's kinds
                  repeats=plan.repeats, hf_baseline=False, progress=progress, seed=int(plan.seed),
                  record_stages=True)
    with pinned_threads(plan.threads or None):  # 1: tiny models, and far less timing jitter
        for group, settings_of in ((grid_names, lambda k: drafter_settings(plan, k)),
                                   (extra_names, lambda k: [c for c in (None, table) if unusable(c, k) is None])):
            if not group:
                continue
            drafters = {name: load_drafter(trained[name].drafter_dir, target=target) for name in group}
            loaded.update(drafters)
            dloops = {name: settings_of(kind_of[name]) for name in group}
            t = time.time()
            built, skipped = predictors_needed(target, drafters, dloops, plan)  # conf, cost, +trunc: each its own
            rows += skipped
            predictors.update(built)
            t = _timed(f"acceptance predictors of {len(group)} drafters", t)
            rows += benchmark(target, drafters, prompts, dloops=dloops, predictors=built, **common)
            _timed(f"decoded {sum(len(v) for v in dloops.values())} drafter settings", t)
        for bs in plan.block_sizes:
            drafters, dloops = {}, {}
            for kind in plan.drafters:
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
                if not _has_predictor(drafter, predictors.get(name)):  # none above (its skipped row says why)
                    usable = [c for c in usable if c is None or not c.needs_predictor]
                drafters[name], dloops[name] = drafter, usable
            if drafters:
                t = time.time()
                sweep_predictors = {n: predictors[n] for n in drafters if n in predictors}
                rows += [dict(r, sweep=bs) for r in benchmark(target, drafters, prompts, dloops=dloops,
                                                              block_size=bs, predictors=sweep_predictors, **common)]
                _timed(f"decoded {sum(len(v) for v in dloops.values())} drafter settings at B = {bs}", t)
    return rows


def _timed(what: str, t: float) -> float:
    now = time.time()
    print(f"[dloop] {what} in {now - t:.0f} s", flush=True)
    return now


def _has_predictor(drafter, predictor) -> bool:
    """Whether a predictor gate has a predictor to read: ``predictor`` (built above) or the drafter's own head's."""
    from lit_domino.decoding.acceptance import predictor_of

    return predictor_of(drafter, predictor) is not None


def log_to_mlflow(plan: DLoopPlan, tables: dict, files: list[Path]) -> str:
    """A ``tables-<preset>`` run in experiment ``dloop-<preset>``: every table cell as a metric, files as artifacts."""
    preset = plan.preset
    with mlflow_run(f"dloop-{preset}", f"tables-{preset}", tags={"table": "dloop", "preset": preset}) as run:
        mlflow.log_params({"thresholds": ",".join(f"{g:g}" for g in plan.thresholds),
                           "stages": ",".join(map(str, plan.stages)), "drafters": ",".join(plan.drafters),
                           "table_dloop": dloop_label(DLoopConfig(**plan.table_dloop)),
                           "pool_size": "full" if plan.pool_size is None else plan.pool_size,
                           "repeats": plan.repeats,
                           "gates": ",".join(dloop_label(c) for c in gate_settings(plan)),
                           "block_sizes": ",".join(map(str, plan.block_sizes)) or "trained",
                           "sweep_gates": ",".join(dloop_label(c) for c in figure_gates(plan))})
        log_metrics(open_client(), run.info.run_id, table_metrics(tables))
        for path in files:
            mlflow.log_artifact(str(path), "tables")
        return run.info.run_id


def eval_key(plan: DLoopPlan, trained: dict, target) -> dict:
    """The decoded rows' cache key: every drafter, everything :func:`evaluate` decodes by, the target and, where a
    gate reads one, the acceptance predictors' settings."""
    key = {"drafters": {n: str(t.drafter_dir) for n, t in trained.items()}, "plan": plan.key_fields(),
           "target": target.fingerprint()}
    if any(c.needs_predictor for c in gate_settings(plan) + figure_gates(plan)):
        from lit_domino.studies.acceptance import predictor_settings

        key["predictors"] = predictor_settings(plan.preset)
    return key


def run_dloop_study(preset: str = "smoke", drafters=None, thresholds=None, stages=None, table_dloop=None,
                    out_dir: Path | None = None, progress: bool = True, mlflow_enabled: bool = True,
                    block_sizes=None) -> dict:
    """The whole study → ``{"tables", "rows", "names", "plan", "seconds"}`` (see the module docstring)."""

    study = Stages("dloop")
    t0 = study.t0
    plan = study_plan(preset, drafters, thresholds, stages, table_dloop, block_sizes=block_sizes)
    out_dir = Path(out_dir or project_root() / "results" / "dloop")
    out_dir.mkdir(parents=True, exist_ok=True)
    target_spec = base_config(plan.drafters[0], plan)["data"]["target"]
    _log(f"preset {preset}: drafters {plan.drafters}, g {plan.thresholds}, N {plan.stages}, "
         f"table gate {dloop_label(DLoopConfig(**plan.table_dloop))}, gates "
         f"{[dloop_label(c) for c in gate_settings(plan)]}, block-size sweep {plan.block_sizes or 'none'} with "
         f"{[dloop_label(c) for c in figure_gates(plan)]}", t0)
    for s in plan.skipped:
        _log(f"{s['drafter']}: gate {s['gate']} skipped: {s['why']}", t0)
    _log(f"stage 1/4 target {target_spec}", t0)
    target = load_target(target_spec)
    names, trained, reports = train_all(plan, t0, progress)

    def decode() -> list[dict]:
        n_grid = sum(1 for k in plan.drafters for v in ("plain", "loop", CONTROL) if v in names[k])
        _log(f"stage 3/4 decode {n_grid} drafters x up to {len(dloop_settings(plan))} DLoop settings, "
             f"{len(trained) - n_grid} more x 2 (off, table gate), on {plan.prompts} x {plan.repeats} repeats, "
             f"then the plain drafters at B = {plan.block_sizes or 'their trained'}", t0)
        return evaluate(target, trained, names, plan, progress)

    rows = study.decode(eval_key(plan, trained, target), f"dloop-{preset}", decode,
                         lossless=out_dir / f"rows-{preset}-not-lossless.json", what="DLoop study")

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
    skipped = plan.skipped + [r for r in rows if r.get("kind") == "skipped"]
    summary = {"preset": preset, "seconds": round(seconds, 1), "plan": plan.as_dict(), "names": names,
               "training": reports, "skipped": skipped, "lossless": True}
    write_json(summary, out_dir / f"summary-{preset}.json")
    write_json(rows, out_dir / f"rows-{preset}.json")
    files += [out_dir / f"summary-{preset}.json"]
    run_id = log_to_mlflow(plan, tables, files) if mlflow_enabled else None

    pool = "the exact head" if plan.pool_size is None else f"a {plan.pool_size}-token candidate pool"
    sections = [("dloop", f"DLoop table ({preset}; Domino decoded with {pool}; speedup = our AR time per token / "
                          "speculative, prefill excluded)"),
                ("loop_gain", f"The loop's own gain: loop-aware training + loop against the control fine-tune ({preset})"),
                ("detach", f"detach_stage_context and the no-loop control ({preset})"),
                ("grid", f"Threshold x depth grid ({preset})"),
                ("gates", f"Gates ({preset}; sum = the papers' reference; draft/verify ms per round: what a gate costs)"),
                ("calibration", f"Gate calibration ({preset}; plot: {plot})"),
                ("gain", f"DLoop's gain against the whole-stage acceptance rate ({preset}; figure: {figure})")]
    for key, title in sections:
        print(f"\n## {title}\n")
        print(tables[key]["markdown"])
    if skipped:
        print(f"\nskipped ({len(skipped)}): " + "; ".join(f"{s['drafter']} {s.get('gate') or s.get('dloop')}"
                                                         + (f" B = {s['block_size']}" if s.get("block_size") else "")
                                                         + f": {s['why']}" for s in skipped))
    print("\nevery row lossless (token identity with the AR baseline at T = 0)")
    where = f"; MLflow experiment dloop-{preset} at {default_tracking_uri()}" if run_id else ""
    print(f"\nwritten to {out_dir}{where}")
    study.done(seconds)
    return {"tables": tables, "rows": rows, "names": names, "plan": plan, "seconds": seconds, "run_id": run_id}
