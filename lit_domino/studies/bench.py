"""The benchmark command behind ``experiments/bench.py``: drafters x benchmarks x temperature x DLoop,
decoded in one process against our AR baseline (and HF peers), written as Markdown + JSON and one MLflow run.

Importing this module is cheap (torch, transformers and the models load inside the functions): the options are
planned first (:func:`lit_domino.studies.bench_plan.bench_plan`), bad input answered in well under a second,
before anything heavy is imported or built.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.paths import project_root
from lit_domino.studies.bench_plan import BenchPlan, as_usage, bench_plan, parse_acceptance, parse_drafters

BENCH_METRICS = ("tau", "accepted_per_round", "speedup", "tpot_ms", "speedup_vs_hf_generate", "match_baseline")
"""The bench run's metrics per ``{benchmark}/{method}/T{temperature}`` (plus the per-position acceptance)."""
BENCH_COLUMNS = ["benchmark", "method", "temperature", "block_size", "pool_size", "tau", "accepted_per_round",
                 "speedup", "speedup_vs_hf_generate", "tpot_ms", "draft_ms_per_round", "verify_ms_per_round",
                 "match_baseline"]


def load_target_spec(spec: str, device: str, dtype: str):
    """``random`` (a random 8-layer, 192-wide, 4096-vocabulary Qwen3) or anything :func:`load_target` takes."""
    if spec == "random":
        from lit_domino.testing import random_target

        target = random_target(vocab_size=4096, hidden_size=192, num_layers=8, max_positions=4096)
        target.model.generation_config.eos_token_id = None
        return target
    from lit_domino.target.load import load_target

    return load_target(spec, dtype=dtype, device=device)


def load_drafters(spec: str | Sequence[tuple[str, str]], target, device: str,
                  acceptance: str | Mapping[str, Path] = "") -> tuple[dict, dict]:
    """``name=path[,name=path...]`` (or the plan's ``(name, path)`` pairs) → ``({name: drafter}, {name: acceptance
    predictor})``; ``path`` may be ``random:<kind>`` (randomly initialised). Each drafter is cast once to the
    target's dtype (no per-call casts while decoding). ``acceptance``: ``name=DIR,...`` (:func:`parse_acceptance`)
    or the plan's ``{name: DIR}``, each predictor checked against its drafter before the cast (its key is the
    drafter's weights as trained), then keyed by the cast drafter, the one ``generate`` checks it against."""
    import torch

    from lit_domino.models import build_drafter, drafter_config
    from lit_domino.interop import load_drafter

    pairs = parse_drafters(spec) if isinstance(spec, str) else list(spec)
    dirs = parse_acceptance(acceptance, [n for n, _ in pairs]) if isinstance(acceptance, str) else dict(acceptance)

    drafters, predictors = {}, {}
    for name, path in pairs:
        if path.startswith("random:"):
            torch.manual_seed(0)
            drafter = build_drafter(drafter_config(path.split(":", 1)[1], target), target)
        else:
            drafter = load_drafter(path, target=target, map_location=device)
        pred = None
        if name in dirs:
            from lit_domino.decoding.acceptance import check_predictor, load_predictor

            try:
                pred = check_predictor(drafter, load_predictor(dirs[name]))
            except (UsageError, ValueError) as err:  # another drafter's predictor, or an unreadable one
                raise UsageError(f"--acceptance {name}: {err}") from None
        drafters[name] = drafter.to(device=device, dtype=target.dtype).eval()
        if pred is not None:
            from lit_domino.decoding.acceptance import drafter_key

            predictors[name] = replace(pred, drafter_key=drafter_key(drafters[name]))  # the same drafter, cast
    return drafters, predictors


def load_prompts(benchmarks: Sequence[tuple[str, str, int | None]], target, seed: int) -> dict:
    """``{label: prompts}`` of the plan's ``(label, name, n)`` prompt sets (:data:`BenchPlan.benchmarks`): a
    benchmark of :mod:`lit_domino.data.benchmarks`, or ``random`` (n random 32-token prompts of the target's
    vocabulary, drawn from ``seed``)."""
    import torch

    from lit_domino.data.benchmarks import load_benchmark

    prompts = {}
    for label, name, n in benchmarks:
        if name == "random":
            g = torch.Generator().manual_seed(seed)
            prompts[label] = [torch.randint(3, target.vocab_size - 1, (32,), generator=g).tolist() for _ in range(n)]
        else:
            prompts[label] = load_benchmark(name, n, seed=seed)
    return prompts


