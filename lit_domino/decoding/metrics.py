"""What real speculative decoding measures (the harness that runs it over prompt sets: ``decoding/harness.py``).

torchmetrics ``Metric``s with sum-reduced count states (they reduce across devices):

* :class:`AcceptanceLength` — ``tau``: tokens committed per round, bonus included (pooled over rounds);
* :class:`AcceptedPerRound` — accepted drafts per round, bonus excluded;
* :class:`PositionAcceptance` — ``acc_rate_pos_{k:02d}`` = P(draft position k accepted | positions < k accepted);
* :class:`TauHistogram` — how many rounds committed τ = 1, 2, ... tokens;
* :class:`StagesPerVerification` — DLoop drafting stages per target verification.

The papers report ``tau`` as the mean over prompts of each prompt's mean
(:func:`per_prompt_tau`); the pooled per-round mean is ``tau_per_round``.
``speedup`` is the AR baseline's mean time-per-output-token divided by ours (each
a mean over prompts of the per-prompt TPOT, prefill excluded, as in the DFlash
benchmark), measured in the same process on the same prompts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import torch
from torchmetrics import Metric

from lit_domino.decoding.result import GenerationResult

# --------------------------------------------------------------------------- metrics


def _rounds(x) -> torch.Tensor:
    """accepted_per_round from a GenerationResult, a list or a tensor → long tensor [R]."""
    if isinstance(x, GenerationResult):
        x = x.accepted_per_round
    return torch.as_tensor(list(x) if not isinstance(x, torch.Tensor) else x, dtype=torch.long).reshape(-1)


class _RoundMean(Metric):
    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    offset = 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("rounds", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, accepted_per_round) -> None:
        acc = _rounds(accepted_per_round).to(self.total.device)
        self.total += acc.sum() + self.offset * acc.numel()
        self.rounds += acc.numel()

    def compute(self) -> torch.Tensor:
        if int(self.rounds) == 0:
            return torch.tensor(float("nan"))
        return self.total.double() / self.rounds


class AcceptanceLength(_RoundMean):
    """``tau``: mean tokens committed per verification round, the bonus included (accepted + 1).

    ``update(result | accepted_per_round)``; ``compute()`` pools all rounds (NaN before any).
    """

    offset = 1


class AcceptedPerRound(_RoundMean):
    """Mean accepted draft tokens per round, bonus excluded (= tau - 1)."""


class PositionAcceptance(Metric):
    """Conditional per-position acceptance P(position k accepted | positions 1..k-1 accepted).

    A round that drafted m tokens and accepted ``acc`` *reached* positions
    ``1..min(acc + 1, m)`` and accepted ``1..acc``. ``compute()`` returns
    ``{"acc_rate_pos_01": rate, ...}`` for the positions some round reached.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, max_positions: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.max_positions = int(max_positions)
        self.add_state("reached", default=torch.zeros(self.max_positions, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("accepted", default=torch.zeros(self.max_positions, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, accepted_per_round, drafted_per_round=None) -> None:
        if isinstance(accepted_per_round, GenerationResult):
            drafted_per_round = accepted_per_round.drafted_per_round
        acc = _rounds(accepted_per_round)
        drafted = _rounds(drafted_per_round)
        if acc.shape != drafted.shape:
            raise ValueError(f"accepted_per_round ({acc.numel()}) and drafted_per_round ({drafted.numel()}) differ")
        k = torch.arange(1, self.max_positions + 1)
        reached = (k[None] <= torch.minimum(acc + 1, drafted)[:, None]).sum(0)
        accepted = (k[None] <= acc[:, None]).sum(0)
        self.reached += reached.to(self.reached.device)
        self.accepted += accepted.to(self.accepted.device)

    def rates(self) -> torch.Tensor:
        """[max_positions] conditional rates, NaN where a position was never reached."""
        return torch.where(self.reached > 0, self.accepted.double() / self.reached.clamp(min=1),
                           torch.tensor(float("nan"), dtype=torch.double))

    def compute(self) -> dict[str, torch.Tensor]:
        rates = self.rates()
        return {f"acc_rate_pos_{k + 1:02d}": rates[k] for k in range(self.max_positions) if self.reached[k] > 0}


class TauHistogram(Metric):
    """Counts of rounds by tokens committed (τ = accepted + 1); ``compute()`` → long tensor [max_tau + 1]."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, max_tau: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.max_tau = int(max_tau)
        self.add_state("counts", default=torch.zeros(self.max_tau + 1, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, accepted_per_round) -> None:
        tau = (_rounds(accepted_per_round) + 1).clamp(max=self.max_tau)
        self.counts += torch.bincount(tau, minlength=self.max_tau + 1).to(self.counts.device)

    def compute(self) -> torch.Tensor:
        return self.counts.clone()


class StagesPerVerification(_RoundMean):
    """Mean DLoop drafting stages per target verification (1.0 without DLoop).

    ``update(result | stages_per_round)``.
    """

    def update(self, stages_per_round) -> None:
        if isinstance(stages_per_round, GenerationResult):
            stages_per_round = stages_per_round.stages_per_round
        super().update(stages_per_round)


# --------------------------------------------------------------------------- aggregation


def _nanmean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(vals) if vals else float("nan")


def per_prompt_tau(results: Sequence[GenerationResult]) -> float:
    """The papers' ``tau``: mean over prompts of each prompt's mean τ (prompts without rounds skipped)."""
    return _nanmean(r.tau for r in results)


def mean_tpot_ms(results: Sequence[GenerationResult]) -> float:
    """Mean over prompts of the per-prompt time per output token (prefill excluded)."""
    return _nanmean(r.tpot_ms for r in results)


def repeat_noise(results: Sequence[GenerationResult], baseline: Sequence[GenerationResult]) -> float:
    """How much the speedup moves between repeated decodes: the speedup of each repeat alone (its decodes of every
    prompt against the baseline's decodes of the same repeat), their standard deviation over their mean (relative;
    NaN without repeats). The same rounds timed twice differ by this much, so a difference between two methods'
    speedups below ~2x it is timing noise."""
    reps = {len(r.repeat_tpot_ms) for r in [*results, *baseline]}
    if len(reps) != 1 or min(reps) < 2:
        return float("nan")
    R = reps.pop()
    speedups = [_nanmean(b.repeat_tpot_ms[k] for b in baseline) / _nanmean(r.repeat_tpot_ms[k] for r in results)
                for k in range(R)]
    mean = sum(speedups) / R
    return (sum((x - mean) ** 2 for x in speedups) / (R - 1)) ** 0.5 / mean


def paired_change(base: Sequence[float], other: Sequence[float]) -> tuple[float, float]:
    """How much faster ``other`` decoded the same prompts than ``base``, paired prompt by prompt (the two decoded the
    same tokens: lossless): ``(Δ %, its standard error in points)``, Δ = exp(mean log(base_i / other_i)) - 1. The
    prompts' own lengths cancel in each ratio, so the noise left is the timing's; a Δ within 2 standard errors of 0
    is not a measured difference. NaN when fewer than 2 prompts have both times."""
    logs = [math.log(b / o) for b, o in zip(base, other) if b > 0 and o > 0 and math.isfinite(b / o)]
    if len(logs) < 2 or len(base) != len(other):
        return float("nan"), float("nan")
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) ** 0.5
    return 100 * math.expm1(mean), 100 * math.exp(mean) * sd / len(logs) ** 0.5


def merge_results(results: Sequence[GenerationResult]) -> GenerationResult:
    """One result for a multi-turn conversation: tokens and rounds concatenated, times summed.

    ``tpot_ms`` is the total decode time over ``len(tokens) - turns`` (each turn's first
    token comes from its prefill).
    """
    if len(results) == 1:
        return results[0]
    out = GenerationResult(tokens=[], stop_reason=results[-1].stop_reason)
    for r in results:
        out.tokens += r.tokens
        for name in ("accepted_per_round", "stages_per_round", "drafted_per_round", "stage_records", "accepted_ranks"):
            getattr(out, name).extend(getattr(r, name))
        for name in ("draft_time_s", "verify_time_s", "other_time_s", "decode_time_s", "prefill_time_s",
                     "num_target_forwards"):
            setattr(out, name, getattr(out, name) + getattr(r, name))
    out.finish()
    n = len(out.tokens) - len(results)
    out.tpot_ms = 1e3 * out.decode_time_s / n if n > 0 else float("nan")
    return out


def summarize(
    results: Sequence[GenerationResult],
    baseline: Sequence[GenerationResult] | None = None,
    hf_baseline: Sequence[GenerationResult] | None = None,
    max_positions: int = 64,
    *,
    compiled_baseline: Sequence[GenerationResult] | None = None,
) -> dict:
    """Metrics of one method over a prompt set (JSON-ready floats).

    ``baseline``: our eager AR results on the same prompts (→ ``speedup``); ``hf_baseline``:
    Hugging Face ``generate`` results (→ ``speedup_vs_hf_generate``); ``compiled_baseline``: the compiled plain
    decoder's (→ ``speedup_vs_compiled_ar``).
    """
    # this process's decodes only: under DDP the eval callback decodes on rank 0 alone, and a metric that gathered
    # its state across ranks at compute() would wait forever for the others (they wait in the callback's broadcast)
    local = {"sync_on_compute": False}
    tau, acc, pos, hist, stages = (AcceptanceLength(**local), AcceptedPerRound(**local),
                                   PositionAcceptance(max_positions, **local), TauHistogram(max_positions + 1, **local),
                                   StagesPerVerification(**local))
    for r in results:
        if r.rounds:
            tau.update(r), acc.update(r), pos.update(r), hist.update(r), stages.update(r)
    rounds = sum(r.rounds for r in results)
    tpot = mean_tpot_ms(results)
    nan = float("nan")
    row = {
        "num_prompts": len(results),
        "tau": per_prompt_tau(results),
        "tau_per_round": float(tau.compute()) if rounds else nan,
        "accepted_per_round": float(acc.compute()) if rounds else nan,
        "stages_per_round": float(stages.compute()) if rounds else nan,
        "tpot_ms": tpot,
        "rounds": rounds,
        "tokens": sum(len(r.tokens) for r in results),
        "draft_ms_per_round": 1e3 * sum(r.draft_time_s for r in results) / rounds if rounds else float("nan"),
        "verify_ms_per_round": 1e3 * sum(r.verify_time_s for r in results) / rounds if rounds else float("nan"),
        "other_ms_per_round": 1e3 * sum(r.other_time_s for r in results) / rounds if rounds else float("nan"),
        "nodes_per_round": sum(sum(r.drafted_per_round) for r in results) / rounds if rounds else float("nan"),
        "prefill_ms": 1e3 * _nanmean(r.prefill_time_s for r in results),
        "decode_s_by_prompt": [float(r.decode_time_s) for r in results],  # paired comparisons (paired_change)
    }
    if baseline is not None:
        row["speedup"] = mean_tpot_ms(baseline) / tpot if tpot > 0 else float("nan")
        row["speedup_noise"] = repeat_noise(results, baseline)
        row["match_baseline"] = _nanmean(float(a.tokens == b.tokens) for a, b in zip(results, baseline))
    if hf_baseline is not None:
        row["speedup_vs_hf_generate"] = mean_tpot_ms(hf_baseline) / tpot if tpot > 0 else float("nan")
    if compiled_baseline is not None:
        row["speedup_vs_compiled_ar"] = mean_tpot_ms(compiled_baseline) / tpot if tpot > 0 else float("nan")
    if rounds:
        row.update({k: float(v) for k, v in pos.compute().items()})
    counts = hist.compute().tolist() if rounds else []
    while counts and counts[-1] == 0:
        counts.pop()
    row["tau_histogram"] = counts  # index = tau
    ranks = [k for r in results for k in r.accepted_ranks]
    if ranks:  # tree rounds: how many accepted nodes were their parent's rank-0, rank-1, ... candidate
        row["accepted_rank_counts"] = [ranks.count(k) for k in range(max(ranks) + 1)]
    records = [list(rec) for r in results for rec in r.stage_records]
    if records:
        row["stage_records"] = records  # [sum log q, last log q, K, accepted] per stage (record_stages)
    return row
