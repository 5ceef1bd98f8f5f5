"""Benchmark loaders: hub schemas read from hand-made local fixtures, the seed-0 protocol, offline errors.

``fixtures/*.jsonl`` are small files written by hand in each hub dataset's
schema (same columns and types, invented content). Nothing here touches the
network: the autouse fixture puts ``datasets`` and ``huggingface_hub`` in
offline mode.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from lit_domino.data.benchmarks import (
    BENCHMARKS,
    BenchmarkPrompt,
    load_benchmark,
    parse_benchmark_list,
)

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_FILE = {
    "gsm8k": "gsm8k.jsonl",
    "math500": "math500.jsonl",
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "humaneval": "humaneval.jsonl",
    "mbpp": "mbpp.jsonl",
    "livecodebench": "livecodebench.jsonl",
    "mt-bench": "mt_bench.jsonl",
    "alpaca": "alpaca.jsonl",
}
HUB = [name for name, spec in BENCHMARKS.items() if spec.hub_id]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Offline mode for the env vars and for the flags both libraries read at import time."""
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    # keep the datasets cache of the fixture loads out of the user's cache
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / FIXTURE_FILE[name]).read_text().splitlines()]


def expected_order(name: str, n: int, seed: int = 0) -> list[dict]:
    """The protocol spelled out independently: ``Dataset.shuffle(seed)``, then the first n."""
    import datasets

    data = rows(name)
    ds = datasets.Dataset.from_dict({"i": list(range(len(data)))}).shuffle(seed=seed)
    return [data[i] for i in ds["i"][:n]]


# ---- names and lists -------------------------------------------------------------------------


def test_every_hub_benchmark_has_a_fixture_and_the_papers_count():
    assert set(HUB) == set(FIXTURE_FILE)
    counts = {name: BENCHMARKS[name].default_n for name in HUB}
    assert counts == {
        "gsm8k": 128, "math500": 128, "aime24": 30, "aime25": 30, "humaneval": 164,
        "mbpp": 128, "livecodebench": 128, "mt-bench": 80, "alpaca": 128,
    }


def test_parse_benchmark_list():
    assert parse_benchmark_list("gsm8k:128,humaneval:164,embedded-math") == [
        ("gsm8k", 128), ("humaneval", 164), ("embedded-math", None)
    ]
    assert parse_benchmark_list(" mt-bench : 5 , alpaca ") == [("mt-bench", 5), ("alpaca", None)]
    assert parse_benchmark_list("") == []
    for bad in ("gsm8k:0", "gsm8k:x", "gsm8k:-1", "gsm8k,,alpaca"):
        with pytest.raises(ValueError):
            parse_benchmark_list(bad)
    with pytest.raises(ValueError, match="known benchmarks: .*gsm8k.*embedded-math"):
        parse_benchmark_list("gsm8k,nope")


def test_unknown_benchmark_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown benchmark 'nope'.*gsm8k.*mt-bench.*embedded-chat"):
        load_benchmark("nope")


# ---- hub loaders on local files --------------------------------------------------------------


@pytest.mark.parametrize("name", HUB)
def test_hub_loader_reads_its_schema_with_the_seed0_protocol(name):
    spec = BENCHMARKS[name]
    got = load_benchmark(name, n=4, data_files=str(FIXTURES / FIXTURE_FILE[name]))
    want = expected_order(name, 4)
    assert len(got) == 4 and all(isinstance(p, BenchmarkPrompt) for p in got)
    assert all(p.benchmark == name and p.domain == spec.domain for p in got)
    assert all(p.turns and all(isinstance(t, str) and t.strip() for t in p.turns) for p in got)
    if spec.id_field:
        assert [p.uid for p in got] == [f"{name}/{r[spec.id_field]}" for r in want]
    # the first turn carries the row's question text
    for p, r in zip(got, want):
        question = r[spec.prompt_field]
        assert (question[0] if isinstance(question, list) else question) in p.turns[0]


def test_gsm8k_reference_is_the_final_number():
    got = load_benchmark("gsm8k", n=6, data_files=str(FIXTURES / "gsm8k.jsonl"))
    by_question = {r["question"]: r for r in rows("gsm8k")}
    for p in got:
        assert p.reference == by_question[p.turns[0]]["answer"].split("####")[-1].strip().replace(",", "")
        assert p.uid.startswith("gsm8k/")
    assert "1500" in {p.reference for p in got}  # "1,500" in the file


