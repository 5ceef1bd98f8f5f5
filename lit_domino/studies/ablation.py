"""The ablation study: train every variant, decode for real, rebuild the papers' tables.

Stages (each visible as it runs, each cached):

1. the target (``load_target``: the embedded tiny Qwen3 is built once and cached);
2. every variant x seed trained through the one DataModule (``experiment.train_variant``:
   a finished drafter with the same config is reused, a killed one resumes);
3. real speculative decoding of every drafter on every benchmark, all methods
   interleaved per prompt in one process against our AR baseline and HF ``generate``
   (plus HF prompt-lookup and HF assisted generation with the small draft LM); the
   measured rows are cached under a key of all drafters + the evaluation settings, so
   a rerun with nothing changed reprints the tables and anything changed re-measures
   every method together (ratios always come from one run);
4. the main table and the Domino ablations (Markdown + JSON in ``results/``) and
   MLflow (``lit_domino.studies.study_runs``): the study's run, with the seed-aggregated τ and speedup, the
   tables and the plots, and the variants' training runs nested under it, each with its decoding
   metrics and plots.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import time
from dataclasses import replace
from pathlib import Path

from lit_domino.runtime import cache
from lit_domino.training.configs import EMBEDDED_PREFIX, ConfigError, check_arguments, load_config, study_overrides
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.command import run_command
from lit_domino.runtime.quiet import set_verbose
from lit_domino.studies.skeleton import Stages
from lit_domino.decoding.metric_names import COMPILED_AR, MethodKey
from lit_domino.runtime.threads import pinned_threads
from lit_domino.runtime.jsonio import write_json
from lit_domino.studies.tables import (EXACT_HEAD, STUDY_FILE, aggregate, load_spec, records_from_rows,  # noqa: F401
                                       speedup_metrics, tables_from_rows, write_table)
from lit_domino.runtime.tracking import default_tracking_uri
from lit_domino.studies.study_runs import StudyRun
# The plan, the stages and the command's parser live apart; their names stay importable from here.
from lit_domino.studies.ablation_plan import AblationPlan, study_file_plan, study_plan  # noqa: F401
from lit_domino.studies.ablation_command import build_parser, jobs_arg, seed_list  # noqa: F401
from lit_domino.studies.ablation_mlflow import log_to_mlflow, peer_table  # noqa: F401
from lit_domino.studies.ablation_train import (INTERRUPTED, STOP_TIMEOUT, log_line, target_load_state,  # noqa: F401
                                               data_modules, plan_trainings, train_all, training_jobs,
                                               training_names)

# Everything above imports no torch, Lightning or MLflow: ``main`` checks its arguments first (quickly), and the
# functions import the heavy modules where they need them.



def study_configs(preset: str, plan: AblationPlan, overrides: dict | None = None) -> tuple[list[dict], list[str]]:
    """Every variant x seed's training config with the overrides that reach it (``configs.study_overrides``:
    ``model.head.rank`` only for the variants whose module takes it, ``methods.<kind>.<key>`` for that method's), and
    the notes naming the variants an override skipped. Each variant's config is parsed by the training parser
    here, so a mistyped key or value fails before any training or cache reuse, naming the variant."""
    per_variant, notes = study_overrides(plan.variants, preset, overrides)  # keys and numbers: no Lightning yet
    from lit_domino.training.cli import check_config

    configs = []
    for variant in plan.variants:
        mine = [load_config(variant, preset, seed, per_variant[variant]) for seed in plan.seeds]
        try:
            check_config(mine[0])  # the seeds' configs differ in seed_everything alone
        except ConfigError as err:
            raise ConfigError(f"variant {variant}: {err}") from None
        configs += mine
    return configs, notes


ROWS_FORMAT = 2
"""The measured rows' layout (2: each row carries its ``MethodKey``); part of their cache key, so rows cached
in an older layout are measured again instead of misread."""


def eval_key(plan: AblationPlan, drafter_dirs: list, target) -> dict:
    """The measured rows' cache key: every drafter, the evaluation plan (table membership aside) and the target."""
    return {"rows": ROWS_FORMAT, "drafters": [str(d) for d in drafter_dirs], "plan": plan.key_fields(),
            "target": target.fingerprint()}


def eval_name(preset: str) -> str:
    return f"ablation-{preset}"


def default_out_dir(preset: str, plan: AblationPlan) -> Path:
    """``results/ablation-<preset>`` for the whole study; a subset (other variants, seeds or ``--set``
    overrides) gets its own folder beside it, so it never replaces the full study's tables."""
    full = study_plan(preset)
    parts = []
    if plan.variants != full.variants:
        parts.append("+".join(plan.variants))
    if plan.seeds != full.seeds:
        parts.append("s" + "-".join(str(s) for s in plan.seeds))
    if plan.overrides:
        parts.append("set-" + cache.config_hash(plan.overrides, 8))
    return project_root() / "results" / "-".join([f"ablation-{preset}", *parts])


