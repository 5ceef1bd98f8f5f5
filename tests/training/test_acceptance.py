"""Acceptance predictors: rounds and labels, the add-on head, sequential calibration, AUC / ECE, the cached
artifact keyed by the drafter."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lit_domino.decoding.acceptance import NoAcceptancePredictor, check_predictor, drafter_key
from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.sessions import StageDraft
from lit_domino.testing import OracleMix, hf_greedy, lively_target
from lit_domino.training.acceptance import (AcceptanceSettings, acceptance_predictor, artifact_key, auc,
                                            build_predictor, calibrated, calibration_report, collect_rounds, ece,
                                            fit_calibration, fit_stages, prefix_weights, stage_markdown, train_head)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


def drafter(target, kind="backbone", seed=0):
    torch.manual_seed(seed)
    kw = dict(num_layers=1) if kind == "backbone" else dict(num_layers=1, head=dict(rank=8))
    if kind == "domino":
        kw["head"]["gru_hidden"] = 12
    return build_drafter(drafter_config(kind, target, block_size=5, **kw), target)


def test_auc_and_ece_on_known_inputs():
    y = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert auc(torch.tensor([0.5, 0.5, 0.5, 0.5]), y) == 0.5
    assert ece(torch.full((4,), 0.5), y) == pytest.approx(0.0)
    assert ece(torch.full((4,), 0.9), y) == pytest.approx(0.4)
    assert ece(torch.full((4,), 0.9), y, w=torch.tensor([0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.1)


def test_sequential_temperatures_recover_the_truth():
    """Position 1 acceptance ~ sigmoid(z / 2), position 2 ~ sigmoid(z / 0.5) on the rounds that survived 1."""
    g = torch.Generator().manual_seed(0)
    n = 20000
    z = torch.randn(n, 2, generator=g, dtype=torch.float64) * 3
    y1 = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(z[:, 0] / 2)).double()
    y2 = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(z[:, 1] / 0.5)).double() * y1
    y = torch.stack([y1, y2], 1)
    torch.testing.assert_close(prefix_weights(y)[:, 1], y1)
    cal = fit_calibration(z, y, "hard", offsets=False)
    assert cal.temperatures[0] == pytest.approx(2.0, rel=0.08)
    assert cal.temperatures[1] == pytest.approx(0.5, rel=0.08)
    rep = calibration_report(z, y, y, cal)
    assert rep["positions"][0]["ece_after"] < 0.02 and rep["positions"][0]["ece_before"] > 0.05
    # the product of calibrated confidences is the survival probability
    assert rep["positions"][1]["survival_ece_after"] < 0.02
    assert calibrated(z, cal).shape == z.shape
    platt = fit_calibration(z + 1.0, y, "hard", offsets=True)  # a shifted head: the offset undoes it
    assert platt.offsets[0] == pytest.approx(-0.5, abs=0.08)


def synthetic_rounds(n: int, seed: int):
    """Rounds of 3 positions whose true c_j = sigmoid(z_j / τ_j + b_j) (τ 2, 0.5, 1; b 0, -1.5, +1): a head
    over-confident at j=1, under-confident and too optimistic at j=2, too pessimistic at j=3. Labels after a
    rejection are drawn too (the rows no round reaches carry no weight)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 3, generator=g, dtype=torch.float64) * 2 + 0.5
    truth = torch.sigmoid(z / torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64) + torch.tensor([0.0, -1.5, 1.0],
                                                                                            dtype=torch.float64))
    return z, (torch.rand(n, 3, generator=g, dtype=torch.float64) < truth).double()


def test_per_position_calibration_on_held_out_rounds_reaches_3_percent():
    """Fitted on one draw, evaluated on another: per-position (τ_j, b_j) bring every c_j and every survival S_j
    within 3 % ECE; temperatures alone cannot move position 2's and 3's means."""
    z, y = synthetic_rounds(8000, 0)
    zt, yt = synthetic_rounds(8000, 1)
    platt = calibration_report(zt, yt, yt, fit_calibration(z, y, "hard", offsets=True))
    temps = calibration_report(zt, yt, yt, fit_calibration(z, y, "hard", offsets=False))
    for r in platt["positions"]:
        assert r["ece_before"] > 0.05 and r["ece_after"] <= 0.03 and r["survival_ece_after"] <= 0.03, r
        assert r["ece_floor"] < 0.02
    assert platt["pooled"]["survival_ece_after"] <= 0.03 < platt["pooled"]["survival_ece_before"]
    assert max(r["ece_after"] for r in temps["positions"][1:]) > 0.03


