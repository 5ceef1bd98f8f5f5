"""The speculative decoding engine against stub drafters: exact tau, losslessness, EOS, bad inputs, DLoop."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.dloop import GATES
from lit_domino.decoding.engine import check_compile, compiled_forward, cpp_compiler
from lit_domino.testing import compiled_graph_count, hf_greedy, opens_every_stage, random_target

VOCAB = 256


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


def lively_target(seed: int = 0, max_positions: int = 512):
    """A tiny random target whose greedy continuations vary (default init just repeats the last token)."""
    target = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                           intermediate_size=64, max_positions=max_positions, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in target.model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    target.model.generation_config.eos_token_id = None  # tests that need EOS set it explicitly
    return target


@pytest.fixture(scope="module")
def target():
    return lively_target()


def greedy_reference(target, prompt: list[int], n: int) -> list[int]:
    """Target greedy continuation (KV-cached, no EOS stop): the oracle drafts look it up."""
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache, toks = out.cache, [int(out.logits[0, -1].argmax())]
        for _ in range(n - 1):
            out = target.model(input_ids=torch.tensor([[toks[-1]]]), cache=cache, use_cache=True)
            toks.append(int(out.logits[0, -1].argmax()))
    return toks


# --------------------------------------------------------------------------- stub drafters


class StubSession:
    """A DraftSession that proposes from a policy and checks the engine's bookkeeping.

    ``extend`` asserts that tokens arrive at consecutive positions with one feature row
    each; with ``check_features`` it also compares them to the target's true features.
    """

    def __init__(self, drafter):
        self.d = drafter
        self.committed: list[int] = []
        self.pending: list[int] = []  # [anchor, drafts of every stage so far] (speculative)
        self.feats: list[torch.Tensor] = []
        self.rng = torch.Generator().manual_seed(drafter.seed)

    def extend(self, tokens, features):
        tokens = [int(t) for t in torch.as_tensor(tokens).reshape(-1)]
        assert not self.pending, "extend before crop: speculative stages were not dropped"
        n_feat = len(self.d.config.feature_layers) * self.d.hidden
        assert features is not None and tuple(features.shape) == (len(tokens), n_feat)
        self.committed += tokens
        self.feats.append(features)
        if self.d.check_features:
            full = torch.cat(self.feats)
            ref = self.d.target.forward_features(torch.tensor([self.committed]), self.d.config.feature_layers)[0]
            torch.testing.assert_close(full, ref, atol=1e-4, rtol=1e-4)

    def crop(self, length):
        assert length == len(self.committed), "crop(start) must drop exactly the speculative positions"
        self.committed = self.committed[:length]
        self.pending = []

    def draft(self, anchor, num_tokens, temperature, generator):
        anchor = int(torch.as_tensor(anchor).reshape(-1)[-1])
        if self.pending:
            assert anchor == self.pending[-1], "a later stage must be anchored at the last draft token"
        else:
            self.pending = [anchor]
        ctx = self.committed + self.pending
        toks, conf = self.d.propose(ctx, num_tokens, self.rng)
        self.pending += toks
        return SimpleNamespace(tokens=torch.tensor(toks), logprobs=torch.tensor(conf), probs=None)


class StubDrafter:
    """Policies: ``oracle`` (target greedy), ``never`` (always wrong), ``noisy`` (right with prob 0.7),
    ``random`` (uniform tokens). Log-probs are 0 (confident) or log 0.3 at random, so DLoop both
    continues and stops."""

    def __init__(self, target, policy, block_size=16, seed=0, check_features=False, references=None):
        self.target, self.policy, self.seed, self.check_features = target, policy, seed, check_features
        self.hidden = target.hidden_size
        self.config = SimpleNamespace(block_size=block_size, feature_layers=[0, 1])
        self.fingerprint = target.fingerprint()
        self.references = references or {}  # prompt tuple -> long greedy continuation

    def bind_target(self, target):
        if target.fingerprint() != self.fingerprint:
            raise ValueError("drafter was built for another target (fingerprint mismatch)")

    def new_session(self):
        return StubSession(self)

    def _greedy(self, ctx, k):
        for prompt, ref in self.references.items():
            full = list(prompt) + ref
            if len(ctx) + k <= len(full) and full[: len(ctx)] == ctx:
                return full[len(ctx): len(ctx) + k]
        return greedy_reference(self.target, ctx, k)

    def propose(self, ctx, k, rng):
        if self.policy == "random":
            toks = torch.randint(0, VOCAB, (k,), generator=rng).tolist()
        else:
            toks = self._greedy(ctx, k)
            if self.policy == "never":
                toks = [(t + 1) % VOCAB for t in toks]
            elif self.policy == "noisy":
                keep = torch.rand(k, generator=rng) < 0.7
                rand = torch.randint(0, VOCAB, (k,), generator=rng)
                toks = [t if c else int(r) for t, c, r in zip(toks, keep.tolist(), rand)]
        conf = [0.0 if self.policy == "oracle" else (0.0 if torch.rand((), generator=rng) < 0.5 else math.log(0.3))
                for _ in range(k)]
        return toks, conf


def prompts(n, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB - 1, (int(torch.randint(4, length + 1, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_oracle_drafter_gives_tau_equal_block_size(target, block_size):
    prompt = prompts(1, seed=3)[0]
    rounds = 3
    n = 1 + rounds * block_size  # x_0 comes from the prefill, then `rounds` full rounds
    ref = {tuple(prompt): greedy_reference(target, prompt, n + block_size)}
    res = generate(target, StubDrafter(target, "oracle", block_size, references=ref), torch.tensor([prompt]),
                   max_new_tokens=n)
    assert res.tokens == hf_greedy(target, prompt, n)
    assert res.rounds == rounds and res.tau == block_size
    assert res.accepted_per_round == [block_size - 1] * rounds
    assert res.num_target_forwards == rounds + 1


def test_tau_counts_the_tokens_a_cut_final_round_emits(target):
    """A final round cut by max_new_tokens counts what it emitted (as dflash_generate does), not what the
    target accepted: every round's acc + 1 tokens add up to the output."""
    prompt, B = prompts(1, seed=3)[0], 4
    n = 1 + 2 * B + 2  # x_0 from the prefill, two full rounds, then 2 of the third round's B tokens
    ref = {tuple(prompt): greedy_reference(target, prompt, n + B)}
    res = generate(target, StubDrafter(target, "oracle", B, references=ref), torch.tensor([prompt]),
                   max_new_tokens=n)
    assert res.tokens == hf_greedy(target, prompt, n)
    assert res.accepted_per_round == [B - 1, B - 1, 1]
    assert sum(a + 1 for a in res.accepted_per_round) == len(res.tokens) - 1


