"""``ParallelDrafter``: the DFlash parallel draft backbone ("backbone-only").

Shapes: b batch, T sequence length, A anchors per sequence, B block size, d
width, n feature layers, V vocabulary.

A block is ``[x_a, MASK x (B-1)]`` at absolute positions ``a .. a+B-1``; block
position k >= 1 predicts ``x_{a+k}`` (DFlash's label convention). Every draft
layer attends from the block to ``cat(k/v_proj(ctx), k/v_proj(block))`` where
ctx is the fused target feature of each position before the block
(``RMSNorm(Linear(n*d, d)(features))``); the context never enters the
residual stream. The target's embedding and LM head are used, frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lit_domino.models.config import DrafterConfig
from lit_domino.models.io import DrafterBase
from lit_domino.models.layers import DecoderLayer, KVCache, RMSNorm, init_weights

IGNORE_INDEX = -100
"""Label value of positions that are not trained (cross-entropy ``ignore_index``)."""


@dataclass
class BlockOutput:
    """What a parallel drafter's training forward returns."""

    hidden: torch.Tensor
    """[b, A, B, d] block hidden states after the final norm."""
    logits: torch.Tensor
    """[b, A, B, V] base logits ``lm_head(hidden)``."""
    labels: torch.Tensor
    """[b, A, B] ``x_{a+k}`` where k >= 1, a+k < T, loss_mask = 1 and the anchor is real; else -100."""
    block_tokens: torch.Tensor
    """[b, A, B] the true tokens ``x_{a+k}`` (0 beyond the sequence), for teacher forcing."""
    final_logits: torch.Tensor | None = None
    """[b, A, B, V] Domino only: ``logits + ΔL`` (ΔL = 0 at block position 0)."""


def block_attention_mask(anchors: torch.Tensor, anchor_mask: torch.Tensor, T: int, B: int) -> torch.Tensor:
    """The training mask ``[b, 1, A*B, T + A*B]`` (True = attend).

    Keys are ``[ctx positions 0..T-1, block 0 (B keys), block 1, ...]``; a query
    of block j sees ctx keys at positions < a_j (none when the anchor is masked
    out) and the B keys of block j (bidirectional), nothing else.
    """
    b, A = anchors.shape
    dev = anchors.device
    ctx_pos = torch.arange(T, device=dev)  # [T]
    ctx_vis = (ctx_pos[None, None, :] < anchors[:, :, None]) & anchor_mask[:, :, None]  # [b, A, T]
    ctx_vis = ctx_vis[:, :, None, :].expand(b, A, B, T).reshape(b, A * B, T)  # [b, A*B, T]
    blk = torch.arange(A, device=dev).repeat_interleave(B)  # [A*B] block id of each query/key
    blk_vis = (blk[:, None] == blk[None, :])[None].expand(b, A * B, A * B)  # [b, A*B, A*B]
    return torch.cat([ctx_vis, blk_vis], dim=-1)[:, None]  # [b, 1, A*B, T + A*B]


class ParallelDrafter(DrafterBase):
    """DFlash backbone: fusion, ``num_layers`` context decoder layers, final norm, the target's embed/head."""

    kind = "backbone"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        c = config
        d = c.hidden_size
        self.fc = nn.Linear(c.num_features * d, d, bias=False)  # n*d -> d
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(d, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rope_theta, c.rms_norm_eps)
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.apply(init_weights)

    # ------------------------------------------------------------------ pieces

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [..., n*d] -> [..., d]
        """Fused context vector per position: ``RMSNorm(Linear(n*d, d)(features))``."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., d]
        return self.embed(ids).to(self.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., V]
        head = self.lm_head
        return head(hidden.to(head.weight.dtype))

    def block_hidden(
        self,
        block_emb: torch.Tensor,  # [b, N, d] embeddings of the block tokens
        block_pos: torch.Tensor,  # [N] | [b, N] absolute positions
        ctx: torch.Tensor | None = None,  # [b, C, d] fused context (keys/values only)
        ctx_pos: torch.Tensor | None = None,  # [C] | [b, C]
        mask: torch.Tensor | None = None,  # bool [b|1, 1, N, keys]; None = see everything
        caches: list[KVCache] | None = None,  # one per layer; ctx keys get appended
    ) -> torch.Tensor:  # [b, N, d] after the final norm
        h = block_emb
        for i, layer in enumerate(self.layers):
            h = layer(h, block_pos, ctx, ctx_pos, mask, caches[i] if caches is not None else None)
        return self.norm(h)

    # ------------------------------------------------------------------ training

    def block_tokens_and_labels(self, input_ids, anchors, anchor_mask, loss_mask=None, attention_mask=None):
        """-> (block_ids [b,A,B] = [x_a, MASK..], positions [b,A,B], block_tokens [b,A,B], labels [b,A,B])."""
        b, T = input_ids.shape
        B = self.config.block_size
        ks = torch.arange(B, device=input_ids.device)  # [B]
        pos = anchors[:, :, None] + ks  # [b, A, B]
        inside = pos < T  # [b, A, B]
        flat = pos.clamp(max=T - 1).reshape(b, -1)  # [b, A*B]
        true = input_ids.gather(1, flat).view_as(pos)  # [b, A, B]
        block_tokens = torch.where(inside, true, torch.zeros_like(true))
        valid = inside & (ks >= 1) & anchor_mask[:, :, None].bool()
        if loss_mask is not None:
            valid &= loss_mask.gather(1, flat).view_as(pos).bool()
        if attention_mask is not None:
            valid &= attention_mask.gather(1, flat).view_as(pos).bool()
        labels = torch.where(valid, true, torch.full_like(true, IGNORE_INDEX))
        block_ids = torch.full_like(true, self.config.mask_token_id)
        block_ids[:, :, 0] = input_ids.gather(1, anchors)
        return block_ids, pos, block_tokens, labels

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        features: torch.Tensor,  # [b, T, n*d] raw target features
        anchors: torch.Tensor,  # [b, A] anchor positions a
        anchor_mask: torch.Tensor,  # [b, A] bool, real anchors
        loss_mask: torch.Tensor | None = None,  # [b, T] 1 on labels (response tokens); None = all
        attention_mask: torch.Tensor | None = None,  # [b, T] 1 on real tokens; None = all
    ) -> BlockOutput:
        """All A blocks of each sequence in one attention call per layer (see ``block_attention_mask``)."""
        b, T = input_ids.shape
        A, B = anchors.shape[1], self.config.block_size
        anchor_mask = anchor_mask.bool()
        anchors = torch.where(anchor_mask, anchors, torch.zeros_like(anchors)).clamp(0, T - 1)
        block_ids, pos, block_tokens, labels = self.block_tokens_and_labels(
            input_ids, anchors, anchor_mask, loss_mask, attention_mask)
        ctx = self.fuse(features)  # [b, T, d]
        ctx_pos = torch.arange(T, device=input_ids.device)  # [T]
        mask = block_attention_mask(anchors, anchor_mask, T, B)  # [b, 1, A*B, T + A*B]
        emb = self.embed_tokens(block_ids).reshape(b, A * B, -1)  # [b, A*B, d]
        hidden = self.block_hidden(emb, pos.reshape(b, A * B), ctx, ctx_pos, mask).view(b, A, B, -1)  # [b,A,B,d]
        return BlockOutput(hidden=hidden, logits=self.compute_logits(hidden), labels=labels, block_tokens=block_tokens)

    # ------------------------------------------------------------------ decoding

    def new_session(self):
        from lit_domino.models.sessions import ParallelSession

        return ParallelSession(self)