def stage_rounds(n: int, seed: int, K: int = 3):
    """Rounds of two K-draft stages whose calibrated c_j (uniform in (0.2, 1)) multiply to S, while the first stage
    is accepted whole with probability w(S) = S² (its product is not calibrated, as a drafter's correlated positions
    make it), a rejected stage holds one random rejection, and a whole first stage's second stage accepts 2 drafts
    then rejects where S < 0.2, all 3 above (its gain given S: 2 S² or 3 S²)."""
    g = torch.Generator().manual_seed(seed)
    c = 0.2 + 0.8 * torch.rand(n, 2 * K, generator=g, dtype=torch.float64)
    S = torch.cumprod(c[:, :K], 1)[:, -1]
    whole = torch.rand(n, generator=g, dtype=torch.float64) < S ** 2
    y = torch.ones(n, 2 * K, dtype=torch.float64)
    miss = torch.randint(0, K, (n,), generator=g)
    y[~whole, miss[~whole]] = 0.0
    y[S < 0.2, K + 2] = 0.0
    return c, y


def test_stage_maps_recover_a_known_stage_law():
    """The isotonic stage maps recover P(whole | S) = S² and the next stage's gain given S, non-decreasing; the report's
    ECE of P(whole | S) is small where that of S is not, and its predicted gains match the observed ones."""
    from lit_domino.decoding.acceptance import Calibration
    from lit_domino.training.acceptance import isotonic, stage_rows

    c, y = stage_rounds(20000, 0)
    whole, gain = fit_stages(torch.cumprod(c, 1), y, 3)
    cal = Calibration([1.0] * 6, [0.5] * 6, stage_whole=whole, stage_gain=gain, stage_tokens=3)
    S = torch.cumprod(c[:, :3], 1)[:, -1].tolist()  # the maps' errors over the rounds' own S (PAV is a step
    # function: pointwise it misses the truth by up to ~0.1 draft here, on average by a few hundredths)
    assert sum(abs(cal.whole_stage(x) - x ** 2) for x in S) / len(S) < 0.01
    assert sum(abs(cal.next_gain(x, 3, 3) - (2 if x < 0.2 else 3) * x ** 2) for x in S) / len(S) < 0.03
    assert 0 < cal.next_gain(0.45, 3, 1) < cal.next_gain(0.45, 3, 3)  # a shorter stage adds less
    assert cal.best_gain(3, 3) == cal.next_gain(1.0, 3, 3) == gain[1][-1]
    ct, yt = stage_rounds(20000, 1)
    row, = stage_rows(torch.cumprod(ct, 1), yt, cal, 3)
    assert row["ece_whole"] < 0.02 < row["ece_S"] and row["gain"] == pytest.approx(row["gain_fit"], rel=0.05)
    table = stage_markdown([row])
    assert "| 1 | 20000 |" in table
    cells = [line.replace("\\|", "").count("|") for line in table.splitlines()]  # an escaped \| is inside a cell
    assert len(set(cells)) == 1, f"the header, separator and rows must have as many columns: {cells}"
    # PAV: a decreasing stretch is pooled; too few rows for two bins: no map (the gates fall back to S)
    knots = isotonic(torch.arange(60.0), torch.cat([torch.ones(20), torch.zeros(20), torch.ones(20)]))
    assert knots[1] == sorted(knots[1]) and len(knots[0]) == 2
    assert isotonic(torch.arange(30.0), torch.ones(30)) is None
    assert fit_stages(torch.cumprod(c[:15], 1), torch.zeros_like(y[:15]), 3) == (None, None)



def survival_rounds(n: int, seed: int, P: int = 6):
    """Rounds of P positions with calibrated-looking c_j (uniform in (0.3, 1)) whose product R_j is not the
    survival: drafts 1..j all survive with probability R_j² (one uniform u per round, alive while u < R_j², as a
    drafter's correlated positions make it)."""
    g = torch.Generator().manual_seed(seed)
    c = 0.3 + 0.7 * torch.rand(n, P, generator=g, dtype=torch.float64)
    u = torch.rand(n, 1, generator=g, dtype=torch.float64)
    return c, (u < torch.cumprod(c, 1) ** 2).double()  # non-increasing along j: y is its own survival


