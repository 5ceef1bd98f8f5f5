"""The verify-cost curve C_v(n) of a target and CaDDTree's rule for a tree's node budget.

C_v(n) is the time of one target forward over ``n + 1`` tokens (the anchor and n tree nodes, or drafts) on top
of a KV cache, measured on the running machine and kept per target model, dtype and device for the process.
It is the one verify curve of the package: tree rounds price their nodes with it, and DLoop's round cost model
(:class:`lit_domino.decoding.cost_model.CostModel`) holds one for its verify part, measured by the same
:func:`measure_verify_cost` (its ``verify(w)`` of w tokens is ``C_v(w - 1)``), so both read one interpolation
rule (:meth:`VerifyCost.seconds_at`).
CaDDTree grows a tree while the expected accepted tokens per second rise: with the nodes in best-first
order and ``g_i = exp(path log q_i)`` the draft's probability that node i is reached,
``E(n) = 1 + Σ_{i <= n} g_i`` (bonus included; a decode calibrates each g_i by what its target accepted of
nodes of that size, :attr:`VerifyCost.gain_ratios`), and the rule verifies the n that maximises
``E(n) / (C_draft + C_v(n))`` (CaDDTree's round rate) or, once a decode knows its throughput λ,
``E(n) - λ (C_draft + C_v(n))`` (:attr:`VerifyCost.rate`: what maximises tokens over time summed over rounds);
``budget`` caps it.

Interface (shared with DLoop's cost model): :class:`VerifyCost` (``seconds_at(n)``, ``best_nodes``, ``best_rate``)
and :func:`measure_verify_cost` (one curve per target, dtype, device, widths and context in a
process).
"""

from __future__ import annotations

import bisect
import functools
import math
import sys
import time
from dataclasses import dataclass

import torch

DEFAULT_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
"""Tree sizes n whose verify time is measured (between them C_v is linear)."""


