"""The acceptance-predictor gates (conf, cost, stage truncation): lossless at T = 0 (token identity) and T > 0
(chi-square on (x1, x2)), what they draft, and their refusals before decoding."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.acceptance import (AcceptanceHead, AcceptancePredictor, Calibration, NoAcceptancePredictor,
                                           check_predictor, drafter_key, input_width, load_predictor)
from lit_domino.decoding.cost_model import CostModel, CostModelError, cache_path, cost_key, resolve
from lit_domino.decoding.gates import RoundPolicy, round_policy
from lit_domino.decoding.round import Clock
from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.sessions import StageDraft
from lit_domino.testing import (OracleMix, chi_square_target, exact_joint, hf_greedy, hf_greedy_and_reference,
                                lively_target, opens_every_stage, passes_chi_square, sampled_pair_counts)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(num_layers=1, head=dict(rank=8, gru_hidden=16))


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


SURVIVAL_MAPS = [[[0.0, 0.5, 1.0], [0.0, 0.2, 1.0]], [[0.0, 0.3, 1.0], [0.0, 0.1, 1.0]]]
"""Survival maps that lower the middle of the product (position 1, then every later one): a ``-maps`` kind's."""


def with_predictor(target, kind, block_size=6, scale=1.5, seed=0, positions=12):
    """A random drafter of ``kind`` and its predictor, ``(drafter, predictor)``: an add-on head of random weights
    (confidences spread over (0, 1)), DSpark's own head spread alike;
    ``domino-gru``: Domino with the head on its GRU state; ``backbone-maps``, ``dspark-maps``: the calibration with
    :data:`SURVIVAL_MAPS`."""
    kind, _, inputs = kind.partition("-")
    maps = SURVIVAL_MAPS if inputs == "maps" else None
    inputs = "" if inputs == "maps" else inputs
    torch.manual_seed(seed)
    kw = SMALL if kind != "backbone" else dict(num_layers=1)
    if kind == "dspark":
        kw = dict(num_layers=1, head=dict(rank=8))
    d = build_drafter(drafter_config(kind, target, block_size=block_size, **kw), target)
    if kind == "dspark":
        spread_own_head(target, d, scale)
        return d, AcceptancePredictor(drafter_key(d), None, Calibration([1.5] * positions, [0.6] * positions,
                                                                        survival_maps=maps))
    head = spread_head(target, d, scale, inputs=inputs or "hidden")
    cal = Calibration([0.8 + 0.1 * j for j in range(positions)], [0.7 - 0.02 * j for j in range(positions)],
                      survival_maps=maps)
    return d, AcceptancePredictor(drafter_key(d), head, cal)


def sample_inputs(target, d):
    """The predictor inputs (H, previous tokens) of stages drafted after six contexts."""
    Hs, prevs = [], []
    for n in range(3, 9):
        ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13][:n]) % target.vocab_size
        s = d.new_session()
        s.extend(ids[:-1], target.forward_features(ids[None], d.config.feature_layers)[0, :-1])
        st = s.draft(ids[-1:], d.config.block_size - 1)
        Hs.append(s.stages[-1].hidden[1:]), prevs.append(torch.cat([ids[-1:], st.tokens[:-1]]))
    return torch.cat(Hs), torch.cat(prevs)


def spread_head(target, d, scale=1.5, centre=1.5, inputs="hidden"):
    """An add-on head of random weights whose logits on sample stages have mean ``centre`` and std ``scale``
    (random drafters' hidden states differ in scale by kind)."""
    head = AcceptanceHead(d.config.hidden_size, input_width(d, inputs), inputs)
    H, prev = sample_inputs(target, d)
    with torch.no_grad():
        torch.nn.init.normal_(head.proj.weight)
        x = head.inputs(d, H, prev)
        head.proj.weight.mul_(scale / head(x).std().clamp_min(1e-6))
        head.proj.bias.fill_(centre - float(head(x).mean()))
    return head


def spread_own_head(target, d, scale=1.5, centre=1.5):
    """DSpark's own confidence head given random weights, spread as :func:`spread_head`'s."""
    H, prev = sample_inputs(target, d)
    with torch.no_grad():
        torch.nn.init.normal_(d.confidence.weight)
        d.confidence.weight.mul_(scale / d.own_confidence_logits(H, prev).std().clamp_min(1e-6))
        d.confidence.bias.add_(centre - float(d.own_confidence_logits(H, prev).mean()))


@pytest.fixture(autouse=True)
def _priced_as_modelled(monkeypatch):
    """The decodes here pin the cost gate's decisions under a given cost model, so their rounds are priced by it
    alone: the clock hands the gate no round times (as on CUDA before a round's events complete). Prices from the
    clock: ``test_the_cost_gate_prices_rounds_by_what_the_clock_timed`` and tests/decoding/test_round_costs.py."""
    monkeypatch.setattr(Clock, "round", lambda self: None)


def cheap_cost(target, drafter, block_size, predictor):
    """A cost model where drafting is cheap against verifying: the cost gate drafts more while survival is high. Its
    reads cost something, so a sequence whose reads open nothing skips some (the decodes cover both paths)."""
    K = block_size - 1
    widths = [1, 2, K + 1, 2 * K + 1, 3 * K + 1]
    return CostModel.of_widths(widths, [1e-3 * (1 + 0.001 * w) for w in widths], 1e-5, 1e-5, 0.0,
                               cost_key(target, drafter, block_size, predictor), read_s=2e-5)


GATES = ["conf@0.3:3", "conf@0.9:3", "trunc@0.5", "trunc@0.95", "conf@0.2:3+trunc@0.4", "-1:3+trunc@0.3", "cost:3",
         "cost:3+trunc@0.2"]


@pytest.mark.parametrize("kind", ["backbone", "domino", "domino-gru", "domino-hidden+gru", "dspark", "backbone-maps",
                                  "dspark-maps"])