def _warn_if_replacing(out_dir: Path, plan: AblationPlan, t0: float) -> None:
    """Say so when ``out_dir`` holds the tables of another plan (they are about to be replaced)."""
    try:
        before = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return
    now = {"variants": plan.variants, "seeds": plan.seeds, "overrides": plan.overrides}
    was = {k: before.get(k) for k in now}
    if was != now:
        log_line(f"note: {out_dir} holds the results of another run ({was}); this run ({now}) replaces them", t0)



def load_prompts(plan) -> dict:
    """The plan's benchmarks; ``benchmark_files`` (``{benchmark: local copy in the hub schema}``, paths relative to the
    checkout, as the rehearsal's) are read instead of the hub."""
    from lit_domino.data.benchmarks import load_benchmark
    from lit_domino.runtime.paths import project_path

    files = plan.benchmark_files or {}
    return {name: load_benchmark(name, n, **({"data_files": str(project_path(files[name]))} if name in files else {}))
            for name, n in plan.prompts.items()}


def evaluate(target, trained: list, plan, progress: bool = True) -> list[dict]:
    """Decode every drafter (and the peers) on every benchmark in this process → benchmark rows. ``plan``: an
    :class:`AblationPlan` or a plan with its decode fields (the objectives study's)."""
    from lit_domino.decoding.harness import benchmark
    from lit_domino.interop import load_drafter

    drafters, pools, assistant = {}, {}, None
    for t in trained:
        d = load_drafter(t.drafter_dir, target=target, map_location=target.device)
        key = MethodKey(t.variant, t.seed)
        drafters[key] = d
        pools[key] = [plan.pool_size] + ([None] if t.variant in plan.exact_head else [])
        inner = d.base_view() if t.variant in plan.inner_backbone else None
        if inner is not None:  # Domino's backbone decoded alone: did it collapse without the curriculum?
            drafters[replace(key, view="backbone")] = inner
        assistant = assistant or d.hf_model()  # the small LM is HF assisted generation's assistant
    peers = [p for p in plan.peers if p != "assisted" or assistant is not None]
    with pinned_threads(plan.threads):
        return benchmark(target, drafters, load_prompts(plan), max_new_tokens=int(plan.max_new_tokens),
                         temperatures=plan.temperatures, peers=peers, assistant_model=assistant,
                         pool_sizes=pools, progress=progress, compiled_baseline=bool(plan.compiled_baseline))


def run_ablation(preset: str = "default", variants: list[str] | None = None, seeds: list[int] | None = None,
                 out_dir: Path | None = None, progress: bool = True, overrides: dict | None = None,
                 train_only: bool = False, jobs: int | str = "auto") -> dict:
    """The whole study; returns ``{"tables": ..., "records": ..., "trained": ..., "seconds": ...}``.

    ``overrides``: dotted config keys of the variants' training configs (for example
    ``{"data.train_examples": {"math": 4000}}``): a model key (``model.head.rank``) reaches the variants whose
    module takes it and ``methods.<kind>.<key>`` the preset's section of that drafter method, the log naming
    the variants skipped (:func:`study_configs`); they change the drafters' cache keys, so the plain study's
    artifacts are left alone. Pair them with ``out_dir``.

    ``train_only``: stop after stage 2 (the drafters are cached); a later run without it decodes.
    Decoding is timed, so train on a busy machine and decode alone.

    ``jobs``: trainings at once in worker processes (``auto``: :func:`training_jobs`). The log has one line
    per stage with the job's ETA (:class:`~lit_domino.runtime.jobclock.JobClock`, from the study file's
    ``reference_seconds``); ``stage_times.json`` beside the tables holds what each stage took.

    MLflow: the study's run (``lit_domino.studies.study_runs``) is RUNNING from the first training to the end of the
    job, which it ends with (FINISHED, FAILED, KILLED)."""
    with StudyRun() as study:
        return _run_ablation(preset, variants, seeds, out_dir, progress, overrides, train_only, jobs, study)