@pytest.mark.parametrize("block_size", [2, 8])
def test_never_matching_drafter_gives_tau_one(target, block_size):
    prompt = prompts(1, seed=4)[0]
    res = generate(target, StubDrafter(target, "never", block_size), torch.tensor([prompt]), max_new_tokens=12)
    assert res.tokens == hf_greedy(target, prompt, 12)
    assert res.tau == 1.0 and res.rounds == 11 and set(res.accepted_per_round) == {0}


def test_lossless_greedy_many_prompts_block_sizes_and_dloop(target):
    """>= 20 prompts x block sizes 2/4/8/16 x DLoop off/on x accept/reject-mixing drafters."""
    ps = prompts(20, seed=5)
    n = 24
    refs = {tuple(p): greedy_reference(target, p, n + 3 * 15 + 1) for p in ps}
    expected = {tuple(p): refs[tuple(p)][:n] for p in ps}
    for p in ps[:3]:  # the cached reference itself equals Hugging Face greedy
        assert expected[tuple(p)] == hf_greedy(target, p, n)
    seen_accepts = set()
    for i, p in enumerate(ps):
        for block_size in (2, 4, 8, 16):
            for dloop in (None, DLoopConfig(threshold=-0.5, max_stages=3, gate=GATES[i % len(GATES)])):
                policy = ("noisy", "random", "oracle", "never")[i % 4] if block_size != 8 else "noisy"
                drafter = StubDrafter(target, policy, block_size, seed=i, references=refs)
                res = generate(target, drafter, torch.tensor([p]), max_new_tokens=n, dloop=dloop)
                assert res.tokens == expected[tuple(p)], (i, block_size, dloop, policy)
                seen_accepts.update(res.accepted_per_round)
                assert len(res.tokens) == n
                if dloop is None:  # a last round with one token left to emit is a plain target step
                    assert set(res.stages_per_round[:-1]) <= {1} and res.stages_per_round[-1] in (0, 1)
    assert 0 in seen_accepts and max(seen_accepts) > 15  # rejections and multi-stage acceptances both ran