def test_gates_are_lossless_greedy(target, kind, tmp_path):
    d, pred = with_predictor(target, kind)
    path = cheap_cost(target, d, 6, pred).save(tmp_path / "cost.json")
    stages_seen, drafted, accepted = set(), set(), set()
    for i, p in enumerate(([5, 6, 7, 8], [9, 3, 4], [17, 2, 40, 41, 42])):
        expected, ref = hf_greedy_and_reference(target, p, 24, 16)
        mixed = OracleMix(d, ref, seed=i)  # accepted drafts, partial and none
        for spec in GATES:
            dl = DLoopConfig.parse(spec)
            if dl.gate == "cost":
                dl = DLoopConfig(gate="cost", max_stages=dl.max_stages, truncate=dl.truncate, cost_model=str(path))
            for drafter in (d, mixed):
                res = generate(target, drafter, torch.tensor([p]), max_new_tokens=24, dloop=dl, predictor=pred)
                assert res.tokens == expected, (kind, spec, p)
                stages_seen.update(res.stages_per_round), drafted.update(res.drafted_per_round)
                accepted.update(res.accepted_per_round)
    assert {1, 2} <= stages_seen  # the gates both stopped and opened
    assert any(n % 5 for n in drafted)  # truncation cut stages (K = 5)
    assert len(accepted) > 2


@pytest.mark.slow
@pytest.mark.parametrize("kind,spec", [("domino", "conf@0.55:3+trunc@0.4"), ("backbone", "trunc@0.5"),
                                       ("backbone", "conf@0.5:3+trunc@0.45"), ("dspark", "conf@0.4:2+trunc@0.4"),
                                       ("domino", "cost:3+trunc@0.3"), ("domino-gru", "conf@0.55:3+trunc@0.4"),
                                       ("domino-hidden+gru", "cost:3+trunc@0.3"),
                                       ("backbone-maps", "cost:3+trunc@0.3"), ("domino", "cost:3")])
def test_gates_sample_the_target_distribution(kind, spec, tmp_path):
    """T > 0: chi-square with q far from p under each gate on (x1, x2) (truncation cuts the stage the pair is
    drafted from), and for a loop on (x3, x4) too: drafted by the first round's second stage (K = 2) where the gate
    opens one, by the next round where it does not. Over 8 tokens the gate changes what is
    drafted from round to round, and a loop drafts a second stage. (A round whose read the cost gate skips is a
    plain round; the greedy identity test decodes such rounds token by token.)"""
    target = chi_square_target()
    kind, _, inputs = kind.partition("-")
    maps = SURVIVAL_MAPS if inputs == "maps" else None
    inputs = "" if inputs == "maps" else inputs
    torch.manual_seed(0)
    kw = dict(num_layers=1, head=dict(rank=8, gru_hidden=8)) if kind == "domino" else \
        dict(num_layers=1, head=dict(rank=4)) if kind == "dspark" else dict(num_layers=1)
    d = build_drafter(drafter_config(kind, target, block_size=3, **kw), target)
    with torch.no_grad():  # a confident, wrong-ish draft: q far from p, so rejections matter
        if kind == "domino":
            d.head.up.weight.mul_(50.0)
        if kind == "dspark":
            torch.nn.init.normal_(d.head.w2.weight, std=3.0)
    cal = Calibration([1.0] * 6, [0.5] * 6, survival_maps=maps)
    if kind == "dspark":
        spread_own_head(target, d, 1.0, 1.5)
        pred = AcceptancePredictor(drafter_key(d), None, cal)
    else:
        pred = AcceptancePredictor(drafter_key(d), spread_head(target, d, 1.0, 1.5, inputs or "hidden"), cal)
    prompt = [3, 5, 2, 6]
    dl = DLoopConfig.parse(spec)
    if dl.gate == "cost":  # verifying more is nearly free here: the gate opens while the survival is high
        path = str(cheap_cost(target, d, 3, pred).save(tmp_path / "cost.json"))
        dl = DLoopConfig(gate="cost", max_stages=dl.max_stages, truncate=dl.truncate, cost_model=path)
    drafted = set()
    for seed in range(40):
        drafted.update(generate(target, d, torch.tensor([prompt]), max_new_tokens=8, seed=seed, temperature=1.0,
                                dloop=dl, predictor=pred).drafted_per_round)
    assert len(drafted) >= 2, drafted  # the gate changed what was drafted from round to round
    assert dl.max_stages == 1 or max(drafted) > 2, drafted  # a loop: some round drafted a second stage (K = 2)
    ats = (1, 3) if dl.max_stages > 1 else (1,)  # both pairs counted in the same 1200 decodes (as many as the trees')
    counts, accepted = sampled_pair_counts(target, d, prompt, 1200, ats, temperature=1.0, dloop=dl, predictor=pred)
    assert {0, 1} <= accepted, accepted
    for at in ats:
        ok, stat = passes_chi_square(counts[at], exact_joint(target, prompt, at=at))
        assert ok, (at, stat)


@pytest.mark.parametrize("maps", [False, True], ids=["product", "survival-maps"])
def test_truncation_cuts_where_survival_falls_and_only_from_earlier_tokens(target, maps):
    d, pred = with_predictor(target, "backbone", block_size=8)
    if maps:  # the survival through a map that lowers the middle (one map: every position)
        pred.calibration.survival_maps = [[[0.0, 0.5, 1.0], [0.0, 0.2, 1.0]]]
    session = d.new_session()
    ids = torch.tensor([5, 6, 7, 8])
    session.extend(ids, target.forward_features(ids[None], d.config.feature_layers)[0])
    st = session.draft(torch.tensor([9]), 7)
    c = pred.confidences(d, session.stages[-1].hidden, torch.tensor([9]), st.tokens)
    # c_j reads H_j and the token before j: changing d_j leaves c_1..c_j unchanged
    other = st.tokens.clone()
    other[3] = (other[3] + 1) % 128
    c2 = pred.confidences(d, session.stages[-1].hidden, torch.tensor([9]), other)
    torch.testing.assert_close(c[:4], c2[:4])
    assert not torch.equal(c[4], c2[4])
    S = torch.tensor(pred.calibration.survivals(torch.cumprod(c, 0).tolist()))
    assert maps == (not torch.allclose(S, torch.cumprod(c, 0)))
    p = float((S[2] + S[3]) / 2) if S[2] > S[3] else float(S[3])
    session.crop(4)
    policy = round_policy(DLoopConfig(max_stages=1, truncate=min(max(p, 1e-6), 1.0)), target, d, 8, pred)
    stages = policy.draft(session, torch.tensor([9]), lambda m: 7 - m, 0.0, None)
    assert stages[0].tokens.numel() == max(1, int((S >= policy.dloop.truncate).sum()))
    assert torch.equal(stages[0].tokens, st.tokens[: stages[0].tokens.numel()])