def test_survival_maps_calibrate_a_product_that_is_not():
    """fit_survival recovers S_j = R_j² per position; on a fresh draw the mapped survival is calibrated where the
    product is not, a round resumed stage by stage (from a position and the survival so far, as a gate reads it)
    equals the whole round, and the survival is non-increasing."""
    from lit_domino.decoding.acceptance import Calibration
    from lit_domino.training.acceptance import fit_survival

    c, y = survival_rounds(20000, 0)
    cal = Calibration([1.0] * 6, [0.5] * 6, survival_maps=fit_survival(c, y))
    R = torch.cumprod(c, 1)
    S = cal.survival(R)
    assert float((S - R ** 2).abs().mean()) < 0.01
    ct, yt = survival_rounds(20000, 1)
    Rt = torch.cumprod(ct, 1)
    assert ece(cal.survival(Rt), yt) < 0.01 < 0.05 < ece(Rt, yt)
    for row in range(5):
        floats = cal.survivals(Rt[row, 2:].tolist(), 2, float(cal.survival(Rt[row:row + 1])[0, 1]))
        torch.testing.assert_close(torch.tensor(floats, dtype=torch.float64), cal.survival(Rt[row:row + 1])[0, 2:])
        assert floats == sorted(floats, reverse=True)
    assert cal.survivals([0.5, 0.4], 40) == [cal.survivals([0.5], 5)[0], cal.survivals([0.4], 5)[0]]  # later: the last
    assert Calibration([1.0], [0.5]).survivals([0.5, 0.4]) == [0.5, 0.4]  # no maps: the product
    with pytest.raises(ValueError, match="survival_maps"):
        Calibration([1.0], [0.5], survival_maps=[[[0.0, 1.0], [1.0, 0.0]]])
    # fitted with the calibration, the stage maps read the mapped survival
    fitted = fit_calibration(torch.logit(c), y, "hard", survival_fit=True, stage_tokens=3)
    assert fitted.survival_maps is not None and len(fitted.survival_maps) == 6
    assert calibration_report(torch.logit(ct), yt, yt, fitted)["pooled"]["survival_ece_after"] < 0.02
    assert fit_calibration(torch.logit(c), y, "hard").survival_maps is None

def test_fit_calibration_with_stage_tokens_fills_the_stage_fields():
    c, y = stage_rounds(4000, 2)
    cal = fit_calibration(torch.logit(c), y, "hard", stage_tokens=3)
    assert cal.stage_whole is not None and cal.stage_gain is not None and cal.stage_tokens == 3
    assert fit_calibration(torch.logit(c), y, "hard").stage_whole is None  # without stage_tokens: as before


def test_ece_floor_is_the_sampling_noise_of_a_calibrated_predictor():
    p = torch.full((400,), 0.3, dtype=torch.float64)
    from lit_domino.training.acceptance import ece_floor
    floor = ece_floor(p)
    assert 0.01 < floor < 0.04  # E|mean - 0.3| over 400 Bernoulli(0.3) draws: 0.8 * sqrt(0.21 / 400) ≈ 1.8 %
    assert ece_floor(p, torch.zeros(400)) != ece_floor(p, torch.zeros(400))  # no rows: nan
    assert ece_floor(torch.full((4000,), 0.3, dtype=torch.float64)) < floor


def test_rounds_labels_and_the_head(target):
    d = drafter(target)
    prompts = [[5, 6, 7, 8], [9, 3, 4, 10, 11]]
    seqs = [(p + hf_greedy(target, p, 24), len(p)) for p in prompts]
    s = AcceptanceSettings(stages=2, anchors_per_sequence=4, steps=50)
    data = collect_rounds(target, d, seqs, s)
    K = d.config.block_size - 1
    assert data["H"].shape[1:] == (2 * K, d.config.hidden_size) and data["hard"].shape == data["soft"].shape
    soft = data["soft"]  # NaN on the rounds labelled from the sequence (greedy, hard labels: never read)
    assert (((soft >= -1e-6) & (soft <= 1 + 1e-6)) | soft.isnan()).all()
    assert set(data["hard"].unique().tolist()) <= {0.0, 1.0}
    # prev: the round's anchor, then each draft
    seq, plen = seqs[0]
    assert int(data["prev"][0, 0]) == seq[plen]
    head = train_head(d, data, s)
    z = head(head.inputs(d, data["H"], data["prev"])).detach()
    assert z.shape == data["hard"].shape and torch.isfinite(z).all()
    with pytest.raises(ValueError, match="label must be one of"):
        AcceptanceSettings(label="fuzzy")
    assert AcceptanceSettings().label == "hard" and AcceptanceSettings(temperature=1.0).label == "soft"