def test_row_formatting_per_benchmark():
    load = lambda name, n=5: load_benchmark(name, n=n, data_files=str(FIXTURES / FIXTURE_FILE[name]))  # noqa: E731
    for p in load("mt-bench"):
        assert len(p.turns) == 2
    refs = {p.uid: p.reference for p in load("mt-bench")}
    assert refs["mt-bench/1001"] == "51\n\n17" and refs["mt-bench/1000"] is None
    for p in load("humaneval"):
        code = p.turns[0].split("```python\n")[1].split("```")[0]
        ast.parse(code + p.reference)  # prompt + canonical solution is a program
    for p in load("mbpp"):
        assert "Your code should pass these tests:" in p.turns[0] and "assert " in p.turns[0]
    for p in load("livecodebench"):
        assert p.reference is None
        assert ("class Solution" in p.turns[0]) == (p.uid in {"livecodebench/1001", "livecodebench/1002"})
    alpaca = {p.reference: p for p in load("alpaca", 6)}
    assert alpaca["Bonjour."].turns[0] == "Translate the sentence into French.\n\nGood morning."
    assert alpaca["Rome."].turns[0] == "Name the capital of Italy."
    assert {p.uid for p in alpaca.values()} == {f"alpaca/{i}" for i in range(6)}


def test_seed_changes_the_sample_and_n_defaults_to_the_papers_count(tmp_path):
    path = str(FIXTURES / "alpaca.jsonl")
    a = load_benchmark("alpaca", n=6, data_files=path)
    b = load_benchmark("alpaca", n=6, data_files=path, seed=1)
    assert a == load_benchmark("alpaca", n=6, data_files=path)
    assert [p.uid for p in a] != [p.uid for p in b] and set(a) == set(b)
    assert [p.uid for p in load_benchmark("alpaca", n=3, data_files=path, seed=1)] == [
        f"alpaca/{rows('alpaca').index(r)}" for r in expected_order("alpaca", 3, seed=1)
    ]
    with pytest.raises(ValueError, match="has 6 prompts; asked for n=128"):
        load_benchmark("alpaca", data_files=path)


def test_parquet_file_reads_like_jsonl(tmp_path):
    import datasets

    parquet = tmp_path / "gsm8k.parquet"
    datasets.Dataset.from_list(rows("gsm8k")).to_parquet(str(parquet))
    jsonl = load_benchmark("gsm8k", n=5, data_files=str(FIXTURES / "gsm8k.jsonl"))
    assert load_benchmark("gsm8k", n=5, data_files=[str(parquet)]) == jsonl


def test_missing_column_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps({"text": "hi", "answer": "#### 1"}) for _ in range(3)))
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['question'\]"):
        load_benchmark("gsm8k", n=2, data_files=str(bad))


# ---- offline ---------------------------------------------------------------------------------


def test_offline_hub_names_the_embedded_alternative():
    """A real load_dataset call in offline mode (nothing cached): fails fast with a useful message."""
    with pytest.raises(RuntimeError) as err:
        load_benchmark("gsm8k")
    message = str(err.value)
    assert "'gsm8k'" in message and "unreachable" in message and "use embedded-math" in message


@pytest.mark.parametrize("name", HUB)
def test_every_hub_failure_names_its_domains_embedded_set(name, monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    alternative = {"math": "embedded-math", "code": "embedded-code", "chat": "embedded-chat"}[BENCHMARKS[name].domain]
    if name == "humaneval":
        alternative = "embedded-humaneval"
    with pytest.raises(RuntimeError, match=f"'{name}'.*unreachable.*use {alternative} "):
        load_benchmark(name)


# ---- embedded sets ---------------------------------------------------------------------------


def test_embedded_sets_work_offline():
    math_set = load_benchmark("embedded-math")
    assert len(math_set) == 128 and all(p.reference.isdigit() for p in math_set)
    assert load_benchmark("embedded-math", seed=0) == math_set
    assert load_benchmark("embedded-math", seed=1) != math_set

    for p in load_benchmark("embedded-code", n=40):
        code = p.turns[0].split("```python\n")[1].split("```")[0]
        ast.parse(code + p.reference)

    chat_set = load_benchmark("embedded-chat")
    assert len(chat_set) == 80 and any(len(p.turns) == 2 for p in chat_set)
    assert all(p.domain == "chat" and p.reference for p in chat_set)

    humaneval = load_benchmark("embedded-humaneval")
    assert len(humaneval) == 164 and len({p.uid for p in humaneval}) == 164
    assert [p.uid for p in humaneval] != [f"embedded-humaneval/HumanEval/{i}" for i in range(164)]  # seed-0 shuffle
    with pytest.raises(ValueError, match="embedded set"):
        load_benchmark("embedded-math", data_files="x.jsonl")
