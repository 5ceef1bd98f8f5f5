"""The benchmark command's plan: ``experiments/bench.py``'s options read and checked once into :class:`BenchPlan`,
every check that needs no loaded model done before one loads (:func:`lit_domino.studies.bench.run_bench` runs it).

:func:`check_options` needs neither torch nor a model (bad input answered in well under a second); :func:`bench_plan`
runs it first, then the checks that need the libraries (compile, drafter kinds, benchmark names, trees). What needs
the loaded target (pool size vs V, predictors and trees vs the drafters) stays with the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_domino.runtime.command import UsageError, positive_int
from lit_domino.runtime.inputs import check_drafter_config, check_drafter_source, check_positive, check_target_spec

HF_PEERS = ("prompt_lookup", "assisted")
"""The Hugging Face decoding loops ``--peers`` can add (:func:`lit_domino.decoding.benchmark`'s peers)."""
OFFICIAL_PEERS = ("dflash",)
"""Other projects' decoding loops ``--peers`` can add: ``dflash`` = z-lab's ``dflash_generate`` on each backbone."""
PEERS = HF_PEERS + OFFICIAL_PEERS
DTYPES = ("float32", "bfloat16", "float16", "float64")
PREDICTOR_FILE = "acceptance.json"
"""An acceptance predictor's file (:data:`lit_domino.decoding.acceptance.PREDICTOR_FILE`; that module imports torch,
and ``--acceptance`` is checked before torch is)."""
OPTIONS = ("target", "drafters", "benchmarks", "temperatures", "dloop", "acceptance", "trees", "block_size",
           "pool_sizes", "max_new_tokens", "peers", "assistant", "prompt_lookup_tokens", "no_hf_baseline", "repeats",
           "seed", "threads", "device", "static_cache", "compile", "dtype", "out", "experiment", "no_mlflow",
           "no_progress")
"""The command's options a plan is built from (``experiments/bench.py``'s flags, as ``argparse`` names them)."""


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark run decodes and where it writes, resolved and checked from the command's options."""

    options: dict[str, Any]
    """The command's options as given (flattened CLI options): the JSON's ``args`` and the MLflow run's params."""
    target: str
    """The target: a model directory, hub id, ``embedded:<preset>`` or ``random``."""
    drafters: tuple[tuple[str, str], ...]
    """``(name, path)`` per drafter, names unique; ``path`` may be ``random:<kind>`` (a known kind)."""
    benchmarks: tuple[tuple[str, str, int | None], ...]
    """``(label, name, n)`` per prompt set: ``name`` a benchmark of :mod:`lit_domino.data.benchmarks` (``n`` prompts,
    None: all) or ``random`` (``n`` random 32-token prompts); ``label`` names its rows."""
    temperatures: tuple[float, ...]
    """Sampling temperatures (finite, >= 0)."""
    out: Path
    """Where ``bench-<time>.md`` and ``.json`` are written."""
    dloops: tuple = (None,)
    """DLoop settings (``DLoopConfig``; None: DLoop off)."""
    trees: tuple = (None,)
    """Tree settings (``TreeConfig``; None: the chain engine)."""
    acceptance: dict[str, Path] = field(default_factory=dict)
    """A trained acceptance predictor's folder per drafter name (the conf, cost and trunc gates)."""
    pool_sizes: tuple[int | None, ...] = (None,)
    """Domino's candidate pools K (None: the whole vocabulary); checked against V once the target is loaded."""
    block_size: int | None = None
    """Block size (None: each drafter's own)."""
    max_new_tokens: int = 256
    """Tokens generated per prompt."""
    peers: tuple[str, ...] = ()
    """Peer decoding loops, of :data:`PEERS`."""
    assistant: str | None = None
    """The ``assisted`` peer's model: a small-LM drafter's name or an HF model directory."""
    prompt_lookup_tokens: int = 10
    """The ``prompt_lookup`` peer's n-gram tokens."""
    hf_baseline: bool = True
    """Whether HF ``generate`` is timed (``speedup_vs_hf_generate``)."""
    repeats: int = 1
    """Decodes per prompt and method (the timings' mean)."""
    seed: int = 0
    """The seed of the prompts drawn and of the decode."""
    threads: int | None = None
    """Torch intra-op threads (None: torch's)."""
    device: str = "cpu"
    """The device the models run on."""
    dtype: str = "float32"
    """The target's dtype, of :data:`DTYPES` (each drafter is cast to the target's)."""
    static_cache: bool = False
    """The fixed-shape cache path (StaticCache, static K/V buffers), run eagerly."""
    compile: bool = False
    """``torch.compile`` of the fixed-shape forwards (checked against the device)."""
    experiment: str = "bench"
    """The MLflow experiment."""
    mlflow: bool = True
    """Whether the run is logged to MLflow."""
    progress: bool = True
    """Whether progress bars are shown."""

    @property
    def hf_peers(self) -> list[str]:
        """The peers run by :func:`lit_domino.decoding.benchmark` itself (the official ones are decoders of ours)."""
        return [p for p in self.peers if p not in OFFICIAL_PEERS]

    def args(self) -> dict[str, Any]:
        """The options as the JSON's ``args`` and the MLflow params have always held them (a copy)."""
        return dict(self.options)


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


def random_prompt_count(item: str) -> int:
    """``random:N`` → N (``--benchmarks``: at least one prompt)."""
    try:
        n = int(item.split(":", 1)[1])
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--benchmarks: random:N takes a prompt count N >= 1, got {item!r}")
    return n


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


def parse_dloops(spec: str) -> list:
    """``off,-0.5:3`` → ``[None, DLoopConfig(-0.5, 3)]`` (``DLoopConfig.parse``'s specs; its module is torch-free)."""
    from lit_domino.decoding import DLoopConfig

    return [as_usage("--dloop", DLoopConfig.parse, s) for s in str(spec).split(",") if s.strip()] or [None]


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


def benchmark_items(spec: str) -> list[str]:
    """The comma-separated items of ``--benchmarks``, stripped (a ``random:N`` item's count checked)."""
    items = [s.strip() for s in str(spec or "").split(",") if s.strip()]
    for item in items:
        if item.startswith("random:"):
            random_prompt_count(item)
    return items


def parse_benchmarks(spec: str) -> list[tuple[str, str, int | None]]:
    """``name[:n],...,random:N`` → ``[(label, name, n), ...]`` (:data:`BenchPlan.benchmarks`); imports the
    benchmark registry (``datasets``): checked after the torch-free checks."""
    from lit_domino.data.benchmarks import parse_benchmark_list

    out = []
    for item in benchmark_items(spec):
        if item.startswith("random:"):
            out.append((item, "random", random_prompt_count(item)))
            continue
        for name, n in as_usage("--benchmarks", parse_benchmark_list, item):
            out.append((name if n is None else f"{name}:{n}", name, n))
    if not out:
        raise UsageError("--benchmarks is empty")
    return out


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
    if not benchmark_items(args.get("benchmarks")):
        raise UsageError("--benchmarks is empty")
    check_positive(args.get("max_new_tokens"), "--max-new-tokens")
    check_positive(args.get("repeats"), "--repeats")
    check_positive(args.get("threads"), "--threads")
    check_positive(args.get("block_size"), "--block-size", 2)
    check_positive(args.get("prompt_lookup_tokens"), "--prompt-lookup-tokens")
    if args.get("dtype") not in DTYPES:
        raise UsageError(f"--dtype: expected one of {', '.join(DTYPES)}, got {args.get('dtype')!r}")
    parse_dloops(args.get("dloop") or "off")


def bench_plan(options: Mapping) -> BenchPlan:
    """The plan of ``options`` (every option of :data:`OPTIONS`; others, e.g. ``debug``, are kept as given): the
    torch-free checks (:func:`check_options`), then those that need the libraries, each a one-line
    :class:`UsageError` naming its flag, all before any model is loaded or built."""
    missing = [k for k in OPTIONS if k not in options]
    if missing:
        raise TypeError(f"bench options: missing {', '.join(missing)} (experiments/bench.py's options)")
    args = dict(options)
    check_options(args)  # paths, peers, pools, numbers: before torch is even imported
    from lit_domino.decoding.engine import check_compile
    from lit_domino.models.registry import kinds

    dloops = parse_dloops(args["dloop"] or "off")
    as_usage("--compile", check_compile, bool(args["compile"]), args["device"])
    drafters = parse_drafters(args["drafters"] or "")
    for name, path in drafters:
        if path.startswith("random:") and path.split(":", 1)[1] not in kinds():
            raise UsageError(f"--drafters {name}={path}: unknown drafter kind; choose from {', '.join(kinds())}")
    benchmarks = parse_benchmarks(args["benchmarks"])
    return BenchPlan(
        options=args, target=args["target"], drafters=tuple(drafters), benchmarks=tuple(benchmarks),
        temperatures=tuple(parse_temperatures(args["temperatures"] or "0")), dloops=tuple(dloops),
        trees=tuple(parse_trees(args["trees"] or "off")),
        acceptance=parse_acceptance(args["acceptance"] or "", [n for n, _ in drafters]),
        pool_sizes=tuple(parse_pool_sizes(args["pool_sizes"] or "full")), block_size=args["block_size"],
        max_new_tokens=args["max_new_tokens"], peers=tuple(parse_peers(args["peers"] or "")),
        assistant=args["assistant"], prompt_lookup_tokens=args["prompt_lookup_tokens"],
        hf_baseline=not args["no_hf_baseline"], repeats=int(args["repeats"] or 1), seed=args["seed"],
        threads=args["threads"] or None, device=args["device"], dtype=args["dtype"],
        static_cache=bool(args["static_cache"]), compile=bool(args["compile"]), out=Path(args["out"]),
        experiment=args["experiment"], mlflow=not args["no_mlflow"], progress=not args["no_progress"])


def as_usage(flag: str, check, *args, **kwargs):
    """``check(*args, **kwargs)``, its ValueError (bad user input to a library check) a :class:`UsageError`."""
    try:
        return check(*args, **kwargs)
    except UsageError:
        raise
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None
