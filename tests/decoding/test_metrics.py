"""Decoding metrics: tau, accepted per round, conditional per-position acceptance, histograms, summaries."""

from __future__ import annotations

import math

import pytest
import torch

from lit_domino.decoding.engine import GenerationResult
from lit_domino.decoding.metrics import (AcceptanceLength, AcceptedPerRound, PositionAcceptance,
    StagesPerVerification, TauHistogram, merge_results, per_prompt_tau, summarize)
from lit_domino.decoding.harness import markdown_table


def result(accepted, drafted, tokens=None, decode=1.0, stages=None):
    n = tokens if tokens is not None else sum(a + 1 for a in accepted) + 1
    return GenerationResult(tokens=list(range(n)), accepted_per_round=list(accepted),
                            drafted_per_round=list(drafted), stages_per_round=stages or [1] * len(accepted),
                            decode_time_s=decode).finish()


def test_tau_and_accepted_per_round():
    tau, acc = AcceptanceLength(), AcceptedPerRound()
    assert math.isnan(float(tau.compute()))
    tau.update([3, 0, 1]), acc.update([3, 0, 1])
    tau.update(result([7], [7])), acc.update(result([7], [7]))
    assert float(tau.compute()) == pytest.approx((4 + 1 + 2 + 8) / 4)
    assert float(acc.compute()) == pytest.approx(11 / 4)


def test_position_acceptance_is_conditional():
    m = PositionAcceptance(max_positions=4)
    # drafted 3 each: acc 3 (reached 1..3, all accepted), acc 0 (reached 1), acc 1 (reached 1..2)
    m.update([3, 0, 1], [3, 3, 3])
    out = m.compute()
    assert set(out) == {"acc_rate_pos_01", "acc_rate_pos_02", "acc_rate_pos_03"}
    assert float(out["acc_rate_pos_01"]) == pytest.approx(2 / 3)
    assert float(out["acc_rate_pos_02"]) == pytest.approx(1 / 2)
    assert float(out["acc_rate_pos_03"]) == pytest.approx(1.0)
    assert math.isnan(float(m.rates()[3]))
    with pytest.raises(ValueError, match="differ"):
        m.update([1, 2], [3])


def test_histogram_and_stages():
    h = TauHistogram(max_tau=5)
    h.update([0, 0, 2, 9])
    assert h.compute().tolist() == [0, 2, 0, 1, 0, 1]  # tau 10 clamps into the last bin
    s = StagesPerVerification()
    s.update(result([1, 2], [3, 6], stages=[1, 2]))
    assert float(s.compute()) == pytest.approx(1.5)


def test_metrics_reduce_by_sum():
    a, b = PositionAcceptance(4), PositionAcceptance(4)
    a.update([1], [3]), b.update([3], [3])
    a.merge_state(b)
    assert float(a.compute()["acc_rate_pos_02"]) == pytest.approx(1 / 2)


def test_per_prompt_tau_differs_from_pooled_and_summary():
    r1, r2 = result([3, 3, 3, 3], [3] * 4, decode=0.5), result([0], [3], decode=0.5)
    assert per_prompt_tau([r1, r2]) == pytest.approx((4 + 1) / 2)
    base = [result([0] * 16, [0] * 16, decode=4.0), result([0], [0], tokens=r2.tokens.__len__(), decode=1.0)]
    row = summarize([r1, r2], baseline=base, hf_baseline=base)
    assert row["tau"] == pytest.approx(2.5) and row["tau_per_round"] == pytest.approx(17 / 5)
    assert row["speedup"] == pytest.approx(((4000 / 16) + 1000 / 1) / 2 / ((500 / 16 + 500 / 1) / 2))
    assert row["acc_rate_pos_01"] == pytest.approx(4 / 5) and row["tau_histogram"] == [0, 1, 0, 0, 4]
    assert row["match_baseline"] == 1.0  # same token lists
    assert "| benchmark |" in markdown_table([dict(row, benchmark="x", method="m", temperature=0.0)])


def test_merge_results_for_multi_turn():
    a, b = result([1, 2], [3, 3], decode=1.0), result([0], [3], decode=3.0)
    m = merge_results([a, b])
    assert m.tokens == a.tokens + b.tokens and m.rounds == 3
    assert m.tau == pytest.approx((2 + 3 + 1) / 3)
    assert m.tpot_ms == pytest.approx(1e3 * 4.0 / (len(m.tokens) - 2))
    assert torch.is_tensor(AcceptanceLength().compute())


def test_repeat_noise_is_the_spread_of_each_repeats_speedup():
    """Two repeats: the method is 2x the baseline in the first and 1x in the second -> speedups 2 and 1, mean 1.5,
    sample std 0.707 (relative 0.471); one repeat has no noise estimate."""
    from lit_domino.decoding.metrics import repeat_noise

    def res(*tpots):
        return GenerationResult(tokens=[1, 2], tpot_ms=sum(tpots) / len(tpots), repeat_tpot_ms=list(tpots))

    base, method = [res(2.0, 2.0), res(4.0, 4.0)], [res(1.0, 2.0), res(2.0, 4.0)]
    assert repeat_noise(method, base) == pytest.approx(0.5 ** 0.5 / 1.5)
    assert summarize(method, base)["speedup_noise"] == pytest.approx(0.5 ** 0.5 / 1.5)
    assert math.isnan(repeat_noise([res(1.0)], [res(2.0)]))


def test_paired_change_compares_each_prompt_with_itself():
    """Prompts of very different lengths, each decoded 1.25x faster: +25 % with no spread; one prompt's time lost or
    a single pair: NaN. Summaries carry each prompt's decode seconds for it."""
    from lit_domino.decoding.metrics import paired_change

    delta, se = paired_change([1.0, 10.0, 100.0], [0.8, 8.0, 80.0])
    assert delta == pytest.approx(25.0) and se == pytest.approx(0.0, abs=1e-9)
    delta, se = paired_change([1.0, 1.0], [1.0, 0.5])  # 1x and 2x: geometric mean sqrt(2)
    assert delta == pytest.approx(100 * (2 ** 0.5 - 1))
    assert se == pytest.approx(100 * 2 ** 0.5 * math.log(2) / 2 ** 0.5 / 2 ** 0.5)  # exp(mean) sd / sqrt(n)
    assert all(math.isnan(x) for x in paired_change([1.0], [2.0]))
    assert all(math.isnan(x) for x in paired_change([1.0, 2.0], [1.0]))
    res = [GenerationResult(tokens=[1, 2], decode_time_s=t) for t in (0.5, 2.0)]
    assert summarize(res)["decode_s_by_prompt"] == [0.5, 2.0]