def test_a_shared_memo_generates_the_continuations_once_and_changes_nothing(target, tmp_path, monkeypatch):
    """A study's predictors share one set of target continuations: generated on the first build, reused by the
    next ones, and the predictors equal those built without the memo."""
    import lit_domino.training.acceptance_rounds as ta

    prompts = [[5, 6, 7, 8], [9, 3, 4], [17, 2, 40, 41], [1, 2, 3]]
    s = AcceptanceSettings(stages=2, anchors_per_sequence=4, steps=20, max_new_tokens=16)
    alone = [acceptance_predictor(target, drafter(target, seed=i), prompts, s, root=tmp_path / "alone")[0]
             for i in (0, 1)]
    calls = []
    real = ta.continuations
    monkeypatch.setattr(ta, "continuations", lambda *a: calls.append(a) or real(*a))
    memo: dict = {}
    shared = [acceptance_predictor(target, drafter(target, seed=i), prompts, s, root=tmp_path / "shared",
                                   continued=memo)[0] for i in (0, 1)]
    assert len(calls) == 1 and list(memo) == [16]
    for a, b in zip(alone, shared):
        assert a.calibration == b.calibration and torch.equal(a.head.proj.weight, b.head.proj.weight)


@pytest.mark.slow
def test_predictor_artifact_is_cached_and_keyed_by_the_drafter(target, tmp_path):
    d = drafter(target)
    prompts = [[5, 6, 7, 8], [9, 3, 4], [17, 2, 40, 41], [1, 2, 3], [60, 61, 62], [7, 7, 8]]
    s = AcceptanceSettings(stages=2, anchors_per_sequence=6, steps=50, max_new_tokens=24)
    pred, path = acceptance_predictor(target, d, prompts, s, root=tmp_path)
    assert (path / "reliability.png").stat().st_size > 0 and (path / "report.md").is_file()
    assert pred.drafter_key == drafter_key(d) and len(pred.calibration.temperatures) == 2 * 4
    again, path2 = acceptance_predictor(target, d, prompts, s, root=tmp_path)
    assert path2 == path and again.calibration == pred.calibration
    assert check_predictor(d, again) is again  # what generate(predictor=again) checks before decoding
    other = drafter(target, seed=1)  # another drafter: another artifact
    _, path3 = acceptance_predictor(target, other, prompts, s, root=tmp_path)
    assert path3 != path
    # DSpark: its own head, calibrated, no add-on weights
    own, _ = acceptance_predictor(target, drafter(target, "dspark"), prompts, s, root=tmp_path)
    assert own.head is None and own.calibration is not None
    # Domino: the hidden-state and the GRU-state heads are two artifacts; the GRU one reloads as itself
    dom = drafter(target, "domino")
    _, hidden_path = acceptance_predictor(target, dom, prompts, s, root=tmp_path)
    gru, gru_path = acceptance_predictor(target, dom, prompts, replace(s, inputs="gru"), root=tmp_path)
    assert gru_path != hidden_path and gru.head.input_kind == "gru"
    back, _ = acceptance_predictor(target, dom, prompts, replace(s, inputs="gru"), root=tmp_path)
    assert back.head.input_kind == "gru" and back.meta["inputs"] == "gru"
    assert check_predictor(dom, back) is back


class Oracle:
    """A real parallel drafter whose drafts are replaced by ``reference``'s tokens (prompt + the target's greedy
    continuation: what the target itself picks), with one-hot logits; round position ``wrong`` (0-based over the
    round's stages) gets another token instead. Its session keeps the inner one's stages (the head's inputs)."""

    def __init__(self, drafter, reference: list[int], wrong: int | None = None):
        self.inner, self.reference, self.wrong = drafter, reference, wrong

    def __getattr__(self, name):  # config, embeddings, kind: the inner drafter's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def new_session(self, **options):
        return _OracleSession(self, self.inner.new_session(**options))