def _run_ablation(preset: str, variants: list[str] | None, seeds: list[int] | None, out_dir: Path | None,
                  progress: bool, overrides: dict | None, train_only: bool, jobs: int | str, study: StudyRun) -> dict:
    """:func:`run_ablation` inside its study run (opened once the configs are checked)."""
    plan = study_plan(preset, variants, seeds, overrides)
    out_dir = Path(out_dir or default_out_dir(preset, plan))
    configs, notes = study_configs(preset, plan, overrides)  # a mistyped --set fails here, before anything is built
    from lit_domino.training.cli import EXPORT_DIR  # Lightning: once the keys are checked (a mistyped one answers before it)
    from lit_domino.training.experiment import drafter_artifact
    from lit_domino.runtime.jobclock import JobClock, StageProgress
    from lit_domino.target.load import load_target

    reference = plan.reference_seconds or {}
    spec = configs[0]["data"]["target"]
    target_state = target_load_state(spec)
    target_cached = target_state is not None
    busy = not target_cached or not all(cache.is_complete(drafter_artifact(c), warn=False) for c in configs)
    clock = JobClock(calibration=reference.get("calibration") if busy else None, jobs=training_jobs(jobs, configs))
    t0 = clock.t0
    _warn_if_replacing(out_dir, plan, t0)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock.plan("target", reference.get("target", 0.0), cached=target_cached)
    clock.plan("regenerate data", reference.get("regenerate", 0.0))  # cached-ness known once the target is
    plan_trainings(configs, clock, reference)
    if not train_only:  # whether the decode is cached is known once the target is loaded (below)
        clock.plan("decode", reference.get("decode", 0.0))
        clock.plan("tables", reference.get("tables", 0.0))
    for note in notes:  # which variants a method's --set key skipped
        log_line(note, t0)
    log_line(f"preset {preset}: {len(configs)} trainings ({', '.join(plan.variants)} x seeds {plan.seeds}); "
         f"trainings {clock.jobs} at a time", t0)

    log_line(f"stage 1/4 target {spec}{f' ({target_state})' if target_cached else ''}; {clock.eta()}", t0)
    clock.start("target")
    if not target_cached and spec.startswith(EMBEDDED_PREFIX):  # built here: its steps revise the ETA
        from lit_domino.target.load import embedded_target_dir

        def echo(step, total):
            log_line(f"stage 1/4 target: step {step}/{total}; {clock.eta()}", t0)

        embedded_target_dir(spec[len(EMBEDDED_PREFIX):], progress=progress,
                            callbacks=[StageProgress(clock, "target", echo)])
    # decoded where the trainings ran (the GPU when there is one): a paper run decoded an 8B target on the CPU
    target = load_target(spec, device=configs[0]["data"].get("target_device", "auto"))
    clock.finish("target", cached=target_cached)

    modules = data_modules(configs)
    found = [dm.cached() for _, dm in modules]
    for (name, _), parts in zip(modules, found):
        clock.plan(name, reference.get("features", 0.0), cached=parts["features"])
    clock.stages["regenerate data"].cached = all(parts["regen"] for parts in found)
    if clock.stages["regenerate data"].cached:
        clock.stages["regenerate data"].reference = 0.0
    if not train_only:
        key = eval_key(plan, [drafter_artifact(c) / EXPORT_DIR for c in configs], target)
        if cache.is_complete(cache.artifact_dir("evals", key, name=eval_name(preset)), warn=False):
            clock.plan("decode", cached=True)
    regen_cached = clock.stages["regenerate data"].cached
    log_line(f"stage 1/4 regenerate the training data{' (cached)' if regen_cached else ''}; {clock.eta()}", t0)
    clock.start("regenerate data")
    modules[0][1].regenerate(progress=progress)
    clock.finish("regenerate data", cached=regen_cached)
    for name, dm in modules:  # every feature cache the trainings share, once, before they fan out
        cached = clock.stages[name].cached
        log_line(f"stage 1/4 {name}{' (cached)' if cached else ''}; {clock.eta()}", t0)
        clock.start(name)
        dm.prepare_data()
        clock.finish(name, cached=cached)

    study.open(f"ablation-{preset}", default_out_dir(preset, plan).name, {"preset": preset}, list(plan.prompts))
    trained = train_all(configs, f"ablation-{preset}", clock, reference, progress, parent_run_id=study.run_id)
    if train_only:
        write_json(clock.summary(), out_dir / "stage_times.json")
        log_line(f"trained {len(trained)} drafters; stopping before decoding (--train-only)\n{clock.report()}", t0)
        return {"trained": trained, "seconds": time.time() - t0}

    def decode() -> list[dict]:
        log_line(f"stage 3/4 decode {len(trained)} drafters on {plan.prompts} (+ AR baseline, HF generate, peers); "
                 f"{clock.eta()}", t0)
        return evaluate(target, trained, plan, progress=progress)

    clock.start("decode")
    stages = Stages("ablation", t0)
    rows = stages.decode(eval_key(plan, [t.drafter_dir for t in trained], target), eval_name(preset), decode)
    compile_s = sum(r.get("warmup_s", 0.0) for r in rows if r["method"] == COMPILED_AR)
    clock.finish("decode", cached=stages.reused, **({"compiled_plain_warmup_seconds": round(compile_s, 1)}
                                                   if plan.compiled_baseline else {}))
    clock.start("tables")

    log_line("stage 4/4 tables", t0)
    records = records_from_rows(rows)
    domains = list(plan.prompts)
    tables = tables_from_rows(rows, domains, load_spec(STUDY_FILE))  # the notebook's too (analysis.rebuild_tables)
    for name, table in tables.items():
        write_table(table, out_dir, name)
    peers = peer_table(records, domains)
    (out_dir / "peers.md").write_text(peers + "\n")
    write_json(rows, out_dir / "rows.json")
    write_json([t.report for t in trained], out_dir / "training.json")
    seconds = time.time() - t0
    summary = {"preset": preset, "seconds": round(seconds, 1), "seeds": plan.seeds, "variants": plan.variants,
               "overrides": plan.overrides,
               # per variant, the mean over seeds of the domains' mean: over the eager plain decoder ("speedup")
               # and, where the decode ran it, over the compiled plain decoder ("speedup_vs_compiled_ar")
               "speedups": {m: {v: round(mean, 4) for (v, d), (mean, _) in aggregate(records, m).items()
                                if d == "avg" and math.isfinite(mean)} for m in speedup_metrics(records)}}
    write_json(summary, out_dir / "summary.json")
    clock.finish("tables")
    write_json(clock.summary(), out_dir / "stage_times.json")  # before the MLflow upload of out_dir's JSON
    log_to_mlflow(preset, trained, records, out_dir, plan.tables["main"], study, domains)

    pool = ("the exact head" if plan.pool_size is None
            else f"a {plan.pool_size}-token candidate pool (the {EXACT_HEAD} rows: the exact head)")
    print(f"\n## Main table ({preset}; speedup = our plain decoder's time per token (eager; compiled where the "
          f"study runs it) / speculative, prefill excluded; Domino decoded with {pool})\n")
    print(tables["main"]["markdown"])
    print(f"\n## Domino ablations ({preset})\n")
    print(tables["ablations"]["markdown"])
    print(f"\n## Speedup beside the Hugging Face peers ({preset})\n")
    print(peers)
    print(f"\nwritten to {out_dir}; MLflow experiment ablation-{preset} at {default_tracking_uri()}")
    log_line(f"done in {seconds / 60:.1f} min\n{clock.report()}", t0)
    return {"tables": tables, "records": records, "rows": rows, "trained": trained, "seconds": seconds}