def test_static_cache_path_gives_identical_tokens_and_rounds(target):
    """The GPU-ready path (StaticCache, rollback by write position, on-device acceptance) on CPU: the same
    tokens and the same rounds as the DynamicCache path, greedy and sampled, with and without DLoop."""
    ps = prompts(4, seed=21)
    refs = {tuple(p): greedy_reference(target, p, 24 + 3 * 7 + 1) for p in ps}
    accepted = set()
    for i, p in enumerate(ps):
        dloop = DLoopConfig(threshold=-0.5, max_stages=3) if i % 2 else None
        drafter = StubDrafter(target, ("noisy", "random")[i % 2], 8, seed=i, references=refs)
        for temperature in (0.0, 1.0):
            runs = [generate(target, drafter, torch.tensor([p]), max_new_tokens=24, dloop=dloop, seed=i,
                             temperature=temperature, static_cache=static) for static in (False, True)]
            assert runs[0].tokens == runs[1].tokens, (i, temperature)
            assert runs[0].accepted_per_round == runs[1].accepted_per_round
            accepted.update(runs[1].accepted_per_round)
        assert generate(target, drafter, torch.tensor([p]), max_new_tokens=24, static_cache=True).tokens == \
            refs[tuple(p)][:24]
        assert generate(target, None, torch.tensor([p]), max_new_tokens=24, static_cache=True).tokens == \
            refs[tuple(p)][:24]
    assert 0 in accepted and max(accepted) >= 3  # rollbacks after rejections and after long acceptances


# one xdist worker compiles every compiled-decode test (this group): dynamo keeps the target forward's graphs
# per process, and the tests of lively_target(128, seed=0) verify at the same widths
@pytest.mark.xdist_group("compiled-decode")
@pytest.mark.slow  # compiles ~4 graphs with inductor: ~1 min on 2 cores
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_path_on_cpu_gives_identical_tokens_and_rounds():
    """compile=True on a CPU (the target's forward under torch.compile, inductor's C++ kernels, over a
    StaticCache): the eager path's tokens and rounds, greedy and sampled, with and without DLoop; greedy is
    still the target's own greedy continuation, speculative and AR alike."""
    target = lively_target(seed=3)
    ps = prompts(2, seed=31)
    refs = {tuple(p): greedy_reference(target, p, 20 + 2 * 3 + 1) for p in ps}
    accepted = set()
    for i, p in enumerate(ps):
        dloop = DLoopConfig(threshold=-0.5, max_stages=2) if i % 2 else None
        drafter = StubDrafter(target, "noisy", 4, seed=i, references=refs)
        for temperature in (0.0, 1.0):
            eager, compiled = (generate(target, drafter, torch.tensor([p]), max_new_tokens=20, dloop=dloop, seed=i,
                                        temperature=temperature, compile=c) for c in (False, True))
            assert eager.tokens == compiled.tokens, (i, temperature)
            assert eager.accepted_per_round == compiled.accepted_per_round
            accepted.update(compiled.accepted_per_round)
        assert compiled_greedy(target, drafter, p) == refs[tuple(p)][:20]
        assert compiled_greedy(target, None, p) == refs[tuple(p)][:20]
    assert target._compiled_forward[0][0] == id(target.model)  # the compiled forward really ran
    assert 0 in accepted and max(accepted) >= 2
    # the graphs guard no module attribute, yet read the weights at every call: new values in the same tensors
    with torch.no_grad():
        next(w for n, w in target.model.named_parameters() if "layers.0" in n and w.dim() == 2).mul_(3.0)
    for p in ps:
        assert compiled_greedy(target, None, p) == hf_greedy(target, p, 20)


