"""The paper preset rehearsed end to end on one machine: the library side of ``experiments/rehearsal.py``.

Every setting of ``--preset paper`` runs, at the ``rehearsal`` preset's sizes (``configs/presets/rehearsal.yaml``:
``extends: paper``, then sizes, counts, the device and threads), as a user would run the paper on GPUs:

1. **target**: ``embedded:rehearsal`` built (or reused): Qwen3-8B's vocabulary, heads, RoPE and chat template at
   CPU width (``lit_domino.target.rehearsal``); its MASK row and feature layers checked;
2. **regenerate**, its own step (``data.regen_missing: error``): a real ``transformers serve`` on the target, two
   ``experiments/regenerate.py --server URL --shard i/2`` workers at once, then ``--merge``;
3. **train**: every variant of the ablation under the preset's strategy (DDP, 2 processes, gloo on a CPU; one launch
   of ``lit_domino.training.distributed``), bf16-mixed, online features, the lean loss, checkpointed layers, the
   ``methods:`` sections; the eval callback decodes at each validation epoch (rank 0, broadcast to the other);
4. **ablation**: ``run_ablation(preset)`` on those drafters (cached): the decode of the paper's benchmarks (local
   copies), the tables, the study's MLflow run;
5. **export**: each drafter to its field format (``experiments/export.py``'s command), re-imported and decoded
   against plain greedy decoding (token identity).

``report.json`` (in ``--out``) says what each stage did and with which settings: those of paper.yaml read back from
each training's MLflow params and its resolved ``config.yaml``, beside paper's own value (``settings``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.studies.common import stage_log

COMMAND_DOC = """Rehearse the paper preset end to end on this machine (docs/paper-rehearsal.md).

    python experiments/rehearsal.py                          # the rehearsal preset on the CPU (a few minutes)
    python experiments/rehearsal.py --device cuda --set data.target=embedded:rehearsal-large   # a GPU, larger

Builds the Qwen3-8B-shaped target, regenerates the training data through a real transformers serve (two --shard
workers, then --merge), trains every paper variant under DDP (2 processes), runs the ablation (decode, tables,
MLflow), exports each drafter to its field format and decodes the re-imported copy against greedy decoding.
Writes report.json (every stage, with its settings read back from MLflow) to --out.
"""
"""The command's description and epilog, and ``experiments/rehearsal.py``'s docstring (tests/test_entry_points.py)."""
PROG = "rehearsal.py"

FIELD_FORMATS = {"backbone": "dflash", "domino": "specforge-domino", "dspark": "dspark", "dflash2": "dflash2",
                 "eagle3": "eagle3", "small_lm": "hf"}
"""Each drafter kind's field format (``hf``: the small LM as Hugging Face ``save_pretrained``, HF assisted
generation's assistant)."""

DEVICE_OVERRIDES = {"cpu": {}, "cuda": {"trainer.accelerator": "gpu", "trainer.devices": 1, "trainer.strategy": "auto"}}
"""What ``--device`` changes in the preset: on one GPU, one process (DDP needs two devices)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    from lit_domino.training.configs import PRESETS, parse_override

    p = CommandParser.from_doc(PROG, COMMAND_DOC)
    p.add_argument("--preset", default="rehearsal", choices=PRESETS, help="the preset to rehearse (default rehearsal)")
    p.add_argument("--device", default="cpu", choices=tuple(DEVICE_OVERRIDES), help="cpu (default) or cuda")
    p.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE",
                   help="a training config override, as ablation.py's (repeatable)")
    p.add_argument("--shards", type=int, default=2, help="regeneration workers (--shard i/N; default 2)")
    p.add_argument("--eval-prompts", type=int, default=1, help="prompts per domain the eval callback decodes (default 1)")
    p.add_argument("--out", default=None, help="report and tables folder (default results/rehearsal-<preset>)")
    p.add_argument("--no-progress", action="store_true", help="stage lines only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Parse and check (no torch yet), then rehearse; bad input is one line ``rehearsal.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> dict:
    args = parse_args(argv)
    if args.shards < 1 or args.eval_prompts < 0:
        raise UsageError("--shards must be >= 1 and --eval-prompts >= 0")
    from lit_domino.studies.ablation_plan import study_file_plan
    from lit_domino.training.configs import check_arguments, study_overrides

    overrides = {**DEVICE_OVERRIDES[args.device], **dict(args.set)}
    _, _, variants = study_file_plan(args.preset)
    check_arguments(args.preset, overrides)
    study_overrides(variants, args.preset, overrides)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    return run_rehearsal(args.preset, device=args.device, overrides=dict(args.set), out_dir=args.out,
                         shards=args.shards, eval_prompts=args.eval_prompts, progress=not args.no_progress)


_log = stage_log("rehearsal")
"""This study's log line: ``[rehearsal <seconds>s] msg``."""


