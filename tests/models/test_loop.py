"""DLoop's loop-aware training forward == what the sessions draft, and the drafting cost of later stages.

(DLoop with N = 1 equal to plain speculative decoding round for round is
tests/decoding/test_engine.py::test_dloop_with_one_stage_equals_plain_speculative_round_for_round;
lossless DLoop decoding of every freshly built drafter kind is tests/decoding/test_drafters.py;
loop-aware fine-tuned drafters are decoded in tests/lit/test_loop.py.)
"""

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.loop import loop_forward
from lit_domino.testing import lively_dflash2_, random_target

B = 5  # block size: K = 4 tokens per stage
K = B - 1
KINDS = ("backbone", "domino", "eagle3", "dspark", "dspark_anchor", "dflash2")  # dspark_anchor: sample_from_anchor


def kind_of(name: str) -> str:
    return "dspark" if name.startswith("dspark") else name


def block_rows(name: str) -> int:
    """Query rows of one block: B, or K where the anchor slot predicts (sample_from_anchor)."""
    return K if name == "dspark_anchor" else B


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


@pytest.fixture(scope="module")
def target():
    t = random_target(vocab_size=96, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, max_positions=128, seed=0)
    with torch.no_grad():  # sharper logits: drafts vary, perturbations show
        t.embed.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    return t


@pytest.fixture(scope="module")
def drafters(target):
    out = {}
    for i, name in enumerate(KINDS):
        torch.manual_seed(10 + i)
        kind = kind_of(name)
        extra = dict(head=dict(rank=8, gru_hidden=16)) if kind == "domino" else {}
        if kind == "dspark":  # the rnn head: its state runs over the stage's rows
            extra = dict(head=dict(rank=8, head_type="rnn"), sample_from_anchor=name == "dspark_anchor")
        if kind == "dflash2":
            extra = dict(head=dict(rank=8, top_k=8, conv_group_size=8))
        cfg = drafter_config(kind, target, block_size=B, num_layers=1 if kind == "eagle3" else 2, **extra)
        d = build_drafter(cfg, target)
        with torch.no_grad():  # W_up / W2 start at zero: give the head a real correction
            if kind == "domino":
                d.head.up.weight.normal_(0.0, 0.5)
            if kind == "dspark":
                d.head.w2.weight.normal_(0.0, 0.5)
        if kind == "dflash2":  # fresh convolutions are the identity: random taps, so they show
            lively_dflash2_(d)
        out[name] = d.eval()
    return out


def final(out):
    return out.final_logits if out.final_logits is not None else out.logits


def moved(a, b) -> float:
    """The largest change between two logit tensors; DFlash 2's are -inf off its candidates (-inf - -inf = nan:
    no change there, a candidate set that moved is an inf change)."""
    return float(torch.nan_to_num(a - b, nan=0.0).abs().max())


def session_stages(drafter, ids, feats, a, n):
    s = drafter.new_session()
    s.extend(ids[:a], feats[:a])
    stages = [s.draft(ids[a], K)]
    for _ in range(n - 1):
        stages.append(s.draft(stages[-1].tokens[-1], K))
    return s, stages


@pytest.mark.parametrize("kind", KINDS)
def test_training_forward_equals_the_session_stage_by_stage(target, drafters, kind):
    """Ground truth = the session's own drafts: every stage's training logits equal the session's (1e-5),
    with a second, overlapping anchor in the same batch (no leakage between anchors)."""
    d = drafters[kind]
    g = torch.Generator().manual_seed(1)
    a, S = 11, 3
    prefix = torch.randint(3, 90, (a + 1,), generator=g)
    feats_p = target.forward_features(prefix[None], d.config.feature_layers)[0]
    _, stages = session_stages(d, prefix, feats_p, a, S)
    seq = torch.cat([prefix] + [st.tokens for st in stages])[None]  # [1, a + 1 + S·K]
    feats = target.forward_features(seq, d.config.feature_layers)
    torch.testing.assert_close(feats[0, :a], feats_p[:a])  # the target is causal: same verified features
    with torch.no_grad():
        outs = loop_forward(d.train(), seq, feats, torch.tensor([[5, a]]), torch.ones(1, 2, dtype=torch.bool), S)
    d.eval()
    assert len(outs) == S
    for s, (out, st) in enumerate(zip(outs, stages)):
        torch.testing.assert_close(final(out)[0, 1, 1:], st.logits, atol=1e-5, rtol=1e-5, msg=f"stage {s + 1}")
        # labels: stage s+1 predicts x_{a_s + k} = the session's drafts
        assert out.labels[0, 1, 1:].tolist() == st.tokens.tolist()
        assert out.block_tokens[0, 1, 0] == seq[0, a + s * K]