@dataclass(frozen=True)
class VerifyCost:
    """A measured verify-cost curve and the draft cost it competes with."""

    widths: tuple[int, ...]
    """Tree sizes n (nodes beyond the anchor; 0 = the anchor alone), increasing."""
    seconds: tuple[float, ...]
    """C_v(n) in seconds per target forward over n + 1 tokens, one per width, non-decreasing."""
    draft_s: float = 0.0
    """C_draft: seconds of drafting per round (the tree rounds replace it by the draft time they measure)."""
    scale: float = 1.0
    """Prices the measured curve: C_v(n) as the rule reads it is ``scale`` x the measured one + :attr:`extra_s` (a
    decode's observed prices, :class:`~lit_domino.decoding.round_costs.RoundCosts`; the measured times stay as
    measured, so the interpolation is computed once per curve)."""
    extra_s: float = 0.0
    """Seconds a round costs beyond its drafting and verify forward (rollback, bookkeeping), added to every C_v(n)."""
    rate: float = 0.0
    """λ, the tokens per second the decode achieves (its recent rounds'): the rule then verifies the n that
    maximises ``E(n) - λ (C_draft + C_v(n))``, adding node i while its gain exceeds what its verify time would
    earn at λ. 0: the n that maximises the round's own ``E(n) / (C_draft + C_v(n))``. A decode's throughput is its
    tokens over its time summed over rounds, and per-round ratios do not maximise that: they give a round of low
    gains more nodes than a round of high ones (Dinkelbach; measured: docs/results.md, 2026-12-07 (night))."""
    gain_ratios: tuple[float, ...] = ()
    """The draft's gains calibrated by their size: a gain g in [2^-(b+1), 2^-b) counts as g x ``gain_ratios[b]``
    (smaller ones: the last ratio), what the target accepted of such nodes in the decode so far
    (:meth:`~lit_domino.decoding.round_costs.RoundCosts.add_gains`); non-increasing, so a larger gain stays
    larger. Empty: the draft's own probabilities."""

    def __post_init__(self):
        if not self.widths or len(self.widths) != len(self.seconds):
            raise ValueError(f"VerifyCost needs one time per width, got {len(self.widths)} widths and "
                             f"{len(self.seconds)} times")
        if list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 0:
            raise ValueError(f"VerifyCost widths must be increasing node counts >= 0, got {self.widths}")
        if any(not s > 0 for s in self.seconds):
            raise ValueError(f"VerifyCost times must be positive, got {self.seconds}")
        if not self.scale > 0 or not self.extra_s >= 0 or not self.rate >= 0:
            raise ValueError(f"VerifyCost scale must be > 0, extra_s and rate >= 0, got {self.scale}, {self.extra_s} "
                             f"and {self.rate}")
        r = self.gain_ratios
        if any(not x > 0 for x in r) or any(b > a for a, b in zip(r, r[1:])):
            raise ValueError(f"VerifyCost gain_ratios must be positive and non-increasing, got {r}")

    def seconds_at(self, n: int) -> float:
        """C_v(n) as priced: :attr:`scale` x the measured curve read at n (:func:`_measured_at`) + :attr:`extra_s`."""
        return self.scale * _measured_at(self.widths, self.seconds, n) + self.extra_s

    def best_nodes(self, gains: list[float], cap: int, draft_s: float | None = None) -> int:
        """CaDDTree's rule: how many of the nodes (best-first order, ``gains[i]`` = the draft's probability of
        reaching node i+1) to verify: the n that maximises ``E(n) / (C_draft + C_v(n))``, at most ``cap`` and
        ``len(gains)``, at least 1 (ties: the smaller n). The global maximum, not the first fall: a measured
        curve is not concave (on a CPU C_v jumps from 1 to 2 nodes and is nearly flat from 4 to 16), and
        stopping at its first step kept trees smaller than the chain."""
        return max(self.best_rate(gains, cap, draft_s)[0], 1)

    def best_rate(self, gains: list[float], cap: int, draft_s: float | None = None) -> tuple[int, float]:
        """The rule's choice and its rate: the n of 1 .. min(``cap``, ``len(gains)``) that maximises ``E(n) - λ
        (C_draft + C_v(n))`` (λ = :attr:`rate`; 0: ``E(n) / (C_draft + C_v(n))``), ties to the smaller n, and its
        ``E(n) / (C_draft + C_v(n))``; no node: ``(0, 1 / (C_draft + C_v(0)))``, the anchor's bonus alone.
        ``gains`` in best-first order (non-increasing), as for :meth:`best_nodes`.

        Plain Python over at most ``cap`` floats: inside a decode (caches cold after the model's forwards) a NumPy
        call costs many times its warm time, and the rule as ten of them cost more than this loop
        (docs/results.md, 2026-12-07 (night))."""
        draft = self.draft_s if draft_s is None else draft_s
        top = min(cap, len(gains))
        if top <= 0:
            return 0, 1.0 / (draft + self.seconds_at(0))
        measured, scale, extra = _measured_upto(self.widths, self.seconds, top), self.scale, self.extra_s
        r, lam = self.gain_ratios, self.rate
        expected, best_n, best, best_rate = 1.0, 0, -math.inf, 0.0
        for n in range(top):
            g = gains[n]
            expected += g * r[gain_class(g, len(r))] if r else g  # E(n+1) = 1 + g_1 + .. + g_{n+1}, in that order
            seconds = draft + (scale * measured[n] + extra)
            rate = expected / seconds
            value = expected - lam * seconds if lam else rate
            if value > best:  # strictly: ties go to the smaller n
                best_n, best, best_rate = n + 1, value, rate
        return best_n, best_rate

    def describe(self) -> str:
        return "C_v(n): " + ", ".join(f"{w}: {1e3 * s:.2f} ms" for w, s in zip(self.widths, self.seconds))


