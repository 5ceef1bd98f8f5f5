"""``generate``'s edges (issue 34, item 7): tiny temperatures decode exactly the greedy path, padded batches take an
attention mask or are refused, ragged lists are a clear error, numpy integers are accepted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.engine import padding_token
from lit_domino.decoding.sampling import GREEDY_BELOW, effective_temperature
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import OracleMix, hf_greedy, hf_greedy_and_reference, lively_target, random_target
from lit_domino.target.tokenizer import train_tokenizer

VOCAB = 128
N = 16

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


def drafter_of(target, kind, block_size=8):
    torch.manual_seed(0)
    extra = dict(head=dict(rank=16, gru_hidden=32)) if kind == "domino" else {}
    return build_drafter(drafter_config(kind, target, block_size=block_size, num_layers=1, **extra), target)


@pytest.fixture(scope="module")
def target():
    return lively_target(VOCAB, seed=0)


@pytest.fixture(scope="module")
def drafters(target):
    return {kind: drafter_of(target, kind) for kind in ("backbone", "domino", "eagle3")}


@pytest.fixture(scope="module")
def tok_target():
    """A lively random target with the embedded tokenizer's layout: pad 0, BOS 1, EOS 2 (no generation EOS)."""
    tok = train_tokenizer(["the cat sat on the mat", "1 + 2 = 3", "def f(x): return x"], vocab_size=300)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    target = random_target(vocab_size=len(tok), hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                           intermediate_size=64, max_positions=256, seed=0, tokenizer=tok)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in target.model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    target.model.generation_config.eos_token_id = None  # eos_token_ids: the tokenizer's (2)
    return target


def prompt(seed, length=7, low=5, high=VOCAB - 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (length,), generator=g).tolist()


# --------------------------------------------------------------------------- tiny temperatures


def test_the_greedy_threshold_is_one_documented_constant():
    assert GREEDY_BELOW == 1e-5
    assert effective_temperature(0.0) == effective_temperature(None) == 0.0
    assert effective_temperature(1e-45) == effective_temperature(np.float32(9.9e-6)) == 0.0
    assert effective_temperature(GREEDY_BELOW) == GREEDY_BELOW and effective_temperature(0.7) == 0.7


@pytest.mark.parametrize("kind", [None, "backbone", "domino", "eagle3"])
def test_tiny_temperatures_decode_token_for_token_as_greedy(target, drafters, kind):
    """T = 1e-45 crashed torch.multinomial (inf/NaN probabilities): below GREEDY_BELOW it is the T = 0 path, so
    tokens and every round's bookkeeping equal T = 0's (and the target's greedy decoding), whatever the seed."""
    drafter = drafters.get(kind)
    for i in range(3):
        p = prompt(i)
        expected, ref = hf_greedy_and_reference(target, p, N, 3 * 7 + 1)
        d = OracleMix(drafter, ref, seed=i) if drafter is not None and i % 2 else drafter  # some accepted drafts
        dloop = DLoopConfig(-2.0, 3) if drafter is not None and i == 2 else None
        greedy = generate(target, d, [p], max_new_tokens=N, dloop=dloop, temperature=0.0)
        assert greedy.tokens == expected
        for j, t in enumerate((1e-45, 1e-30, 1e-8, np.float64(9.9e-6))):
            d = OracleMix(drafter, ref, seed=i) if drafter is not None and i % 2 else drafter
            tiny = generate(target, d, [p], max_new_tokens=N, dloop=dloop, temperature=t, seed=j)
            assert tiny.tokens == greedy.tokens, (kind, i, t)
            assert tiny.accepted_per_round == greedy.accepted_per_round
            assert tiny.drafted_per_round == greedy.drafted_per_round


def test_temperatures_at_the_threshold_still_sample(target, drafters):
    out = generate(target, drafters["domino"], [prompt(0)], max_new_tokens=N, temperature=GREEDY_BELOW, seed=0)
    assert len(out.tokens) == N  # the sampling path, at a temperature float32 handles


# --------------------------------------------------------------------------- integers and lists


def test_numpy_integers_and_lists_are_accepted(target, drafters):
    p = prompt(4)
    ref = generate(target, drafters["domino"], torch.tensor([p]), max_new_tokens=N, block_size=4, pool_size=8,
                   seed=3, threads=1)
    for ids in (p, [p], np.array([p], dtype=np.int64), np.array(p, dtype=np.int32), torch.tensor(p, dtype=torch.int32),
                [torch.tensor(p)]):
        out = generate(target, drafters["domino"], ids, max_new_tokens=np.int64(N), block_size=np.int64(4),
                       pool_size=np.int32(8), seed=np.int64(3), threads=np.int64(1))
        assert out.tokens == ref.tokens and out.accepted_per_round == ref.accepted_per_round
    out = generate(target, None, p, max_new_tokens=np.int16(5), temperature=np.float32(0.0))
    assert out.tokens == hf_greedy(target, p, 5)


@pytest.mark.parametrize("bad,word", [
    (dict(max_new_tokens=5.0), "max_new_tokens must be a positive integer, got 5.0"),
    (dict(max_new_tokens=True), "max_new_tokens must be a positive integer, got True"),
    (dict(max_new_tokens=np.int64(0)), "max_new_tokens must be a positive integer"),
    (dict(max_new_tokens=5, block_size=np.float64(4)), "block_size=np.float64"),
    (dict(max_new_tokens=5, seed=1.5), "seed must be an integer or None, got 1.5"),
    (dict(max_new_tokens=5, temperature="0.5"), "temperature must be >= 0"),
])
def test_non_integers_are_still_refused(target, drafters, bad, word):
    with pytest.raises(ValueError, match=word.replace("(", r"\(").replace(".", r"\.")):
        generate(target, drafters["backbone"], [prompt(0)], **bad)