def test_the_compiled_forward_is_kept_per_model_dtype_and_device():
    """Its graphs do not guard the model's attributes, so a cast (or moved, or copied) model gets a new compiled
    forward (``torch.compile`` is lazy: nothing compiles here)."""
    target = lively_target(seed=4)
    fn = compiled_forward(target)
    assert compiled_forward(target) is fn
    target.model.to(torch.float64)
    assert compiled_forward(target) is not fn


@pytest.mark.xdist_group("compiled-decode")
@pytest.mark.slow  # one graph of the target above's shapes (inductor's cache has it from the test above)
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_a_compiled_chains_last_round_replays_the_stage_graph():
    """A decode whose last round verifies its anchor alone (an always-right drafter, block 4: the prefill's token,
    two rounds of 4, then 1 still wanted) pads that verify to the stage's width: the target's compiled forward holds
    one graph, not a second of width 1, and the tokens are the target's greedy ones."""
    target = lively_target(seed=3)
    p = prompts(1, seed=31)[0]
    ref = greedy_reference(target, p, 10 + 4)
    res = generate(target, StubDrafter(target, "oracle", 4, references={tuple(p): ref}), torch.tensor([p]),
                   max_new_tokens=10, compile=True)
    assert res.tokens == ref[:10] and res.drafted_per_round == [3, 3, 0]
    assert compiled_graph_count(target._compiled_forward[1]) == 1


def compiled_greedy(target, drafter, prompt):
    return generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20, compile=True).tokens


def test_compile_on_an_unsupported_device_or_without_a_cpp_compiler_is_refused(target, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
        generate(target, None, torch.tensor([[5, 6, 7]]), max_new_tokens=4, compile=True)
    monkeypatch.delenv("CXX")
    with pytest.raises(ValueError, match="runs on a CUDA or CPU target; this target is on mps"):
        check_compile(True, "mps")


def test_stage_records_say_how_much_of_each_stage_was_accepted(target):
    p = prompts(1, seed=22)[0]
    refs = {tuple(p): greedy_reference(target, p, 60)}
    drafter = StubDrafter(target, "noisy", 4, seed=1, references=refs)
    res = generate(target, drafter, torch.tensor([p]), max_new_tokens=20, record_stages=True,
                   dloop=DLoopConfig(float("-inf"), 3))
    assert len(res.stage_records) == sum(res.stages_per_round) and opens_every_stage(res, 3, 3, 20)
    first = 0
    for n, acc in zip(res.stages_per_round, res.accepted_per_round):
        stages, first = res.stage_records[first: first + n], first + n
        assert [s[3] for s in stages] == [min(max(acc - 3 * j, 0), 3) for j in range(n)]
        assert all(s[2] == 3 and s[0] <= s[1] + 1e-6 and s[0] <= 0 for s in stages)
    assert generate(target, drafter, torch.tensor([p]), max_new_tokens=20).stage_records == []


def test_features_and_positions_reach_the_session_exactly(target):
    prompt = prompts(1, seed=6)[0]
    drafter = StubDrafter(target, "noisy", 4, check_features=True)
    res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20, dloop=DLoopConfig(-1.0, 2))
    assert res.tokens == hf_greedy(target, prompt, 20)
    assert max(res.stages_per_round) == 2


