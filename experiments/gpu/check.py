"""The GPU check, one script a lent GPU runs in under 8 minutes; it writes one JSON: results/gpu/check-<time>.json.

    python experiments/gpu/check.py                        # on one GPU (expected ~6-7 min on an H100, never run yet)
    python experiments/gpu/check.py --device cpu           # a dry run of the script on a CPU (tests/test_rehearsal.py)

Parts, in order (a failed part is recorded and the next one runs; the exit status is 1 if any failed):

1. ``rehearsal``: the paper preset rehearsed on CUDA in bf16 (``lit_domino.studies.rehearsal``, as
   ``experiments/rehearsal.py --device cuda``) at a larger size: the ``embedded:rehearsal-large`` target (d 512,
   12 layers, Qwen3-8B's 32 x 128 query heads over 8 KV heads, its vocabulary, RoPE and template), paper's head
   ranks and widths, 64 anchors, 128-token answers; ``transformers serve`` on the GPU, one training process;
2. ``cuda_tests``: ``pytest tests/test_cuda.py`` (every drafter lossless on the GPU, bf16-mixed training);
3. ``decode``: the compiled decode path with CUDA graphs, eager against compiled, lossless, against the official
   loop (``experiments/gpu/decode_check.py``);
4. ``paper_step``: the paper-shaped training step's peak memory, Qwen3-8B shapes in bf16
   (``experiments/gpu/paper_step.py``), for the backbone and Domino.

``--device cpu`` runs every part at CPU sizes (the rehearsal preset at ``DRY_RUN``'s counts, the CUDA tests skipped,
the decode check's dry run, a narrow training step) to check the script before device time is spent on it; its
figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LARGER = {"data.target": "embedded:rehearsal-large", "data.num_anchors": 64, "data.batch_size": 4,
          "data.max_new_tokens": 128, "data.max_prompt_tokens": 384, "data.max_length": 512,
          "methods.domino.head": {"rank": 256, "gru_hidden": 1024}, "methods.dspark.head.rank": 256,
          "methods.dflash2.head.rank": 256}
"""The rehearsal's GPU size: paper's head sizes, a wider target, more anchors and longer answers."""
DRY_RUN = {"data.train_examples.nemotron": 6, "data.num_anchors": 2}
"""The rehearsal's counts in the dry run (``--device cpu``), below the preset's (16 prompts, 4 anchors): 21 prompts
(one of them two-turn) in 3 chunks, so both shards still answer, and 6 optimizer steps a drafter. The dry run checks
the script, not the preset; tests/test_rehearsal.py runs ``experiments/rehearsal.py`` with the same ``--set``s first,
and the dry run reuses its cache."""


def _script(name: str):
    """A sibling script of this folder as a module (decode_check, paper_step: reused, not copied)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rehearsal(args) -> dict:
    from lit_domino.studies.rehearsal import run_rehearsal

    overrides = LARGER if args.device == "cuda" else DRY_RUN
    report = run_rehearsal("rehearsal", device=args.device, overrides=overrides, out_dir=Path(args.out) / "rehearsal",
                           progress=False)
    stages = report["stages"]
    return {"ok": stages["ablation"]["lossless"] and stages["export"]["lossless"], "overrides": overrides,
            "seconds_by_stage": {k: v["seconds"] for k, v in stages.items()}, "report": report}


def cuda_tests(args) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(ROOT / "tests" / "test_cuda.py")]
    # a pytest of its own: without the calling pytest's variables (an xdist worker's PYTEST_XDIST_WORKER makes the
    # suite's conftest regroup the items, and the child then runs none of them)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.part_timeout, env=env)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    # on a GPU every test runs and passes; on a CPU (the dry run) every one skips, none errors
    ok = proc.returncode == 0 and ("passed" in last if args.device == "cuda" else "skipped" in last)
    return {"ok": ok, "rc": proc.returncode,
            "summary": last, "output_tail": proc.stdout[-3000:] + proc.stderr[-2000:]}


def decode(args) -> dict:
    argv = ["--device", args.device, "--out", str(Path(args.out) / "decode")]
    argv += ["--prompts", "2", "--max-new-tokens", "64"] if args.device == "cuda" else [
        "--prompts", "1", "--max-new-tokens", "12", "--pool-sizes", "full"]
    report = _script("decode_check").main(argv)
    return {"ok": bool(report["lossless"]), "report": report}


def paper_step(args) -> dict:
    argv = ["--device", args.device, "--methods", "backbone,domino", "--steps", "2" if args.device == "cuda" else "1",
            "--out", str(Path(args.out) / "paper_step.json")]
    report = _script("paper_step").main(argv)
    return {"ok": all("error" not in r for r in report["rows"]), "report": report,
            "peak_gb": {r["method"]: r.get("peak_bytes", 0) / 2**30 for r in report["rows"]}}


PARTS = {"rehearsal": rehearsal, "cuda_tests": cuda_tests, "decode": decode, "paper_step": paper_step}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (the check) or cpu (a dry run)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--part-timeout", type=float, default=420.0, help="seconds the CUDA tests may take")
    p.add_argument("--out", default=str(ROOT / "results" / "gpu"), help="where check-<time>.json goes")
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("experiments/gpu/check.py needs a CUDA GPU: torch.cuda.is_available() is False; "
                         "--device cpu runs its dry run")
    unknown = [n for n in args.parts.split(",") if n not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    t0 = time.perf_counter()
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)",
           "torch": torch.__version__, "argv": list(argv if argv is not None else sys.argv[1:]), "parts": {}}
    for name in args.parts.split(","):
        start = time.perf_counter()
        print(f"[check {start - t0:6.0f}s] {name} ...", flush=True)
        try:
            part = PARTS[name](args)
        except BaseException as err:  # noqa: BLE001 (recorded; the next part still runs)
            if isinstance(err, KeyboardInterrupt):
                raise
            part = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        part["seconds"] = round(time.perf_counter() - start, 1)
        out["parts"][name] = part
        print(f"[check {time.perf_counter() - t0:6.0f}s] {name}: {'ok' if part['ok'] else 'FAILED'} "
              f"({part['seconds']:.0f} s)", flush=True)
    out["ok"] = all(p["ok"] for p in out["parts"].values())
    out["seconds"] = round(time.perf_counter() - t0, 1)
    path = Path(args.out) / f"check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"{'all parts ok' if out['ok'] else 'FAILED: ' + ', '.join(n for n, p in out['parts'].items() if not p['ok'])}"
          f"; wrote {path} ({out['seconds']:.0f} s)")
    if not out["ok"] and argv is None:
        sys.exit(1)
    return out


if __name__ == "__main__":
    main()
