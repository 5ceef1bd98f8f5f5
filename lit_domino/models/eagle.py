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
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lit_domino.models.backbone import BlockOutput
from lit_domino.models.base import Drafter, DrafterConfig
from lit_domino.models.layers import (Attention, KVCache, RMSNorm, StructuredAttention, SwiGLU, call_layer,
                                     flex_block_mask, init_weights)
from lit_domino.models.loop import ContextFn, check_stages, pad_right
from lit_domino.models.registry import register
from lit_domino.models.sessions import ChainSession, Rows, Stage, StageDraft, as_ids, draft_chain
from lit_domino.models.objectives import DEFAULT_CHUNK_SIZE, IGNORE_INDEX, LossSettings, chunked_ce, ttt_loss
from lit_domino.models.objectives.blocks import chain_objective


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


def ttt_mask(T: int, s: int, device=None) -> torch.Tensor:
    """Step s's mask ``[1, 1, T, (s+1)*T]`` over keys ``[step 0, step 1, .., step s]`` (T each)."""
    t = torch.arange(T, device=device)[:, None]  # [T, 1] query position
    tp = torch.arange(T, device=device)[None, :]  # [1, T] key position
    blocks = [((tp <= t - s) & (tp >= 1)) | ((tp == t) if s == 0 else torch.zeros_like(tp == t))]
    blocks += [tp == t - s + sp for sp in range(1, s + 1)]  # chain key of step s' at m + s'
    return torch.cat(blocks, dim=1)[None, None]  # [1, 1, T, (s+1)*T]


