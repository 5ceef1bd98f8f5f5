"""Throughput and latency of an OpenAI-compatible server under concurrency: ``experiments/serve_bench.py``.

The suite's own engine (``lit_domino.decoding``) is the batch-1 reference that defines τ and
speedup exactly; deployed throughput with many requests in flight is the serving engines' job
(vLLM and SGLang batch speculative decoding with CUDA graphs). This drives any such endpoint at
concurrency 1, 2, 4, ... on a benchmark's prompts (the Domino paper measured 2-32 concurrent requests
on SGLang) and, with ``baseline``, the same target served without speculation, level by level in
turn, so both see the same machine state. Per level: output tokens/s (all output tokens over the
level's wall time) and request latency (mean, p50, p90). Greedy outputs of both servers should be
the same text (``match_baseline``: the fraction that is; batched GPU kernels can flip near-ties).

Everything is measured before anything is written: an unreachable URL fails before the first
request (after the client's retries), and the Markdown, JSON and MLflow run appear only when every
level has finished.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.inputs import check_positive, check_server, parse_json_object
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.serving import ServerClient, ServerError

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32)
"""Concurrency levels measured by default."""
SERVE_COLUMNS = ["server", "concurrency", "requests", "output_tokens", "seconds", "tokens_per_s", "speedup",
                 "latency_mean_s", "latency_p50_s", "latency_p90_s", "match_baseline"]
SERVE_KEYS = ("tokens_per_s", "speedup", "latency_mean_s", "latency_p50_s", "latency_p90_s", "match_baseline",
              "output_tokens", "seconds")
"""The MLflow metrics per ``{server}/c{concurrency}``."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between order statistics (NumPy's default)."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_levels(spec: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]`` (each >= 1)."""
    try:
        levels = [int(x) for x in spec.split(",") if x.strip()] if isinstance(spec, str) else [int(x) for x in spec]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise UsageError(f"--concurrency: levels must be positive integers (e.g. 1,2,4), got {spec!r}")
    return levels


def benchmark_messages(spec: str, seed: int = 0) -> list[list[dict]]:
    """The first user turn of each prompt of ``name[:n],...`` (:mod:`lit_domino.data.benchmarks`) as chat messages."""
    from lit_domino.data.benchmarks import load_benchmark, parse_benchmark_list  # datasets: only when measuring

    try:
        names = parse_benchmark_list(spec)
    except ValueError as err:
        raise UsageError(f"--benchmarks: {err}") from None
    out = []
    for name, n in names:
        out += [[{"role": "user", "content": p.turns[0]}] for p in load_benchmark(name, n, seed=seed)]
    if not out:
        raise UsageError(f"--benchmarks {spec!r} gave no prompts")
    return out


def measure_level(client: ServerClient, prompts: list[list[dict]], concurrency: int, *, max_tokens: int,
                  temperature: float = 0.0, chat_template_kwargs: dict | None = None) -> tuple[dict, list[str]]:
    """One concurrency level: ``max(len(prompts), concurrency)`` requests (prompts cycled) with ``concurrency`` in
    flight; returns the row and the answers' texts (in request order)."""
    n = max(len(prompts), concurrency)
    jobs = [prompts[i % len(prompts)] for i in range(n)]

    def one(messages):
        return client.chat(messages, max_tokens=max_tokens, temperature=temperature,
                           chat_template_kwargs=chat_template_kwargs)

    t0 = time.perf_counter()
    done = client.map(one, jobs, concurrency)
    wall = time.perf_counter() - t0
    if any(c.completion_tokens is None for c in done):
        raise ServerError(client.url, f"the server at {client.url} reports no usage.completion_tokens; "
                                      "serve_bench counts output tokens from it")
    tokens = sum(c.completion_tokens for c in done)
    lat = [c.latency_s for c in done]
    row = {"concurrency": concurrency, "requests": n, "output_tokens": tokens, "seconds": wall,
           "tokens_per_s": tokens / wall if wall > 0 else math.nan, "latency_mean_s": sum(lat) / len(lat),
           "latency_p50_s": percentile(lat, 50), "latency_p90_s": percentile(lat, 90)}
    return row, [c.text for c in done]


