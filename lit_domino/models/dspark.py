"""DSpark: the DFlash backbone plus a sequential Markov head over the previous token and a confidence head
(DeepSeek's DSpark; vLLM's ``speculators`` ``DSparkDraftModel``).

Shapes: b batch, A anchors, B block size, K = B-1 drafted positions, N rows (blocks), d width, r rank,
V vocabulary.

The backbone's parallel block gives hidden states H_k and base logits ``L_base_k`` (block position k
predicts ``x_{a+k}``, the suite's label convention). The Markov head adds a low-rank bias that depends on
the token before position k, ``x_{k-1}`` (the anchor x_a for k = 1, then the previous pick when drafting):

* ``vanilla``: ``u_k = W1[x_{k-1}]`` (a first-order Markov bigram bias);
* ``gated``: ``u_k = σ(W_g·[H_k ; W1[x_{k-1}]] + b_g) ⊙ W1[x_{k-1}]``;
* ``rnn``: a rank-r recurrent state over the block, ``[g; c; o] = W_j·[s_{k-1} ; W1[x_{k-1}] ; H_k] + b_j``,
  ``s_k = g' s_{k-1} + (1 - g') tanh(c)`` with ``g' = σ(g)``, ``u_k = tanh(o)``; the state runs from block
  slot 0 (whose previous token is the anchor itself, as speculators feeds it).

``L_k = L_base_k + W2·u_k`` (``W2``: r -> V, zero at init so a fresh DSpark drafts what its backbone does).
The confidence head is a linear layer on ``[H_k ; W1[x_{k-1}]]`` (or ``H_k`` alone): the logit of
P(position k accepted | every earlier position accepted).

The objective is DeepSpec's, against the target's distribution p_k (what predicted ``x_{a+k}``):
``0.1·CE(L_k, x_{a+k}) + 0.9·TV(q_k, p_k) + 1.0·BCE(conf_k, c*_k)``, ``c*_k = 1 − ½‖q_k − p_k‖₁`` (no
gradient), each term weighted by the block position weights ``exp(−(k−1)/γ)`` (γ = 4: DeepSpec's).

The target's distribution: a DSpark drafter's ``feature_layers`` end with the target's last decoder layer
(feature rule ``dspark``: the DFlash layers, then ``L-1``). ``hidden_states[L]`` of an HF decoder is its
final-normed output, so ``lm_head(features[..., -d:])`` are the target's logits at that position; the fusion
reads the first ``n·d`` columns only (``num_features`` = n). The cached features carry the distribution at
every position, and the lean loss applies the LM head to the labelled positions only, chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from lit_domino.models.backbone import BackboneConfig, BlockOutput, ParallelDrafter, ParallelSession
from lit_domino.models.base import DrafterMismatchError, default_num_feature_layers
from lit_domino.models.layers import init_weights
from lit_domino.models.registry import register
from lit_domino.models.sessions import StageDraft, is_greedy, pool_stage
from lit_domino.models.objectives import LossSettings, chunked_row_sums, distill_terms, label_rows

HEAD_TYPES = ("vanilla", "gated", "rnn")
"""The Markov head's variants (speculators' ``markov_head_type``)."""


@dataclass
class DSparkHeadConfig:
    """DSpark's sequential (Markov) head and its confidence head."""

    rank: int = 256
    """Rank r of the Markov bias ``W2·W1[x_{k-1}]`` (W1: V -> r, W2: r -> V). Default 256, the paper's."""

    head_type: str = "vanilla"
    """``vanilla`` (bigram bias), ``gated`` (gated by the hidden state) or ``rnn`` (recurrent state over the
    block): speculators' ``markov_head_type``. Default vanilla."""

    confidence: bool = True
    """Whether the drafter has the confidence head (P(position accepted | earlier accepted)). Default True."""

    confidence_with_markov: bool = True
    """The confidence head reads ``[H_k ; W1[x_{k-1}]]`` (True) or ``H_k`` alone. Default True (speculators')."""