def test_the_cost_gate_prices_rounds_by_what_the_clock_timed():
    """One cost model, two sequences: where the decode's clock times drafting at 100x the model's, the gate opens
    no further stage at a survival where, with the verifies timed at 100x the model's instead, it opens one (the
    model alone would open it in both); ρ is the sequence's committed tokens over its rounds' timed seconds."""
    from lit_domino.decoding.gates import RoundPolicy

    cost = CostModel.of_widths([1, 8, 15, 22], [1e-3, 1.1e-3, 1.2e-3, 1.3e-3], 1e-3, 1e-3, 0.0, {"block_size": 8})
    cal = Calibration([1.0] * 21, [0.9] * 21)  # another stage of 7 at survival 0.99: 0.99 * sum(0.9^j) = 4.2 drafts
    timed = {"draft": {"draft": 0.1, "verify": 1.1e-3, "other": 0.0},  # a round of one stage, verifying 8 tokens
             "verify": {"draft": 1e-3, "verify": 0.11, "other": 0.0}}
    gates = {}
    for dear, spent in timed.items():
        policy = RoundPolicy(DLoopConfig(gate="cost", max_stages=3), None, AcceptancePredictor("", None, cal), cost)
        policy.begin()
        assert policy.gate.another(None, 1, 0.99, 7, 7)  # priced by the model: drafting is cheap, the stage pays
        tokens, seconds = policy.gate.tokens, policy.gate.seconds
        for _ in range(8):
            policy.observe(7, 1, 8, spent)
        assert policy.gate.rate == pytest.approx((tokens + 64) / (seconds + 8 * sum(spent.values())))
        gates[dear] = policy.gate
    assert not gates["draft"].another(None, 1, 0.99, 7, 7)
    assert gates["verify"].another(None, 1, 0.99, 7, 7)
    # unknown costs (a CUDA round not timed yet) leave the prices and count the round as modelled
    policy.observe(7, 1, 8, None)
    assert gates["verify"].costs.verify_scale == pytest.approx(100)


def test_a_cost_gate_that_cannot_open_costs_no_predictor_call(target, tmp_path, monkeypatch):
    """When no survival could make a second stage pay (verify cheap against drafting), the cost gate skips the
    predictor and decodes plain's rounds; when one could, it reads the predictor."""
    d, pred = with_predictor(target, "backbone")
    calls = []
    from lit_domino.decoding import acceptance

    real = acceptance.AcceptancePredictor.survival_reader

    def counted(self, drafter):  # the gate's reader, counting its reads
        read = real(self, drafter)
        return lambda *a, **k: calls.append(1) or read(*a, **k)

    monkeypatch.setattr(acceptance.AcceptancePredictor, "survival_reader", counted)
    # a stage's draft costs as much as a hundred verifications, so a round's time is a stage's: worth its yield only
    dear = CostModel.of_widths([1, 2, 6, 11, 16], [1e-3] * 5, 1e-1, 1e-1, 0.0, cost_key(target, d, 6, pred))
    dear = dear.save(tmp_path / "d.json")
    cheap = cheap_cost(target, d, 6, pred).save(tmp_path / "cheap.json")
    p = torch.tensor([[5, 6, 7, 8]])
    plain = generate(target, d, p, max_new_tokens=24)
    cal = pred.calibration
    cal.stage_whole, cal.stage_gain, cal.stage_tokens = [[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 0.5]], 5
    few = generate(target, d, p, max_new_tokens=24, predictor=pred,
                   dloop=DLoopConfig(gate="cost", max_stages=3, cost_model=str(dear)))
    cal.stage_whole = cal.stage_gain = cal.stage_tokens = None  # another stage adds half a draft at best: less than
    # what its time (a round's) yields
    assert few.tokens == plain.tokens and set(few.stages_per_round) == {1} and not calls
    generate(target, d, p, max_new_tokens=24, predictor=pred,
             dloop=DLoopConfig(gate="cost", max_stages=3, cost_model=str(cheap)))
    assert calls


@pytest.mark.parametrize("stage_fit", [False, True], ids=["mean-confidences", "stage-map"])
def test_the_cost_gates_shortcut_never_skips_a_stage_the_rule_would_draft(stage_fit):
    """CostGate.may_open false => the full rule says no for every survival of the first stage (brute force over random cost
    models, calibrations with and without the stage map and yields, and sequence rates)."""
    from lit_domino.decoding.gates import RoundPolicy

    g = torch.Generator().manual_seed(int(stage_fit))
    u = lambda lo, hi: lo + (hi - lo) * float(torch.rand((), generator=g))  # noqa: E731
    shut = opened = 0
    for _ in range(60):
        widths = [1, 4, 8, 16, 24]
        verify = sorted(u(1e-3, 5e-3) for _ in widths)
        cost = CostModel.of_widths(widths, verify, u(1e-4, 5e-3), u(1e-4, 5e-3), u(0, 1e-3), {})
        x = sorted(u(0.0, 1.0) for _ in range(4))
        fit = dict(stage_whole=[x, sorted(u(0.0, 1.0) for _ in x)], stage_gain=[x, sorted(u(0.0, 2.0) for _ in x)],
                   stage_tokens=7) if stage_fit else {}
        cal = Calibration([1.0] * 16, [u(0.05, 0.99) for _ in range(16)], **fit)
        policy = RoundPolicy(DLoopConfig(gate="cost", max_stages=3), None, AcceptancePredictor("", None, cal), cost)
        policy.begin()
        policy.observe(int(u(0, 7)), 1, 8)  # a round of this sequence moves its rate
        k, room = 7, 7
        if policy.gate.may_open(k, room):
            opened += 1
            continue
        shut += 1
        for _ in range(100):
            assert not policy.gate.another(None, 1, float(torch.rand((), generator=g)), k, room)
        assert not policy.gate.another(None, 1, 1.0, k, room)  # the best case: every draft survives
    assert shut >= 5 and opened >= 5  # both answers occur among the random cost models