def assistant_model(peers: Sequence[str], assistant: str | None, drafters: dict, device: str):
    """The HF model of the ``assisted`` peer: a small-LM drafter's ``.lm`` (by name) or an HF model directory."""
    if "assisted" not in peers:
        return None
    if not assistant:
        raise UsageError("--peers assisted needs --assistant (a small_lm drafter name or an HF model directory)")
    if assistant in drafters:
        lm = drafters[assistant].hf_model()
        if lm is None:
            raise UsageError(f"--assistant {assistant!r} is not a standalone LM drafter (e.g. small_lm)")
        return lm
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(assistant).to(device).eval()


def official_peers(peers: list[str], drafters: dict, target) -> dict:
    """``{"<name>@dflash_generate": decode}`` for each backbone drafter when ``dflash`` is among ``peers``:
    the official DFlash loop decoding our backbone (converted in memory, as the ``dflash`` export writes it)."""
    if "dflash" not in peers:
        return {}
    from lit_domino.decoding.dflash_peer import dflash_official, to_dflash_model

    backbones = {name: d for name, d in drafters.items() if d.kind == "backbone"}
    if not backbones:
        raise UsageError("--peers dflash decodes a backbone drafter with dflash_generate: pass one in --drafters "
                         "(kind 'backbone')")
    out = {}
    for name, drafter in backbones.items():
        model = to_dflash_model(drafter)
        out[f"{name}@dflash_generate"] = (lambda ids, n, t, seed, m=model:
                                          dflash_official(target, m, ids, max_new_tokens=n, temperature=t, seed=seed))
    return out


def check_trees(trees: list, drafters: dict) -> None:
    """Every ``--trees`` builder is built by at least one drafter (a drafter that lacks one skips it)."""
    from lit_domino.models.capabilities import capabilities_of  # the models package imports torch

    for tree in trees:
        if tree is not None and not any(tree.builder in capabilities_of(d).tree_builders for d in drafters.values()):
            raise UsageError(f"--trees {tree.label()}: no drafter in --drafters builds a {tree.builder!r} tree "
                             f"({', '.join(f'{n}: {d.kind}' for n, d in drafters.items())})")


def check_predictors(dloops: list, drafters: dict, predictors: dict | None = None) -> None:
    """The predictor gates (conf, cost, +trunc) need every drafter to have an acceptance predictor (``predictors``:
    name -> the one given, else its own head's): refused by name before any decoding
    (:class:`~lit_domino.decoding.acceptance.NoAcceptancePredictor`, a usage error)."""
    from lit_domino.decoding.acceptance import require_predictor

    for dl in dloops:
        if dl is not None and dl.needs_predictor:
            for name, drafter in drafters.items():
                if drafter is not None:
                    require_predictor(drafter, (predictors or {}).get(name), f"--dloop {dl.label()} (drafter {name})",
                                      calibrated=dl.gate == "cost")