def test_batch_rows_decode_independently(target):
    ps = prompts(3, seed=7, length=6)
    ps = [p[:4] for p in ps]
    drafter = StubDrafter(target, "noisy", 4)
    out = generate(target, drafter, torch.tensor(ps), max_new_tokens=10)
    assert isinstance(out, list) and len(out) == 3
    for p, r in zip(ps, out):
        assert r.tokens == hf_greedy(target, p, 10)
    base = generate(target, None, torch.tensor(ps), max_new_tokens=10)
    assert [r.tokens for r in base] == [r.tokens for r in out]


def test_autoregressive_baseline_equals_hf_generate(target):
    for p in prompts(4, seed=8):
        res = generate(target, None, torch.tensor([p]), max_new_tokens=15)
        assert res.tokens == hf_greedy(target, p, 15)
        assert res.tau == 1.0 and res.rounds == 14 and res.num_target_forwards == 15
        assert res.tpot_ms > 0 and res.prefill_time_s > 0


def test_eos_stops_and_nothing_after_it_is_emitted():
    target = lively_target()
    prompt = prompts(1, seed=9)[0]
    ref = greedy_reference(target, prompt, 30)
    eos = ref[6]
    cut = ref.index(eos)  # the first occurrence
    target.model.generation_config.eos_token_id = eos
    assert target.eos_token_ids == [eos]
    for policy, bs in (("oracle", 8), ("noisy", 4), ("never", 2)):
        drafter = StubDrafter(target, policy, bs, references={tuple(prompt): ref})
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=30)
        assert res.tokens == ref[: cut + 1] and res.stop_reason == "eos"
    base = generate(target, None, torch.tensor([prompt]), max_new_tokens=30)
    assert base.tokens == ref[: cut + 1] == hf_greedy(target, prompt, 30)
    # EOS as the very first token: no round runs.
    target.model.generation_config.eos_token_id = ref[0]
    res = generate(target, StubDrafter(target, "oracle", 4), torch.tensor([prompt]), max_new_tokens=30)
    assert res.tokens == [ref[0]] and res.rounds == 0 and math.isnan(res.tau)


def test_max_new_tokens_is_exact_and_one_token_needs_no_round(target):
    prompt = prompts(1, seed=10)[0]
    ref = {tuple(prompt): greedy_reference(target, prompt, 60)}
    for n in (1, 2, 5, 13):
        res = generate(target, StubDrafter(target, "oracle", 8, references=ref), torch.tensor([prompt]),
                       max_new_tokens=n)
        assert res.tokens == ref[tuple(prompt)][:n]
        assert res.rounds == (0 if n == 1 else math.ceil((n - 1) / 8))


def test_dloop_with_one_stage_equals_plain_speculative_round_for_round(target):
    for i, p in enumerate(prompts(4, seed=11)):
        a = generate(target, StubDrafter(target, "noisy", 4, seed=i), torch.tensor([p]), max_new_tokens=20)
        b = generate(target, StubDrafter(target, "noisy", 4, seed=i), torch.tensor([p]), max_new_tokens=20,
                     dloop=DLoopConfig(threshold=-0.1, max_stages=1))
        assert a.tokens == b.tokens
        assert a.accepted_per_round == b.accepted_per_round and a.drafted_per_round == b.drafted_per_round
        assert b.stages_per_round == a.stages_per_round and set(b.stages_per_round[:-1]) == {1}