def test_the_cost_gates_rate_is_the_sequences():
    """ρ starts from a plain round's expectation and follows the sequence's committed tokens over modelled time."""
    from lit_domino.decoding.gates import RoundPolicy

    cost = CostModel.of_widths([1, 8, 15], [1e-3, 1e-3, 1e-3], 1e-3, 1e-3, 0.0, {"block_size": 8})
    cal = Calibration([1.0] * 14, [0.5] * 14)
    policy = RoundPolicy(DLoopConfig(gate="cost"), None, AcceptancePredictor("", None, cal), cost)
    policy.begin()
    prior = 1.0 + sum(0.5 ** j for j in range(1, 8))  # a plain round's expected tokens
    assert policy.gate.rate == pytest.approx(prior / 2e-3)
    for _ in range(400):
        policy.observe(7, 1, 8)  # every round emits 8 tokens in 2 ms
    assert policy.gate.rate == pytest.approx(4000, rel=0.01)
    policy.begin()
    assert policy.gate.rate == pytest.approx(prior / 2e-3)  # a new sequence
    # trust: how the sequence's first stages survived against the predicted P(whole | S)
    assert policy.gate.trust == 1.0
    policy.gate.first = (0.8, 7)
    policy.observe(3, 1, 8)  # predicted 0.8, not accepted whole
    assert policy.gate.trust == pytest.approx(1 / 1.8) and policy.gate.first is None
    policy.gate.first = (0.5, 7)
    policy.observe(7, 2, 15)  # accepted whole
    assert policy.gate.trust == pytest.approx(2 / 2.3)
    policy.observe(7, 1, 8)  # a round whose first stage the gate did not read leaves the record as it is
    assert policy.gate.trust == pytest.approx(2 / 2.3)


def test_the_cost_gate_reads_the_measured_stage_gain(target, tmp_path):
    """With cheap drafting the cost gate drafts another stage when the next stage is expected to add drafts, and
    never when the held-out rounds say it adds none, whatever the survival (the calibration's G(S))."""
    d, pred = with_predictor(target, "backbone")
    cheap = cheap_cost(target, d, 6, pred).save(tmp_path / "cheap.json")
    p = torch.tensor([[5, 6, 7, 8]])
    cal = pred.calibration
    runs = {}
    for y in (0.0, 5.0):
        cal.stage_whole, cal.stage_gain, cal.stage_tokens = [[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [y, y]], 5
        runs[y] = generate(target, d, p, max_new_tokens=24, predictor=pred,
                           dloop=DLoopConfig(gate="cost", max_stages=3, cost_model=str(cheap)))
    cal.stage_whole = cal.stage_gain = cal.stage_tokens = None
    assert set(runs[0.0].stages_per_round) == {1} and max(runs[5.0].stages_per_round) > 1
    assert runs[0.0].tokens == runs[5.0].tokens


def test_the_conf_gate_reads_the_stage_map(target):
    """conf@p drafts another stage while P(whole | S) >= p: a map far below S drafts fewer stages than S itself, on
    the same rounds."""
    d, pred = with_predictor(target, "backbone")
    cal = pred.calibration
    p = torch.tensor([[5, 6, 7, 8]])
    conf = DLoopConfig(gate="conf", threshold=0.05, max_stages=3)
    plain = generate(target, d, p, max_new_tokens=24, dloop=conf, predictor=pred)
    cal.stage_whole, cal.stage_gain, cal.stage_tokens = [[0.0, 1.0], [0.0, 0.01]], [[0.0, 1.0], [0.0, 1.0]], 5
    strict = generate(target, d, p, max_new_tokens=24, dloop=conf, predictor=pred)
    cal.stage_whole = cal.stage_gain = cal.stage_tokens = None
    assert sum(strict.stages_per_round) < sum(plain.stages_per_round) and strict.tokens == plain.tokens


@pytest.mark.parametrize("kind", ["backbone", "domino", "dspark"])
def test_the_fused_head_reads_what_the_head_reads(target, kind):
    """The gate's fused head (its token part looked up per token: the add-on head's embedding part, DSpark's own
    head's Markov part) gives the head's own confidences."""
    d, pred = with_predictor(target, kind)
    H, prev = sample_inputs(target, d)
    K = d.config.block_size - 1
    hidden = torch.cat([H[:1], H[:K]])  # [K+1, d]: slot 0 unused
    anchor, tokens = prev[:1], torch.cat([prev[1:K], prev[:1]])
    fast = pred.confidences(d, hidden, anchor, tokens, 2)
    slow = torch.sigmoid(pred.calibration.apply(pred.logits(d, H[:K], prev[:K]).float(), 2))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("kind", ["backbone", "domino-gru", "dspark"])
@pytest.mark.parametrize("calibration", ["platt", "temperatures", "none"])
def test_the_gates_survival_reader_is_the_cumulated_confidences(target, kind, calibration):
    """What the gates read (floats, the calibration applied in Python for a fused head; the tensor path for a head
    on Domino's GRU state) is ``survival · cumprod(c)``, at offsets past the calibrated positions too (the last
    position's map repeats)."""
    d, pred = with_predictor(target, kind, positions=4)
    if calibration == "temperatures":
        pred.calibration.offsets = None
    elif calibration == "none":
        pred.calibration = None
    else:
        pred.calibration.offsets = [0.3, -0.2, 0.1, -0.4]
    H, prev = sample_inputs(target, d)
    K = d.config.block_size - 1
    hidden = torch.cat([H[:1], H[:K]])
    anchor, tokens = prev[:1], torch.cat([prev[1:K], prev[:1]])
    read = pred.survival_reader(d)
    for offset, survival in ((0, 1.0), (2, 0.6)):
        expected = survival * torch.cumprod(pred.confidences(d, hidden, anchor, tokens, offset), 0)
        got = read(hidden, anchor, tokens, offset, survival)
        assert isinstance(got, list) and len(got) == K
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), expected, rtol=1e-5, atol=1e-7)
    assert len(set(read(hidden, anchor, tokens, 0))) == K  # the confidences are not all 1: the test can fail