@dataclass
class DSparkConfig(BackboneConfig):
    """The backbone's config plus DSpark's heads; ``feature_layers`` end with the target's last layer."""

    head: DSparkHeadConfig = field(default_factory=DSparkHeadConfig)
    """The Markov and confidence heads."""

    feature_rule: ClassVar[str | None] = "dspark"

    @property
    def num_features(self) -> int:
        """n: the fused layers (every feature layer but the last, which carries the target's distribution)."""
        return len(self.feature_layers) - 1

    @classmethod
    def target_values(cls, target) -> dict:
        values = super().target_values(target)
        values["feature_layers"] = list(target.layer_ids("dspark", default_num_feature_layers(target.num_layers)))
        return values

    def validate(self) -> "DSparkConfig":
        super().validate()
        h = self.head
        if isinstance(h.rank, bool) or not isinstance(h.rank, int) or h.rank <= 0:
            raise ValueError(f"rank must be a positive integer (the DSpark Markov head's rank r), got {h.rank!r}")
        if h.head_type not in HEAD_TYPES:
            raise ValueError(f"unknown DSpark head_type {h.head_type!r}; choose one of {', '.join(HEAD_TYPES)}")
        if len(self.feature_layers) < 2:
            raise ValueError(f"a DSpark drafter's feature_layers are the fused layers followed by the target's last "
                             f"layer (its distribution): need at least 2, got {self.feature_layers}")
        return self