class _OracleSession:
    def __init__(self, oracle: Oracle, inner):
        self.oracle, self.inner, self.pos, self.drafted = oracle, inner, 0, 0

    def extend(self, tokens, features):
        self.inner.extend(tokens, features)
        self.pos, self.drafted = self.inner.length, 0

    @property
    def stages(self):
        return self.inner.stages

    def draft(self, anchor, num_tokens, temperature, generator):
        self.inner.draft(anchor, num_tokens, temperature, generator)
        start = self.pos + 1 + self.drafted  # the anchor sits at self.pos
        toks = torch.tensor(self.oracle.reference[start: start + num_tokens])
        w = self.oracle.wrong
        if w is not None and self.drafted <= w < self.drafted + num_tokens:
            toks[w - self.drafted] = (toks[w - self.drafted] + 1) % 128
        self.inner.stages[-1].tokens = toks  # the next stage anchors at this stage's last draft
        self.drafted += num_tokens
        logits = torch.full((num_tokens, 128), -30.0)
        logits[torch.arange(num_tokens), toks] = 30.0
        return StageDraft(toks, None, None, logits)


@pytest.mark.parametrize("kind", ["backbone", "dspark"])
def test_labels_read_off_the_sequence_equal_the_targets_verdicts(target, kind):
    """Greedy rounds with hard labels on the reached rows are labelled from the sequence without a target
    forward: on every position a round reaches the label is the target's own verdict (head_rows="all" still
    verifies every round), later positions are 0, and the predictor built from them is the same."""
    from lit_domino.training.acceptance import fit_calibration, prefix_weights, reads_off_continuation

    prompt = [5, 6, 7, 8]
    s = AcceptanceSettings(stages=2, anchors_per_sequence=12, anchors="even")
    K = drafter(target, kind).config.block_size - 1
    reference = prompt + hf_greedy(target, prompt, 30 + s.stages * K)
    d = Oracle(drafter(target, kind), reference, wrong=K + 1)  # right up to the second stage's second draft
    seqs = [(reference[: len(prompt) + 30], len(prompt))]  # the last rounds draft past the sequence's end
    forward = replace(s, head_rows="all")
    assert reads_off_continuation(s) and not reads_off_continuation(forward)
    assert not reads_off_continuation(replace(s, temperature=1.0))
    fast, slow = collect_rounds(target, d, seqs, s), collect_rounds(target, d, seqs, forward)
    w = prefix_weights(slow["hard"])
    assert torch.equal(fast["hard"] * w, slow["hard"] * w)  # the target's verdicts wherever a round reaches
    read = fast["soft"].isnan().all(1)  # the rounds labelled from the sequence: 0 after the first rejection
    assert torch.equal(fast["hard"][read], (slow["hard"] * w)[read])
    assert read.any() and not read.all()  # the last rounds draft past the sequence's end: verified by the target
    assert not slow["soft"].isnan().any() and not fast["soft"][~read].isnan().any()
    assert 0 < float(fast["hard"].mean()) < 1 and torch.equal(fast["H"], slow["H"])
    z = torch.randn(fast["hard"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert fit_calibration(z, fast["hard"], "hard", stage_tokens=K) == fit_calibration(z, slow["hard"], "hard",
                                                                                         stage_tokens=K)


@pytest.mark.parametrize("kind", ["backbone", "domino", "dspark", "dflash2"])
def test_labels_of_a_drafter_that_drafts_the_targets_tokens(target, kind):
    """Every position a drafter drafting the target's own picks reaches is accepted, across the stage boundary;
    a wrong token at round position 3 is rejected there (the smoke drafters accepted none at j = 3: not the
    labels)."""
    d = drafter(target, kind)
    prompt = [5, 6, 7, 8]
    s = AcceptanceSettings(stages=3, anchors_per_sequence=5, anchors="even")
    K = d.config.block_size - 1
    ref = prompt + hf_greedy(target, prompt, 20 + s.stages * K)
    seqs = [(ref[: len(prompt) + 20], len(prompt))]
    data = collect_rounds(target, Oracle(d, ref), seqs, s)
    assert data["hard"].shape == (5, s.stages * K) and bool((data["hard"] == 1).all())
    soft = collect_rounds(target, Oracle(d, ref), seqs, replace(s, head_rows="all"))["soft"]  # every round verified
    assert bool((soft > 0).all())  # c* = p_j(d_j) for a one-hot q
    wrong = collect_rounds(target, Oracle(d, ref, wrong=2), seqs, s)["hard"]
    assert bool((wrong[:, :2] == 1).all()) and bool((wrong[:, 2] == 0).all())


@pytest.mark.parametrize("kind", ["backbone", "domino"])
def test_decode_anchors_are_the_engines_round_starts(target, kind):
    """The rounds ``anchors="decode"`` collects start where the engine's own greedy decode starts its rounds (drafts
    replaced by the target's tokens at random, the same draws in both, so that rounds accept some of their drafts)."""
    from lit_domino.decoding import generate
    from lit_domino.training.acceptance import decode_starts

    d = drafter(target, kind)
    prompt = [5, 6, 7, 8]
    reference = prompt + hf_greedy(target, prompt, 80)
    res = generate(target, OracleMix(d, reference, seed=1, p=0.7), torch.tensor([prompt]), max_new_tokens=40)
    oracle = OracleMix(d, reference, seed=1, p=0.7)
    seq = torch.tensor(prompt + res.tokens)
    engine = [len(prompt)]
    for acc in res.accepted_per_round:
        engine.append(engine[-1] + acc + 1)
    feats = target.forward_features(seq[None], d.config.feature_layers)[0]
    K = d.config.block_size - 1
    starts = decode_starts(oracle, seq, feats, len(prompt), len(seq) - 1 - K, K, {}, 0.0, None)
    assert max(res.accepted_per_round) >= 2 and starts == engine[: len(starts)] and len(starts) >= 5


def test_gru_head_trains_on_domino_and_is_refused_elsewhere(target):
    d = drafter(target, "domino")
    with torch.no_grad():
        d.head.up.weight.normal_()
    seqs = [(p + hf_greedy(target, p, 24), len(p)) for p in ([5, 6, 7, 8], [9, 3, 4, 10, 11])]
    s = AcceptanceSettings(stages=2, anchors_per_sequence=4, steps=50, inputs="gru")
    data = collect_rounds(target, d, seqs, s)
    for inputs, width in (("gru", 12), ("hidden+gru", d.embed.weight.shape[1] + 12)):
        head = train_head(d, data, replace(s, inputs=inputs))
        assert head.input_kind == inputs and head.embed_size == width
        x = head.inputs(d, data["H"], data["prev"])
        assert x.shape == (*data["hard"].shape, d.config.hidden_size + width)
        z = head(x).detach()
        assert torch.isfinite(z).all() and z.std() > 0
    with pytest.raises(ValueError, match="inputs must be one of"):
        AcceptanceSettings(inputs="state")
    with pytest.raises(NoAcceptancePredictor, match=r"inputs='gru'.*backbone drafter has no causal state"):
        build_predictor(target, drafter(target), [[5, 6, 7]], s)
    with pytest.raises(NoAcceptancePredictor, match="dspark drafter has no causal state"):
        build_predictor(target, drafter(target, "dspark"), [[5, 6, 7]], AcceptanceSettings(inputs="gru",
                                                                                            own_head=False))


def test_the_artifact_key_names_the_inputs(target):
    d, prompts = drafter(target, "domino"), [[5, 6, 7]]
    hidden, gru = (artifact_key(target, d, prompts, AcceptanceSettings(inputs=i)) for i in ("hidden", "gru"))
    assert hidden != gru and gru["settings"]["inputs"] == "gru"
    assert "inputs" not in hidden["settings"]  # the hidden head's artifacts built before the GRU variant stay valid
    assert artifact_key(target, drafter(target, "domino", seed=1), prompts, AcceptanceSettings()) != hidden
    # a changed calibration or head recipe is a new artifact (the defaults of 2026-12-04 night included)
    for changed in (dict(offsets=False), dict(head_rows="all")):
        assert artifact_key(target, d, prompts, AcceptanceSettings(**changed)) != hidden
    assert hidden["settings"]["offsets"] is True and hidden["settings"]["head_rows"] == "reached"
    with pytest.raises(ValueError, match="head_rows must be one of"):
        AcceptanceSettings(head_rows="some")
