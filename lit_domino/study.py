"""The study layer shared by the ablation, the DLoop study, the sweep, the eval callback and the bench command.

* strict JSON: :func:`to_json` / :func:`write_json` (NaN and ±inf → ``null``, numpy/torch numbers → Python);
* :func:`pinned_threads`: torch's intra-op threads for a block, restored after;
* :func:`cached_rows`: measured benchmark rows cached in the artifact cache (kind ``evals``);
* benchmark rows → MLflow metrics: :func:`drafter_metrics` (the documented names ``{benchmark}/tau``,
  ``{benchmark}/speedup``, ..., ``acc_rate_pos_{k:02d}``, and their means over benchmarks under the bare
  names), :func:`row_metrics` (one metric per row and key, any naming) and :func:`log_metrics`;
* :func:`run_bench`: the benchmark command behind ``experiments/bench.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

# --------------------------------------------------------------------------- strict JSON


def _key(k) -> str:
    """A dict key as JSON names it (``None`` → ``"null"``, ``True`` → ``"true"``, ``3`` → ``"3"``)."""
    if isinstance(k, str):
        return k
    return json.dumps(k) if k is None or isinstance(k, bool) else str(k)  # as json.dumps names them


def _plain(obj, convert: Callable | None, finite_only: bool):
    """:func:`to_json`'s walk; ``finite_only=False`` keeps NaN/±inf (to find where they are)."""
    if convert is not None:
        obj = convert(obj)
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) or not finite_only else None
    if isinstance(obj, Mapping):
        return {_key(k): _plain(v, convert, finite_only) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, convert, finite_only) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy / torch scalars and arrays
        return _plain(obj.tolist(), convert, finite_only)
    return obj  # anything else: json.dumps says it cannot encode it


def to_json(obj: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as plain JSON types: NaN and ±inf → None, numpy/torch numbers → Python, Paths → str,
    tuples → lists, dict keys → str. ``convert`` is applied to every value first (e.g. table cells → dicts)."""
    return _plain(obj, convert, finite_only=True)


def write_json(obj: Any, path: str | Path, indent: int = 1, convert: Callable[[Any], Any] | None = None) -> Path:
    """Write :func:`to_json` of ``obj`` to ``path`` as strict JSON (no bare NaN/Infinity); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(obj, convert), indent=indent, allow_nan=False))
    return path


# --------------------------------------------------------------------------- threads


@contextlib.contextmanager
def pinned_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, restoring the previous count after (None: leave as is)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- cached evaluation

ROWS_FILE = "rows.json"
NONFINITE_FILE = "nonfinite.json"
"""Where the NaN/±inf of the cached rows were (rows.json itself holds ``null`` there)."""


def _nonfinite(obj, path=()) -> Iterator[list]:
    """``[path, "nan" | "inf" | "-inf"]`` of every non-finite float in plain JSON data."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            yield [list(path), str(obj)]
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nonfinite(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nonfinite(v, (*path, i))


def _restore_nonfinite(obj, holes: list) -> None:
    """Put the floats :func:`_nonfinite` listed back into ``obj`` (in place)."""
    for path, value in holes:
        node = obj
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = float(value)


def cached_rows(key: Any, name: str, compute: Callable[[], list[dict]], *,
                on_reuse: Callable[[], None] | None = None) -> list[dict]:
    """Rows measured once per ``key``: reused from ``evals/<name>-<hash of key>/rows.json`` when that artifact
    is complete (``on_reuse`` is called first), else ``compute()``d, written as strict JSON and marked complete.

    Rows come back as computed: ``nonfinite.json`` beside ``rows.json`` says where the NaN/±inf were
    (``rows.json`` holds ``null`` there); files written before it existed (bare ``NaN``) are read as they are.
    """
    from lit_domino import cache

    directory = cache.artifact_dir("evals", key, name=name)
    if cache.is_complete(directory):
        if on_reuse is not None:
            on_reuse()
        rows = json.loads((directory / ROWS_FILE).read_text())  # json.loads also reads the old bare NaN
        holes = directory / NONFINITE_FILE
        if holes.is_file():
            _restore_nonfinite(rows, json.loads(holes.read_text()))
        return rows
    rows = compute()
    write_json(rows, directory / ROWS_FILE)
    write_json(list(_nonfinite(_plain(rows, None, finite_only=False))), directory / NONFINITE_FILE)
    cache.mark_complete(directory, key)
    return rows


# --------------------------------------------------------------------------- benchmark rows → metrics

POSITIONS = "acc_rate_pos_*"
"""Every per-position acceptance rate of a row (``acc_rate_pos_01``, ``acc_rate_pos_02``, ...)."""
DECODE_KEYS = ("tau", "speedup", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round", "backbone_tau",
               POSITIONS)
"""Keys logged per benchmark (``{benchmark}/{key}``)."""
MEAN_KEYS = ("tau", "speedup", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round", POSITIONS)
"""Keys logged as their mean over benchmarks under the bare name (``backbone_tau`` only per benchmark)."""


def finite(x) -> bool:
    """True for a real, finite number (not None, NaN, ±inf, a bool or a string)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _expand(keys: Iterable[str], rows: Iterable[Mapping]) -> list[str]:
    """``keys`` with each ``prefix*`` replaced by the rows' keys of that prefix (sorted)."""
    rows = list(rows)
    out = []
    for key in keys:
        if key.endswith("*"):
            out += sorted({k for r in rows for k in r if k.startswith(key[:-1])})
        else:
            out.append(key)
    return out