@pytest.mark.parametrize("kind", ["backbone", "domino", "dspark_anchor", "dflash2"])
def test_stage_one_is_ordinary_training(target, drafters, kind):
    d = drafters[kind]
    ids = torch.randint(3, 90, (2, 20), generator=torch.Generator().manual_seed(2))
    feats = target.forward_features(ids, d.config.feature_layers)
    anchors, am = torch.tensor([[3, 9], [6, 0]]), torch.tensor([[True, True], [True, False]])
    with torch.no_grad():
        ref = d.forward_train(ids, feats, anchors, am)
        outs = loop_forward(d, ids, feats, anchors, am, 3)
    torch.testing.assert_close(final(outs[0]), final(ref), atol=0, rtol=0)
    assert (outs[1].labels[1, 1] == -100).all()  # an unused anchor has no labels at any depth


@pytest.mark.parametrize("kind", KINDS)
def test_stage_context_is_the_drafters_own_hidden_states(target, drafters, kind):
    """Perturbing stage 1's hidden states changes stage 2 (and 3) but nothing of stage 1; perturbing stage 2's
    changes stage 3 only; target features at unverified positions (>= a) are never read."""
    d = drafters[kind]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 90, (1, 30), generator=g)
    feats = target.forward_features(ids, d.config.feature_layers)
    anchors, am = torch.tensor([[4, 9]]), torch.ones(1, 2, dtype=torch.bool)

    def run(f=feats, fn=None):
        with torch.no_grad():
            return [final(o) for o in loop_forward(d, ids, f, anchors, am, 3, context_fn=fn)]

    ref = run()

    def bump(stage):
        return lambda s, h: h + 0.5 if s == stage else h

    p1 = run(fn=bump(1))
    torch.testing.assert_close(p1[0], ref[0], atol=0, rtol=0)
    assert moved(p1[1], ref[1]) > 1e-3 and moved(p1[2], ref[2]) > 1e-3
    p2 = run(fn=bump(2))
    torch.testing.assert_close(p2[0], ref[0], atol=0, rtol=0)
    torch.testing.assert_close(p2[1], ref[1], atol=0, rtol=0)
    assert moved(p2[2], ref[2]) > 1e-3
    # anchor 9's stages never read target features at positions >= 9 (they are unverified drafts)
    f2 = feats.clone()
    f2[:, 9:] += 3.0
    for s, out in enumerate(run(f=f2)):
        torch.testing.assert_close(out[:, 1], ref[s][:, 1], atol=1e-6, rtol=1e-6)
    # ... while target features before the anchor do change every stage
    f3 = feats.clone()
    f3[:, 6] += 3.0
    assert all(moved(o[:, 1], r[:, 1]) > 1e-4 for o, r in zip(run(f=f3), ref))


@pytest.mark.parametrize("kind", KINDS)
def test_detach_stage_context_stops_gradients(target, drafters, kind):
    d = drafters[kind]
    ids = torch.randint(3, 90, (1, 24), generator=torch.Generator().manual_seed(4))
    feats = target.forward_features(ids, d.config.feature_layers)
    for detach in (False, True):
        seen = []

        def hook(s, h):
            if h.requires_grad:
                h.register_hook(lambda grad: seen.append(s))
            return h

        outs = loop_forward(d.train(), ids, feats, torch.tensor([[5]]), torch.ones(1, 1, dtype=torch.bool), 2,
                            detach_stage_context=detach, context_fn=hook)
        final(outs[1]).logsumexp(-1).sum().backward()
        assert (seen == []) == detach, (kind, detach, seen)
        d.zero_grad()
    d.eval()


def test_bad_stage_depths(target, drafters):
    d = drafters["backbone"]
    ids = torch.randint(3, 90, (1, 20))
    feats = target.forward_features(ids, d.config.feature_layers)
    am = torch.ones(1, 1, dtype=torch.bool)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="num_stages"):
            loop_forward(d, ids, feats, torch.tensor([[3]]), am, bad)
    with pytest.raises(ValueError, match="max_position_embeddings"):  # 128 positions: 32 stages x 4 reach 128
        loop_forward(d, ids, feats, torch.tensor([[3]]), am, 32)
    with pytest.raises(ValueError, match="anchor 15"):  # 15 + 28 x 4 = 127 fits, but 15 + 29 x 4 does not
        loop_forward(drafters["eagle3"], ids, feats, torch.tensor([[15]]), am, 29)
    with pytest.raises(ValueError, match="block_size - 1"):
        loop_forward(d, ids, feats, torch.tensor([[3]]), am, 2, stage_tokens=2)


