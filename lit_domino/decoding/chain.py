"""Chain rounds: the proposer of plain speculative decoding and of DLoop's stages (:func:`lit_domino.decoding.round.
decode` runs them).

A round drafts one stage of up to block_size-1 tokens below the anchor; under DLoop (:mod:`.gates`) further
stages, each anchored at the previous stage's last draft, while the gate is open. The target verifies the chain
``[anchor, d_1..d_m]`` and the walk is greedy at T = 0 (``acc = sum(cumprod(d == argmax(logits)[:-1]))``) or
rejection sampling at T > 0 (:mod:`.sampling`), the accepted drafts always a prefix of the chain.
"""

from __future__ import annotations

import torch

from lit_domino.decoding.gates import RoundPolicy
from lit_domino.decoding.round import Proposal, Verdict
from lit_domino.decoding.sampling import accept_greedy, one_hot_probs, verify_sampling
from lit_domino.models.sessions import is_greedy


class ChainProposer:
    """Chain rounds for one sequence: the round's stages (one stage without DLoop, ``policy`` None; the gate's
    stages with it), then the greedy or rejection-sampling walk along the chain."""

    def __init__(self, policy: RoundPolicy | None, block_size: int, limit: int | None, temperature: float, generator,
                 record_stages: bool = False):
        self.policy, self.block_size, self.limit, self.record_stages = policy, block_size, limit, record_stages
        self.temperature, self.generator, self.greedy = temperature, generator, is_greedy(temperature)
        self.looping = policy is not None and policy.dloop.max_stages > 1  # one stage is plain decoding

    def begin(self) -> None:
        if self.policy is not None:
            self.policy.begin()

    def room(self, start: int, wanted: int, drafted: int) -> int:
        """Drafts the next stage may add after ``drafted``: block_size-1; fewer at the context's end, and without
        DLoop never more than the round could emit (acc + 1 <= the tokens still wanted: the official loop's shorter
        last block; DLoop's stages keep their length, its calibration records are per full stage, and none is
        drafted once the round's drafts and its bonus already cover the tokens still wanted)."""
        if self.looping and drafted and drafted + 1 >= wanted:
            return 0
        n = self.block_size - 1 if self.looping else min(self.block_size - 1, wanted - 1)
        return n if self.limit is None else min(n, self.limit - 1 - start - drafted)

    def draft(self, session, anchor: torch.Tensor, start: int, wanted: int) -> Proposal:
        room = (lambda m: self.room(start, wanted, m))
        if self.policy is not None:  # DLoop: stages while the gate is open
            stages = self.policy.draft(session, anchor, room, self.temperature, self.generator)
        else:  # plain speculative decoding: one stage, no gate
            stages = [session.draft(anchor, room(0), self.temperature, self.generator)] if room(0) > 0 else []
        drafts = (torch.cat([s.tokens.reshape(-1) for s in stages]).to(anchor.device) if stages
                  else torch.zeros(0, dtype=torch.long, device=anchor.device))  # d_1..d_m
        # a round with no stage (its anchor alone, the decode's last token) is padded to one stage's width: a
        # compiled target replays that graph instead of compiling one more for width 1
        return Proposal(torch.cat([anchor.reshape(1), drafts]), drafts=stages,
                        width=max(len(stages), 1) * (self.block_size - 1) + 1)

    def accept(self, prop: Proposal, logits: torch.Tensor, temperature: float, generator) -> Verdict:
        drafts, stages = prop.ids[1:], prop.drafts
        if self.greedy:  # on the device, one host copy: the accepted drafts equal the target's own picks
            acc, committed = accept_greedy(drafts, logits)
        else:  # q: each stage's draft distribution (a greedy stage's: one-hot on its picks)
            q = torch.cat([s.probs if s.probs is not None else one_hot_probs(s.tokens, logits.shape[-1])
                           for s in stages]) if stages else logits.new_zeros(0, logits.shape[-1])
            acc, bonus = verify_sampling(drafts, q, logits, temperature, generator)
            committed = drafts[:acc].tolist() + [bonus]
        return Verdict(acc, committed)

    def observe(self, res, prop: Proposal, v: Verdict, spent: dict | None = None) -> None:
        stages, acc = prop.drafts, v.acc
        if self.record_stages:  # per stage: (sum log q, last log q, K, accepted of its K)
            offset = 0
            for st in stages:
                lp, k = st.logprobs.reshape(-1).tolist(), st.tokens.numel()
                res.stage_records.append((sum(lp), lp[-1], k, min(max(acc - offset, 0), k)))
                offset += k
        res.stages_per_round.append(len(stages))
        res.drafted_per_round.append(prop.ids.shape[0] - 1)
        if self.policy is not None:
            self.policy.observe(acc, len(stages), prop.ids.shape[0], spent)
