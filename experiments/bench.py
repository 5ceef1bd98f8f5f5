"""Benchmark speculative decoding: tau, speedup vs our AR baseline and vs HF generate, peers.

    python experiments/bench.py --target embedded:default \\
        --drafters domino=artifacts/drafters/domino-xxxx,dflash=artifacts/drafters/backbone-xxxx \\
        --benchmarks embedded-math:20,embedded-code:20 --temperatures 0 --dloop off,-0.5:3 \\
        --max-new-tokens 256 --peers prompt_lookup,assisted --assistant small

Writes ``results/bench-<time>.md`` + ``.json`` and one MLflow run (experiment ``bench``;
``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``). Everything runs in one
process on the same prompts (see :func:`lit_domino.decoding.benchmark`).

Smoke options (no trained artifacts): ``--target random`` (a random 8-layer, 192-wide,
4096-vocabulary Qwen3), ``--drafters NAME=random:KIND`` (a randomly initialised drafter),
``--benchmarks random:N`` (N random token prompts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="embedded:default",
                   help="model directory, hub id, embedded:<preset>, or 'random' (default: embedded:default)")
    p.add_argument("--drafters", default="", help="name=path[,name=path...]; path may be random:<kind>")
    p.add_argument("--benchmarks", default="embedded-math:20",
                   help="name[:n],... from lit_domino.data.benchmarks, or random:N (default: embedded-math:20)")
    p.add_argument("--temperatures", default="0", help="comma-separated temperatures (default: 0)")
    p.add_argument("--dloop", default="off", help="comma-separated DLoop settings: off or THRESHOLD:STAGES")
    p.add_argument("--block-size", type=int, default=None, help="block size (default: each drafter's own)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--peers", default="", help="HF peers: prompt_lookup,assisted")
    p.add_argument("--assistant", default=None,
                   help="for the assisted peer: the name of a small_lm drafter in --drafters, or an HF model dir")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10)
    p.add_argument("--no-hf-baseline", action="store_true", help="skip HF generate (no speedup_vs_hf_generate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", default=str(ROOT / "results"), help="output directory (default: results/)")
    p.add_argument("--experiment", default="bench", help="MLflow experiment (default: bench)")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def load_target_spec(spec: str, device: str, dtype: str):
    if spec == "random":
        from lit_domino.testing import random_target

        target = random_target(vocab_size=4096, hidden_size=192, num_layers=8, max_positions=4096)
        target.model.generation_config.eos_token_id = None
        return target
    from lit_domino.target import load_target

    return load_target(spec, dtype=dtype, device=device)


def load_drafters(spec: str, target, device: str) -> dict:
    drafters = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--drafters: expected name=path, got {item!r}")
        if path.startswith("random:"):
            import torch

            from lit_domino.models import DrafterConfig, build_drafter

            torch.manual_seed(0)
            drafter = build_drafter(DrafterConfig.from_target(target, path.split(":", 1)[1]), target)
        else:
            from lit_domino.models.io import load_drafter

            drafter = load_drafter(path, target=target, map_location=device)
        drafters[name] = drafter.to(device).eval()
    return drafters


def load_prompts(spec: str, target, seed: int) -> dict:
    import torch

    prompts = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item.startswith("random:"):
            n = int(item.split(":", 1)[1])
            g = torch.Generator().manual_seed(seed)
            prompts[item] = [torch.randint(3, target.vocab_size - 1, (32,), generator=g).tolist() for _ in range(n)]
            continue
        from lit_domino.data.benchmarks import load_benchmark, parse_benchmark_list

        for name, n in parse_benchmark_list(item):
            prompts[name if n is None else f"{name}:{n}"] = load_benchmark(name, n, seed=seed)
    if not prompts:
        raise SystemExit("--benchmarks is empty")
    return prompts


def assistant_model(args, drafters: dict, device: str):
    if "assisted" not in args.peers:
        return None
    if not args.assistant:
        raise SystemExit("--peers assisted needs --assistant (a small_lm drafter name or an HF model directory)")
    if args.assistant in drafters:
        lm = getattr(drafters[args.assistant], "lm", None)
        if lm is None:
            raise SystemExit(f"--assistant {args.assistant!r} is not a small_lm drafter (it has no .lm)")
        return lm
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.assistant).to(device).eval()


def _metric_key(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_\-./ :]", "_", "/".join(str(p) for p in parts))


def log_mlflow(args, rows, md_path: Path, json_path: Path) -> str | None:
    from lit_domino.tracking import mlflow_run

    import mlflow

    with mlflow_run(args.experiment, run_name=f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                    tags={"table": "bench", "target": args.target}) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in vars(args).items()})
        for r in rows:
            prefix = (r["benchmark"], r["method"], f"T{r['temperature']:g}")
            for k, v in r.items():
                if isinstance(v, float) and v == v and (k in ("tau", "accepted_per_round", "speedup", "tpot_ms",
                                                              "speedup_vs_hf_generate", "match_baseline")
                                                         or k.startswith("acc_rate_pos_")):
                    mlflow.log_metric(_metric_key(*prefix, k), v)
        mlflow.log_artifact(str(md_path))
        mlflow.log_artifact(str(json_path))
        return run.info.run_id


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import torch

    from lit_domino.decoding import DLoopConfig, benchmark
    from lit_domino.decoding.metrics import markdown_table

    if args.threads:
        torch.set_num_threads(args.threads)
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    dloops = [DLoopConfig.parse(s) for s in args.dloop.split(",") if s.strip()] or [None]
    peers = [s.strip() for s in args.peers.split(",") if s.strip()]
    target = load_target_spec(args.target, args.device, args.dtype)
    drafters = load_drafters(args.drafters, target, args.device)
    prompts = load_prompts(args.benchmarks, target, args.seed)
    rows = benchmark(target, drafters, prompts, max_new_tokens=args.max_new_tokens, temperatures=temperatures,
                     dloops=dloops, block_size=args.block_size, peers=peers,
                     assistant_model=assistant_model(args, drafters, args.device),
                     prompt_lookup_num_tokens=args.prompt_lookup_tokens, hf_baseline=not args.no_hf_baseline,
                     seed=args.seed, progress=not args.no_progress)
    columns = ["benchmark", "method", "temperature", "block_size", "tau", "accepted_per_round", "speedup",
               "speedup_vs_hf_generate", "tpot_ms", "match_baseline"]
    table = markdown_table(rows, columns)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    header = (f"# Speculative decoding benchmark\n\ntarget `{args.target}`, max_new_tokens {args.max_new_tokens}, "
              f"torch threads {torch.get_num_threads()}. speedup = mean TPOT of our AR baseline / mean TPOT "
              "(prefill excluded, same process, same prompts); tau includes the bonus token.\n\n")
    md_path.write_text(header + table + "\n")
    json_path.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    print(table)
    print(f"\nwrote {md_path} and {json_path}")
    if not args.no_mlflow:
        run_id = log_mlflow(args, rows, md_path, json_path)
        print(f"MLflow run {run_id}")
    return rows


if __name__ == "__main__":
    main()
