"""The verify-cost curve C_v(n) of a target and CaDDTree's rule for a tree's node budget.

C_v(n) is the time of one target forward over ``n + 1`` tokens (the anchor and n tree nodes, or drafts) on top
of a KV cache, measured on the running machine and kept per target model, dtype and device for the process.
It is the one verify curve of the package: tree rounds price their nodes with it, and DLoop's round cost model
(:class:`lit_domino.decoding.cost_model.CostModel`) holds one for its verify part, measured by the same
:func:`measure_verify_cost` (its ``verify(w)`` of w tokens is ``C_v(w - 1)``), so both read one interpolation
rule (:meth:`VerifyCost.seconds_at`).
CaDDTree grows a tree while the expected accepted tokens per second rise: with the nodes in best-first
order and ``g_i = exp(path log q_i)`` the draft's probability that node i is reached,
``E(n) = 1 + Σ_{i <= n} g_i`` (bonus included), and the rule verifies the n that maximises
``E(n) / (C_draft + C_v(n))``; ``budget`` caps it.

Interface (shared with DLoop's cost model): :class:`VerifyCost` (``seconds_at(n)``, ``best_nodes``, ``best_rate``)
and :func:`measure_verify_cost` (one curve per target, dtype, device, widths and context in a
process).
"""

from __future__ import annotations

import bisect
import functools
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
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

    def __post_init__(self):
        if not self.widths or len(self.widths) != len(self.seconds):
            raise ValueError(f"VerifyCost needs one time per width, got {len(self.widths)} widths and "
                             f"{len(self.seconds)} times")
        if list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 0:
            raise ValueError(f"VerifyCost widths must be increasing node counts >= 0, got {self.widths}")
        if any(not s > 0 for s in self.seconds):
            raise ValueError(f"VerifyCost times must be positive, got {self.seconds}")

    def seconds_at(self, n: int) -> float:
        """C_v(n): linear between the measured widths, linear beyond the last two, flat below the first (one
        width: proportional to n, or flat when that width is 0)."""
        w, s = self.widths, self.seconds
        if n <= w[0] or len(w) == 1:
            return s[0] if n <= w[0] or w[0] == 0 else s[0] * n / w[0]
        j = min(bisect.bisect_left(w, n), len(w) - 1)
        i = j - 1
        return s[i] + (s[j] - s[i]) * (n - w[i]) / (w[j] - w[i])

    def best_nodes(self, gains: list[float], cap: int, draft_s: float | None = None) -> int:
        """CaDDTree's rule: how many of the nodes (best-first order, ``gains[i]`` = the draft's probability of
        reaching node i+1) to verify: the n that maximises ``E(n) / (C_draft + C_v(n))``, at most ``cap`` and
        ``len(gains)``, at least 1 (ties: the smaller n). The global maximum, not the first fall: a measured
        curve is not concave (on a CPU C_v jumps from 1 to 2 nodes and is nearly flat from 4 to 16), and
        stopping at its first step kept trees smaller than the chain."""
        return max(self.best_rate(gains, cap, draft_s)[0], 1)

    def best_rate(self, gains: list[float], cap: int, draft_s: float | None = None) -> tuple[int, float]:
        """The rule's choice and its rate: ``(n, E(n) / (C_draft + C_v(n)))`` maximised over n = 1 ..
        min(``cap``, ``len(gains)``) (ties: the smaller n); no node: ``(0, 1 / (C_draft + C_v(0)))``, the
        anchor's bonus alone. ``gains`` in best-first order (non-increasing), as for :meth:`best_nodes`."""
        rates = self._rates(gains, cap, draft_s)
        if not rates.size:
            return 0, 1.0 / ((self.draft_s if draft_s is None else draft_s) + self.seconds_at(0))
        n = int(np.argmax(rates))  # the first maximum: ties go to the smaller n
        return n + 1, float(rates[n])

    def _rates(self, gains: list[float], cap: int, draft_s: float | None) -> np.ndarray:
        """The rule's rates ``E(n) / (C_draft + C_v(n))`` for n = 1 .. min(``cap``, ``len(gains)``)."""
        draft = self.draft_s if draft_s is None else draft_s
        top = min(cap, len(gains))
        # E(n) = 1 + g_1 + .. + g_n summed in that order (cumsum is sequential): the rates of a Python loop
        return np.cumsum([1.0, *gains[:top]])[1:] / (draft + self._seconds_upto(top))

    @functools.lru_cache(maxsize=16)
    def _seconds_upto(self, top: int) -> np.ndarray:
        """C_v(1 .. top) as an array (:meth:`seconds_at`), kept per curve and ``top``: the rule runs every round
        (a cost-aware path tree: at every depth)."""
        return np.array([self.seconds_at(n) for n in range(1, top + 1)])

    def describe(self) -> str:
        return "C_v(n): " + ", ".join(f"{w}: {1e3 * s:.2f} ms" for w, s in zip(self.widths, self.seconds))


_CURVES: dict[tuple, VerifyCost] = {}


@torch.inference_mode()
def measure_verify_cost(target, widths: tuple[int, ...] = DEFAULT_WIDTHS, context: int = 64, repeats: int = 3,
                        verbose: bool = True, hidden: bool = True) -> VerifyCost:
    """C_v(n) of ``target`` on this machine: the median of ``repeats`` forwards (after a warm-up) over n + 1
    tokens on the engine's eager DynamicCache runner holding ``context`` positions, with hidden states when
    ``hidden`` (as a drafter reading features verifies), for each n in ``widths``, the widths taking turns within
    each repeat (a load spike then moves the whole curve, not one width: timed width after width, one width's
    reading moved a lot between runs on a shared 2-core box); kept per target model, dtype, device, widths, context and
    ``hidden`` (printed once when measured). Times are made non-decreasing (a larger forward never costs less; a
    lucky sample would otherwise invite a larger tree or more stages)."""
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
    times = [statistics.median(x) for x in samples]
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
