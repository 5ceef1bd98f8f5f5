"""DominoDrafter: zero-init equivalence, causality of teacher forcing, training == session."""

import copy

import pytest
import torch

from lit_domino.models import DrafterConfig, build_drafter, drafter_config
from lit_domino.models.domino import DominoHead, gru_gates
from lit_domino.testing import random_target

B = 6


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=2, seed=0)


def _drafter(target, zero_up=False, seed=1):
    torch.manual_seed(seed)
    cfg = drafter_config("domino", target, block_size=B, head=dict(rank=16, gru_hidden=32))
    d = build_drafter(cfg, target).eval()
    if not zero_up:
        torch.nn.init.normal_(d.head.up.weight, std=0.5)  # a visible correction
    return d


def _batch(T=24, b=1, seed=0, width=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 250, (b, T), generator=g), torch.randn(b, T, width, generator=g)


def test_fresh_domino_equals_backbone_only(target):
    dom = _drafter(target, zero_up=True)
    assert (dom.head.up.weight == 0).all()
    shared = {k: v for k, v in dom.config.to_dict().items() if k != "head"}
    backbone = build_drafter(DrafterConfig.from_dict({**shared, "kind": "backbone"}), target)
    backbone.load_state_dict({k: v for k, v in dom.state_dict().items() if not k.startswith("head.")})
    ids, feats = _batch()
    anchors, am = torch.tensor([[3, 11]]), torch.ones(1, 2, dtype=torch.bool)
    with torch.no_grad():
        out = dom.forward_train(ids, feats, anchors, am)
        ref = backbone.forward_train(ids, feats, anchors, am)
        tt = dom.forward_train(ids, feats, anchors, am, causal_inputs="training_time_test")
    assert torch.equal(out.final_logits, out.logits) and torch.equal(out.logits, ref.logits)
    assert torch.equal(tt.final_logits, ref.logits)
    s, r = dom.new_session(), backbone.new_session()
    for sess in (s, r):
        sess.extend(ids[0, :11], feats[0, :11])
    assert torch.equal(s.draft(ids[0, 11], B - 1).logits, r.draft(ids[0, 11], B - 1).logits)


def test_teacher_forcing_is_causal(target):
    dom = _drafter(target)
    ids, feats = _batch()
    a = 8
    anchors, am = torch.tensor([[a]]), torch.ones(1, 1, dtype=torch.bool)

    def delta(i):
        with torch.no_grad():
            out = dom.forward_train(i, feats, anchors, am)
        return (out.final_logits - out.logits)[0, 0]  # [B, V]

    ref = delta(ids)
    assert (ref[0] == 0).all() and ref[1:].abs().max() > 1e-3
    for i in range(1, B):
        changed = ids.clone()
        changed[0, a + i:] = (changed[0, a + i:] + 17) % 250  # tokens at block positions >= i
        d = delta(changed)
        torch.testing.assert_close(d[: i + 1], ref[: i + 1], atol=0, rtol=0)  # ΔL_i uses S_{i-1}: x_a..x_{a+i-1}
        if i + 1 < B:
            assert (d[i + 1:] - ref[i + 1:]).abs().max() > 1e-5


def test_session_equals_teacher_forced_training(target):
    dom = _drafter(target)
    ids, feats = _batch(T=30)
    a = 13
    s = dom.new_session()
    s.extend(ids[0, :a], feats[0, :a])
    d = s.draft(ids[0, a], B - 1)
    forced = ids.clone()
    forced[0, a + 1: a + B] = d.tokens  # teacher forcing with the session's own inputs
    with torch.no_grad():
        out = dom.forward_train(forced, feats, torch.tensor([[a]]), torch.ones(1, 1, dtype=torch.bool))
        tt = dom.forward_train(ids, feats, torch.tensor([[a]]), torch.ones(1, 1, dtype=torch.bool),
                               causal_inputs="training_time_test")
    torch.testing.assert_close(d.logits, out.final_logits[0, 0, 1:], atol=1e-5, rtol=1e-5)
    # at T = 0 the session picks argmax of the final logits: exactly training-time test's inputs
    torch.testing.assert_close(d.logits, tt.final_logits[0, 0, 1:], atol=1e-5, rtol=1e-5)
    assert d.tokens.tolist() == d.logits.argmax(-1).tolist()
    # the correction changes the picks' logits relative to the backbone
    assert (out.final_logits - out.logits).abs().max() > 1e-3