class _ReadCounter:
    """A session of stages of 7 drafts whose predictor read gives the survival a script says, counting the reads."""

    def __init__(self, survivals):
        self.survivals, self.reads, self.stages = list(survivals), 0, [SimpleNamespace(hidden=None)]

    def draft(self, anchor, n, temperature=0.0, generator=None):
        return StageDraft(torch.arange(1, n + 1), torch.zeros(n))

    def read(self, hidden, anchor, tokens, offset=0, product=1.0):
        self.reads += 1
        return [self.survivals[0]] * tokens.numel()


def test_the_cost_gate_reads_while_its_reads_pay():
    """A read costs the cost model's read_s; it earns the modelled seconds of the stage it opens. Where no read
    opens a stage, the gate reads the first READ_GRACE rounds, then every PROBE_EVERY-th; where reads open stages,
    it reads every round; a probe that opens one brings the reads back."""
    from lit_domino.decoding.gates import RoundPolicy

    cost = CostModel.of_widths([1, 8, 15, 22], [1e-3, 1.1e-3, 1.2e-3, 1.3e-3], 1e-4, 1e-4, 0.0, {"block_size": 8},
                               read_s=5e-5)
    cal = Calibration([1.0] * 21, [0.9] * 21, stage_whole=[[0.0, 1.0], [0.0, 1.0]],
                      stage_gain=[[0.0, 0.5, 1.0], [0.0, 0.0, 7.0]], stage_tokens=7)
    for script, reads, opened in [([0.1] * 40, [0, 1, 2, 3, 11, 19, 27, 35], []),
                                  ([0.9] * 40, list(range(40)), list(range(40))),
                                  ([0.1] * 19 + [0.9] * 21, [0, 1, 2, 3, 11, *range(19, 40)], list(range(19, 40)))]:
        policy = RoundPolicy(DLoopConfig(gate="cost", max_stages=2), None, AcceptancePredictor("", None, cal), cost)
        policy.begin()
        read_at, opened_at = [], []
        for r, survival in enumerate(script):
            session = _ReadCounter([survival])
            policy._read = session.read
            stages = policy.draft(session, torch.tensor([0]), lambda m: 7 if m < 14 else 0, 0.0, None)
            if session.reads:
                read_at.append(r)
            if len(stages) > 1:
                opened_at.append(r)
            policy.observe(7 if len(stages) > 1 else 2, len(stages), 7 * len(stages) + 1)
        assert read_at == reads and opened_at == opened, script[0]


class _ScriptedSession:
    """Drafts the given stages in turn (log q = 0: the Σ log q gate always opens another)."""

    def __init__(self, stages):
        self.stages_left = [torch.tensor(s) for s in stages]

    def draft(self, anchor, n, temperature=0.0, generator=None):
        tokens = self.stages_left.pop(0)[:n]
        return StageDraft(tokens, torch.zeros(tokens.numel()))


@pytest.mark.parametrize("stages,expected", [([[1, 2, 3], [4, 5, 6], [7, 8, 9]], 3), ([[1, 9, 3], [4, 5, 6]], 1),
                                             ([[1, 2, 3], [4, 5, 9], [7, 8, 2]], 2)])
def test_no_stage_is_drafted_after_a_drafted_eos(stages, expected):
    """Tokens after an EOS are never emitted (accepted, it ends the sequence): whatever the gate says, the round
    ends at the stage that drafted one."""
    policy = RoundPolicy(DLoopConfig(threshold=-0.5, max_stages=3), None, eos=frozenset({9}))
    got = policy.draft(_ScriptedSession(stages), torch.tensor([0]), lambda m: 3, 0.0, None)
    assert len(got) == expected
    assert len(RoundPolicy(DLoopConfig(threshold=-0.5, max_stages=3), None).draft(
        _ScriptedSession([[1, 9, 3], [4, 5, 6], [7, 8, 2]]), torch.tensor([0]), lambda m: 3, 0.0, None)) == 3


def test_no_stage_is_drafted_past_the_tokens_still_wanted(target):
    """Once a round's drafts and its bonus cover the tokens still wanted, no further stage could emit a token:
    a gate that always opens drafts one stage per round near the end, and more where tokens are still wanted."""
    d, _ = with_predictor(target, "backbone")
    p = [5, 6, 7, 8]
    always = DLoopConfig(threshold=-1e9, max_stages=3)
    for n in (2, 6):  # the first round's stage of 5 drafts and its bonus cover the n - 1 tokens after the anchor
        res = generate(target, d, torch.tensor([p]), max_new_tokens=n, dloop=always)
        assert res.tokens == hf_greedy(target, p, n) and set(res.stages_per_round) == {1}
    res = generate(target, d, torch.tensor([p]), max_new_tokens=40, dloop=always)
    assert res.tokens == hf_greedy(target, p, 40) and opens_every_stage(res, 3, 5, 40)