def row_metrics(rows: Iterable[Mapping], keys: Sequence[str], by: str | Callable[[Mapping], Any] = "benchmark",
                sep: str = "/") -> dict[str, float]:
    """One metric per row and key: ``sep.join(by(row) parts + [key])`` → float, non-finite values skipped.

    ``by``: a row key (``"benchmark"``) or a function of the row giving a name part or a tuple of parts;
    a key ending in ``*`` stands for every key of the row with that prefix. Rows that share a name: last wins.
    """
    out: dict[str, float] = {}
    for r in rows:
        parts = r[by] if isinstance(by, str) else by(r)
        parts = tuple(parts) if isinstance(parts, (tuple, list)) else (parts,)
        for key in _expand(keys, [r]):
            if finite(r.get(key)):
                out[sep.join(str(p) for p in (*parts, key))] = float(r[key])
    return out


def drafter_metrics(rows: Iterable[Mapping], *, keys: Sequence[str] = DECODE_KEYS,
                    mean_keys: Sequence[str] = MEAN_KEYS, overall: Mapping | None = None,
                    by: str | Callable[[Mapping], Any] = "benchmark") -> dict[str, float]:
    """One drafter's benchmark rows → its MLflow metrics, non-finite values skipped.

    ``{benchmark}/{key}`` for ``keys`` (per-position rates included), then the bare ``mean_keys``: the mean
    over the rows (one per benchmark) of the finite values, or, with ``overall`` (a summary pooled over all
    prompts), that row's values. Pass only the drafter's rows (one temperature, one row per benchmark).
    """
    rows = list(rows)
    metrics = row_metrics(rows, keys, by)
    source = rows if overall is None else [overall]
    for key in _expand(mean_keys, source):
        values = [float(r[key]) for r in source if finite(r.get(key))]
        if values:
            metrics[key] = sum(values) / len(values)
    return metrics


def mlflow_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ :]", "_", name)


def log_metrics(client, run_id: str, metrics: Mapping[str, float], step: int = 0) -> int:
    """Log ``metrics`` (non-finite values skipped) to run ``run_id`` with an ``MlflowClient``, in batches of
    at most 1000 (MLflow's limit); returns how many were logged."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    items = [Metric(k, float(v), stamp, step) for k, v in metrics.items() if finite(v)]
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i:i + 1000])
    return len(items)


# --------------------------------------------------------------------------- the bench command

BENCH_KEYS = ("tau", "accepted_per_round", "speedup", "tpot_ms", "speedup_vs_hf_generate", "match_baseline",
              POSITIONS)
"""The bench run's metrics per ``{benchmark}/{method}/T{temperature}``."""
BENCH_COLUMNS = ["benchmark", "method", "temperature", "block_size", "tau", "accepted_per_round", "speedup",
                 "speedup_vs_hf_generate", "tpot_ms", "match_baseline"]


def load_target_spec(spec: str, device: str, dtype: str):
    """``random`` (a random 8-layer, 192-wide, 4096-vocabulary Qwen3) or anything :func:`load_target` takes."""
    if spec == "random":
        from lit_domino.testing import random_target

        target = random_target(vocab_size=4096, hidden_size=192, num_layers=8, max_positions=4096)
        target.model.generation_config.eos_token_id = None
        return target
    from lit_domino.target import load_target

    return load_target(spec, dtype=dtype, device=device)