def serve_bench(servers: Mapping[str, ServerClient], prompts: list[list[dict]], levels: Sequence[int], *,
                max_tokens: int, temperature: float = 0.0, chat_template_kwargs: dict | None = None,
                baseline: str | None = None, warmup: int = 1, progress: bool = True) -> list[dict]:
    """Rows for every server and level (levels outer, servers inner: measured in turn); with ``baseline`` (a key of
    ``servers``) each other row gets ``speedup`` (its tokens/s over the baseline's at that level) and
    ``match_baseline``."""
    for client in servers.values():
        client.served_model()  # every URL answers before the first measurement
    for client in servers.values():
        for _ in range(warmup):  # first requests pay for lazy loading and compilation
            client.chat(prompts[0], max_tokens=max_tokens, temperature=temperature,
                        chat_template_kwargs=chat_template_kwargs)
    rows = []
    for c in levels:
        texts = {}
        for name, client in servers.items():
            row, texts[name] = measure_level(client, prompts, c, max_tokens=max_tokens, temperature=temperature,
                                             chat_template_kwargs=chat_template_kwargs)
            rows.append({"server": name, "url": client.url, "model": client.model, **row})
            if progress:
                print(f"[serve_bench] {name} c={c}: {row['tokens_per_s']:.1f} tok/s, "
                      f"p50 {row['latency_p50_s']:.3f} s", flush=True)
        if baseline is not None:
            base = next(r for r in rows if r["server"] == baseline and r["concurrency"] == c)
            for r in rows:
                if r["concurrency"] == c:
                    r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else math.nan
                    same = [a == b for a, b in zip(texts[r["server"]], texts[baseline])]
                    r["match_baseline"] = sum(same) / len(same)
    return rows


def check_options(args: Mapping) -> tuple[list[int], dict | None]:
    """The cheap checks, before any prompt is loaded: levels, numbers, JSON, and every URL answers now (one
    ``GET /v1/models`` each, a few seconds at most) -> (levels, chat template kwargs)."""
    levels = parse_levels(args["concurrency"])
    kwargs = parse_json_object(args.get("chat_template_kwargs"), "--chat-template-kwargs")
    check_positive(args.get("max_tokens"), "--max-tokens")
    check_positive(args.get("warmup"), "--warmup", 0)
    check_positive(args.get("retries"), "--retries", 0)
    if args.get("timeout") is not None and not args["timeout"] > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args['timeout']}")
    if args.get("temperature") is not None and not args["temperature"] >= 0:
        raise UsageError(f"--temperature must be >= 0, got {args['temperature']}")
    check_server(args["url"], "--url")
    if args.get("baseline"):
        check_server(args["baseline"], "--baseline")
    return levels, kwargs


def run_serve_bench(options: Mapping | Any) -> list[dict]:
    """The command: measure, then write ``<out>/serve_bench-<time>.md`` + ``.json`` and log one MLflow run.

    ``options``: ``experiments/serve_bench.py``'s options (an ``argparse.Namespace`` or a dict): url, model,
    baseline, baseline_model, benchmarks, concurrency, max_tokens, temperature, chat_template_kwargs (JSON),
    retries, timeout, warmup, seed, out, experiment, no_mlflow, no_progress.
    """
    args = dict(options if isinstance(options, Mapping) else vars(options))
    levels, kwargs = check_options(args)
    prompts = benchmark_messages(args["benchmarks"], seed=args.get("seed", 0))
    client_kw = {"retries": args.get("retries", 3), "timeout_s": args.get("timeout", 600.0)}
    servers = {"speculative": ServerClient(args["url"], model=args.get("model"), **client_kw)}
    if args.get("baseline"):
        servers["baseline"] = ServerClient(args["baseline"], model=args.get("baseline_model"), **client_kw)
    rows = serve_bench(servers, prompts, levels, max_tokens=args["max_tokens"], temperature=args.get("temperature", 0.0),
                       chat_template_kwargs=kwargs, baseline="baseline" if "baseline" in servers else None,
                       warmup=args.get("warmup", 1), progress=not args.get("no_progress"))
    from lit_domino.decoding.harness import markdown_table
    from lit_domino.runtime.cache import write_text_atomic
    from lit_domino.runtime.jsonio import write_json

    table = markdown_table(rows, SERVE_COLUMNS)
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    stem = f"serve_bench-{time.strftime('%Y%m%d-%H%M%S')}"
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    names = ", ".join(f"{k} `{c.url}` ({c.model})" for k, c in servers.items())
    header = (f"# Serving throughput under concurrency\n\n{names}; benchmarks `{args['benchmarks']}` "
              f"({len(prompts)} prompts, first turn), max_tokens {args['max_tokens']}, temperature "
              f"{args.get('temperature', 0.0):g}. tokens_per_s = output tokens of a level / its wall time; latency per "
              "request; speedup = tokens_per_s / the baseline's at the same concurrency.\n\n")
    write_text_atomic(md_path, header + table + "\n")
    write_json({"args": args, "rows": rows}, json_path, indent=2)
    print(table)
    print(f"\nwrote {md_path} and {json_path}")
    if not args.get("no_mlflow"):
        print(f"MLflow run {_log(args, rows, md_path, json_path)}")
    return rows