def run_bench(options: BenchPlan | Mapping | Any) -> list[dict]:
    """The benchmark command: decode, write ``<out>/bench-<time>.md`` + ``.json``, log one MLflow run.

    ``options``: a :class:`BenchPlan`, or the options of ``experiments/bench.py`` (an ``argparse.Namespace`` or a
    dict with the same names; an option left out takes the command's default) planned first. The options are the
    run's params and the JSON's ``args``. Returns the benchmark rows.
    """
    plan = options if isinstance(options, BenchPlan) else bench_plan(command_options(options))
    import torch

    from lit_domino.decoding import benchmark
    from lit_domino.models.sessions import check_pool_size
    from lit_domino.runtime.threads import pinned_threads

    with pinned_threads(plan.threads):
        target = load_target_spec(plan.target, plan.device, plan.dtype)
        drafters, predictors = load_drafters(plan.drafters, target, plan.device, plan.acceptance)
        check_predictors(list(plan.dloops), drafters, predictors)
        check_trees(list(plan.trees), drafters)
        external = official_peers(list(plan.peers), drafters, target)
        prompts = load_prompts(plan.benchmarks, target, plan.seed)
        for size in plan.pool_sizes:  # V is known now
            as_usage("--pool-sizes", check_pool_size, size, target.vocab_size)
        rows = benchmark(target, drafters, prompts, max_new_tokens=plan.max_new_tokens,
                         temperatures=list(plan.temperatures), dloops=list(plan.dloops),
                         pool_sizes=list(plan.pool_sizes), block_size=plan.block_size, peers=plan.hf_peers,
                         static_cache=plan.static_cache, compile=plan.compile,
                         assistant_model=assistant_model(plan.peers, plan.assistant, drafters, plan.device),
                         prompt_lookup_num_tokens=plan.prompt_lookup_tokens, hf_baseline=plan.hf_baseline,
                         seed=plan.seed, progress=plan.progress, external=external, repeats=plan.repeats,
                         trees=list(plan.trees), predictors=predictors)
        threads = torch.get_num_threads()
    from lit_domino.decoding.harness import markdown_table
    from lit_domino.runtime.jsonio import write_json

    table = markdown_table(rows, BENCH_COLUMNS)
    plan.out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    md_path, json_path = plan.out / f"{stem}.md", plan.out / f"{stem}.json"
    header = (f"# Speculative decoding benchmark\n\ntarget `{plan.target}`, max_new_tokens {plan.max_new_tokens}, "
              f"torch threads {threads}. speedup = mean TPOT of our AR baseline / mean TPOT "
              "(prefill excluded, same process, same prompts); tau includes the bonus token and is the papers' mean "
              "over prompts of each prompt's τ, while accepted_per_round pools all rounds (short prompts that stop "
              "at EOS after a few long rounds weigh more in tau: the two need not differ by 1).\n\n")
    md_path.write_text(header + table + "\n")
    write_json({"args": plan.args(), "rows": rows}, json_path, indent=2)
    print(table)
    print(f"\nwrote {md_path} and {json_path}")
    if plan.mlflow:
        print(f"MLflow run {_log_bench(plan, rows, md_path, json_path)}")
    return rows


def command_options(options: Mapping | Any) -> dict[str, Any]:
    """``options`` (an ``argparse.Namespace`` or a dict) as a dict in their order, each command option left out
    taking its default (:func:`parse_args`'s)."""
    given = dict(options if isinstance(options, Mapping) else vars(options))
    return {**given, **{k: v for k, v in vars(parse_args([])).items() if k not in given}}


def _log_bench(plan: BenchPlan, rows: list[dict], md_path: Path, json_path: Path) -> str:
    """The bench's MLflow run: options as params, ``{benchmark}/{method}/T{t}/{key}`` metrics, both files."""
    from lit_domino.decoding.metric_names import POSITIONS, row_metrics
    from lit_domino.studies.common import log_command_run

    metrics = row_metrics(rows, BENCH_METRICS + (POSITIONS,),
                          by=lambda r: (r["benchmark"], r["method"], f"T{r['temperature']:g}"))
    return log_command_run(plan.experiment, f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                           {"table": "bench", "target": plan.target}, plan.args(), metrics, [md_path, json_path])


# --------------------------------------------------------------------------- the command