def load_drafters(spec: str, target, device: str) -> dict:
    """``name=path[,name=path...]`` → ``{name: drafter}``; ``path`` may be ``random:<kind>`` (randomly initialised)."""
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
    """``name[:n],...`` of :mod:`lit_domino.data.benchmarks`, or ``random:N`` (N random 32-token prompts)."""
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


def assistant_model(peers: str, assistant: str | None, drafters: dict, device: str):
    """The HF model of the ``assisted`` peer: a small-LM drafter's ``.lm`` (by name) or an HF model directory."""
    if "assisted" not in peers:
        return None
    if not assistant:
        raise SystemExit("--peers assisted needs --assistant (a small_lm drafter name or an HF model directory)")
    if assistant in drafters:
        lm = getattr(drafters[assistant], "lm", None)
        if lm is None:
            raise SystemExit(f"--assistant {assistant!r} is not a small_lm drafter (it has no .lm)")
        return lm
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(assistant).to(device).eval()


def run_bench(options: Mapping | Any) -> list[dict]:
    """The benchmark command: decode, write ``<out>/bench-<time>.md`` + ``.json``, log one MLflow run.

    ``options``: the options of ``experiments/bench.py`` (an ``argparse.Namespace`` or a dict with the same
    names); they are the run's params and the JSON's ``args``. Returns the benchmark rows.
    """
    from lit_domino.decoding import DLoopConfig, benchmark
    from lit_domino.decoding.metrics import markdown_table

    args = dict(options if isinstance(options, Mapping) else vars(options))
    with pinned_threads(args["threads"] or None):
        import torch

        temperatures = [float(t) for t in args["temperatures"].split(",") if t.strip()]
        dloops = [DLoopConfig.parse(s) for s in args["dloop"].split(",") if s.strip()] or [None]
        peers = [s.strip() for s in args["peers"].split(",") if s.strip()]
        target = load_target_spec(args["target"], args["device"], args["dtype"])
        drafters = load_drafters(args["drafters"], target, args["device"])
        prompts = load_prompts(args["benchmarks"], target, args["seed"])
        rows = benchmark(target, drafters, prompts, max_new_tokens=args["max_new_tokens"], temperatures=temperatures,
                         dloops=dloops, block_size=args["block_size"], peers=peers,
                         assistant_model=assistant_model(args["peers"], args["assistant"], drafters, args["device"]),
                         prompt_lookup_num_tokens=args["prompt_lookup_tokens"], hf_baseline=not args["no_hf_baseline"],
                         seed=args["seed"], progress=not args["no_progress"])
        threads = torch.get_num_threads()
    table = markdown_table(rows, BENCH_COLUMNS)
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    header = (f"# Speculative decoding benchmark\n\ntarget `{args['target']}`, max_new_tokens {args['max_new_tokens']}, "
              f"torch threads {threads}. speedup = mean TPOT of our AR baseline / mean TPOT "
              "(prefill excluded, same process, same prompts); tau includes the bonus token.\n\n")
    md_path.write_text(header + table + "\n")
    write_json({"args": args, "rows": rows}, json_path, indent=2)
    print(table)
    print(f"\nwrote {md_path} and {json_path}")
    if not args["no_mlflow"]:
        print(f"MLflow run {_log_bench(args, rows, md_path, json_path)}")
    return rows


def _log_bench(args: dict, rows: list[dict], md_path: Path, json_path: Path) -> str:
    """The bench's MLflow run: options as params, ``{benchmark}/{method}/T{t}/{key}`` metrics, both files."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri, mlflow_run

    metrics = row_metrics(rows, BENCH_KEYS, by=lambda r: (r["benchmark"], r["method"], f"T{r['temperature']:g}"))
    with mlflow_run(args["experiment"], run_name=f"bench-{time.strftime('%Y%m%d-%H%M%S')}",
                    tags={"table": "bench", "target": args["target"]}) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in args.items()})
        log_metrics(MlflowClient(default_tracking_uri()), run.info.run_id,
                    {mlflow_name(k): v for k, v in metrics.items()})
        mlflow.log_artifact(str(md_path))
        mlflow.log_artifact(str(json_path))
        return run.info.run_id
