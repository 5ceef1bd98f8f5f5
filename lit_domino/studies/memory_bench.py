"""The command behind ``experiments/memory_bench.py``: peak memory of one training step per drafter method, old
vs new path, each (method, path) case in a fresh ``python -m lit_domino.studies.memory`` process.

Importing this module is cheap (:mod:`lit_domino.studies.memory` imports torch: only the table reads it, once
every case ran), so bad options are answered in well under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.inputs import check_positive
from lit_domino.runtime.paths import project_root
from lit_domino.studies.memory_cases import METHODS, PATHS

if TYPE_CHECKING:
    from lit_domino.studies.memory import StepShape

PACKAGE_PARENT = Path(__file__).resolve().parents[2]
"""The directory holding the imported ``lit_domino``: the cases' subprocesses import the same copy."""


COMMAND_DOC = """Peak memory of one training step per drafter method, old (full logits, dense masks) vs new (lean) path.

Shapes: the paper's vocabulary and blocks (V = 151,936, B = 16) with a narrow width (d = 64, one draft
layer, a 4-layer target) so it runs on a CPU; A anchors per sequence (default 128: at A = 512 the old
Domino step needs ~30 GB, more than this 23 GB machine; ``--anchors 512`` runs it where it fits).

Method: every (method, path) case runs in a fresh subprocess (``python -m lit_domino.studies.memory``) that builds
the random target, the drafter and the batch, then runs one step (online target features without the
LM head, forward, loss, backward, AdamW step). The figure is the process's peak resident set
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which covers every allocation since the process started,
so setup is included; setup is ~0.3 GB here and far below either step's peak); ``step Δ`` subtracts the
RSS just before the step. Large tensors are mmap'ed by the allocator and returned to the OS when freed,
so the peak RSS tracks the peak of live tensors. Cases run one after another (each alone in its process).

    python experiments/memory_bench.py                       # table + results/memory_bench.json
    python experiments/memory_bench.py --anchors 64 --methods backbone,domino
"""
"""The command's description, and ``experiments/memory_bench.py``'s docstring (tests/test_entry_points.py)."""
PROG = "memory_bench.py"


def run(method: str, path: str, shape: StepShape, threads: int) -> dict:
    env = {**os.environ, "LIT_DOMINO_BENCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": str(PACKAGE_PARENT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "lit_domino.studies.memory", method, path, json.dumps(dataclasses.asdict(shape)), "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"method": method, "path": path, "error": (proc.stderr.strip().splitlines() or [f"rc {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    from lit_domino.studies.memory import GB  # that module imports torch: loaded after the options are checked

    out = ["| method | old peak GB | new peak GB | old/new | old step Δ GB | new step Δ GB | old s | new s | loss old = new |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    by = {(r["method"], r["path"]): r for r in rows}
    for m in dict.fromkeys(r["method"] for r in rows):
        o, n = by.get((m, "old"), {}), by.get((m, "new"), {})
        if "error" in o or "error" in n or not o or not n:
            out.append(f"| {m} | {o.get('error', '')} | {n.get('error', '')} | | | | | | |")
            continue
        same = abs(o["loss"][0] - n["loss"][0]) <= 1e-4 * max(1.0, abs(o["loss"][0]))
        out.append(f"| {m} | {o['peak_bytes'] / GB:.2f} | {n['peak_bytes'] / GB:.2f} | "
                   f"{o['peak_bytes'] / n['peak_bytes']:.1f}x | {o['step_bytes'] / GB:.2f} | {n['step_bytes'] / GB:.2f} | "
                   f"{o['step_seconds'][0]:.1f} | {n['step_seconds'][0]:.1f} | {'yes' if same else 'NO'} |")
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = CommandParser(prog=PROG, description=COMMAND_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=None,
                    help="comma list of the drafter methods (lit_domino.studies.memory_cases.METHODS; default: all of them)")
    ap.add_argument("--anchors", type=int, default=128, help="A, anchors per sequence (paper 512)")
    ap.add_argument("--seq-len", type=int, default=1024, help="T, tokens per sequence")
    ap.add_argument("--hidden", type=int, default=64, help="d, the narrow width")
    ap.add_argument("--chunk", type=int, default=1024, help="the new path's loss chunk (labelled rows)")
    ap.add_argument("--paths", default="old,new", help="comma list of old, new")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per case")
    ap.add_argument("--out", default=str(project_root() / "results" / "memory_bench.json"), help="JSON output")
    args = ap.parse_args(argv)
    for flag in ("anchors", "seq_len", "chunk", "threads"):
        check_positive(getattr(args, flag), f"--{flag.replace('_', '-')}")
    if args.hidden < 4 or args.hidden % 4:
        raise UsageError(f"--hidden must be a positive multiple of 4 (head_dim = hidden / 4), got {args.hidden}")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - set(PATHS):
        raise UsageError(f"--paths: a comma list of {', '.join(PATHS)}, got {args.paths!r}")
    args.paths = ",".join(paths)
    methods = [m.strip() for m in (args.methods or ",".join(METHODS)).split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UsageError(f"--methods: unknown method(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                         f"choose from {', '.join(METHODS)}")
    args.methods = ",".join(methods)
    return args


def main(argv=None) -> None:
    """Parse and check (no torch yet), then run every case; bad input is one line ``memory_bench.py: error: ...``."""
    run_command(PROG, _run, argv)


def _run(argv: list[str]) -> None:
    args = parse_args(argv)
    from lit_domino.studies.memory import PATH_KEYS, StepShape, memory_model, memory_model_table

    methods = args.methods.split(",")
    shape = StepShape.cpu_bench(anchors=args.anchors, seq_len=args.seq_len, hidden_size=args.hidden,
                                head_dim=args.hidden // 4, chunk_size=args.chunk)
    rows = []
    for method in methods:
        for path in args.paths.split(","):
            rows.append(run(method, path, shape, args.threads))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "shape"}), flush=True)
    print(f"\nOne training step, V = {shape.vocab_size}, B = {shape.block_size}, A = {shape.anchors}, "
          f"T = {shape.seq_len}, b = {shape.batch_size}, d = {shape.hidden_size}, 1 draft layer, new-path chunk "
          f"{shape.chunk_size} (CPU, peak RSS)\n")
    print(table(rows))
    model = memory_model()
    print("\nAnalytic model: Domino on Qwen3-8B at the paper preset (b = 4, T = 3072, A = 512, B = 16, 5 draft "
          "layers, r = 256, d_s = 1024, bf16-mixed), one 80 GB GPU")
    print(memory_model_table(model))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"shape": dataclasses.asdict(shape), "rows": rows,
                               "model": {k: [list(r) for r in model[k]] for k in PATH_KEYS}}, indent=1))
    print(f"\nwrote {out}")
