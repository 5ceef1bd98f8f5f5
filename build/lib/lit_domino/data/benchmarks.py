"""Benchmark prompt sets: the papers' hub benchmarks, and embedded eval sets that work offline.

Protocol (docs/METHOD.md, "The papers' evaluation protocol"): each benchmark is
shuffled with seed 0 and its first N prompts are used, N being the papers'
count unless the caller gives one. ``load_benchmark(name, data_files=...)``
reads a local file in the hub schema instead of the hub (that is how the tests
run offline, and how users with a private mirror run).

Hub ids, configs, splits and columns were checked against the dataset cards
(HF datasets, 2025); the notes on each spec say where a choice was made.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import datasets

from lit_domino.data.corpora import build_corpus
from lit_domino.data.corpora.code import code_prompt, humaneval_rows

DOMAINS = ("math", "code", "chat")


@dataclass(frozen=True)
class BenchmarkPrompt:
    """One benchmark item: the user turns to answer in order, and the gold answer if the benchmark has one."""

    benchmark: str
    domain: str
    turns: tuple[str, ...]
    uid: str
    reference: str | None = None


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives and which columns hold what.

    ``hub_id`` None marks an embedded set (built in-process, no hub).
    ``hub_files``: raw files inside the hub repo to read with the generic json
    loader, for repos whose own loading script ``datasets`` >= 4 refuses.
    """

    name: str
    domain: str
    default_n: int  # the papers' sample count (docs/METHOD.md)
    hub_id: str | None = None
    config: str | None = None
    split: str | None = None
    prompt_field: str | None = None
    reference_field: str | None = None
    id_field: str | None = None  # None: the row's position in the unshuffled set
    hub_files: tuple[str, ...] = ()
    extra_fields: tuple[str, ...] = ()  # other columns the row formatter reads


_LCB = "hf://datasets/livecodebench/code_generation_lite/"

BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec("gsm8k", "math", 128, "openai/gsm8k", "main", "test", "question", "answer"),
        BenchmarkSpec("math500", "math", 128, "HuggingFaceH4/MATH-500", None, "test", "problem", "answer", "unique_id"),
        BenchmarkSpec("aime24", "math", 30, "HuggingFaceH4/aime_2024", None, "train", "problem", "answer", "id"),
        # AIME 2025: math-ai/aime25 (30 rows, I and II together, columns problem/answer/id);
        # yentinglin/aime_2025 holds the same problems, but math-ai/aime25 is the one
        # most evaluation harnesses load, so results compare directly.
        BenchmarkSpec("aime25", "math", 30, "math-ai/aime25", None, "test", "problem", "answer", "id"),
        BenchmarkSpec("humaneval", "code", 164, "openai/openai_humaneval", None, "test", "prompt", "canonical_solution", "task_id"),
        BenchmarkSpec(
            "mbpp", "code", 128, "google-research-datasets/mbpp", "sanitized", "test", "prompt", "code", "task_id",
            extra_fields=("test_list",),
        ),
        # The repo's own loader is a script (refused by datasets >= 4), so the raw
        # JSONL files of all releases (v1..v6, "release_latest") are read directly.
        BenchmarkSpec(
            "livecodebench", "code", 128, "livecodebench/code_generation_lite", None, "train",
            "question_content", None, "question_id",
            hub_files=tuple(f"{_LCB}test{i}.jsonl" for i in ("", "2", "3", "4", "5", "6")),
            extra_fields=("starter_code",),
        ),
        BenchmarkSpec("mt-bench", "chat", 80, "HuggingFaceH4/mt_bench_prompts", None, "train", "prompt", "reference", "prompt_id"),
        BenchmarkSpec("alpaca", "chat", 128, "tatsu-lab/alpaca", None, "train", "instruction", "output", extra_fields=("input",)),
        # Embedded sets: default counts follow the hub benchmark of the same domain
        # (GSM8K 128, MBPP 128, MT-Bench 80, HumanEval 164).
        BenchmarkSpec("embedded-math", "math", 128),
        BenchmarkSpec("embedded-code", "code", 128),
        BenchmarkSpec("embedded-chat", "chat", 80),
        BenchmarkSpec("embedded-humaneval", "code", 164),
    )
}

