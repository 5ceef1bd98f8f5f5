"""The paper-shaped training step of every method on one GPU: peak memory and step time.

A random Qwen3-8B-shaped target (36 layers, d = 4096, V = 151,936, bf16) on CUDA, the paper preset's
batch (b = 4, T = 3072, A = 512, B = 16, 5 draft layers, Domino r = 256, d_s = 1024), bf16 autocast;
per method: online target features (no LM head), forward, loss, backward, AdamW step, the lean path
(``new``: chunked label-only loss, flex block masks) and, with ``--old``, the full-logits reference
(expected to run out of memory). Same logic as the CPU benchmark (``lit_domino.studies.memory.run_case``).
Finishes in a few minutes on one H100/H200. ``--device cpu`` is a dry run of the script (the paper's vocabulary
and block shapes at a narrow width, ``StepShape.cpu_bench``): its figures say nothing about a GPU.

    python experiments/gpu/paper_step.py [--methods backbone,domino] [--steps 2] [--old] [--out FILE]
    python experiments/gpu/paper_step.py --device cpu --methods backbone --steps 1   # dry run, no GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lit_domino.studies.memory import GB, METHODS, StepShape, memory_model, memory_model_table, run_case  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=2, help="steps per case (the first includes compilation)")
    ap.add_argument("--old", action="store_true", help="also run the full-logits reference path")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (the check) or cpu (a dry run)")
    ap.add_argument("--out", default=str(ROOT / "results" / "paper_step_gpu.json"))
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("experiments/gpu/paper_step.py needs a CUDA GPU (torch.cuda.is_available() is False); on CPU run "
                 "experiments/memory_bench.py, the same step at a narrow width")
    cuda = args.device == "cuda"
    shape = StepShape() if cuda else StepShape.cpu_bench(seq_len=256, anchors=16)
    rows, t0 = [], time.perf_counter()
    for method in args.methods.split(","):
        for path in (("old", "new") if args.old else ("new",)):
            try:
                row = run_case(method, path, shape, args.device, torch.bfloat16 if cuda else torch.float32,
                               steps=args.steps)
            except torch.cuda.OutOfMemoryError as err:
                row = {"method": method, "path": path, "error": f"OOM: {str(err).splitlines()[0]}"}
            if cuda:
                torch.cuda.empty_cache()
            rows.append(row)
            brief = {k: v for k, v in row.items() if k != "shape"}
            print(json.dumps(brief), flush=True)
    print("\n| method | path | peak GB (max allocated) | step s (last) | loss |\n|---|---|---:|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['method']} | {r['path']} | {r['error']} | | |")
        else:
            print(f"| {r['method']} | {r['path']} | {r['peak_bytes'] / GB:.1f} | {r['step_seconds'][-1]:.2f} | "
                  f"{r['loss'][-1]:.3f} |")
    print("\nAnalytic model (Domino, paper preset, 80 GB):")
    print(memory_model_table(memory_model(StepShape())))
    device = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    print(f"\ntotal {time.perf_counter() - t0:.0f} s on {device}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"device": device, "shape": dataclasses.asdict(shape), "rows": rows}
    out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