def _log(args: dict, rows: list[dict], md_path: Path, json_path: Path) -> str:
    """One MLflow run: options as params, ``{server}/c{concurrency}/{key}`` metrics, both files as artifacts."""
    from lit_domino.studies.common import log_command_run
    from lit_domino.decoding.metric_names import row_metrics

    metrics = row_metrics(rows, SERVE_KEYS, by=lambda r: (r["server"], f"c{r['concurrency']}"))
    tags = {"table": "serve_bench", "server": args["url"], "baseline": args.get("baseline") or ""}
    return log_command_run(args["experiment"], md_path.stem, tags, args, metrics, [md_path, json_path])


# --------------------------------------------------------------------------- the command

COMMAND_DOC = """Serving throughput under concurrency: any OpenAI-compatible endpoint against one without speculation.

    # on a GPU box: the target with a drafter, and the target alone (see docs/serving.md)
    python experiments/serve_bench.py --url http://localhost:8000 --baseline http://localhost:8001 \\
        --benchmarks gsm8k:64,humaneval:64 --concurrency 1,2,4,8,16,32 --max-tokens 512

    # on CPU, a local transformers serve of a model directory (no speculation; checks the pipeline)
    transformers serve DIR --device cpu --dtype float32 --port 8000 &
    python experiments/serve_bench.py --url http://localhost:8000 --benchmarks embedded-math:8 --concurrency 1,2

Reports per concurrency level output tokens/s and request latency (mean, p50, p90), and the speedup
over the baseline; writes results/serve_bench-<time>.md + .json and one MLflow run (experiment
`serve_bench`). An unreachable URL is an error before anything is written.
"""
"""The command's description and epilog, and ``experiments/serve_bench.py``'s docstring (tests/test_entry_points.py)."""
PROG = "serve_bench.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser.from_doc(PROG, COMMAND_DOC)
    p.add_argument("--url", required=True, help="the (speculative) server, e.g. http://localhost:8000")
    p.add_argument("--model", default=None, help="its served model name (default: its first model)")
    p.add_argument("--baseline", default=None, help="the same target served without speculation")
    p.add_argument("--baseline-model", default=None, help="the baseline's served model name")
    p.add_argument("--benchmarks", default="embedded-math:32",
                   help="name[:n],... from lit_domino.data.benchmarks (default embedded-math:32)")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="concurrency levels (default 1,2,4,8,16,32)")
    p.add_argument("--max-tokens", type=int, default=256, help="answer budget per request (default 256)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chat-template-kwargs", default='{"enable_thinking": false}',
                   help="JSON for the server's chat template (default: Qwen3 thinking off, as the suite); '' = none")
    p.add_argument("--retries", type=int, default=3, help="retries per request, with backoff (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--warmup", type=int, default=1, help="requests per server before measuring (default 1)")
    p.add_argument("--seed", type=int, default=0, help="benchmark shuffle seed")
    p.add_output_flags(str(project_root() / "results"), "serve_bench")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse, check the options and that every URL answers, then measure; errors are one line."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    return run_serve_bench(parse_args(argv))