class MarkovHead(nn.Module):
    """The low-rank sequential bias ``W2·u_k``; ``u_k`` from the previous token (and H_k / a state, by type)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, head_type: str):
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.w1 = nn.Embedding(vocab_size, rank)  # W1: previous token -> r
        self.w2 = nn.Linear(rank, vocab_size, bias=False)  # W2: r -> V
        if head_type == "gated":
            self.gate = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint = nn.Linear(2 * rank + hidden_size, 3 * rank)  # [gate; candidate; output]
        self.apply(init_weights)
        nn.init.normal_(self.w1.weight, std=0.01)
        nn.init.zeros_(self.w2.weight)  # no bias at init: the drafter equals its backbone

    def step(self, h: torch.Tensor, e: torch.Tensor, state: torch.Tensor | None):
        """One block position: H_k [N, d], e = W1[x_{k-1}] [N, r], the rnn state [N, r] (None otherwise) ->
        (u_k [N, r], next state)."""
        if self.head_type == "vanilla":
            return e, state
        h = h.to(e.dtype)
        if self.head_type == "gated":
            return torch.sigmoid(self.gate(torch.cat([h, e], dim=-1))) * e, state
        g, c, o = self.joint(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        return torch.tanh(o), g * state + (1.0 - g) * torch.tanh(c)

    def block_inputs(self, H: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: every previous token known. H [N, B, d], e [N, B, r] -> u [N, B, r]."""
        if self.head_type != "rnn":
            return self.step(H, e, None)[0]
        state, us = e.new_zeros(e.shape[0], self.rank), []
        for k in range(e.shape[1]):
            u, state = self.step(H[:, k], e[:, k], state)
            us.append(u)
        return torch.stack(us, dim=1)

    @torch.no_grad()
    def draft(self, H: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode-time rollout of one block: H [K+1, d] (slot 0 = the anchor's), base [K, V] the backbone
        logits of slots 1..K, anchor [1] -> (tokens [K], corrected logits [K, V]).

        Position i picks ``argmax(L_i/T + G_i)`` (G = 0 greedy; else Gumbel noise ``-log E``, E ~ Exp(1): an
        exact sample of softmax(L_i/T)) and feeds its pick to position i+1; q is softmax of those same
        corrected logits, so rejection sampling stays exact."""
        K = base.shape[0]
        noise = None if is_greedy(temperature) else \
            -torch.empty_like(base, dtype=torch.float32).exponential_(generator=generator).log()  # [K, V]
        w2_t = self.w2.weight.T.to(base.dtype)  # [r, V]
        prev, state = anchor, None
        if self.head_type == "rnn":  # the state starts at slot 0, whose previous token is the anchor
            state = H.new_zeros(1, self.rank, dtype=self.w1.weight.dtype)
            _, state = self.step(H[0:1], self.w1(anchor), state)
        rows, picks = [], []
        for i in range(K):
            u, state = self.step(H[i + 1: i + 2], self.w1(prev), state)  # [1, r]
            L = torch.addmm(base[i: i + 1], u.to(base.dtype), w2_t)  # [1, V] L_base + W2·u
            prev = (L if noise is None else L.float() / temperature + noise[i: i + 1]).argmax(-1)  # [1]
            rows.append(L), picks.append(prev)
        return torch.cat(picks), torch.cat(rows)


@dataclass
class DSparkOutput(BlockOutput):
    """A DSpark block output: the backbone's plus the confidence logits and the target's last hidden states."""

    confidence: torch.Tensor | None = None
    """[b, A, B] the confidence head's logits (None without the head)."""
    target_hidden: torch.Tensor | None = None
    """[b, A, B, d] the target's final hidden state at ``a+k-1`` (what predicted ``x_{a+k}``): p_k =
    softmax(lm_head(·)). Set by ``forward_train``."""


def previous_tokens(block_tokens: torch.Tensor) -> torch.Tensor:
    """[..., B] block tokens ``x_a .. x_{a+B-1}`` -> the previous token of each slot, ``[x_a, x_a .. x_{a+B-2}]``
    (slot 0 gets the anchor itself, as speculators' ``sample_from_anchor=False`` feeds it)."""
    return torch.cat([block_tokens[..., :1], block_tokens[..., :-1]], dim=-1)


class DSparkSession(ParallelSession):
    """Backbone block once, then the Markov head over positions 1..K (:meth:`MarkovHead.draft`). The target
    features it is given include the distribution layer; only the fused layers' columns are kept."""

    @torch.no_grad()
    def extend(self, tokens, features) -> None:
        if features is not None:
            features = torch.as_tensor(features, device=self.device)
            width = self.config.num_features * self.config.hidden_size
            if features.shape[-1] == width + self.config.hidden_size:
                features = features[..., :width]
        super().extend(tokens, features)

    def _pick(self, hidden, anchor, temperature, generator) -> StageDraft:
        drafter = self.drafter
        base = drafter.compute_logits(hidden[1:])  # [K, V]
        tokens, logits = drafter.head.draft(hidden, base, anchor, temperature, generator)
        return pool_stage(tokens, tokens, logits, None, temperature, base.shape[-1])


@register("dspark")
class DSparkDrafter(ParallelDrafter):
    """DFlash backbone + Markov head + confidence head; DeepSpec's CE + TV + confidence-BCE objective."""

    config_class = DSparkConfig
    session_class = DSparkSession
    draft_options = ("static_capacity", "compile")
    supports_loop_training = False  # the later stages' target distributions are not gathered (yet)

    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        c, h = config, config.head
        self.head = MarkovHead(c.hidden_size, c.vocab_size, h.rank, h.head_type)
        self.confidence = None
        if h.confidence:
            self.confidence = nn.Linear(c.hidden_size + (h.rank if h.confidence_with_markov else 0), 1)
            init_weights(self.confidence)

    def bind_target(self, target) -> "DSparkDrafter":
        super().bind_target(target)
        last = self.config.feature_layers[-1]
        if last != target.num_layers - 1:
            raise DrafterMismatchError(
                f"a DSpark drafter's last feature layer carries the target's distribution and must be its last "
                f"decoder layer ({target.num_layers - 1} in {target.name!r}), got {last}")
        return self

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The fused context of the first n layers (the last feature layer is the target's distribution)."""
        width = self.config.num_features * self.config.hidden_size
        return super().fuse(features[..., :width])

    def forward_train(self, input_ids, features, anchors, anchor_mask, loss_mask=None, attention_mask=None,
                      causal_inputs: str = "teacher_forced", with_logits: bool = True) -> DSparkOutput:
        """The backbone's forward with the heads (teacher forced: the true previous tokens), plus the target's
        final hidden state at ``a+k-1`` for each block position (``target_hidden``)."""
        out = super().forward_train(input_ids, features, anchors, anchor_mask, loss_mask, attention_mask,
                                    causal_inputs, with_logits)
        b, T = input_ids.shape
        d, B = self.config.hidden_size, self.config.block_size
        anchors = torch.where(anchor_mask.bool(), anchors, torch.zeros_like(anchors)).clamp(0, T - 1)
        pos = (anchors[:, :, None] + torch.arange(B, device=input_ids.device) - 1).clamp(0, T - 1)  # [b, A, B]
        last = features[..., -d:]  # [b, T, d] the target's final (normed) hidden states
        out.target_hidden = last.gather(1, pos.reshape(b, -1, 1).expand(-1, -1, d)).view(b, *pos.shape[1:], d)
        return out

    def add_head(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> DSparkOutput:
        """The Markov inputs ``out.head_state`` = u [b, A, B, r] from the true previous tokens, the confidence
        logits, and (when the base logits are materialised) ``final_logits = logits + W2·u``."""
        if causal_inputs != "teacher_forced":
            raise ValueError(f"a DSpark drafter trains teacher forced (its Markov head reads the true previous "
                             f"token), got causal_inputs={causal_inputs!r}")
        b, A, B, d = out.hidden.shape
        e = self.head.w1(previous_tokens(out.block_tokens))  # [b, A, B, r]
        u = self.head.block_inputs(out.hidden.reshape(b * A, B, d), e.reshape(b * A, B, -1)).view(b, A, B, -1)
        conf = None
        if self.confidence is not None:
            x = torch.cat([out.hidden, e.to(out.hidden.dtype)], -1) if self.config.head.confidence_with_markov \
                else out.hidden
            conf = self.confidence(x).squeeze(-1)  # [b, A, B]
        final = None if out.logits is None else out.logits + self.head.w2(u).to(out.logits.dtype)
        fields = {k: getattr(out, k) for k in ("hidden", "labels", "block_tokens", "logits")}
        return DSparkOutput(**fields, final_logits=final, head_state=u, confidence=conf,
                            target_hidden=getattr(out, "target_hidden", None))

    def row_inputs(self, out: BlockOutput) -> list[torch.Tensor]:
        if out.head_state is None:
            raise ValueError("a DSpark BlockOutput without head_state: run it through add_head")
        return [out.hidden, out.head_state]

    def row_logits(self, h: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of (H, u) -> (base, corrected) logits: ``L = [H ; u]·[W_lmᵀ ; W2ᵀ]``."""
        base = self.compute_logits(h)
        return base, base + self.head.w2(u).to(base.dtype)

    def block_loss(self, out: DSparkOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """DeepSpec's objective ``c_ce·CE + c_tv·TV(q, p) + c_conf·BCE(conf, 1 − TV)`` (``settings.distill``
        = (c_ce, c_tv, c_conf)), each term position-weighted over the labelled positions → (loss, parts); from
        the materialised logits when the forward made them, else chunk by chunk (the LM head on the labelled
        rows only, the target's logits included)."""
        if out.target_hidden is None:
            raise ValueError("a DSpark loss needs the target's distribution: use drafter.forward_train")
        keep, y, w = label_rows(out.labels, settings.position_weights)
        conf = None if out.confidence is None else out.confidence[keep]
        if out.final_logits is not None:  # the reference path: every logit materialised
            terms = distill_terms(out.final_logits[keep], self.compute_logits(out.target_hidden[keep]), y, conf)
            sums = [(t * w).sum() for t in terms]
        else:
            def rows_fn(y_, h, u, th, *c):
                return distill_terms(self.row_logits(h, u)[1], self.compute_logits(th), y_, c[0] if c else None)

            rows = [y, out.hidden[keep], out.head_state[keep], out.target_hidden[keep]]
            sums = chunked_row_sums(rows_fn, rows + ([conf] if conf is not None else []), w, settings.chunk_size)
        denom = w.sum()
        ce, tv, bce = (s * 0.0 if denom <= 0 else s / denom for s in sums)
        c_ce, c_tv, c_conf = settings.distill
        loss = c_ce * ce + c_tv * tv + c_conf * bce
        return loss, {"loss_ce": ce.detach(), "loss_tv": tv.detach(), "loss_conf": bce.detach(),
                      "accept_rate": (1.0 - tv).detach()}
