"""Hugging Face peers and the benchmark() library function (speedup rows, multi-turn prompts)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_domino.decoding import DLoopConfig, benchmark, generate
from lit_domino.decoding.hf_peers import hf_assisted, hf_generate, hf_prompt_lookup
from lit_domino.decoding.harness import markdown_table, run_prompt
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import random_target

VOCAB = 128


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


@pytest.fixture(scope="module")
def target():
    t = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, max_positions=256, seed=0)
    t.model.generation_config.eos_token_id = None
    return t


@pytest.fixture(scope="module")
def small_lm(target):
    torch.manual_seed(0)
    return build_drafter(drafter_config("small_lm", target, num_layers=1, block_size=4), target)


PROMPTS = [[5, 9, 17, 33, 5, 9], [40, 41, 42, 40, 41], [7, 7, 8, 100]]


def test_hf_peers_match_our_greedy_and_time_the_decode_phase(target, small_lm):
    for p in PROMPTS:
        ids = torch.tensor([p])
        ours = generate(target, None, ids, max_new_tokens=12)
        for res in (hf_generate(target, ids, max_new_tokens=12),
                    hf_prompt_lookup(target, ids, max_new_tokens=12, prompt_lookup_num_tokens=3),
                    hf_assisted(target, small_lm.lm, ids, max_new_tokens=12)):
            assert res.tokens == ours.tokens
            assert res.prefill_time_s > 0 and res.decode_time_s >= 0 and math.isnan(res.tau)
    batch = hf_generate(target, torch.tensor([PROMPTS[1][:4], PROMPTS[2]]), max_new_tokens=5)
    assert isinstance(batch, list) and len(batch) == 2


def test_hf_generate_stops_at_eos_like_we_do():
    t = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, seed=2)
    ids = torch.tensor([PROMPTS[0]])
    t.model.generation_config.eos_token_id = None
    free = generate(t, None, ids, max_new_tokens=10).tokens
    t.model.generation_config.eos_token_id = free[3]
    cut = free.index(free[3]) + 1
    ours = generate(t, None, ids, max_new_tokens=10).tokens
    assert ours == free[:cut] == hf_generate(t, ids, max_new_tokens=10).tokens


def test_benchmark_rows(target, small_lm):
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, num_layers=1, block_size=4), target)
    rows = benchmark(target, {"backbone": backbone, "small": small_lm}, {"toy": PROMPTS},
                     max_new_tokens=10, temperatures=(0.0, 1.0), dloops=(None, DLoopConfig(-0.5, 2)),
                     peers=("prompt_lookup", "assisted"), assistant_model=small_lm.lm, progress=False)
    methods = [(r["method"], r["temperature"]) for r in rows]
    assert methods[:2] == [("ar", 0.0), ("hf_generate", 0.0)]
    assert ("backbone+dloop(-0.5:2)", 1.0) in methods and ("hf_assisted", 0.0) in methods
    assert len(rows) == 2 * (2 + 2 * 2 + 2)
    ar_at = {r["temperature"]: r for r in rows if r["method"] == "ar"}
    hf_at = {r["temperature"]: r for r in rows if r["method"] == "hf_generate"}
    drafters = {"backbone": backbone, "small": small_lm}
    for r in rows:
        # the ratios of the same run's mean times per output token: our AR baseline's, HF generate's, over this row's
        assert r["tpot_ms"] > 0
        assert r["speedup"] == pytest.approx(ar_at[r["temperature"]]["tpot_ms"] / r["tpot_ms"])
        assert r["speedup_vs_hf_generate"] == pytest.approx(hf_at[r["temperature"]]["tpot_ms"] / r["tpot_ms"])
        assert r["num_prompts"] == 3 and r["benchmark"] == "toy"
        if r["temperature"] == 0:
            assert r["match_baseline"] == 1.0  # lossless, and HF peers agree
        if r["kind"] == "drafter":
            hist = r["tau_histogram"]
            assert "acc_rate_pos_01" in r and sum(hist) == r["rounds"]
            assert r["tau_per_round"] == pytest.approx(sum(k * c for k, c in enumerate(hist)) / sum(hist))
        if r["kind"] == "drafter" and r["temperature"] == 0 and r["method"] in drafters:
            # τ: the mean over prompts of the engine's own τ, each prompt decoded alone here
            alone = [generate(target, drafters[r["method"]], torch.tensor([p]), max_new_tokens=10) for p in PROMPTS]
            assert r["tau"] == pytest.approx(sum(a.tau for a in alone) / len(alone))
    ar = rows[0]
    assert ar["speedup"] == 1.0 and ar["tau"] == 1.0
    table = markdown_table(rows)
    assert table.count("\n") == len(rows) + 1 and "speedup_vs_hf_generate" in table
    with pytest.raises(ValueError, match="unknown peers"):
        benchmark(target, {}, {"toy": PROMPTS}, peers=("medusa",))
    with pytest.raises(ValueError, match="assistant_model"):
        benchmark(target, {}, {"toy": PROMPTS}, peers=("assisted",))


def test_multi_turn_prompts_answer_each_turn_in_order(tiny_target):
    from lit_domino.data.benchmarks import BenchmarkPrompt

    gen_cfg = tiny_target.model.generation_config
    old_eos, gen_cfg.eos_token_id = gen_cfg.eos_token_id, None  # the fixture is shared: restored below
    try:
        _check_multi_turn(tiny_target, BenchmarkPrompt)
    finally:
        gen_cfg.eos_token_id = old_eos


def _check_multi_turn(tiny_target, BenchmarkPrompt):
    torch.manual_seed(0)
    drafter = build_drafter(drafter_config("backbone", tiny_target, num_layers=1, block_size=4),
                            tiny_target)
    item = BenchmarkPrompt("toy", "chat", ("What is 2+2?", "And 3+3?"), "u1")
    seen = []

    def decode(ids, n):
        seen.append(ids[0].tolist())
        return generate(tiny_target, drafter, ids, max_new_tokens=n)

    res = run_prompt(tiny_target, decode, item, max_new_tokens=6)
    assert len(seen) == 2 and seen[1][: len(seen[0])] == seen[0]  # turn 2 extends the conversation
    assert len(res.tokens) == 12 and res.rounds >= 2
    base = run_prompt(tiny_target, lambda ids, n: generate(tiny_target, None, ids, max_new_tokens=n), item,
                      max_new_tokens=6)
    assert base.tokens == res.tokens


def test_benchmark_pool_sweep_rows(target):
    """``pool_sizes``: one row per pool for drafters that take one (Domino), one row for the others."""
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, num_layers=1, block_size=4), target)
    domino = build_drafter(drafter_config("domino", target, num_layers=1, block_size=4,
                                          head=dict(rank=8, gru_hidden=16)), target)
    torch.nn.init.normal_(domino.head.up.weight, std=0.5)
    rows = benchmark(target, {"bb": backbone, "dom": domino}, {"toy": PROMPTS[:2]}, max_new_tokens=8,
                     pool_sizes=(None, 4), hf_baseline=False, warmup=False, progress=False)
    assert [(r["method"], r["pool_size"]) for r in rows] == [("ar", None), ("bb", None), ("dom", None),
                                                            ("dom+pool(4)", 4)]
    assert all(r["match_baseline"] == 1.0 and r["draft_ms_per_round"] > 0 for r in rows[1:])
    with pytest.raises(ValueError, match="pool_size"):
        benchmark(target, {"dom": domino}, {"toy": PROMPTS}, pool_sizes=(VOCAB + 1,), progress=False)
    # per drafter: the ablation decodes each Domino variant with its preset's pool, one of them also exactly
    dom2 = build_drafter(drafter_config("domino", target, num_layers=1, block_size=4,
                                        head=dict(rank=8, gru_hidden=16)), target)
    rows = benchmark(target, {"bb": backbone, "dom": domino, "dom2": dom2}, {"toy": PROMPTS[:1]}, max_new_tokens=8,
                     pool_sizes={"dom": [4, None], "dom2": [4]}, hf_baseline=False, warmup=False, progress=False)
    assert [(r["method"], r["pool_size"]) for r in rows] == [("ar", None), ("bb", None), ("dom+pool(4)", 4),
                                                            ("dom", None), ("dom2+pool(4)", 4)]
    with pytest.raises(ValueError, match=r"names drafters \['dmo'\]"):
        benchmark(target, {"dom": domino}, {"toy": PROMPTS}, pool_sizes={"dmo": [4]}, progress=False)
    with pytest.raises(ValueError, match="pool_size"):
        benchmark(target, {"dom": domino}, {"toy": PROMPTS}, pool_sizes={"dom": [0]}, progress=False)


def test_benchmark_dloops_per_drafter(target):
    """``dloops`` as a mapping: each drafter decodes its own gates (a name it lacks: DLoop off only), lossless."""
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, num_layers=1, block_size=4), target)
    lm = build_drafter(drafter_config("small_lm", target, num_layers=1, block_size=4), target)
    gate = DLoopConfig(threshold=float("-inf"), max_stages=3)  # always drafts 3 stages
    rows = benchmark(target, {"bb": backbone, "lm": lm}, {"toy": PROMPTS[:2]}, max_new_tokens=10,
                     dloops={"bb": [None, gate]}, hf_baseline=False, warmup=False, progress=False)
    assert [(r["method"], r["dloop"]) for r in rows] == [("ar", "off"), ("bb", "off"), ("bb+dloop(-inf:3)", "-inf:3"),
                                                        ("lm", "off")]
    assert all(r["match_baseline"] == 1.0 for r in rows[1:])
    assert rows[2]["stages_per_round"] > 1.5 > rows[1]["stages_per_round"]
    with pytest.raises(ValueError, match=r"dloops names drafters \['b'\]"):
        benchmark(target, {"bb": backbone}, {"toy": PROMPTS}, dloops={"b": [gate]}, progress=False)


def test_benchmark_static_cache_rows_match_and_compile_needs_a_cpp_compiler(target, monkeypatch):
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, num_layers=1, block_size=4), target)
    rows = benchmark(target, {"bb": backbone}, {"toy": PROMPTS[:1]}, max_new_tokens=8, static_cache=True,
                     hf_baseline=False, warmup=False, progress=False)
    assert [r["match_baseline"] for r in rows] == [1.0, 1.0]
    assert rows[0]["tokens"] == rows[1]["tokens"] == 8
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(ValueError, match="C\\+\\+ compiler"):
        benchmark(target, {"bb": backbone}, {"toy": PROMPTS[:1]}, compile=True, progress=False)


def _timed_peer(target, calls: list, name: str, seconds: list[float], tokens_shift: int = 0):
    """An external peer that records its calls and reports ``seconds[k]`` as its k-th decode time."""
    def decode(ids, n, temperature, seed):
        calls.append(name)
        res = generate(target, None, ids, max_new_tokens=n)
        res.decode_time_s = seconds[calls.count(name) - 1]
        if tokens_shift and calls.count(name) > 1:
            res.tokens = [(t + tokens_shift) % VOCAB for t in res.tokens]
        return res.finish()
    return decode


def test_benchmark_repeats_reverse_the_order_and_keep_the_fastest(target):
    calls = []
    external = {"a": _timed_peer(target, calls, "a", [3.0, 1.0]), "b": _timed_peer(target, calls, "b", [2.0, 4.0])}
    rows = benchmark(target, {}, {"toy": PROMPTS[:1]}, max_new_tokens=6, hf_baseline=False, warmup=False,
                     progress=False, external=external, repeats=2)
    assert calls == ["a", "b", "b", "a"]  # the second repeat runs the methods in reverse order
    tpot = {r["method"]: r["tpot_ms"] for r in rows}
    assert tpot["a"] == pytest.approx(1e3 * 1.0 / 5) and tpot["b"] == pytest.approx(1e3 * 2.0 / 5)  # the fastest
    assert {r["method"]: r["decode_s_by_prompt"] for r in rows if r["method"] in "ab"} == {"a": [1.0], "b": [2.0]}
    with pytest.raises(ValueError, match="repeats"):
        benchmark(target, {}, {"toy": PROMPTS[:1]}, repeats=0, progress=False)
    shifty = {"c": _timed_peer(target, [], "c", [1.0, 1.0], tokens_shift=1)}
    with pytest.raises(RuntimeError, match="different tokens"):
        benchmark(target, {}, {"toy": PROMPTS[:1]}, max_new_tokens=6, hf_baseline=False, warmup=False,
                  progress=False, external=shifty, repeats=2)


def test_the_compiled_plain_decoder_is_a_second_baseline(target, monkeypatch):
    """``compiled_baseline``: the compiled plain decoder (row ``ar_compiled``, warmed up on every prompt in full,
    untimed) beside the eager one; every row's ``speedup_vs_compiled_ar`` is its time per token against it, where
    ``speedup`` stays over the eager plain decoder. ``torch.compile`` is stubbed by a recording identity here (the
    compiled graphs' tokens are tests/decoding/test_engine.py's), so only the baseline's plumbing is timed."""
    import lit_domino.decoding.round as round_mod

    compiled = []
    monkeypatch.setattr(round_mod, "compile_decode_step", lambda fn, device: compiled.append(fn) or fn)
    monkeypatch.setattr(target, "_compiled_forward", (None, None), raising=False)
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, num_layers=1, block_size=4), target)
    rows = benchmark(target, {"bb": backbone}, {"toy": PROMPTS[:2]}, max_new_tokens=8, hf_baseline=False,
                     compiled_baseline=True, progress=False)
    assert compiled, "the compiled plain decoder did not go through the compiled forward"
    by = {r["method"]: r for r in rows}
    assert list(by) == ["ar", "ar_compiled", "bb"]
    ar, fast, bb = by["ar"], by["ar_compiled"], by["bb"]
    assert fast["match_baseline"] == 1.0 and fast["kind"] == "ar" and fast["warmup_s"] > 0
    assert "warmup_s" not in ar and "warmup_s" not in bb
    for row in rows:
        assert row["speedup"] == pytest.approx(ar["tpot_ms"] / row["tpot_ms"])
        assert row["speedup_vs_compiled_ar"] == pytest.approx(fast["tpot_ms"] / row["tpot_ms"])
    plain = benchmark(target, {"bb": backbone}, {"toy": PROMPTS[:1]}, max_new_tokens=8, hf_baseline=False,
                      warmup=False, progress=False)
    assert all("speedup_vs_compiled_ar" not in r for r in plain) and [r["method"] for r in plain] == ["ar", "bb"]