# --------------------------------------------------------------------------- drafting cost


def count_rows(monkeypatch, attn):
    """Count the positions whose keys/values an attention layer computes."""
    rows = []
    orig = attn.project_kv

    def counted(h, pos):
        rows.append(h.shape[1])
        return orig(h, pos)

    monkeypatch.setattr(attn, "project_kv", counted)
    return rows


@pytest.mark.parametrize("kind", KINDS)
def test_later_stages_reuse_the_cached_context(target, drafters, kind, monkeypatch):
    """A DLoop stage computes only the previous stage's K stand-in positions + its own block (parallel
    drafters) or its own K chain steps (EAGLE-3), never the committed prefix again."""
    d = drafters[kind]
    attn = d.layers[0].self_attn if kind != "eagle3" else d.self_attn
    rows = count_rows(monkeypatch, attn)
    ids = torch.randint(3, 90, (40,), generator=torch.Generator().manual_seed(5))
    feats = target.forward_features(ids[None], d.config.feature_layers)[0]
    prefix = 20
    s = d.new_session()
    s.extend(ids[:prefix], feats[:prefix])
    first = s.draft(ids[prefix], K)
    n1 = sum(rows)
    R = block_rows(kind)
    assert n1 == (prefix + R if kind != "eagle3" else prefix - 1 + K)  # the prefix once (EAGLE: steps 1..a-1)
    rows.clear()
    second = s.draft(first.tokens[-1], K)
    assert sum(rows) == (K + R if kind != "eagle3" else K)
    rows.clear()
    s.draft(second.tokens[-1], K)
    assert sum(rows) == (K + R if kind != "eagle3" else K)
    # after verification (3 tokens accepted): only the newly committed positions are computed
    s.crop(prefix)
    s.extend(ids[prefix:prefix + 3], feats[prefix:prefix + 3])
    rows.clear()
    s.draft(ids[prefix + 3], K)
    assert sum(rows) == (3 + R if kind != "eagle3" else 3 + K)


@pytest.mark.parametrize("kind", ["dspark", "dspark_anchor", "dflash2"])
def test_distilled_stages_carry_the_targets_distribution_there(target, drafters, kind):
    """Stage s of a DSpark / DFlash 2 unroll carries the target's distribution at ``a_s + k - 1`` (what predicted
    its label ``x_{a_s+k}``), and its loss is the method's objective on it (DeepSpec's TV + confidence, DFlash 2's
    KL + selector CE: finite, gradients reach the head)."""
    from lit_domino.models.objectives import LossSettings, position_weights

    d = drafters[kind]
    ids = torch.randint(3, 90, (1, 30), generator=torch.Generator().manual_seed(6))
    feats = target.forward_features(ids, d.config.feature_layers)
    with torch.no_grad():
        want = target.model(input_ids=ids).logits[0]  # [T, V]
    outs = loop_forward(d.train(), ids, feats, torch.tensor([[4]]), torch.ones(1, 1, dtype=torch.bool), 3,
                        with_logits=False)
    for s, out in enumerate(outs):
        a_s = 4 + s * K
        torch.testing.assert_close(d.compute_logits(out.target_hidden[0, 0, 1:]), want[a_s:a_s + K], rtol=1e-4,
                                   atol=1e-4, msg=f"stage {s + 1}")
    loss, parts = d.block_loss(outs[-1], LossSettings(position_weights(B, 4.0)))
    loss.backward()
    assert torch.isfinite(loss)
    if kind == "dflash2":
        assert float(parts["loss_kl"]) > 0 and float(parts["loss_selector"]) > 0
        assert d.selector.hidden_projection.weight.grad.abs().sum() > 0
        assert d.layers[0].attention_conv.kernel_projection.weight.grad.abs().sum() > 0
    else:
        assert float(parts["loss_tv"]) > 0
        assert d.head.w2.weight.grad.abs().sum() > 0 and d.head.joint.weight.grad.abs().sum() > 0
    d.zero_grad()
    d.eval()