class ChainAttention(StructuredAttention):
    """Step s >= 1 of the training-time test without the empty blocks of its dense mask (the CPU path).

    Step s's keys are ``[step 0 | step 1 | .. | step s]``, T each (:func:`ttt_mask`): the query at t
    attends causally to step-0 keys 1..t-s and to exactly one key of each later step s', its own
    chain's at t - s + s'. All but T + s entries of a dense mask row are empty, so here step 0 is one
    [T, T] score matrix and each later step one dot product per position (EAGLE-3's own eager form):
    T² + s·T scores per step instead of (s+1)·T². Equal to SDPA under :func:`ttt_mask`
    (``tests/models/test_eagle.py``)."""

    def __init__(self, T: int, s: int, device=None):
        if s < 1:
            raise ValueError("step 0 is plain causal attention: use ttt_mask")
        self.T, self.s = T, s
        t = torch.arange(T, device=device)[:, None]  # [T, 1] query position
        tp = torch.arange(T, device=device)[None, :]  # [1, T] key position
        self.hidden = ~((tp <= t - s) & (tp >= 1))  # [T, T] step-0 keys a query may not attend
        self.t = t

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, H, T, hd = q.shape  # k, v [b, KV, (s+1)*T, hd]
        KV = k.shape[1]
        qg = q.view(b, KV, H // KV, T, hd) * hd**-0.5  # query head h reads KV head h // (H/KV), as SDPA's GQA
        scores = [(qg @ k[:, :, :T].unsqueeze(2).transpose(-1, -2)).masked_fill(self.hidden, float("-inf"))]
        chain_values = []
        for sp in range(1, self.s + 1):
            shift = self.s - sp  # the chain's key of step sp sits shift positions before the query
            if shift >= T:
                continue  # no query has one
            ks, vs = (F.pad(x[:, :, sp * T : (sp + 1) * T - shift], (0, 0, shift, 0)) for x in (k, v))  # [b,KV,T,hd]
            score = (qg * ks.unsqueeze(2)).sum(-1, keepdim=True)  # [b, KV, H/KV, T, 1]
            scores.append(score.masked_fill(self.t < shift, float("-inf")) if shift else score)
            chain_values.append(vs.unsqueeze(2))
        p = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # [b, KV, H/KV, T, T + chain keys]
        out = p[..., :T] @ v[:, :, :T].unsqueeze(2)
        for i, vs in enumerate(chain_values):
            out = out + p[..., T + i : T + i + 1] * vs
        return out.reshape(b, H, T, hd)


def ttt_flex_mask(T: int, s: int, device=None):
    """:func:`ttt_mask` as a flex-attention ``BlockMask`` (the same pattern, no dense tensor)."""

    def mask_mod(bi, h, q, kv):
        st, tp = kv // T, kv % T  # key's step and position
        real = (tp >= 1) & (tp <= q - s)
        if s == 0:
            real = real | (tp == q)
        return torch.where(st == 0, real, tp == q - s + st)

    return flex_block_mask(mask_mod, None, T, (s + 1) * T, device)


@dataclass
class Eagle3Config(DrafterConfig):
    """EAGLE-3's config: the shared fields, the EAGLE-3 feature rule (low, middle, high layer) and its TTT depth."""

    ttt_steps: int = 7
    """Training-time-test unroll depth (= draft chain length trained). Default 7, EAGLE-3's."""

    feature_rule: ClassVar[str | None] = "eagle3"

    def validate(self) -> "Eagle3Config":
        super().validate()
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1 (EAGLE-3 training-time-test steps), got {self.ttt_steps}")
        if len(self.feature_layers) != 3:
            raise ValueError(f"an eagle3 drafter fuses exactly 3 feature layers (low, middle, high), "
                             f"got {self.feature_layers}")
        return self

    @classmethod
    def from_legacy(cls, legacy: dict) -> dict:
        return {"ttt_steps": legacy["ttt_steps"]} if "ttt_steps" in legacy else {}


class EagleSession(ChainSession):
    """EAGLE-3 chain: cached step K/V of the real prefix (positions 1..length-1) + the drafted chain."""

    needs_features = True

    def __init__(self, drafter):
        super().__init__(drafter)
        self.cache = KVCache()
        self._g = Rows(torch.zeros(0, drafter.config.hidden_size, device=self.device))  # fused features [len, d]
        self._cached = 0  # real steps (positions 1.._cached) in the cache
        self._chain: tuple | None = None  # (next position, previous hidden [1, 1, d]) after a stage

    def _drop_stages(self) -> None:
        if self.stages:
            self.cache.crop(self._cached)
            self.stages, self._chain = [], None

    def _append_features(self, features: torch.Tensor) -> None:
        self._g.append(self.drafter.fuse(features))

    def _crop_to(self, length: int) -> None:
        self._g.crop(length)
        self._cached = min(self._cached, max(0, length - 1))  # the step at position p reads g_{p-1}
        self.cache.crop(self._cached)

    def _root_step(self, anchor_token, num_tokens: int) -> tuple[torch.Tensor, int]:
        """The real steps not cached yet and the anchor's step at ``length``, in one call → (its output h
        [1, 1, d], the anchor position)."""
        drafter, dev = self.drafter, self.device
        start = self._len
        if start < 1:
            raise ValueError("an EAGLE-3 session needs at least one committed token with target features "
                             "(extend the prompt) before drafting")
        anchor = self._check_draft(anchor_token, num_tokens, start)
        # real steps at positions _cached+1 .. start-1 and the anchor step at start, in one call
        toks = torch.cat([self._tokens[self._cached + 1: start], anchor])  # [n]
        feats = self._g[self._cached: start]  # [n, d] g_{p-1}
        n = toks.numel()
        pos = torch.arange(self._cached + 1, start + 1, device=dev)  # [n]
        mask = None
        if n > 1:
            m = len(self.cache)
            causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            mask = torch.cat([torch.ones(n, m, dtype=torch.bool, device=dev), causal], dim=1)[None, None]
        h = drafter.step(drafter.embed_tokens(toks)[None], feats[None], pos, mask, self.cache)[:, -1:]
        self._cached = start - 1
        return h, start

    @torch.no_grad()
    def tree_head(self, anchor_token, depth: int) -> "EagleTreeHead":
        """The drafter over a draft tree below ``anchor_token`` (at ``length``), ``depth`` levels deep
        (:class:`EagleTreeHead`); its steps stay in the cache until the next crop/extend."""
        if self.stages:
            raise ValueError("a tree grows from the committed context: crop() before drafting a new round")
        h, start = self._root_step(anchor_token, depth)
        self.stages.append(Stage(start, as_ids(anchor_token, self.device)))  # dropped (cache cropped) on crop
        return EagleTreeHead(self.drafter, self.cache, h[0], start)

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> StageDraft:
        drafter, dev = self.drafter, self.device
        if self._chain is not None:
            start, h_prev = self._chain
            anchor = self._check_draft(anchor_token, num_tokens, start)
            h = drafter.step(drafter.embed_tokens(anchor)[None], h_prev, torch.tensor([start], device=dev),
                             None, self.cache)  # [1, 1, d]
        else:
            h, start = self._root_step(anchor_token, num_tokens)
        chain = {"h": h, "pos": start}  # h: the step at position pos (its logits predict pos + 1)

        def next_logits(prev):
            if prev is not None:  # the next step takes the pick and the previous step's own output
                chain["pos"] += 1
                chain["h"] = drafter.step(drafter.embed_tokens(prev)[None], chain["h"],
                                          torch.tensor([chain["pos"]], device=dev), None, self.cache)
            return drafter.compute_logits(chain["h"][0])  # [1, V]

        out = draft_chain(next_logits, num_tokens, temperature, generator)
        h = chain["h"]
        self._chain = (start + num_tokens, h)
        self.stages.append(Stage(start, out.tokens))
        return out


class EagleTreeHead:
    """EAGLE-3's drafter over a tree's frontier (EAGLE-2's draft tree), in the protocol of the path heads
    (:class:`lit_domino.decoding.tree.PathHead`, over the full vocabulary): the children of a node come from its
    own step, which takes the node's token and its parent's step output at position anchor + depth; every
    frontier node of a depth is one batched step whose mask lets each node see the committed steps (the cache up
    to the anchor's) and its ancestors' steps (written to the cache depth by depth) and itself.

    States: ready nodes ``(h [F, d], seen [F, S])`` (their step outputs; which of the S tree steps so far each
    sees) or pending ones ``(tokens [F], parent h [F, d], parent seen [F, S])``."""

    def __init__(self, drafter, cache: KVCache, root: torch.Tensor, start: int):
        self.drafter, self.cache, self.start_pos = drafter, cache, start
        self.committed = len(cache)  # the real steps and the anchor's
        self.root = root  # [1, d] the anchor step's output
        self.vocab_size = drafter.config.vocab_size

    def start(self):
        return self.root, torch.zeros(1, 0, dtype=torch.bool, device=self.root.device)

    def step(self, i: int, states) -> tuple[torch.Tensor, None, tuple]:
        """Depth-i frontier → (its children's logits [F, V], None: no candidate pool (EAGLE-3 has no base logits
        to pool from), what the children inherit)."""
        if len(states) == 3:  # pending: the depth's nodes take their one step together
            tokens, h_par, seen_par = states
            drafter, F_ = self.drafter, tokens.numel()
            dev = tokens.device
            seen = torch.cat([seen_par, torch.eye(F_, dtype=torch.bool, device=dev)], 1)  # [F, S + F]
            mask = torch.cat([torch.ones(F_, self.committed, dtype=torch.bool, device=dev), seen], 1)[None, None]
            pos = torch.full((F_,), self.start_pos + i, dtype=torch.long, device=dev)
            h = drafter.step(drafter.embed_tokens(tokens)[None], h_par[None], pos, mask, self.cache)[0]  # [F, d]
            states = (h, seen)
        h, seen = states
        return self.drafter.compute_logits(h), None, (h, seen)

    def child(self, inherited, rows: torch.Tensor, tokens: torch.Tensor):
        h, seen = inherited
        return tokens, h.index_select(0, rows), seen.index_select(0, rows)


def eagle_loop_forward(
    drafter,
    input_ids: torch.Tensor,  # [b, T]
    features: torch.Tensor,  # [b, T, 3d]
    anchors: torch.Tensor,  # [b, A] chain starts (the anchor step's position)
    anchor_mask: torch.Tensor,  # [b, A] bool
    num_stages: int,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    detach_stage_context: bool = False,
    stage_tokens: int | None = None,
    context_fn: ContextFn | None = None,
    with_logits: bool = True,
) -> list[BlockOutput]:
    """DLoop's loop-aware training forward of EAGLE-3: stages 1..S of a chain per anchor
    (``lit_domino.models.loop`` explains the unroll). ``stage_tokens`` K defaults to ``block_size - 1``
    (the engine's tokens per stage)."""
    K = check_stages(drafter, num_stages, anchors, anchor_mask, drafter.stage_tokens(drafter.config, stage_tokens))
    if K < 1:
        raise ValueError(f"stage_tokens must be >= 1, got {K}")
    b, T = input_ids.shape
    A = anchors.shape[1]
    dev = input_ids.device
    J = num_stages * K
    anchor_mask = anchor_mask.bool() & (anchors >= 1)  # an EAGLE chain needs one real step before it
    anchors = torch.where(anchor_mask, anchors, torch.ones_like(anchors)).clamp(1, T - 1)
    if loss_mask is None:
        loss_mask = torch.ones_like(input_ids)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    ids = pad_right(input_ids, J + 1)  # [b, T + J + 1]
    ok = (pad_right(loss_mask, J + 1) * pad_right(attention_mask, J + 1)).bool()
    g = drafter.fuse(features)  # [b, T, d]
    feat_prev = F.pad(g[:, :-1], (0, 0, 1, 0))  # [b, T, d] g_{p-1}
    x_real = torch.cat([drafter.input_layernorm(drafter.embed_tokens(input_ids)),
                        drafter.hidden_norm(feat_prev)], dim=-1)  # [b, T, 2d] the real steps' layer inputs
    pos_real = torch.arange(T, device=dev)[None].expand(b, T)
    p = torch.arange(T, device=dev)
    real_vis = ((p[None, None] >= 1) & (p[None, None] < anchors[:, :, None]) & anchor_mask[:, :, None])[:, None]
    same = torch.eye(A, dtype=torch.bool, device=dev)[None, None].expand(b, 1, A, A)  # [b, 1, A, A]
    h = feat_prev.gather(1, anchors[:, :, None].expand(b, A, g.shape[-1]))  # [b, A, d] g_{a-1}
    chain_x, chain_pos, steps = [], [], []
    attn = drafter.self_attn
    for j in range(J):
        if j and j % K == 0:  # entering stage j // K + 1: h is the previous stage's last hidden state
            if context_fn is not None:
                h = context_fn(j // K, h)
            if detach_stage_context:
                h = h.detach()
                chain_x = [chain_x[0]] + [x.detach() for x in chain_x[1:]]
        pos = anchors + j  # [b, A]
        tok = ids.gather(1, pos)  # [b, A] ground truth x_{a+j}
        x = torch.cat([drafter.input_layernorm(drafter.embed_tokens(tok)), drafter.hidden_norm(h)], dim=-1)
        ctx = torch.cat([x_real, *chain_x], dim=1)  # [b, T + j·A, 2d]
        ctx_pos = torch.cat([pos_real, *chain_pos], dim=1)
        mask = torch.cat([real_vis, *([same] * (j + 1))], dim=-1)  # [b, 1, A, T + (j+1)·A]
        out = h + attn(x, pos, ctx, ctx_pos, mask)
        out = out + drafter.mlp(drafter.post_attention_layernorm(out))  # [b, A, d] pre final norm
        label = ids.gather(1, pos + 1)
        valid = ok.gather(1, pos + 1) & (pos + 1 < T) & anchor_mask
        steps.append((out, drafter.compute_logits(out) if with_logits else None,
                      torch.where(valid, label, torch.full_like(label, -100))))
        chain_x.append(x)
        chain_pos.append(pos)
        h = out
    outs = []
    for s in range(num_stages):
        hs, ls, ys = zip(*steps[s * K:(s + 1) * K])
        start = anchors + s * K
        tokens = ids.gather(1, (start[:, :, None] + torch.arange(K + 1, device=dev)).reshape(b, -1)).view(b, A, K + 1)
        inside = (start[:, :, None] + torch.arange(K + 1, device=dev)) < T
        hidden = torch.stack([torch.zeros_like(hs[0]), *hs], dim=2)  # [b, A, K+1, d]
        logits = torch.stack([torch.zeros_like(ls[0]), *ls], dim=2) if with_logits else None  # [b, A, K+1, V]
        labels = torch.stack([torch.full_like(ys[0], IGNORE_INDEX), *ys], dim=2)  # [b, A, K+1]
        outs.append(BlockOutput(hidden=hidden, logits=logits, labels=labels,
                                block_tokens=torch.where(inside, tokens, torch.zeros_like(tokens))))
    return outs


@register("eagle3")
class Eagle3Drafter(Drafter):
    """EAGLE-3: fusion, one 2d-input decoder layer, final norm, the target's LM head."""

    config_class = Eagle3Config
    session_class = EagleSession
    supports_loop_training = True
    tree_builders = ("chain", "eagle", "path")

    @classmethod
    def stage_tokens(cls, config: Eagle3Config, requested: int | None = None) -> int:
        """A stage is the next K chain steps: any K >= 1 (default ``block_size - 1``, what the engine drafts)."""
        return config.block_size - 1 if requested is None else int(requested)

    def __init__(self, config: Eagle3Config):
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
        past_k = past_v = None  # earlier steps' keys/values [b, KV, s*T, hd]
        feat = F.pad(g[:, :-1], (0, 0, 1, 0))  # [b, T, d] g_{t-1} (zeros at t = 0)
        out = EagleOutput([], [], [])
        flex = self.train_options.use_flex(dev)
        recompute = self.training and self.train_options.checkpoint_layers
        for s in range(self.config.ttt_steps):
            # flex on CUDA; on CPU the chain form for s >= 1 (about 1/3 less attention time at T = 200)
            mask = ttt_flex_mask(T, s, dev) if flex else ChainAttention(T, s, dev) if s else ttt_mask(T, 0, dev)
            h, past_k, past_v = call_layer(self.ttt_step, tok, feat, pos, mask, past_k, past_v,
                                           recompute=recompute)  # h [b, T, d]
            out.hidden.append(h)
            if with_logits:
                out.logits.append(self.compute_logits(h))
            out.labels.append(torch.where(ok & (t - s >= 1), nxt, torch.full_like(nxt, IGNORE_INDEX)))
            feat = F.pad(h[:, :-1], (0, 0, 1, 0))  # [b, T, d] h^s_{t-1}
        return out

    def ttt_step(self, tok, feat, pos, mask, past_k, past_v):
        """One training-time-test step as a pure function (checkpointable): the step over every position
        attending to the earlier steps' keys/values ``past_k/v`` → (h, all keys, all values)."""
        cache = KVCache.of(past_k, past_v)
        h = self.step(tok, feat, pos, mask, cache)
        return (h, *cache.tensors())

    # ------------------------------------------------------------------ losses

    def batch_loss(self, batch, features, settings, causal_inputs: str = "teacher_forced"):
        """Its TTT loss (``settings.step_decay``) on every position of the batch (anchors unused)."""
        out = self.forward_train(batch["input_ids"], features, batch.get("loss_mask"), batch.get("attention_mask"),
                                 with_logits=False)
        loss, per_step, _ = self.train_loss(out, settings.step_decay, chunk_size=settings.chunk_size)
        return loss, {f"loss_step_{s}": l.detach() for s, l in enumerate(per_step)}

    def train_loss(self, out: EagleOutput, step_decay: float = 0.8, with_preds: bool = False,
                   chunk_size: int | None = DEFAULT_CHUNK_SIZE, objective=None):
        """The TTT loss ``Σ_s step_decay^s · CE_s`` of a ``forward_train(with_logits=False)`` output
        → (loss, [CE_s], per-step argmax ``[b, T]`` or None). The LM head (most of a step's cost) runs
        only where step s has a label (the response positions), ``chunk_size`` rows at a time with
        recomputation in the backward pass (None = all of a step's rows at once). A selected ``objective``
        other than ``ce`` sees the steps as chains (:func:`~lit_domino.models.objectives.blocks.chain_objective`;
        no per-step losses then)."""
        if objective is not None and objective.name != "ce":
            loss, _, preds = chain_objective(self, out.hidden, out.labels, step_decay, objective, chunk_size, with_preds)
            return loss, [], preds
        return self._chain_loss(list(out.hidden), list(out.labels), step_decay, with_preds, chunk_size)

    def _chain_loss(self, hidden: list[torch.Tensor], labels: list[torch.Tensor], decay: float,
                    with_preds: bool, chunk_size: int | None):
        """``Σ_s decay^s · mean CE_s`` over chain steps s (hidden [..., d] / labels [...] per step), lean."""
        per_step, preds = [], []
        for h, label in zip(hidden, labels):
            keep = label != IGNORE_INDEX
            y = label[keep]  # [N_s]
            (total,), picks = chunked_ce(self.row_logits, [h[keep]], y, torch.ones_like(y, dtype=torch.float32),
                                         chunk_size, argmax=0 if with_preds else None)
            per_step.append(total / keep.sum().clamp_min(1))
            if with_preds:  # argmax back in place; unlabelled positions are never scored
                preds.append(torch.zeros_like(label).masked_scatter(keep, picks))
        loss = sum(decay**s * l for s, l in enumerate(per_step))
        return loss, per_step, (preds if with_preds else None)

    def block_loss(self, out: BlockOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """A DLoop stage's loss: its K chain steps' TTT loss, step k weighing ``step_decay**(k-1)`` (from the
        materialised logits when the forward made them, else lean)."""
        K = out.labels.shape[2] - 1
        if out.logits is not None:
            loss, _ = ttt_loss([out.logits[:, :, k] for k in range(1, K + 1)],
                               [out.labels[:, :, k] for k in range(1, K + 1)], settings.step_decay)
        else:
            loss, _, _ = self._chain_loss([out.hidden[:, :, k] for k in range(1, K + 1)],
                                          [out.labels[:, :, k] for k in range(1, K + 1)], settings.step_decay,
                                          False, settings.chunk_size)
        return loss, {}

    def loop_forward(self, input_ids, features, anchors, anchor_mask, num_stages: int, loss_mask=None,
                     attention_mask=None, detach_stage_context: bool = False, causal_inputs: str = "teacher_forced",
                     stage_tokens: int | None = None, context_fn: ContextFn | None = None,
                     with_logits: bool = True) -> list[BlockOutput]:
        """DLoop's loop-aware training forward (:func:`eagle_loop_forward`; ``causal_inputs`` does not apply)."""
        return eagle_loop_forward(self, input_ids, features, anchors, anchor_mask, num_stages, loss_mask,
                                  attention_mask, detach_stage_context, stage_tokens, context_fn, with_logits)