COMMAND_DOC = """Benchmark speculative decoding: tau, speedup vs our AR baseline and vs HF generate, peers.

    python experiments/bench.py --target embedded:default \\
        --drafters domino=artifacts/drafters/domino-xxxx,dflash=artifacts/drafters/backbone-xxxx \\
        --benchmarks embedded-math:20,embedded-code:20 --temperatures 0 --dloop off,-0.5:3 \\
        --max-new-tokens 256 --peers prompt_lookup,assisted,dflash --assistant small

The Domino head's K sweep (correction, pick and q on the top-K base candidates): ``--pool-sizes full,16,64,256``
(rows ``domino+pool(K)``; compare ``tau`` and ``draft_ms_per_round`` with the ``full`` row, ``--threads 1``).

Writes ``results/bench-<time>.md`` + ``.json`` and one MLflow run (experiment ``bench``;
``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``). Everything runs in one
process on the same prompts (see :func:`lit_domino.decoding.benchmark`; the command itself is
:func:`lit_domino.studies.bench.run_bench`).

Smoke options (no trained artifacts): ``--target random`` (a random 8-layer, 192-wide,
4096-vocabulary Qwen3), ``--drafters NAME=random:KIND`` (a randomly initialised drafter),
``--benchmarks random:N`` (N random token prompts).
"""
"""The command's description and epilog, and ``experiments/bench.py``'s docstring (tests/test_entry_points.py)."""
PROG = "bench.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser.from_doc(PROG, COMMAND_DOC)
    p.add_argument("--target", default="embedded:default",
                   help="model directory, hub id, embedded:<preset>, or 'random' (default: embedded:default)")
    p.add_argument("--drafters", default="", help="name=path[,name=path...]; path may be random:<kind>")
    p.add_argument("--benchmarks", default="embedded-math:20",
                   help="name[:n],... from lit_domino.data.benchmarks, or random:N (default: embedded-math:20)")
    p.add_argument("--temperatures", default="0", help="comma-separated temperatures (default: 0)")
    p.add_argument("--dloop", default="off", help="comma-separated DLoop settings: off, [GATE@]THRESHOLD[:STAGES] (sum, mean, scaled, "
                   "last), conf@P[:STAGES], cost[:STAGES], trunc@P, each optionally +trunc@P; conf, cost and "
                   "trunc need a drafter with an acceptance predictor (DSpark's own head, or one given: "
                   "--acceptance)")
    p.add_argument("--acceptance", default="",
                   help="name=DIR[,name=DIR...]: a trained acceptance predictor per drafter of --drafters for the "
                        "conf, cost and trunc gates (an artifacts/acceptance/<name>-<hash> folder of "
                        "experiments/acceptance.py, or its predictor/ folder; refused for another drafter)")
    p.add_argument("--trees", default="off",
                   help="comma-separated tree settings (TreeConfig.label's format): off (the chain engine), chain, "
                        "ddtree:32k4, path:32k4, eagle:32k4, each optionally +drawn (children drawn from q) and "
                        "+multidraft (the q-aware walk, implies +drawn); a drafter skips a builder it lacks "
                        "(default: off)")
    p.add_argument("--block-size", type=int, default=None, help="block size (default: each drafter's own)")
    p.add_argument("--pool-sizes", default="full",
                   help="Domino candidate pools K to run, comma-separated: full (the whole vocabulary, the exact "
                        "head) or integers 1..V, e.g. full,16,64,256 for the K sweep (default: full)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--peers", default="",
                   help="comma-separated peers: prompt_lookup,assisted (HF) and dflash (z-lab's dflash_generate on "
                        "each backbone drafter; needs requirements-peers.txt)")
    p.add_argument("--assistant", default=None,
                   help="for the assisted peer: the name of a small_lm drafter in --drafters, or an HF model dir")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10)
    p.add_argument("--no-hf-baseline", action="store_true", help="skip HF generate (no speedup_vs_hf_generate)")
    p.add_argument("--repeats", type=int, default=1,
                   help="decodes per prompt and method, the method order reversed on every other one; times are "
                        "their mean (default: 1; 2 for a comparison of close loops, e.g. ours vs dflash_generate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--static-cache", action="store_true",
                   help="the target's KV cache as a transformers StaticCache and the parallel drafters' static K/V "
                        "buffers (the fixed-shape path --compile compiles, run eagerly; same tokens)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile of the target's forward over a StaticCache (the AR baseline and every "
                        "drafter alike) and of the parallel drafters' fixed-shape block forward and Domino's rollout (CUDA graphs on "
                        "cuda, inductor's C++ kernels on cpu; compiled in an untimed "
                        "warm-up over every prompt)")
    p.add_argument("--dtype", default="float32")
    p.add_output_flags(str(project_root() / "results"), "bench")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse, check the options (no torch yet), then benchmark; bad input is one line ``bench.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    return run_bench(bench_plan(vars(parse_args(argv))))
