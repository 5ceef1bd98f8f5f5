"""What one decoded sequence records: its tokens, τ, its rounds and the time of each phase."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    """One decoded sequence and how it was decoded.

    ``tau`` is the mean number of tokens committed per verification round *including*
    the bonus (``mean(accepted_per_round) + 1``; NaN when no round ran). A final round cut by
    ``max_new_tokens`` or EOS counts the tokens it emitted, as ``dflash_generate`` does (counting
    what the target accepted beyond them flattered τ); the verification
    outcome of every stage stays in ``stage_records``.
    ``drafted_per_round`` is the number of draft tokens verified in each round.
    Times are seconds (``time.perf_counter``); ``decode_time_s`` excludes the prefill
    (which produces the first token), and ``tpot_ms`` is
    ``decode_time_s / (len(tokens) - 1)`` in milliseconds: the same definition for the
    AR baseline and every drafter, so their ratio is the speedup.
    """

    tokens: list[int]
    tau: float = float("nan")
    rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    stages_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    other_time_s: float = 0.0
    decode_time_s: float = 0.0
    prefill_time_s: float = 0.0
    tpot_ms: float = float("nan")
    num_target_forwards: int = 0
    stop_reason: str = "length"  # "eos" or "length"
    accepted_ranks: list[int] = field(default_factory=list)
    """Tree rounds (``generate(..., tree=...)``): the sibling rank of every accepted node (0 = its parent's top
    candidate), the statistic of how often a tree's branches pay."""
    repeat_tpot_ms: list[float] = field(default_factory=list)
    """``benchmark(..., repeats=R)``: the time per output token of each of the R decodes (``tpot_ms`` is their mean),
    what the rows' repeat-to-repeat noise is measured from."""
    stage_records: list[tuple[float, float, int, int]] = field(default_factory=list)
    """``generate(..., record_stages=True)``: per drafted stage ``(sum log q, last log q, K, accepted)`` — the
    stage's draft log-probabilities (for any DLoop gate's confidence) and how many of its K tokens the target
    then accepted (K: the whole stage): DLoop's calibration data."""

    def finish(self) -> GenerationResult:
        self.rounds = len(self.accepted_per_round)
        self.tau = (sum(self.accepted_per_round) / self.rounds + 1.0) if self.rounds else float("nan")
        n = len(self.tokens) - 1
        self.tpot_ms = 1e3 * self.decode_time_s / n if n > 0 else float("nan")
        return self