def test_dloop_gates_on_confidence(target):
    p = prompts(1, seed=12)[0]
    ref = {tuple(p): greedy_reference(target, p, 80)}
    # oracle log-probs are 0 >= g: always the full N stages, all accepted -> tau = N*(B-1)+1
    res = generate(target, StubDrafter(target, "oracle", 4, references=ref), torch.tensor([p]), max_new_tokens=31,
                   dloop=DLoopConfig(threshold=-0.5, max_stages=3))
    assert res.stages_per_round == [3] * 3 and res.tau == 10
    # never confident enough: one stage per round
    res = generate(target, StubDrafter(target, "never", 4), torch.tensor([p]), max_new_tokens=10,
                   dloop=DLoopConfig(threshold=0.0, max_stages=3))
    assert set(res.stages_per_round) <= {1, 2, 3}
    res = generate(target, StubDrafter(target, "random", 4), torch.tensor([p]), max_new_tokens=10,
                   dloop=DLoopConfig(threshold=float("-inf"), max_stages=2))
    assert opens_every_stage(res, 2, 3, 10)


# --------------------------------------------------------------------------- validation


def test_bad_inputs_fail_before_decoding(target):
    p = torch.tensor([prompts(1, seed=13)[0]])
    d = StubDrafter(target, "oracle", 8)
    calls = []
    d.new_session = lambda: calls.append(1)  # any decoding would call it
    cases = [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(max_new_tokens=5, temperature=-0.1), "temperature"),
        (dict(max_new_tokens=5, block_size=1), "block_size"),
        (dict(max_new_tokens=5, block_size=9), "block_size"),
        (dict(max_new_tokens=600), "max_positions"),
        (dict(max_new_tokens=5, dloop="-0.5:3"), "DLoopConfig"),
        (dict(max_new_tokens=5, compile="yes"), "compile must be True or False"),
    ]
    for kwargs, word in cases:
        with pytest.raises(ValueError, match=word):
            generate(target, d, p, **kwargs)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(target, d, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, d, torch.tensor([[VOCAB + 5]]), max_new_tokens=5)
    other = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                          intermediate_size=64)
    with pytest.raises(ValueError, match="fingerprint"):
        generate(other, d, p, max_new_tokens=5)
    assert not calls


@pytest.mark.parametrize("dloop", [None, DLoopConfig(-0.5, 3)])
def test_a_request_that_fits_the_context_is_decoded_drafting_less_at_its_end(target, dloop):
    """prompt + max_new_tokens == max_positions: autoregressive decoding accepts it, so speculative decoding
    must too; the last rounds draft fewer tokens (the last ones none), the output is still the target's."""
    p = torch.tensor([prompts(1, seed=13)[0]])
    n = 512 - p.shape[1]
    d = StubDrafter(target, "oracle", 8)  # proposes the target's own tokens: every round would fill a block
    res = generate(target, d, p, max_new_tokens=n, dloop=dloop)
    assert res.tokens == generate(target, None, p, max_new_tokens=n).tokens and len(res.tokens) == n
    assert max(res.drafted_per_round) == (3 if dloop else 1) * 7  # full blocks before the end
    start = p.shape[1]  # every round's anchor + drafts fit the 512 positions
    for acc, drafted in zip(res.accepted_per_round, res.drafted_per_round):
        assert start + drafted <= 511
        start += acc + 1


def test_drafter_training_flag_is_restored(target):
    class ModuleDrafter(torch.nn.Module, StubDrafter):
        def __init__(self):
            torch.nn.Module.__init__(self)
            StubDrafter.__init__(self, target, "noisy", 4)

    d = ModuleDrafter().train()
    generate(target, d, torch.tensor([prompts(1)[0]]), max_new_tokens=6)
    assert d.training and not target.model.training


def test_generate_bounds_its_threads_and_restores_them(target, monkeypatch):
    from lit_domino.decoding import engine
    from lit_domino.runtime import threads

    p = torch.tensor([prompts(1, seed=13)[0]])
    seen = []
    real = engine._autoregressive

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_autoregressive", spy)
    before = torch.get_num_threads()
    generate(target, None, p, max_new_tokens=2, threads=1)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 1)  # torch would use more threads than the CPUs it may run on
    torch.set_num_threads(2)
    try:
        generate(target, None, p, max_new_tokens=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
    with pytest.raises(ValueError, match="threads"):
        generate(target, None, p, max_new_tokens=2, threads=0)