@contextlib.contextmanager
def _interrupt_not_exit():
    """Lightning ends a fit stopped by Ctrl-C (the embedded target's build) with ``SystemExit(1)``: the command
    ends as interrupted instead (rc 130, its one line), not with a silent rc 1."""
    from lit_domino.runtime.tracking import _interrupt_of

    try:
        yield
    except SystemExit as exc:
        if _interrupt_of(exc) is None:
            raise
        raise KeyboardInterrupt(INTERRUPTED) from None


def _main(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    overrides = dict(args.set)
    # what YAML alone can refuse, before torch is imported: the preset, the variants, the --set sections, the target
    _, _, chosen = study_file_plan(args.preset, variants)
    check_arguments(args.preset, overrides)
    study_overrides(chosen, args.preset, overrides)  # model keys and numbers, read from the modules' source
    set_verbose(args.verbose)  # the workers inherit it
    if args.no_progress:  # the libraries' own bars too (dataset saves, weight loading)
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    from lit_domino.training.experiment import interruptible

    with interruptible(), _interrupt_not_exit():  # SIGTERM as Ctrl-C: one line, rc 130 (run_command)
        return run_ablation(
            args.preset,
            variants=variants,
            seeds=args.seeds,
            out_dir=args.out,
            progress=not args.no_progress,
            overrides=overrides,
            train_only=args.train_only,
            jobs=args.jobs,
        )


def main(argv: list[str] | None = None) -> dict:
    """Command line of ``experiments/ablation.py`` (the console script: :func:`console_main`): errors the
    user can fix are one line (``ablation: error: ...``, rc 2), an interrupt ``ablation: interrupted`` (rc 130)."""
    try:
        return run_command("ablation", _main, argv)
    except SystemExit:
        gc.freeze()  # the process ends: skip the final collection of torch's heap (most of the exit's time)
        raise


def console_main() -> None:
    """The ``lit-domino-ablation`` console script: :func:`main` without its return value (a console script's
    return is its exit status, and ``sys.exit`` of the study's dict printed it and ended with rc 1)."""
    main()