# What to run instead when the hub cannot be reached.
EMBEDDED_ALTERNATIVE = {"math": "embedded-math", "code": "embedded-code", "chat": "embedded-chat"}
_OFFLINE_ALTERNATIVE = {"humaneval": "embedded-humaneval"}


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(BENCHMARKS)}")


def parse_benchmark_list(spec: str) -> list[tuple[str, int | None]]:
    """``"gsm8k:128,humaneval:164,embedded-math"`` → ``[("gsm8k", 128), ("humaneval", 164), ("embedded-math", None)]``.

    An empty string is an empty list; unknown names and counts that are not
    positive integers are errors.
    """
    out: list[tuple[str, int | None]] = []
    if not spec.strip():
        return out
    for item in spec.split(","):
        name, sep, count = item.strip().partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"empty benchmark name in {spec!r}")
        if name not in BENCHMARKS:
            raise _unknown(name)
        n = None
        if sep:
            if not count.strip().isdigit() or int(count) < 1:
                raise ValueError(f"benchmark count must be a positive integer, got {item.strip()!r}")
            n = int(count)
        out.append((name, n))
    return out


# ---- row formatters: one hub row → (turns, reference) -------------------------------------------


def _gsm8k_reference(answer: str) -> str:
    """GSM8K answers end with ``#### 1,234``; the gold answer is the number (commas dropped)."""
    final = answer.rsplit("####", 1)[-1]
    return final.strip().replace(",", "")


def _code_prompt(code: str) -> str:
    return code_prompt(code)


def _mbpp_prompt(row: dict) -> str:
    # The original MBPP prompt: the task, then the asserts the function must pass
    # (they fix the function's name and signature).
    tests = "\n".join(row.get("test_list") or [])
    return f"{row['prompt']}\nYour code should pass these tests:\n\n{tests}" if tests else row["prompt"]


def _lcb_prompt(row: dict) -> str:
    # LiveCodeBench's two prompt shapes: complete a starter stub (LeetCode) or
    # write a stdin/stdout program (AtCoder, Codeforces).
    starter = (row.get("starter_code") or "").strip()
    if starter:
        return (
            f"{row['question_content']}\n\nUse the following starter code and enclose your solution "
            f"in a ```python block.\n\n```python\n{starter}\n```"
        )
    return (
        f"{row['question_content']}\n\nRead the input from standard input and write the answer to "
        "standard output. Enclose your solution in a ```python block."
    )


def _alpaca_prompt(row: dict) -> str:
    extra = (row.get("input") or "").strip()
    return f"{row['instruction']}\n\n{extra}" if extra else row["instruction"]


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):  # MT-Bench: one reference per turn, often empty
        parts = [str(v) for v in value if v]
        return "\n\n".join(parts) if parts else None
    return str(value)


_TURNS: dict[str, Callable[[dict], tuple[str, ...]]] = {
    "humaneval": lambda row: (_code_prompt(row["prompt"]),),
    "mbpp": lambda row: (_mbpp_prompt(row),),
    "livecodebench": lambda row: (_lcb_prompt(row),),
    "mt-bench": lambda row: tuple(row["prompt"]),
    "alpaca": lambda row: (_alpaca_prompt(row),),
}
_REFERENCE: dict[str, Callable[[dict], str | None]] = {
    "gsm8k": lambda row: _gsm8k_reference(row["answer"]),
}


def _row_prompt(spec: BenchmarkSpec, row: dict, index: int) -> BenchmarkPrompt:
    turns = _TURNS.get(spec.name, lambda r: (str(r[spec.prompt_field]),))(row)
    if spec.name in _REFERENCE:
        reference = _REFERENCE[spec.name](row)
    else:
        reference = _text(row.get(spec.reference_field)) if spec.reference_field else None
    key = row[spec.id_field] if spec.id_field else index
    return BenchmarkPrompt(spec.name, spec.domain, tuple(turns), f"{spec.name}/{key}", reference)


# ---- loading ---------------------------------------------------------------------------------


def _builder_for(files: list[str]) -> str:
    first = files[0].lower()
    for ext, builder in ((".parquet", "parquet"), (".csv", "csv"), (".json", "json"), (".jsonl", "json")):
        if first.endswith(ext) or first.endswith(ext + ".gz"):
            return builder
    raise ValueError(f"cannot tell the format of {files[0]!r}; use .jsonl, .json, .parquet or .csv")


