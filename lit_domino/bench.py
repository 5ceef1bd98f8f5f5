"""The benchmark command behind ``experiments/bench.py``: drafters x benchmarks x temperature x DLoop,
decoded in one process against our AR baseline (and HF peers), written as Markdown + JSON and one MLflow run."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from lit_domino.data.benchmarks import load_benchmark, parse_benchmark_list
from lit_domino.decoding import DLoopConfig, benchmark
from lit_domino.decoding.engine import check_compile
from lit_domino.decoding.metrics import markdown_table
from lit_domino.models import build_drafter, drafter_config, load_drafter
from lit_domino.study import POSITIONS, log_command_run, pinned_threads, row_metrics, write_json
from lit_domino.target import load_target
from lit_domino.testing import random_target

BENCH_KEYS = ("tau", "accepted_per_round", "speedup", "tpot_ms", "speedup_vs_hf_generate", "match_baseline",
              POSITIONS)
"""The bench run's metrics per ``{benchmark}/{method}/T{temperature}``."""
BENCH_COLUMNS = ["benchmark", "method", "temperature", "block_size", "pool_size", "tau", "accepted_per_round",
                 "speedup", "speedup_vs_hf_generate", "tpot_ms", "draft_ms_per_round", "verify_ms_per_round",
                 "match_baseline"]


def load_target_spec(spec: str, device: str, dtype: str):
    """``random`` (a random 8-layer, 192-wide, 4096-vocabulary Qwen3) or anything :func:`load_target` takes."""
    if spec == "random":
        target = random_target(vocab_size=4096, hidden_size=192, num_layers=8, max_positions=4096)
        target.model.generation_config.eos_token_id = None
        return target
    return load_target(spec, dtype=dtype, device=device)


def load_drafters(spec: str, target, device: str) -> dict:
    """``name=path[,name=path...]`` → ``{name: drafter}``; ``path`` may be ``random:<kind>`` (randomly initialised).
    Each drafter is cast once to the target's dtype (no per-call casts while decoding)."""
    drafters = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--drafters: expected name=path, got {item!r}")
        if path.startswith("random:"):
            torch.manual_seed(0)
            drafter = build_drafter(drafter_config(path.split(":", 1)[1], target), target)
        else:
            drafter = load_drafter(path, target=target, map_location=device)
        drafters[name] = drafter.to(device=device, dtype=target.dtype).eval()
    return drafters


def load_prompts(spec: str, target, seed: int) -> dict:
    """``name[:n],...`` of :mod:`lit_domino.data.benchmarks`, or ``random:N`` (N random 32-token prompts)."""
    prompts = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item.startswith("random:"):
            n = int(item.split(":", 1)[1])
            g = torch.Generator().manual_seed(seed)
            prompts[item] = [torch.randint(3, target.vocab_size - 1, (32,), generator=g).tolist() for _ in range(n)]
            continue
        for name, n in parse_benchmark_list(item):
            prompts[name if n is None else f"{name}:{n}"] = load_benchmark(name, n, seed=seed)
    if not prompts:
        raise SystemExit("--benchmarks is empty")
    return prompts


def assistant_model(peers: str, assistant: str | None, drafters: dict, device: str):
    """The HF model of the ``assisted`` peer: a small-LM drafter's ``.lm`` (by name) or an HF model directory."""
    if "assisted" not in peers:
        return None
    if not assistant:
        raise SystemExit("--peers assisted needs --assistant (a small_lm drafter name or an HF model directory)")
    if assistant in drafters:
        lm = drafters[assistant].hf_model()
        if lm is None:
            raise SystemExit(f"--assistant {assistant!r} is not a standalone LM drafter (e.g. small_lm)")
        return lm
    return AutoModelForCausalLM.from_pretrained(assistant).to(device).eval()


OFFICIAL_PEERS = ("dflash",)
"""Other projects' decoding loops ``--peers`` can add: ``dflash`` = z-lab's ``dflash_generate`` on each backbone."""


def official_peers(peers: list[str], drafters: dict, target) -> dict:
    """``{"<name>@dflash_generate": decode}`` for each backbone drafter when ``dflash`` is among ``peers``:
    the official DFlash loop decoding our backbone (converted in memory, as the ``dflash`` export writes it)."""
    if "dflash" not in peers:
        return {}
    from lit_domino.interop.dflash_peer import dflash_official, to_dflash_model

    backbones = {name: d for name, d in drafters.items() if d.kind == "backbone"}
    if not backbones:
        raise SystemExit("--peers dflash decodes a backbone drafter with dflash_generate: pass one in --drafters "
                         "(kind 'backbone')")
    out = {}
    for name, drafter in backbones.items():
        model = to_dflash_model(drafter)
        out[f"{name}@dflash_generate"] = (lambda ids, n, t, seed, m=model:
                                          dflash_official(target, m, ids, max_new_tokens=n, temperature=t, seed=seed))
    return out


