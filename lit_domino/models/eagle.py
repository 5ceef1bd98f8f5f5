"""``Eagle3Drafter``: the EAGLE-3-style autoregressive baseline.

Shapes: b batch, T sequence length, S ttt steps, d width, V vocabulary.

One decoder layer whose attention reads ``cat(RMSNorm(embed(token)), RMSNorm(g))``
(q/k/v take 2d) and whose residual stream is g (d wide); final norm; the
target's LM head. ``g`` is ``Linear(3d, d)`` of the three EAGLE-3 feature layers.

Alignment: the step at position t takes (token x_t, feature g_{t-1}) and its
output hidden h_t (before the final norm) predicts x_{t+1}. While drafting,
the step after the real prefix takes the drafter's own previous output h_{t-1}
instead of g_{t-1}.

Training-time test over S steps: step 0 runs on target features with a causal
mask over step-0 keys of positions 1..t. Step s at position t continues the
chain whose real prefix ends at m = t - s: its feature is step s-1's output
at t-1 and its token the true x_t; it attends to step-0 keys at positions
1..m plus its chain's keys of steps 1..s (step s' at m + s'), exactly what a
decoding session sees after s own steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lit_domino.models.backbone import IGNORE_INDEX
from lit_domino.models.config import DrafterConfig
from lit_domino.models.io import DrafterBase
from lit_domino.models.layers import Attention, KVCache, RMSNorm, SwiGLU, init_weights


@dataclass
class EagleOutput:
    """Per training-time-test step outputs; index t along T is the step at position t (t = 0 is a dummy)."""

    logits: list[torch.Tensor]
    """S tensors [b, T, V]: step s's logits at position t (predicting x_{t+1}); empty when
    ``forward_train(with_logits=False)`` (the caller applies the head where it needs it)."""
    labels: list[torch.Tensor]
    """S tensors [b, T]: x_{t+1} where t+1 < T, loss_mask[t+1] = 1 and the chain start t - s >= 1; else -100."""
    hidden: list[torch.Tensor]
    """S tensors [b, T, d]: step outputs before the final norm (the next step's feature)."""


def eagle_loss(outputs: EagleOutput, weights: float = 0.8, return_steps: bool = False):
    """``Σ_s weights^s · CE_s`` (CE_s averaged over step s's labels; 0 if it has none)."""
    total, steps = 0.0, []
    for s, (logits, labels) in enumerate(zip(outputs.logits, outputs.labels)):
        if (labels != IGNORE_INDEX).any():
            ce = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        else:
            ce = logits.sum() * 0.0
        steps.append(ce)
        total = total + (weights ** s) * ce
    return (total, steps) if return_steps else total


def ttt_mask(T: int, s: int, device=None) -> torch.Tensor:
    """Step s's mask ``[1, 1, T, (s+1)*T]`` over keys ``[step 0, step 1, .., step s]`` (T each)."""
    t = torch.arange(T, device=device)[:, None]  # [T, 1] query position
    tp = torch.arange(T, device=device)[None, :]  # [1, T] key position
    blocks = [((tp <= t - s) & (tp >= 1)) | ((tp == t) if s == 0 else torch.zeros_like(tp == t))]
    blocks += [tp == t - s + sp for sp in range(1, s + 1)]  # chain key of step s' at m + s'
    return torch.cat(blocks, dim=1)[None, None]  # [1, 1, T, (s+1)*T]


class Eagle3Drafter(DrafterBase):
    """EAGLE-3: fusion, one 2d-input decoder layer, final norm, the target's LM head."""

    kind = "eagle3"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        c = config
        d = c.hidden_size
        self.fc = nn.Linear(c.num_features * d, d, bias=False)  # 3d -> d
        self.input_layernorm = RMSNorm(d, c.rms_norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)  # on the feature / previous hidden
        self.self_attn = Attention(2 * d, d, c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.mlp = SwiGLU(d, c.intermediate_size)
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.apply(init_weights)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [..., 3d] -> [..., d]
        return self.fc(features.to(self.dtype))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., d]
        return self.embed(ids).to(self.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., d] (pre-norm) -> [..., V]
        head = self.lm_head
        return head(self.norm(hidden).to(head.weight.dtype))

    def step(self, tok_emb, feat, pos, mask=None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """tok_emb, feat [b, n, d], pos [n]|[b, n] -> h [b, n, d] (pre final norm). Queries' own keys are
        appended to ``kv_cache`` when given."""
        x = torch.cat([self.input_layernorm(tok_emb), self.hidden_norm(feat)], dim=-1)  # [b, n, 2d]
        h = feat + self.self_attn(x, pos, mask=mask, kv_cache=kv_cache, append_x=True)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        features: torch.Tensor,  # [b, T, 3d]
        loss_mask: torch.Tensor | None = None,  # [b, T]
        attention_mask: torch.Tensor | None = None,  # [b, T]
        with_logits: bool = True,
    ) -> EagleOutput:
        """The S-step TTT unroll. ``with_logits=False`` skips the LM head: at V = 4096 and d = 192 the
        head over every position of every step is ~2/3 of a training step, and only the labelled
        positions (the response's) need it (see ``Eagle3Module.forward_step``)."""
        b, T = input_ids.shape
        dev = input_ids.device
        g = self.fuse(features)  # [b, T, d]
        tok = self.embed_tokens(input_ids)  # [b, T, d]
        pos = torch.arange(T, device=dev)  # [T]
        t = pos[None]  # [1, T]
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # [b, T] x_{t+1} (wraps at the end)
        ok = (t + 1 < T).expand(b, T)
        if loss_mask is not None:
            ok = ok & torch.cat([loss_mask[:, 1:], loss_mask[:, :1]], dim=1).bool()
        if attention_mask is not None:
            ok = ok & torch.cat([attention_mask[:, 1:], attention_mask[:, :1]], dim=1).bool()
        cache = KVCache()
        feat = F.pad(g[:, :-1], (0, 0, 1, 0))  # [b, T, d] g_{t-1} (zeros at t = 0)
        out = EagleOutput([], [], [])
        for s in range(self.config.ttt_steps):
            h = self.step(tok, feat, pos, ttt_mask(T, s, dev), cache)  # [b, T, d]
            out.hidden.append(h)
            if with_logits:
                out.logits.append(self.compute_logits(h))
            out.labels.append(torch.where(ok & (t - s >= 1), nxt, torch.full_like(nxt, IGNORE_INDEX)))
            feat = F.pad(h[:, :-1], (0, 0, 1, 0))  # [b, T, d] h^s_{t-1}
        return out

    def new_session(self):
        from lit_domino.models.sessions import EagleSession

        return EagleSession(self)