def _load_rows(spec: BenchmarkSpec, data_files: str | list[str] | None):
    if data_files is not None:
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        if not files:
            raise ValueError(f"{spec.name}: data_files is empty")
        return datasets.load_dataset(_builder_for(files), data_files=files, split="train")
    try:
        if spec.hub_files:
            return datasets.load_dataset("json", data_files=list(spec.hub_files), split="train")
        return datasets.load_dataset(spec.hub_id, spec.config, split=spec.split)
    except Exception as err:  # offline, DNS, 404, rate limit: all mean "cannot get it from the hub"
        alternative = _OFFLINE_ALTERNATIVE.get(spec.name, EMBEDDED_ALTERNATIVE[spec.domain])
        raise RuntimeError(
            f"benchmark {spec.name!r}: the Hugging Face hub is unreachable or {spec.hub_id!r} could not be "
            f"loaded ({type(err).__name__}: {err}). Offline, use {alternative} instead "
            f"(or pass data_files= with a local copy in the hub schema)."
        ) from err


def _check_columns(spec: BenchmarkSpec, columns: list[str]) -> None:
    needed = [c for c in (spec.prompt_field, spec.reference_field, spec.id_field, *spec.extra_fields) if c]
    missing = [c for c in needed if c not in columns]
    if missing:
        raise ValueError(
            f"benchmark {spec.name!r}: the data lacks column(s) {missing}; it has {columns}. "
            f"Expected the schema of {spec.hub_id}."
        )


def _take(name: str, items: list, n: int) -> list:
    if n > len(items):
        raise ValueError(f"benchmark {name!r} has {len(items)} prompts; asked for n={n}")
    return items[:n]


def _embedded(spec: BenchmarkSpec, n: int, seed: int) -> list[BenchmarkPrompt]:
    if spec.name == "embedded-humaneval":
        rows = humaneval_rows()
        random.Random(seed).shuffle(rows)
        return [
            BenchmarkPrompt(spec.name, "code", (_code_prompt(r["prompt"]),), f"{spec.name}/{r['task_id']}", r["canonical_solution"])
            for r in _take(spec.name, rows, n)
        ]
    examples = _take(spec.name, build_corpus(spec.domain, "eval", seed=seed), n)
    out = []
    for ex in examples:
        if spec.domain == "math":
            reference = ex.answer
        elif spec.domain == "code":  # the bare body, like HumanEval's canonical_solution
            reference = ex.response.removeprefix("```python\n").removesuffix("```")
        else:  # chat: the source text's answer to the last turn
            reference = ex.response
        out.append(BenchmarkPrompt(spec.name, spec.domain, ex.user_turns, ex.uid, reference))
    return out


def load_benchmark(
    name: str, n: int | None = None, *, seed: int = 0, data_files: str | list[str] | None = None
) -> list[BenchmarkPrompt]:
    """The first ``n`` prompts (default: the papers' count) of benchmark ``name`` after a ``seed`` shuffle.

    Hub sets use ``Dataset.shuffle(seed=seed)``; ``data_files`` reads a local
    json/jsonl/parquet/csv file in the hub schema instead of the hub. Embedded
    sets ignore ``data_files``. Raises ValueError for an unknown name or an
    ``n`` larger than the set, RuntimeError when the hub cannot be reached.
    """
    if name not in BENCHMARKS:
        raise _unknown(name)
    spec = BENCHMARKS[name]
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    count = spec.default_n if n is None else n
    if spec.hub_id is None:
        if data_files is not None:
            raise ValueError(f"{name} is an embedded set; data_files applies to hub benchmarks only")
        return _embedded(spec, count, seed)
    ds = _load_rows(spec, data_files)
    _check_columns(spec, list(ds.column_names))
    if count > len(ds):
        raise ValueError(f"benchmark {name!r} has {len(ds)} prompts; asked for n={count}")
    # Remember each row's original position: benchmarks without an id column use it as uid.
    ds = ds.add_column("__row_index__", list(range(len(ds))))
    ds = ds.shuffle(seed=seed).select(range(count))
    return [_row_prompt(spec, row, row["__row_index__"]) for row in ds]