def test_parse_and_labels_of_predictor_gates():
    assert DLoopConfig.parse("conf@0.6:3") == DLoopConfig(0.6, 3, "conf")
    assert DLoopConfig.parse("cost:4") == DLoopConfig(gate="cost", max_stages=4)
    assert DLoopConfig.parse("cost") == DLoopConfig(gate="cost")
    assert DLoopConfig.parse("trunc@0.3") == DLoopConfig(max_stages=1, truncate=0.3)
    assert DLoopConfig.parse("conf@0.6:3+trunc@0.3") == DLoopConfig(0.6, 3, "conf", truncate=0.3)
    assert DLoopConfig.parse("-0.5:2+trunc@0.3") == DLoopConfig(-0.5, 2, truncate=0.3)
    for spec in ("conf@0.6:3", "cost:4", "trunc@0.3", "conf@0.6:3+trunc@0.3", "-0.5:2+trunc@0.3", "-0.5:3"):
        assert DLoopConfig.parse(spec).label() == spec
    assert DLoopConfig(gate="conf").threshold == 0.5 and DLoopConfig().threshold == -0.5


@pytest.mark.parametrize("kwargs,match", [
    (dict(gate="conf", threshold=0.0), r"in \(0, 1\]"),
    (dict(gate="conf", threshold=1.5), r"in \(0, 1\]"),
    (dict(gate="conf", threshold=-0.5), r"in \(0, 1\]"),
    (dict(truncate=0.0), r"truncate .* in \(0, 1\]"),
    (dict(truncate=2.0), r"truncate"),
    (dict(gate="cost", threshold=0.5), "no threshold"),
    (dict(gate="median"), "gate must be one of"),
])
def test_bad_predictor_gate_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DLoopConfig(**kwargs)
    with pytest.raises(ValueError):
        DLoopConfig.parse("conf@1.5:3")
    with pytest.raises(ValueError, match="cannot parse"):
        DLoopConfig.parse("conf@0.5:3+cut@0.2")


def test_a_predictor_gate_without_a_head_is_refused_before_decoding(target):
    torch.manual_seed(0)
    d = build_drafter(drafter_config("backbone", target, block_size=6, num_layers=1), target)
    for spec in ("conf@0.5:3", "trunc@0.5", "cost:3"):
        with pytest.raises(NoAcceptancePredictor, match="no confidence head"):
            generate(target, d, torch.tensor([[5, 6, 7]]), max_new_tokens=4, dloop=DLoopConfig.parse(spec))
    nohead = build_drafter(drafter_config("dspark", target, block_size=6, num_layers=1,
                                          head=dict(rank=8, confidence=False)), target)
    with pytest.raises(NoAcceptancePredictor, match="no confidence head"):
        generate(target, nohead, torch.tensor([[5, 6, 7]]), max_new_tokens=4, dloop=DLoopConfig.parse("trunc@0.5"))
    # DSpark's own head is uncalibrated: conf works, cost needs the calibration's forecasts
    own = build_drafter(drafter_config("dspark", target, block_size=6, num_layers=1, head=dict(rank=8)), target)
    generate(target, own, torch.tensor([[5, 6, 7]]), max_new_tokens=4, dloop=DLoopConfig.parse("conf@0.5:2"))
    with pytest.raises(NoAcceptancePredictor, match="calibrated"):
        generate(target, own, torch.tensor([[5, 6, 7]]), max_new_tokens=4, dloop=DLoopConfig.parse("cost:2"))


def no_decoding(monkeypatch):
    """Make any decode fail the test: what is refused must be refused before decoding."""
    from lit_domino.decoding import engine

    def decode(*a, **k):
        raise AssertionError("decoded")

    monkeypatch.setattr(engine, "decode", decode)


def test_a_predictor_of_another_drafter_is_refused_before_decoding(target, monkeypatch):
    d, pred = with_predictor(target, "backbone")
    torch.manual_seed(1)
    other = build_drafter(drafter_config("backbone", target, block_size=6, num_layers=1), target)
    no_decoding(monkeypatch)
    ids = torch.tensor([[5, 6, 7]])
    # refused whatever the gate, one that reads no predictor included: the predictor is checked when given
    for dloop in (DLoopConfig.parse("conf@0.5:3"), DLoopConfig.parse("cost:3"), DLoopConfig.parse("-1:3"), None):
        with pytest.raises(NoAcceptancePredictor, match=f"another drafter \\(key {pred.drafter_key}, this backbone "
                                                        f"drafter's is {drafter_key(other)}\\): retrain it"):
            generate(target, other, ids, max_new_tokens=4, dloop=dloop, predictor=pred)
    key = drafter_key(d)
    assert drafter_key(d) == key and d.__dict__["_drafter_key"][1] == key  # memoised
    with torch.no_grad():  # a fine-tuned drafter is another drafter
        next(d.parameters()).add_(0.01)
    assert drafter_key(d) != key
    with pytest.raises(NoAcceptancePredictor, match="another drafter"):
        generate(target, d, ids, max_new_tokens=4, dloop=DLoopConfig.parse("trunc@0.5"), predictor=pred)
    with pytest.raises(NoAcceptancePredictor, match="another drafter"):
        check_predictor(d, pred)


def test_a_predictor_the_drafter_cannot_read_or_without_a_drafter_is_refused(target, monkeypatch):
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, block_size=6, num_layers=1), target)
    no_decoding(monkeypatch)
    ids, conf = torch.tensor([[5, 6, 7]]), DLoopConfig.parse("conf@0.5:3")
    own_head = AcceptancePredictor("", None, None)  # the uncalibrated own head: fits any drafter that has one
    with pytest.raises(NoAcceptancePredictor, match="reads the drafter's own confidence head, and the backbone "
                                                    "drafter has none"):
        generate(target, backbone, ids, max_new_tokens=4, dloop=conf, predictor=own_head)
    calibrated = AcceptancePredictor("", None, Calibration([1.0] * 5, [0.5] * 5))
    dspark = build_drafter(drafter_config("dspark", target, block_size=6, num_layers=1, head=dict(rank=8)), target)
    with pytest.raises(NoAcceptancePredictor, match="another drafter \\(key none"):  # a calibration is one drafter's
        generate(target, dspark, ids, max_new_tokens=4, dloop=conf, predictor=calibrated)
    eagle = build_drafter(drafter_config("eagle3", target, block_size=6), target)
    addon = AcceptancePredictor(drafter_key(eagle), AcceptanceHead(8, 8), None)
    with pytest.raises(NoAcceptancePredictor, match="needs a parallel drafter's block hidden states; the eagle3"):
        generate(target, eagle, ids, max_new_tokens=4, predictor=addon)
    with pytest.raises(ValueError, match="plain decoding \\(drafter=None\\) has no draft"):
        generate(target, None, ids, max_new_tokens=4, predictor=own_head)
    with pytest.raises(ValueError, match="predictor must be an AcceptancePredictor or None, got str"):
        generate(target, dspark, ids, max_new_tokens=4, predictor="dspark.json")