@pytest.mark.parametrize("ids,word", [
    ([[1, 2, 3], [4, 5]], r"input_ids rows have different lengths \[3, 2\]: .*attention_mask"),
    ([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], r"rows have different lengths \[3, 2\]"),
    ([np.array([1, 2]), [3]], r"rows have different lengths \[2, 1\]"),
    ([1.5, 2.0], "integer token ids, got dtype torch.float32"),
    (["a", "b"], "input_ids must be token ids"),
    ([[[1, 2]]], r"input_ids must be a LongTensor \[b, T\] \(or \[T\]\), got shape \(1, 1, 2\)"),
    ([], "empty prompt"),
])
def test_ragged_or_non_integer_input_ids_are_a_clear_error(target, drafters, ids, word):
    with pytest.raises(ValueError, match=word):
        generate(target, drafters["backbone"], ids, max_new_tokens=5)


# --------------------------------------------------------------------------- padding and attention masks


class Spy:
    """A drafter wrapper that records whether decoding started."""

    def __init__(self, drafter):
        self.inner, self.config, self.sessions = drafter, drafter.config, 0

    def bind_target(self, target):
        return self.inner.bind_target(target)

    def new_session(self, **options):
        self.sessions += 1
        return self.inner.new_session(**options)


def test_padding_token_rule(tok_target, target):
    assert padding_token(tok_target) == 0  # the embedded tokenizer's <|pad|>: neither EOS nor BOS
    assert padding_token(target) is None  # no tokenizer: nothing is taken for padding
    tok_target.model.generation_config.eos_token_id = [2, 0]  # a pad that is also an EOS id (Qwen3's layout)
    try:
        assert padding_token(tok_target) is None
    finally:
        tok_target.model.generation_config.eos_token_id = None


def test_a_padded_batch_without_a_mask_is_refused_before_decoding(tok_target):
    """A right-padded batch of 2 used to decode the second prompt with its pads (output [967, 967, ...])."""
    spy = Spy(drafter_of(tok_target, "domino"))
    a, b = prompt(1, 6, high=tok_target.vocab_size - 1), prompt(2, 4, high=tok_target.vocab_size - 1)
    right = torch.tensor([a, b + [0, 0]])
    left = torch.tensor([a, [0, 0] + b])
    with pytest.raises(ValueError, match=r"input_ids row 1 ends with 2 pad tokens \(id 0, '<\|pad\|>'\): .*"
                                         r"Pass attention_mask .* equal-length prompts, or decode row by row"):
        generate(tok_target, spy, right, max_new_tokens=5)
    with pytest.raises(ValueError, match=r"input_ids row 1 starts with 2 pad tokens"):
        generate(tok_target, spy, left, max_new_tokens=5)
    with pytest.raises(ValueError, match=r"input_ids row 0 ends with 1 pad token \(id 0"):
        generate(tok_target, None, a + [0], max_new_tokens=5)  # a single padded prompt as well
    assert spy.sessions == 0
    # legitimate prompts: equal lengths, a finished turn ending in EOS (2), a document starting with BOS (1)
    for ids in (torch.tensor([a, b + a[:2]]), [1] + a + [2]):
        generate(tok_target, spy, ids, max_new_tokens=3)
    assert spy.sessions == 3


@pytest.mark.parametrize("kind", [None, "domino", "eagle3"])
def test_an_attention_mask_decodes_each_row_as_its_own_prompt(tok_target, kind):
    drafter = drafter_of(tok_target, kind) if kind else None
    v = tok_target.vocab_size - 1
    rows = [prompt(3, 7, high=v), prompt(4, 3, high=v), prompt(5, 5, high=v)]
    width = max(map(len, rows))
    right = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    left = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask_right = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    mask_left = mask_right.flip(-1)
    expected = [hf_greedy(tok_target, r, N) for r in rows]
    alone = [generate(tok_target, drafter, [r], max_new_tokens=N) for r in rows]
    assert [o.tokens for o in alone] == expected
    for ids, mask in ((right, mask_right), (left, mask_left), (right, mask_right.bool()), (left, mask_left.tolist()),
                      (left, mask_left.numpy().astype(bool))):
        out = generate(tok_target, drafter, ids, attention_mask=mask, max_new_tokens=N)
        assert [o.tokens for o in out] == expected
        assert [o.accepted_per_round for o in out] == [o.accepted_per_round for o in alone]
    one = generate(tok_target, drafter, right[1], attention_mask=mask_right[1], max_new_tokens=N)  # [T] + [T]
    assert one.tokens == expected[1]


@pytest.mark.parametrize("mask,word", [
    ([[1, 1, 1], [1, 1, 0]], r"attention_mask has shape \(2, 3\), input_ids \(2, 4\): they must match"),
    ([[1, 1, 1, 1], [1, 2, 0, 0]], "attention_mask must hold 0 .* and 1 .* only"),
    ([[1, 1, 1, 1], [0, 0, 0, 0]], "attention_mask row 1 is all padding"),
    ([[1, 1, 1, 1], [1, 0, 1, 0]], r"attention_mask row 1 has padding between real tokens \(positions 0..2\)"),
    ([[1, 1, 1, 1], [0.5, 1, 0, 0]], "attention_mask must hold integer"),
])
def test_bad_attention_masks_are_refused(tok_target, mask, word):
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    with pytest.raises(ValueError, match=word):
        generate(tok_target, None, ids, attention_mask=mask, max_new_tokens=3)