def test_session_sampling_uses_corrected_distribution(target):
    dom = _drafter(target)
    ids, feats = _batch(T=24)
    s = dom.new_session()
    s.extend(ids[0, :15], feats[0, :15])
    d = s.draft(ids[0, 15], B - 1, temperature=1.3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(d.probs, torch.softmax(d.logits / 1.3, -1))
    torch.testing.assert_close(d.logprobs.exp(), d.probs.gather(-1, d.tokens[:, None])[:, 0])
    forced = ids.clone()
    forced[0, 16: 15 + B] = d.tokens
    with torch.no_grad():
        out = dom.forward_train(forced, feats, torch.tensor([[15]]), torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(d.logits, out.final_logits[0, 0, 1:], atol=1e-5, rtol=1e-5)


def test_dloop_stage_two_for_domino(target):
    dom = _drafter(target)
    ids, feats = _batch(T=14)

    def run(perturb):
        s = dom.new_session()
        s.extend(ids[0, :9], feats[0, :9])
        d1 = s.draft(ids[0, 9], B - 1)
        s.stages[-1].hidden[perturb] += perturb_scale
        return d1, s.draft(d1.tokens[-1], B - 1)

    perturb_scale = 0.0
    d1, d2 = run(1)
    perturb_scale = 1.0
    p1, p2 = run(1)
    torch.testing.assert_close(p1.logits, d1.logits, atol=0, rtol=0)
    assert (p2.logits - d2.logits).abs().max() > 1e-4


def test_gru_step_matches_nn_gru():
    torch.manual_seed(0)
    head = DominoHead(16, 24, 8, 50)
    x, h = torch.randn(3, 16), torch.randn(3, 24)
    with torch.no_grad():
        ref = head.gru(x[:, None], h[None])[0][:, 0]
        step = gru_gates(x @ head.gru.weight_ih_l0.T, h @ head.gru.weight_hh_l0.T, h)
        torch.testing.assert_close(step, ref, atol=1e-6, rtol=1e-6)


def test_rollout_fed_the_true_tokens_equals_the_parallel_form():
    """The head's two forms of one equation: ``rollout`` (sequential, used by TTT and decoding) and
    ``delta`` over one ``nn.GRU`` pass (teacher forcing) give the same final logits on the same inputs."""
    torch.manual_seed(0)
    N, K, d, V = 3, 5, 16, 50
    head = DominoHead(d, 24, 8, V)
    torch.nn.init.normal_(head.up.weight, std=0.5)
    emb = torch.nn.Embedding(V, d)
    H, base = torch.randn(N, K, d), torch.randn(N, K, V)
    tokens = torch.randint(0, V, (N, K))  # x_a, then the tokens fed after positions 1..K-1
    with torch.no_grad():
        S, _ = head.gru(emb(tokens))  # S_0 .. S_{K-1}
        parallel = base + head.delta(H, S)
        step = head.rollout(H, base, emb(tokens[:, 0]), emb)
        sequential = torch.stack([step(None if i == 0 else tokens[:, i]) for i in range(K)], dim=1)
    torch.testing.assert_close(sequential, parallel, atol=1e-5, rtol=1e-5)
    assert (parallel - base).abs().max() > 1e-2  # the correction is visible


def test_training_gradients_and_variants(target):
    dom = _drafter(target).train()
    ids, feats = _batch(T=16)
    for mode in ("teacher_forced", "training_time_test"):
        dom.zero_grad()
        out = dom.forward_train(ids, feats, torch.tensor([[2, 7]]), torch.ones(1, 2, dtype=torch.bool),
                                torch.ones_like(ids), causal_inputs=mode)
        out.final_logits.logsumexp(-1).mean().backward()
        for p in (dom.head.gru.weight_hh_l0, dom.head.gru.weight_ih_l0, dom.head.down.weight, dom.head.up.weight,
                  dom.fc.weight):
            assert p.grad.abs().sum() > 0, (mode, p.shape)
    with pytest.raises(ValueError, match="causal_inputs"):
        dom.forward_train(ids, feats, torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.bool), causal_inputs="x")


# --------------------------------------------------------------------------- the cheap decode head (candidate pool)


def _draft(dom, ids, feats, a, temperature=0.0, seed=0, **options):
    s = dom.new_session(**options)
    s.extend(ids[0, :a], feats[0, :a])
    return s.draft(ids[0, a], B - 1, temperature=temperature, generator=torch.Generator().manual_seed(seed))


def test_pool_of_the_whole_vocabulary_is_the_exact_head(target):
    dom = _drafter(target)
    ids, feats = _batch(T=30)
    full, same = _draft(dom, ids, feats, 13), _draft(dom, ids, feats, 13, pool_size=target.vocab_size)
    assert torch.equal(full.tokens, same.tokens) and torch.equal(full.logits, same.logits)


def test_pool_logits_are_the_exact_equation_on_the_pool(target):
    """On a pool of P base-logit candidates the final logits equal the full head's at those tokens (teacher
    forced with the pool's own picks), -inf elsewhere; the pick is the pool's argmax."""
    dom = _drafter(target)
    ids, feats = _batch(T=30)
    P, a = 5, 13
    d = _draft(dom, ids, feats, a, pool_size=P)
    forced = ids.clone()
    forced[0, a + 1: a + B] = d.tokens
    with torch.no_grad():
        out = dom.forward_train(forced, feats, torch.tensor([[a]]), torch.ones(1, 1, dtype=torch.bool))
    pool = out.logits[0, 0, 1:].topk(P, -1).indices  # [K, P] top-P of the base logits
    inside = torch.zeros_like(d.logits, dtype=torch.bool).scatter_(-1, pool, True)
    torch.testing.assert_close(d.logits[inside], out.final_logits[0, 0, 1:][inside], atol=1e-5, rtol=1e-5)
    assert torch.isinf(d.logits[~inside]).all()
    assert d.tokens.tolist() == d.logits.argmax(-1).tolist()
    on_pool = torch.log_softmax(out.final_logits[0, 0, 1:].gather(-1, pool), -1)  # [K, P] log q over the pool alone
    torch.testing.assert_close(d.logprobs, on_pool[pool == d.tokens[:, None]], atol=1e-5, rtol=1e-5)
    assert (d.logprobs > _draft(dom, ids, feats, a).logprobs - 1e-6).all()  # log q on the pool >= on all V


def test_pool_sampling_q_lives_on_the_pool(target):
    dom = _drafter(target)
    ids, feats = _batch(T=24)
    d = _draft(dom, ids, feats, 15, temperature=1.3, pool_size=7)
    assert ((d.probs > 0).sum(-1) == 7).all()
    torch.testing.assert_close(d.probs.sum(-1), torch.ones(B - 1))
    torch.testing.assert_close(d.probs, torch.softmax(d.logits / 1.3, -1))
    torch.testing.assert_close(d.logprobs.exp(), d.probs.gather(-1, d.tokens[:, None])[:, 0])


def _rollout_picks(head, H, base, anchor, emb, P=None, temperature=0.0, noise=None):
    """The reference: training-time test's rollout (``nn.GRU``'s equations written out), picking
    ``argmax(L_i / T + G_i)`` on the top-P pool of the base logits at each position."""
    step = head.rollout(H[None], base[None], emb[anchor], lambda t: emb[t])
    ids = base.topk(P, -1).indices if P else None
    prev, toks, rows = None, [], []
    for i in range(H.shape[0]):
        L = step(prev)[0]  # [V]
        if ids is not None:
            L = L[ids[i]]
        j = (L if temperature == 0 else L / temperature + noise[i]).argmax(-1)
        prev = (j if ids is None else ids[i, j]).view(1)
        toks.append(prev), rows.append(L)
    return torch.cat(toks), torch.stack(rows)


@pytest.mark.parametrize("P", [None, 6])
def test_decode_draft_equals_the_training_rollout(P):
    """``DominoHead.draft`` (decoding: fused ``gru_cell``, the pool's rows gathered up front) picks what the
    training-time-test rollout picks, with the same final logits, for a weak and a strong correction."""
    torch.manual_seed(0)
    K, d, V = 7, 16, 40
    head = DominoHead(d, 24, 8, V)
    emb = torch.randn(V, d)
    H, base, anchor = torch.randn(K, d), torch.randn(K, V), torch.tensor([3])
    changed = []
    for std in (0.0, 0.3, 3.0):
        torch.nn.init.normal_(head.up.weight, std=std)
        with torch.no_grad():
            out = head.draft(H, base, anchor, emb, pool_size=P)
            want, rows = _rollout_picks(head, H, base, anchor, emb, P)
        assert torch.equal(out.tokens, want), std
        torch.testing.assert_close(out.logits, rows, atol=1e-5, rtol=1e-5)
        assert torch.equal(out.tokens, out.picks if P is None else out.ids.gather(-1, out.picks[:, None])[:, 0])
        changed.append(int((out.tokens != base.argmax(-1)).sum()))
    assert changed[0] == 0 and changed[2] > 0, changed  # W_up = 0 keeps the base picks; a strong head does not


def test_decode_tables_follow_every_weight_they_come_from():
    """The decode tables (the GRU input projection of every token, the transposed weights) are cached, and rebuilt
    whenever a weight they come from changes: an in-place update (an optimizer step), ``load_state_dict``, a
    new embedding tensor, a deep copy. A stale table would draft with old weights."""
    torch.manual_seed(0)
    K, d, V = 5, 16, 40
    head = DominoHead(d, 24, 8, V)
    torch.nn.init.normal_(head.up.weight, std=3.0)
    emb = torch.randn(V, d)
    H, base, anchor = torch.randn(K, d), torch.randn(K, V), torch.tensor([3])

    def check(h, e):
        with torch.no_grad():
            out = h.draft(H, base, anchor, e)
            want, rows = _rollout_picks(h, H, base, anchor, e, None)
        assert torch.equal(out.tokens, want)
        torch.testing.assert_close(out.logits, rows, atol=1e-5, rtol=1e-5)
        return out.logits

    first = check(head, emb)
    assert head.decode_tables(emb) is head.decode_tables(emb)  # built once while nothing changes
    seen = [first]
    with torch.no_grad():
        head.gru.weight_ih_l0.mul_(-2.0)  # in place: the input-projection table is stale
    seen.append(check(head, emb))
    with torch.no_grad():
        head.down.weight.add_(0.5)
    seen.append(check(head, emb))
    other = DominoHead(d, 24, 8, V)
    torch.nn.init.normal_(other.up.weight, std=3.0)
    head.load_state_dict(other.state_dict())
    seen.append(check(head, emb))
    seen.append(check(head, torch.randn(V, d)))  # another embedding
    twin = copy.deepcopy(head)
    assert "_decode_tables" in head.__dict__ and "_decode_tables" not in twin.__dict__  # copies leave them behind
    with torch.no_grad():
        twin.up.weight.mul_(-1.0)
    seen.append(check(twin, emb))
    check(head, emb)  # the original keeps its own tables
    assert all(not torch.equal(a, b) for a, b in zip(seen, seen[1:]))  # every change changed the draft


def test_decode_sampling_is_the_exponential_race():
    """At T > 0 each pick is ``argmax(L_i / T - log E_i)``, E ~ Exp(1) drawn once per block from the generator
    (an exact sample of softmax(L_i / T)), fed to the GRU like a greedy pick."""
    torch.manual_seed(0)
    K, d, V, P, T = 7, 16, 40, 9, 1.7
    head = DominoHead(d, 24, 8, V)
    torch.nn.init.normal_(head.up.weight, std=3.0)
    emb = torch.randn(V, d)
    H, base, anchor = torch.randn(K, d), torch.randn(K, V), torch.tensor([3])
    with torch.no_grad():
        out = head.draft(H, base, anchor, emb, pool_size=P, temperature=T, generator=torch.Generator().manual_seed(5))
        noise = -torch.empty(K, P).exponential_(generator=torch.Generator().manual_seed(5)).log()
        want, _ = _rollout_picks(head, H, base, anchor, emb, P, T, noise)
    assert torch.equal(out.tokens, want)
    assert not torch.equal(out.tokens, head.draft(H, base, anchor, emb, pool_size=P).tokens)  # not the greedy picks


def test_first_pick_is_distributed_as_the_draft_q():
    """The exponential race samples q = softmax(L_1 / T): χ² of 3,000 first picks on a pool of 5 against q
    itself (the lossless tests check whole generations against the target)."""
    from tests.decoding.test_sampling import chi2_critical, chi_square, dof_after_pooling

    torch.manual_seed(0)
    K, d, V, P, T, n = 3, 8, 12, 5, 0.8, 3000
    head = DominoHead(d, 8, 4, V)
    torch.nn.init.normal_(head.up.weight, std=1.0)
    H, base, emb, g = torch.randn(K, d), torch.randn(K, V), torch.randn(V, d), torch.Generator().manual_seed(1)
    with torch.no_grad():
        draws = [head.draft(H, base, torch.tensor([3]), emb, pool_size=P, temperature=T, generator=g)
                 for _ in range(n)]
    q = torch.softmax(draws[0].logits[0] / T, -1)  # position 1 does not depend on earlier picks
    counts = torch.bincount(torch.stack([o.picks[0] for o in draws]), minlength=P).double()
    expected = q.double() * n
    assert chi_square(counts, expected) < chi2_critical(dof_after_pooling(expected))
    wrong = torch.softmax(draws[0].logits[0] / (2 * T), -1).double() * n
    assert chi_square(counts, wrong) > chi2_critical(dof_after_pooling(wrong))


def test_pool_size_is_checked_before_decoding(target):
    from lit_domino.decoding import generate

    dom = _drafter(target)
    prompt = torch.tensor([[5, 6, 7]])
    for bad in (0, -3, target.vocab_size + 1, 2.5, True):
        with pytest.raises(ValueError, match="pool_size"):
            generate(target, dom, prompt, max_new_tokens=4, pool_size=bad)
    backbone = build_drafter(drafter_config("backbone", target, block_size=B), target)
    with pytest.raises(ValueError, match=r"pool_size=8 needs a drafter whose head corrects its base logits \(domino, dspark: .*\); this backbone"):
        generate(target, backbone, prompt, max_new_tokens=4, pool_size=8)
    with pytest.raises(ValueError, match="plain decoding"):
        generate(target, None, prompt, max_new_tokens=4, pool_size=8)
    with pytest.raises(ValueError, match="takes no decoding option"):
        backbone.new_session(pool_size=8)
