"""The benchmark command behind ``experiments/bench.py``: drafters x benchmarks x temperature x DLoop,
decoded in one process against our AR baseline (and HF peers), written as Markdown + JSON and one MLflow run.

Importing this module is cheap (torch, transformers and the models load inside the functions), so that
:func:`check_options` answers bad input in well under a second, before anything heavy is imported or built.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from lit_domino.runtime.command import CommandParser, UsageError, positive_int, run_command
from lit_domino.runtime.inputs import check_drafter_config, check_drafter_source, check_positive, check_target_spec
from lit_domino.runtime.paths import project_root

BENCH_METRICS = ("tau", "accepted_per_round", "speedup", "tpot_ms", "speedup_vs_hf_generate", "match_baseline")
"""The bench run's metrics per ``{benchmark}/{method}/T{temperature}`` (plus the per-position acceptance)."""
BENCH_COLUMNS = ["benchmark", "method", "temperature", "block_size", "pool_size", "tau", "accepted_per_round",
                 "speedup", "speedup_vs_hf_generate", "tpot_ms", "draft_ms_per_round", "verify_ms_per_round",
                 "match_baseline"]
HF_PEERS = ("prompt_lookup", "assisted")
"""The Hugging Face decoding loops ``--peers`` can add (:func:`lit_domino.decoding.benchmark`'s peers)."""
OFFICIAL_PEERS = ("dflash",)
"""Other projects' decoding loops ``--peers`` can add: ``dflash`` = z-lab's ``dflash_generate`` on each backbone."""
PEERS = HF_PEERS + OFFICIAL_PEERS
DTYPES = ("float32", "bfloat16", "float16", "float64")
PREDICTOR_FILE = "acceptance.json"
"""An acceptance predictor's file (:data:`lit_domino.decoding.acceptance.PREDICTOR_FILE`; that module imports torch,
and ``--acceptance`` is checked before torch is)."""


def load_target_spec(spec: str, device: str, dtype: str):
    """``random`` (a random 8-layer, 192-wide, 4096-vocabulary Qwen3) or anything :func:`load_target` takes."""
    if spec == "random":
        from lit_domino.testing import random_target

        target = random_target(vocab_size=4096, hidden_size=192, num_layers=8, max_positions=4096)
        target.model.generation_config.eos_token_id = None
        return target
    from lit_domino.target.load import load_target

    return load_target(spec, dtype=dtype, device=device)