def test_benchmark_passes_each_drafter_its_predictor_and_refuses_a_wrong_one(target, monkeypatch):
    from lit_domino.decoding.harness import benchmark

    d, pred = with_predictor(target, "backbone")
    other, other_pred = with_predictor(target, "domino")
    prompts, conf = {"p": [[9, 3, 4, 2]]}, DLoopConfig.parse("conf@0.2:3+trunc@0.4")
    rows = benchmark(target, {"bb": d, "dom": other}, prompts, max_new_tokens=12, dloops=[None, conf],
                     predictors={"bb": pred, "dom": other_pred}, hf_baseline=False, progress=False, warmup=False)
    gated = {r["method"]: r for r in rows if r.get("dloop") == conf.label()}  # neither has a head of its own
    assert set(gated) == {"bb+dloop(conf@0.2:3+trunc@0.4)", "dom+dloop(conf@0.2:3+trunc@0.4)"}
    assert all(r["match_baseline"] == 1.0 for r in rows)
    no_decoding(monkeypatch)
    with pytest.raises(ValueError, match=r"predictors names drafters \['x'\] that are not in drafters \['bb'\]"):
        benchmark(target, {"bb": d}, prompts, max_new_tokens=4, predictors={"x": pred}, hf_baseline=False,
                  progress=False)
    with pytest.raises(NoAcceptancePredictor, match="built for another drafter"):
        benchmark(target, {"bb": d}, prompts, max_new_tokens=4, predictors={"bb": other_pred}, hf_baseline=False,
                  progress=False)


def test_decoding_with_a_predictor_leaves_the_drafter_as_it_was(target):
    """The predictor is passed, never kept: the drafter gains no attribute, and a later decode without it has none
    (the predictor gates are refused) while one with it decodes the same tokens and rounds again."""
    d, pred = with_predictor(target, "backbone")
    before = dict(d.__dict__)  # the key is memoised when the predictor is built (drafter_key)
    ids, conf = torch.tensor([[9, 3, 4, 2]]), DLoopConfig.parse("conf@0.2:3+trunc@0.4")
    first = generate(target, d, ids, max_new_tokens=24, dloop=conf, predictor=pred)
    assert d.__dict__.keys() == before.keys()  # bind_target re-binds the same target: equal, not identical
    assert all(d.__dict__[k] is v or d.__dict__[k] == v for k, v in before.items())
    assert not any(isinstance(v, AcceptancePredictor) for v in vars(d).values())
    with pytest.raises(NoAcceptancePredictor, match="no confidence head"):
        generate(target, d, ids, max_new_tokens=24, dloop=conf)
    again = generate(target, d, ids, max_new_tokens=24, dloop=conf, predictor=pred)
    assert (again.tokens, again.accepted_per_round, again.stages_per_round, again.drafted_per_round) == (
        first.tokens, first.accepted_per_round, first.stages_per_round, first.drafted_per_round)
    assert first.tokens == hf_greedy(target, [9, 3, 4, 2], 24)
    assert max(first.stages_per_round) > 1 and any(n % 5 for n in first.drafted_per_round)  # the predictor was read
    # a predictor with no gate that reads it is checked and ignored: the Σ log q gate's tokens and rounds
    sum_gate = DLoopConfig.parse("-1:3")
    with_pred = generate(target, d, ids, max_new_tokens=24, dloop=sum_gate, predictor=pred)
    without = generate(target, d, ids, max_new_tokens=24, dloop=sum_gate)
    assert (with_pred.tokens, with_pred.stages_per_round) == (without.tokens, without.stages_per_round)


def test_dsparks_own_head_is_the_default_predictor(target):
    """Without ``predictor`` a drafter with its own head reads it, uncalibrated: the same decode as passing
    :func:`own_predictor` (or the calibrated own-head predictor built for it) explicitly."""
    from lit_domino.decoding.acceptance import own_predictor

    d, pred = with_predictor(target, "dspark")
    ids, conf = torch.tensor([[5, 6, 7, 8]]), DLoopConfig.parse("conf@0.5:3+trunc@0.3")
    default = generate(target, d, ids, max_new_tokens=24, dloop=conf)
    explicit = generate(target, d, ids, max_new_tokens=24, dloop=conf, predictor=own_predictor(d))
    assert (default.tokens, default.drafted_per_round) == (explicit.tokens, explicit.drafted_per_round)
    calibrated = generate(target, d, ids, max_new_tokens=24, dloop=conf, predictor=pred)  # τ = 1.5: other cuts
    assert calibrated.tokens == default.tokens and calibrated.drafted_per_round != default.drafted_per_round


def test_predictor_round_trips(target, tmp_path):
    d, pred = with_predictor(target, "domino")
    back = load_predictor(pred.save(tmp_path / "p"))
    assert back.drafter_key == pred.drafter_key and back.calibration == pred.calibration
    torch.testing.assert_close(back.head.proj.weight, pred.head.proj.weight)
    (tmp_path / "p" / "acceptance.json").write_text("{")
    with pytest.raises(ValueError, match="cannot be read"):
        load_predictor(tmp_path / "p")