def _measured_at(w: tuple[int, ...], s: tuple[float, ...], n: int) -> float:
    """The measured curve ``s`` at ``w`` read at n nodes: linear between the measured widths, linear beyond the
    last two, flat below the first (one width: proportional to n, or flat when that width is 0)."""
    if n <= w[0] or len(w) == 1:
        return s[0] if n <= w[0] or w[0] == 0 else s[0] * n / w[0]
    j = min(bisect.bisect_left(w, n), len(w) - 1)
    i = j - 1
    return s[i] + (s[j] - s[i]) * (n - w[i]) / (w[j] - w[i])


@functools.lru_cache(maxsize=64)
def _measured_upto(widths: tuple[int, ...], seconds: tuple[float, ...], top: int) -> tuple[float, ...]:
    """:func:`_measured_at` at n = 1 .. top, kept per curve and ``top`` (the rule reads it every round)."""
    return tuple(_measured_at(widths, seconds, n) for n in range(1, top + 1))


def gain_class(g: float, classes: int) -> int:
    """The size class b of a gain g among ``classes``: g in [2^-(b+1), 2^-b), so class 0 holds [1/2, 1] (and
    above), the last every smaller gain, 0 included."""
    if classes <= 1 or g <= 0:
        return max(classes - 1, 0)
    return min(max(-math.frexp(g)[1], 0), classes - 1)  # g = m 2^e with m in [1/2, 1): g in [2^(e-1), 2^e)


_CURVES: dict[tuple, VerifyCost] = {}


@torch.inference_mode()
def measure_verify_cost(target, widths: tuple[int, ...] = DEFAULT_WIDTHS, context: int = 64, repeats: int = 3,
                        verbose: bool = True, hidden: bool = True) -> VerifyCost:
    """C_v(n) of ``target`` on this machine: the fastest of ``repeats`` forwards (after a warm-up) over n + 1
    tokens on the engine's eager DynamicCache runner holding ``context`` positions, with hidden states when
    ``hidden`` (as a drafter reading features verifies), for each n in ``widths``, the widths taking turns within
    each repeat; kept per target model, dtype, device, widths, context and ``hidden`` (printed once when
    measured). The fastest, not the median: noise only adds time, and a load spike over two of three samples of
    one width once made a median curve flat from 4 to 64 nodes, so the rule grew every tree to its cap. Times are
    made non-decreasing (a larger forward never costs less). A decode rescales the curve by the verifies it
    observes (:class:`~lit_domino.decoding.round_costs.RoundCosts`)."""
    from lit_domino.decoding.round import TargetRunner

    widths = tuple(int(w) for w in widths)
    if not widths or repeats < 1 or context < 1:
        raise ValueError(f"measure_verify_cost needs widths, repeats >= 1 and context >= 1, got widths={widths}, "
                         f"repeats={repeats}, context={context}")
    key = (id(target.model), target.model.dtype, str(target.device), widths, int(context), bool(hidden))
    if key in _CURVES:
        return _CURVES[key]
    dev = torch.device(target.device)
    gen = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    runner = TargetRunner(target, context + max(widths) + 1, False, False)
    runner.prefill(torch.randint(0, vocab, (context,), generator=gen).to(dev), False)
    inputs = [torch.randint(0, vocab, (n + 1,), generator=gen).to(dev) for n in widths]
    samples = [[] for _ in widths]
    for rep in range(repeats + 1):  # the first is a warm-up
        for ids, out in zip(inputs, samples):
            _sync(dev)
            t0 = time.perf_counter()
            runner.forward(ids, hidden)
            _sync(dev)
            if rep:
                out.append(time.perf_counter() - t0)
            runner.crop(context)
    times = [min(x) for x in samples]  # noise only adds time: a load spike on two of three samples moved a median
    for i in range(1, len(times)):
        times[i] = max(times[i], times[i - 1])
    curve = VerifyCost(widths, tuple(times))
    _CURVES[key] = curve
    if verbose:
        print(f"verify cost of {getattr(target, 'name', 'the target')} ({target.model.dtype}, {dev}): "
              f"{curve.describe()}", file=sys.stderr)
    return curve


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