def parse_drafters(spec: str) -> list[tuple[str, str]]:
    """``name=path[,name=path...]`` → ``[(name, path), ...]`` (names unique; ``path`` may be ``random:<kind>``)."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UsageError(f"--drafters: expected name=path, got {item!r}")
        out.append((name.strip(), path.strip()))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--drafters: the name(s) {', '.join(dup)} appear more than once")
    return out


def load_drafters(spec: str, target, device: str, acceptance: str = "") -> tuple[dict, dict]:
    """``name=path[,name=path...]`` → ``({name: drafter}, {name: acceptance predictor})``; ``path`` may be
    ``random:<kind>`` (randomly initialised). Each drafter is cast once to the target's dtype (no per-call casts
    while decoding). ``acceptance``: ``name=DIR,...`` (:func:`parse_acceptance`), each predictor checked against its
    drafter before the cast (its key is the drafter's weights as trained), then keyed by the cast drafter, the one
    ``generate`` checks it against."""
    import torch

    from lit_domino.models import build_drafter, drafter_config
    from lit_domino.interop import load_drafter

    dirs = parse_acceptance(acceptance, [name for name, _ in parse_drafters(spec)])

    drafters, predictors = {}, {}
    for name, path in parse_drafters(spec):
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


def parse_acceptance(spec: str, names: list[str]) -> dict[str, Path]:
    """``name=DIR[,name=DIR...]`` → ``{name: predictor dir}``: a trained acceptance predictor per drafter of
    ``--drafters`` (``names``) for the conf, cost and trunc gates; DIR is an artifact of ``experiments/acceptance.py``
    (``artifacts/acceptance/<name>-<hash>``) or its ``predictor/`` folder."""
    out = {}
    for item in filter(None, (s.strip() for s in str(spec or "").split(","))):
        name, sep, path = (part.strip() for part in item.partition("="))
        if not sep or not name or not path:
            raise UsageError(f"--acceptance: expected name=DIR, got {item!r}")
        if name not in names:
            raise UsageError(f"--acceptance {name}: no drafter of that name in --drafters ({', '.join(names) or 'none'})")
        if name in out:
            raise UsageError(f"--acceptance: the drafter {name} is named more than once")
        found = [d for d in (Path(path), Path(path) / "predictor") if (d / PREDICTOR_FILE).is_file()]
        if not found:
            raise UsageError(f"--acceptance {name}={path}: no acceptance predictor there ({PREDICTOR_FILE}, or "
                             f"predictor/{PREDICTOR_FILE}: an artifact of experiments/acceptance.py)")
        out[name] = found[0]
    return out


def load_prompts(spec: str, target, seed: int) -> dict:
    """``name[:n],...`` of :mod:`lit_domino.data.benchmarks`, or ``random:N`` (N random 32-token prompts)."""
    import torch

    from lit_domino.data.benchmarks import load_benchmark, parse_benchmark_list

    prompts = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item.startswith("random:"):
            n = _random_prompts(item)
            g = torch.Generator().manual_seed(seed)
            prompts[item] = [torch.randint(3, target.vocab_size - 1, (32,), generator=g).tolist() for _ in range(n)]
            continue
        for name, n in parse_benchmark_list(item):
            prompts[name if n is None else f"{name}:{n}"] = load_benchmark(name, n, seed=seed)
    if not prompts:
        raise UsageError("--benchmarks is empty")
    return prompts


def _random_prompts(item: str) -> int:
    try:
        n = int(item.split(":", 1)[1])
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--benchmarks: random:N takes a prompt count N >= 1, got {item!r}")
    return n


def assistant_model(peers: str, assistant: str | None, drafters: dict, device: str):
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


def parse_pool_sizes(spec: str) -> list[int | None]:
    """``full,16,64`` -> ``[None, 16, 64]``: the Domino candidate pools to run (``full`` = the whole vocabulary)."""
    sizes = []
    for item in filter(None, (s.strip().lower() for s in str(spec).split(","))):
        if item in ("full", "none", "all"):
            sizes.append(None)
            continue
        sizes.append(positive_int(item, "--pool-sizes", "'full' or an integer",
                                  "a candidate pool holds at least 1 token"))
    return sizes or [None]


def parse_peers(spec: str) -> list[str]:
    """``prompt_lookup,assisted,dflash`` → the list; an unknown peer is refused listing :data:`PEERS`."""
    peers = [s.strip() for s in str(spec or "").split(",") if s.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise UsageError(f"--peers: unknown peer(s) {', '.join(map(repr, unknown))}; choose from {', '.join(PEERS)}")
    return peers


def parse_temperatures(spec: str) -> list[float]:
    """``0,0.7`` → ``[0.0, 0.7]`` (finite, >= 0)."""
    out = []
    for item in filter(None, (s.strip() for s in str(spec).split(","))):
        try:
            t = float(item)
        except ValueError:
            raise UsageError(f"--temperatures: expected numbers, got {item!r}") from None
        if not math.isfinite(t) or t < 0:
            raise UsageError(f"--temperatures: a temperature is a finite number >= 0, got {item!r}")
        out.append(t)
    if not out:
        raise UsageError("--temperatures is empty")
    return out


def parse_trees(spec: str) -> list:
    """``off,eagle:32k4,ddtree:32k4+drawn+multidraft`` → ``[None, TreeConfig(...), ...]``: ``off`` is the chain
    engine, anything else :meth:`TreeConfig.parse` (its ``label()`` format; ``chain`` is the chain through the
    tree path). Imports torch (the tree module): checked after the torch-free checks."""
    from lit_domino.decoding.tree import TreeConfig, TreeError

    try:
        out = [None if s.strip().lower() == "off" else TreeConfig.parse(s) for s in str(spec).split(",") if s.strip()]
    except TreeError as err:
        raise UsageError(f"--trees: {err}") from None
    return out or [None]


def check_trees(trees: list, drafters: dict) -> None:
    """Every ``--trees`` builder is built by at least one drafter (a drafter that lacks one skips it)."""
    from lit_domino.models.capabilities import capabilities_of  # the models package imports torch

    for tree in trees:
        if tree is not None and not any(tree.builder in capabilities_of(d).tree_builders for d in drafters.values()):
            raise UsageError(f"--trees {tree.label()}: no drafter in --drafters builds a {tree.builder!r} tree "
                             f"({', '.join(f'{n}: {d.kind}' for n, d in drafters.items())})")


def check_options(args: Mapping) -> None:
    """Every check of the command's options that needs neither torch nor a model: run before anything loads.

    Drafter paths exist and hold a drafter config, peers and pools are known, numbers are in range."""
    check_target_spec(args.get("target"))
    names = set()
    for name, path in parse_drafters(args.get("drafters") or ""):
        names.add(name)
        if path.startswith("random:"):
            if not path.split(":", 1)[1]:
                raise UsageError(f"--drafters {name}={path}: random:<kind> needs a drafter kind")
            continue
        local = check_drafter_source(path, f"--drafters {name}")
        if local is not None:
            check_drafter_config(local, f"--drafters {name}")
    peers = parse_peers(args.get("peers") or "")
    if "assisted" in peers:
        assistant = args.get("assistant")
        if not assistant:
            raise UsageError("--peers assisted needs --assistant (a small_lm drafter name or an HF model directory)")
        if assistant not in names:
            check_target_spec(assistant, "--assistant")
    parse_acceptance(args.get("acceptance") or "", sorted(names))
    parse_pool_sizes(args.get("pool_sizes") or "full")
    parse_temperatures(args.get("temperatures") or "0")
    for item in filter(None, (s.strip() for s in str(args.get("benchmarks") or "").split(","))):
        if item.startswith("random:"):
            _random_prompts(item)
    if not str(args.get("benchmarks") or "").strip():
        raise UsageError("--benchmarks is empty")
    check_positive(args.get("max_new_tokens"), "--max-new-tokens")
    check_positive(args.get("repeats"), "--repeats")
    check_positive(args.get("threads"), "--threads")
    check_positive(args.get("block_size"), "--block-size", 2)
    check_positive(args.get("prompt_lookup_tokens"), "--prompt-lookup-tokens")
    if args.get("dtype") not in DTYPES:
        raise UsageError(f"--dtype: expected one of {', '.join(DTYPES)}, got {args.get('dtype')!r}")
    parse_dloops(args.get("dloop") or "off")


def parse_dloops(spec: str) -> list:
    """``off,-0.5:3`` → ``[None, DLoopConfig(-0.5, 3)]`` (``DLoopConfig.parse``'s specs; its module is torch-free)."""
    from lit_domino.decoding import DLoopConfig

    return [_usage("--dloop", DLoopConfig.parse, s) for s in str(spec).split(",") if s.strip()] or [None]


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


def run_bench(options: Mapping | Any) -> list[dict]:
    """The benchmark command: decode, write ``<out>/bench-<time>.md`` + ``.json``, log one MLflow run.

    ``options``: the options of ``experiments/bench.py`` (an ``argparse.Namespace`` or a dict with the same
    names); they are the run's params and the JSON's ``args``. Returns the benchmark rows.
    """
    args = dict(options if isinstance(options, Mapping) else vars(options))
    check_options(args)  # paths, peers, pools, numbers: before torch is even imported
    import torch

    from lit_domino.data.benchmarks import parse_benchmark_list
    from lit_domino.decoding import benchmark
    from lit_domino.decoding.engine import check_compile
    from lit_domino.models.registry import kinds
    from lit_domino.models.sessions import check_pool_size
    from lit_domino.runtime.threads import pinned_threads

    # the checks that need the libraries, still before any model is loaded or built
    dloops = parse_dloops(args["dloop"])
    _usage("--compile", check_compile, bool(args.get("compile")), args["device"])
    for name, path in parse_drafters(args.get("drafters") or ""):
        if path.startswith("random:") and path.split(":", 1)[1] not in kinds():
            raise UsageError(f"--drafters {name}={path}: unknown drafter kind; choose from {', '.join(kinds())}")
    for item in filter(None, (s.strip() for s in args["benchmarks"].split(","))):
        if not item.startswith("random:"):
            _usage("--benchmarks", parse_benchmark_list, item)
    temperatures = parse_temperatures(args["temperatures"])
    trees = parse_trees(args.get("trees") or "off")
    pool_sizes = parse_pool_sizes(args.get("pool_sizes") or "full")
    peers = parse_peers(args["peers"])
    with pinned_threads(args["threads"] or None):
        target = load_target_spec(args["target"], args["device"], args["dtype"])
        drafters, predictors = load_drafters(args["drafters"], target, args["device"], args.get("acceptance") or "")
        check_predictors(dloops, drafters, predictors)
        check_trees(trees, drafters)
        external = official_peers(peers, drafters, target)
        peers = [p for p in peers if p not in OFFICIAL_PEERS]
        prompts = load_prompts(args["benchmarks"], target, args["seed"])
        for size in pool_sizes:  # V is known now
            _usage("--pool-sizes", check_pool_size, size, target.vocab_size)
        rows = benchmark(target, drafters, prompts, max_new_tokens=args["max_new_tokens"], temperatures=temperatures,
                         dloops=dloops, pool_sizes=pool_sizes, block_size=args["block_size"], peers=peers,
                         static_cache=bool(args.get("static_cache")), compile=bool(args.get("compile")),
                         assistant_model=assistant_model(args["peers"], args["assistant"], drafters, args["device"]),
                         prompt_lookup_num_tokens=args["prompt_lookup_tokens"], hf_baseline=not args["no_hf_baseline"],
                         seed=args["seed"], progress=not args["no_progress"], external=external,
                         repeats=int(args.get("repeats") or 1), trees=trees, predictors=predictors)
        threads = torch.get_num_threads()
    from lit_domino.decoding.harness import markdown_table
    from lit_domino.runtime.jsonio import write_json

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


def _usage(flag: str, check, *args, **kwargs):
    """``check(*args, **kwargs)``, its ValueError (bad user input to a library check) a :class:`UsageError`."""
    try:
        return check(*args, **kwargs)
    except UsageError:
        raise
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None


def _log_bench(args: dict, rows: list[dict], md_path: Path, json_path: Path) -> str:
    """The bench's MLflow run: options as params, ``{benchmark}/{method}/T{t}/{key}`` metrics, both files."""
    from lit_domino.decoding.metric_names import POSITIONS, row_metrics
    from lit_domino.studies.common import log_command_run

    metrics = row_metrics(rows, BENCH_METRICS + (POSITIONS,),
                          by=lambda r: (r["benchmark"], r["method"], f"T{r['temperature']:g}"))
    return log_command_run(args["experiment"], f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                           {"table": "bench", "target": args["target"]}, args, metrics, [md_path, json_path])


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
    args = parse_args(argv)
    check_options(vars(args))
    return run_bench(args)