def run_rehearsal(preset: str = "rehearsal", device: str = "cpu", overrides: dict | None = None,
                  out_dir: str | Path | None = None, shards: int = 2, eval_prompts: int = 1,
                  progress: bool = False) -> dict:
    """Every stage (module docstring) in order; returns the report (also ``<out_dir>/report.json``)."""
    from lit_domino.runtime.jsonio import write_json
    from lit_domino.runtime.paths import project_root
    from lit_domino.studies import ablation
    from lit_domino.studies.rehearsal_stages import (check_settings, export_stage, regenerate_stage, target_stage,
                                                     train_stage)

    t0 = time.time()
    overrides = {**DEVICE_OVERRIDES[device], **(overrides or {})}
    out_dir = Path(out_dir or project_root() / "results" / f"rehearsal-{preset}")
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = ablation.study_plan(preset)
    configs, notes = ablation.study_configs(preset, plan, overrides)
    report = {"preset": preset, "device": device, "overrides": overrides, "variants": plan.variants,
              "stages": {}}
    for note in notes:  # which variants an override skipped
        _log(note, t0)

    def stage(name: str, fn, *args, **kwargs):
        _log(f"{name} ...", t0)
        start = time.time()
        out = fn(*args, **kwargs)
        out["seconds"] = round(time.time() - start, 1)
        report["stages"][name] = out
        _log(f"{name} done in {out['seconds']:.0f} s", t0)
        return out

    target = stage("target", target_stage, configs, device)
    stage("regenerate", regenerate_stage, preset, overrides, configs[0], target["dir"], device, shards, out_dir)
    trained = stage("train", train_stage, configs, preset, eval_prompts)
    stage("ablation", _ablation_stage, preset, overrides, out_dir / "ablation", progress)
    stage("export", export_stage, trained["trained"], configs[0]["data"]["target"], out_dir / "exports", device, plan)
    report["settings"] = check_settings(configs, trained["trained"])
    report["seconds"] = round(time.time() - t0, 1)
    for stage_report in report["stages"].values():
        stage_report.pop("trained", None)  # the objects: their JSON is under "trainings"
    write_json(report, out_dir / "report.json")
    _log(f"done in {report['seconds'] / 60:.1f} min: {out_dir / 'report.json'}", t0)
    return report


def _ablation_stage(preset: str, overrides: dict, out_dir: Path, progress: bool) -> dict:
    """``run_ablation``: the drafters come from the train stage's cache; decode, tables, the study's MLflow run."""
    from lit_domino.runtime.tracking import open_client
    from lit_domino.studies.ablation import run_ablation

    out = run_ablation(preset, out_dir=out_dir, progress=progress, overrides=overrides or None)
    client = open_client()
    experiment = client.get_experiment_by_name(f"ablation-{preset}")
    studies = client.search_runs([experiment.experiment_id], "tags.study_role = 'study'", max_results=5,
                                 order_by=["attributes.start_time DESC"])
    rows = out["rows"]
    return {"out_dir": str(out_dir), "tables": sorted(p.name for p in out_dir.glob("*.md")),
            "trainings_cached": all(t.from_cache for t in out["trained"]),
            "study_run": {"id": studies[0].info.run_id, "status": studies[0].info.status,
                          "metrics": sorted(studies[0].data.metrics)} if studies else None,
            "rows": len(rows), "methods": sorted({r["method"] for r in rows}),
            "benchmarks": sorted({r["benchmark"] for r in rows}),
            "lossless": all(r.get("match_baseline", 1.0) == 1.0 for r in rows if "match_baseline" in r),
            "match_baseline": sorted({(r["method"], r.get("match_baseline")) for r in rows if "match_baseline" in r})}


def shard_command(preset: str, overrides: dict, *extra: str) -> list[str]:
    """``python experiments/regenerate.py --preset P [--set K=V ...] EXTRA`` (the checkout's script, else the
    library's command), as a user types it."""
    from lit_domino.runtime.paths import project_root

    script = project_root() / "experiments" / "regenerate.py"
    head = [sys.executable, str(script)] if script.is_file() else [
        sys.executable, "-c", "import sys; from lit_domino.training.regen_step import main; main(sys.argv[1:])"]
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    return [*head, "--preset", preset, *sets, *extra]


def child_env(threads: int = 1) -> dict:
    """The environment of the processes the rehearsal starts: this checkout first on the path, ``threads`` threads."""
    from lit_domino.runtime.paths import PACKAGE_DIR

    path = os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}


def run_shards(preset: str, overrides: dict, url: str, shards: int, log_dir: Path) -> list[dict]:
    """The ``--shard i/N`` workers at once, each a process; returns their summaries (their printed JSON)."""
    procs = []
    for i in range(shards):
        cmd = shard_command(preset, overrides, "--server", url, "--shard", f"{i}/{shards}", "--concurrency", "4",
                            "--no-progress")
        log = open(log_dir / f"shard-{i}.log", "wb")
        procs.append((cmd, log, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=child_env())))
    out = []
    for cmd, log, proc in procs:
        stdout, _ = proc.communicate()
        log.close()
        text = stdout.decode(errors="replace")
        if proc.returncode != 0:
            tail = "\n".join(Path(log.name).read_text(errors="replace").splitlines()[-5:])
            raise RuntimeError(f"regeneration worker {' '.join(cmd[1:])} failed (rc {proc.returncode}):\n{tail}")
        out.append({"command": " ".join(["python", *cmd[1:]]), "rc": proc.returncode,
                    "summary": json.loads(text[text.index("{"):])})
    return out