def test_cost_model_cache_is_keyed_and_checked(target, tmp_path):
    d, pred = with_predictor(target, "backbone", block_size=4)
    with pytest.raises(CostModelError, match="cost_model='cached'"):
        resolve(target, d, 4, "cached", root=tmp_path, predictor=pred)
    logs = []
    cm = resolve(target, d, 4, None, max_stages=2, root=tmp_path, log=logs.append, predictor=pred)
    assert cm.key["predictor"] == "addon:hidden" and cm.read_s > 0  # the stage's read of the predictor given
    assert logs and "measured" in logs[0] and cm.widths == [1, 2, 4, 7] and cm.draft_first_s > 0
    assert all(v > 0 for v in cm.verify_s)
    files = list((tmp_path / "cost_models").glob("*.json"))
    assert len(files) == 1
    # a file measured for another device is refused by name; a stale cache entry is re-measured
    data = json.loads(files[0].read_text())
    data["key"]["device_name"] = "some other GPU"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    with pytest.raises(CostModelError, match="device_name"):
        resolve(target, d, 4, str(other), root=tmp_path, predictor=pred)
    with pytest.raises(CostModelError, match="does not exist"):
        resolve(target, d, 4, str(tmp_path / "missing.json"), root=tmp_path, predictor=pred)
    assert resolve(target, d, 4, str(files[0]), predictor=pred).key == cm.key
    with pytest.raises(CostModelError, match="predictor differ"):  # measured with a read the plain drafter lacks
        resolve(target, d, 4, str(files[0]))


def test_gru_head_reads_the_state_domino_drafts_with_and_only_earlier_tokens(target):
    d, pred = with_predictor(target, "domino-gru", block_size=8)
    with torch.no_grad():
        d.head.up.weight.normal_()  # a live correction: the GRU state shapes the drafts
    assert pred.head.input_kind == "gru" and pred.head.embed_size == d.causal_state_size
    session = d.new_session()
    ids = torch.tensor([5, 6, 7, 8])
    session.extend(ids, target.forward_features(ids[None], d.config.feature_layers)[0])
    st = session.draft(torch.tensor([9]), 7)
    hidden = session.stages[-1].hidden
    prev = torch.cat([torch.tensor([9]), st.tokens[:-1]])
    # S_{j-1} is the state the head's correction read when it drafted position j
    with torch.no_grad():
        final = d.compute_logits(hidden[1:]) + d.head.delta(hidden[1:], d.causal_states(prev))
    torch.testing.assert_close(final, st.logits, atol=1e-4, rtol=1e-4)
    c = pred.confidences(d, hidden, torch.tensor([9]), st.tokens)
    other = st.tokens.clone()
    other[3] = (other[3] + 1) % 128
    c2 = pred.confidences(d, hidden, torch.tensor([9]), other)
    torch.testing.assert_close(c[:4], c2[:4])  # c_j sees d_1 .. d_{j-1} only
    assert not torch.equal(c[4:], c2[4:])
    # a round's positions (two stages, concatenated): the state restarts at the second stage's anchor
    x = pred.head.inputs(d, torch.cat([hidden[1:], hidden[1:]]), torch.cat([prev, prev]))
    torch.testing.assert_close(x[:7], x[7:])
    # hidden+gru: [H_j ; E[x_{j-1}] ; S_{j-1}]
    both = AcceptanceHead(d.config.hidden_size, input_width(d, "hidden+gru"), "hidden+gru")
    y = both.inputs(d, hidden[1:], prev)
    assert both.embed_size == d.embed.weight.shape[1] + d.causal_state_size
    torch.testing.assert_close(y, torch.cat([hidden[1:], d.embed_tokens(prev), d.causal_states(prev)], -1))


def test_gru_inputs_are_refused_for_a_drafter_without_a_gru(target, tmp_path):
    _, gru = with_predictor(target, "domino-gru")
    torch.manual_seed(0)
    backbone = build_drafter(drafter_config("backbone", target, block_size=6, num_layers=1), target)
    with pytest.raises(NoAcceptancePredictor, match="inputs 'gru' read Domino's GRU state.*backbone"):
        check_predictor(backbone, replace(gru, drafter_key=drafter_key(backbone)))
    with pytest.raises(NoAcceptancePredictor, match="no causal state"):
        gru.head.inputs(backbone, torch.zeros(5, backbone.config.hidden_size), torch.zeros(5, dtype=torch.long))
    wide = build_drafter(drafter_config("domino", target, block_size=6, num_layers=1,
                                        head=dict(rank=8, gru_hidden=32)), target)
    with pytest.raises(NoAcceptancePredictor, match="reads 16 features besides H_j, the domino drafter has 32"):
        check_predictor(wide, replace(gru, drafter_key=drafter_key(wide)))
    with pytest.raises(ValueError, match="inputs must be one of"):
        AcceptanceHead(8, 8, "state")
    with pytest.raises(NoAcceptancePredictor, match="inputs 'hidden\\+gru'.*backbone drafter has no causal state"):
        input_width(backbone, "hidden+gru")
    back = load_predictor(gru.save(tmp_path / "p"))
    assert back.head.input_kind == "gru" and back.head.embed_size == 16
    torch.testing.assert_close(back.head.proj.weight, gru.head.proj.weight)


def test_cost_model_verify_is_the_tree_curve_and_old_files_are_remeasured(target, tmp_path, monkeypatch):
    from lit_domino.decoding import cost_model
    from lit_domino.decoding.cost import measure_verify_cost

    monkeypatch.setattr(cost_model, "_MEMO", {})  # this process's models aside: read the file

    d, pred = with_predictor(target, "backbone", block_size=4)
    path = cache_path(cost_key(target, d, 4, pred), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "widths": [1, 2], "verify_s": [1.0, 2.0], "draft_first_s": 1.0,
                                "draft_next_s": 1.0, "other_s": 0.0, "key": cost_key(target, d, 4, pred)}))
    logs = []
    cm = resolve(target, d, 4, None, max_stages=2, root=tmp_path, log=logs.append, predictor=pred)
    assert "cannot be read" in logs[0] and "measured" in logs[1]
    assert json.loads(path.read_text())["format"] == cost_model.COST_FORMAT
    tree = measure_verify_cost(target, (0, 1, 3, 6), context=96, repeats=7, hidden=True, verbose=False)
    assert cm.curve.widths == tree.widths and cm.widths == [n + 1 for n in tree.widths]
    for n in range(0, 9):
        assert cm.verify(n + 1) == tree.seconds_at(n)