def parse_pool_sizes(spec: str) -> list[int | None]:
    """``full,16,64`` -> ``[None, 16, 64]``: the Domino candidate pools to run (``full`` = the whole vocabulary)."""
    sizes = []
    for item in filter(None, (s.strip().lower() for s in str(spec).split(","))):
        if item in ("full", "none", "all"):
            sizes.append(None)
            continue
        try:
            sizes.append(int(item))
        except ValueError:
            raise SystemExit(f"--pool-sizes: expected 'full' or an integer, got {item!r}") from None
    return sizes or [None]


def run_bench(options: Mapping | Any) -> list[dict]:
    """The benchmark command: decode, write ``<out>/bench-<time>.md`` + ``.json``, log one MLflow run.

    ``options``: the options of ``experiments/bench.py`` (an ``argparse.Namespace`` or a dict with the same
    names); they are the run's params and the JSON's ``args``. Returns the benchmark rows.
    """
    args = dict(options if isinstance(options, Mapping) else vars(options))
    try:  # before any loading: a compile request the device cannot serve
        check_compile(bool(args.get("compile")), args["device"])
    except ValueError as err:
        raise SystemExit(f"--compile: {err}") from None
    with pinned_threads(args["threads"] or None):
        temperatures = [float(t) for t in args["temperatures"].split(",") if t.strip()]
        dloops = [DLoopConfig.parse(s) for s in args["dloop"].split(",") if s.strip()] or [None]
        pool_sizes = parse_pool_sizes(args.get("pool_sizes") or "full")
        peers = [s.strip() for s in args["peers"].split(",") if s.strip()]
        target = load_target_spec(args["target"], args["device"], args["dtype"])
        drafters = load_drafters(args["drafters"], target, args["device"])
        external = official_peers(peers, drafters, target)
        peers = [p for p in peers if p not in OFFICIAL_PEERS]
        prompts = load_prompts(args["benchmarks"], target, args["seed"])
        rows = benchmark(target, drafters, prompts, max_new_tokens=args["max_new_tokens"], temperatures=temperatures,
                         dloops=dloops, pool_sizes=pool_sizes, block_size=args["block_size"], peers=peers,
                         static_cache=bool(args.get("static_cache")), compile=bool(args.get("compile")),
                         assistant_model=assistant_model(args["peers"], args["assistant"], drafters, args["device"]),
                         prompt_lookup_num_tokens=args["prompt_lookup_tokens"], hf_baseline=not args["no_hf_baseline"],
                         seed=args["seed"], progress=not args["no_progress"], external=external,
                         repeats=int(args.get("repeats") or 1))
        threads = torch.get_num_threads()
    table = markdown_table(rows, BENCH_COLUMNS)
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    header = (f"# Speculative decoding benchmark\n\ntarget `{args['target']}`, max_new_tokens {args['max_new_tokens']}, "
              f"torch threads {threads}. speedup = mean TPOT of our AR baseline / mean TPOT "
              "(prefill excluded, same process, same prompts); tau includes the bonus token and is the papers' mean "
              "over prompts of each prompt's τ, while accepted_per_round pools all rounds (short prompts that stop "
              "at EOS after a few long rounds weigh more in tau: the two need not differ by 1).\n\n")
    md_path.write_text(header + table + "\n")
    write_json({"args": args, "rows": rows}, json_path, indent=2)
    print(table)
    print(f"\nwrote {md_path} and {json_path}")
    if not args["no_mlflow"]:
        print(f"MLflow run {_log_bench(args, rows, md_path, json_path)}")
    return rows


def _log_bench(args: dict, rows: list[dict], md_path: Path, json_path: Path) -> str:
    """The bench's MLflow run: options as params, ``{benchmark}/{method}/T{t}/{key}`` metrics, both files."""
    metrics = row_metrics(rows, BENCH_KEYS, by=lambda r: (r["benchmark"], r["method"], f"T{r['temperature']:g}"))
    return log_command_run(args["experiment"], f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                           {"table": "bench", "target": args["target"]}, args, metrics, [md_path, json_path])
