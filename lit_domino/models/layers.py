"""Qwen3-style pre-norm decoder pieces in plain torch.

Shapes use: b batch, n query positions, c extra context positions, m cached
positions, d model width, H query heads, KV key/value heads, hd head width,
I MLP width. Positions are absolute token positions (LongTensor ``[n]`` or
``[b, n]``). Masks are boolean, ``True`` = may attend, shaped ``[b|1, 1, n, keys]``.

RoPE follows Hugging Face Qwen3 exactly (``rotate_half``, ``inv_freq`` from
``rope_theta`` and ``head_dim``), q/k get a per-head RMSNorm before RoPE, and
attention is ``torch.nn.functional.scaled_dot_product_attention`` with GQA.

Training masks have two exact forms (:class:`TrainOptions` ``attention``): a dense boolean
tensor (SDPA's math kernel stores every score, and a dense mask rules out the flash and
memory-efficient kernels) or a ``torch.nn.attention.flex_attention`` ``BlockMask`` built from
a ``mask_mod`` (flex skips fully masked tiles and never stores the scores). Flex has no
backward on CPU (torch 2.13), so ``auto`` means flex on CUDA and dense elsewhere.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

ATTENTION_KINDS = ("auto", "dense", "flex")


@dataclass
class TrainOptions:
    """How a drafter's training forward computes (never what: every option gives the same loss)."""

    attention: str = "auto"
    """Training attention masks: ``dense`` (a boolean ``[b, 1, queries, keys]`` tensor for SDPA), ``flex``
    (a flex-attention ``BlockMask``; CUDA only for training, no CPU backward in torch 2.13) or ``auto``
    (flex on CUDA, dense elsewhere). Default ``auto``."""
    checkpoint_layers: bool = False
    """Recompute each draft layer's activations in the backward pass (``torch.utils.checkpoint``) instead
    of storing them. Default False."""
    chunk_size: int | None = 1024
    """Rows (positions) per LM-head chunk in the forward's no-grad passes (Domino's training-time-test
    picks); the lit modules set it to the loss's chunk size. None = one chunk."""

    def __post_init__(self):
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")

    def use_flex(self, device: torch.device) -> bool:
        """Whether training masks on ``device`` are flex ``BlockMask``s (raises for flex where it cannot train)."""
        device = torch.device(device)
        if self.attention == "flex":
            if device.type == "cpu" and torch.is_grad_enabled():
                raise ValueError("attention: flex cannot train on CPU (flex attention has no CPU backward in "
                                 f"torch {torch.__version__}); use attention: dense (or auto) on CPU")
            return True
        return self.attention == "auto" and device.type == "cuda"


MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def flex_block_mask(mask_mod: MaskMod, b: int, n: int, keys: int, device) -> BlockMask:
    """A ``BlockMask`` [b, 1, n, keys] of ``mask_mod(batch, head, q_idx, kv_idx) -> bool`` (True = attend)."""
    device = torch.device("cpu" if device is None else device)
    return create_block_mask(mask_mod, b, None, n, keys, device=device, _compile=device.type == "cuda")


_compiled_flex = None


def _flex(q, k, v, block_mask: BlockMask, enable_gqa: bool) -> torch.Tensor:
    """flex attention, compiled on CUDA (eager flex materialises the scores: only a reference)."""
    global _compiled_flex
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)  # dynamic shapes after the first recompile (T varies)
        return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


class StructuredAttention:
    """An attention pattern that computes itself instead of being a mask tensor: ``pattern(q, k, v) -> out``
    with q [b, H, n, hd], k/v [b, KV, keys, hd], out [b, H, n, hd]. For patterns whose dense mask is mostly
    empty (EAGLE-3's training-time test, :class:`lit_domino.models.eagle.ChainAttention`)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def call_layer(layer: nn.Module, *args, recompute: bool = False):
    """``layer(*args)``, under ``torch.utils.checkpoint`` when ``recompute`` and gradients are on."""
    if recompute and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis (Qwen3RMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # low precision: normalise in fp32 like HF, then scale in the input dtype
        y = F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)
        return self.weight * y


def rotate_half(x: torch.Tensor) -> torch.Tensor:  # [..., hd] -> [..., hd]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


@contextlib.contextmanager
def outside_inference_mode():
    """A block whose tensors are ordinary ones even inside ``torch.inference_mode`` (and record no gradient):
    for what a module caches on itself during decoding (``generate`` runs in inference mode) and reuses
    later, when the module may be training again; an inference tensor saved for backward raises there."""
    with torch.inference_mode(False), torch.no_grad():
        yield


class Rotary(nn.Module):
    """Rotary position embedding tables for absolute positions (HF Qwen3 convention)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        # [hd/2]; a plain attribute (not a buffer) so .to(bfloat16) never degrades it
        self._inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))

    def forward(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``pos`` [b, n] (long) -> (cos, sin), each [b, 1, n, hd] in ``dtype``."""
        if self._inv_freq.device != pos.device:
            with outside_inference_mode():  # kept for training too
                self._inv_freq = self._inv_freq.to(pos.device)
        freqs = pos[..., None].float() * self._inv_freq  # [b, n, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [b, n, hd]
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, hd], cos/sin [b, 1, n, hd] -> [b, heads, n, hd]."""
    return x * cos + rotate_half(x) * sin


class KVCache:
    """Roped keys/values of one attention layer in a growable buffer (batch dim kept).

    ``k``/``v`` views are ``[b, KV, len, hd]``. ``write`` stores new entries after the
    current length without committing them (so a query block's own keys can be
    attended without a concatenation copy); ``commit`` advances the length.
    """

    def __init__(self):
        self._k: torch.Tensor | None = None  # [b, KV, capacity, hd]
        self._v: torch.Tensor | None = None  # [b, KV, capacity, hd]
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @classmethod
    def of(cls, k: torch.Tensor | None, v: torch.Tensor | None) -> "KVCache":
        """A cache holding k/v [b, KV, len, hd] (None = empty): a pure function of its inputs, for
        recomputed (checkpointed) training steps."""
        cache = cls()
        if k is not None:
            cache._k, cache._v, cache.length = k, v, k.shape[2]
        return cache

    def tensors(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The committed k/v [b, KV, len, hd] (None when empty)."""
        if self._k is None or self.length == 0:
            return None, None
        return self._k[:, :, : self.length], self._v[:, :, : self.length]

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [b, KV, t, hd] at ``length..length+t-1``; return views of all ``length+t`` keys/values.
        ``positions`` (:class:`StaticKVCache`'s slots) is not needed: entries append after the current length."""
        end = self.length + k.shape[2]
        if k.requires_grad or v.requires_grad:
            # training: functional concatenation (in-place writes would break autograd)
            if self._k is None or self.length == 0:
                self._k, self._v = k, v
            else:
                self._k = torch.cat([self._k[:, :, : self.length], k], dim=2)
                self._v = torch.cat([self._v[:, :, : self.length], v], dim=2)
            return self._k, self._v
        if self._k is None or end > self._k.shape[2] or self._k.dtype != k.dtype or self._k.device != k.device:
            cap = max(64, 2 * end)
            nk = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])  # [b, KV, cap, hd]
            nv = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
            if self._k is not None and self.length:
                nk[:, :, : self.length] = self._k[:, :, : self.length]
                nv[:, :, : self.length] = self._v[:, :, : self.length]
            self._k, self._v = nk, nv
        self._k[:, :, self.length:end] = k
        self._v[:, :, self.length:end] = v
        return self._k[:, :, :end], self._v[:, :, :end]

    def commit(self, t: int) -> None:
        """Make ``t`` entries written after the current length permanent."""
        self.length += t

    def crop(self, length: int) -> None:
        """Drop entries at index >= length."""
        self.length = min(self.length, max(0, int(length)))


class StaticKVCache:
    """Roped keys/values of one attention layer in a fixed buffer whose slot i holds position i (batch 1).

    The decode path that compiles (``ParallelSession(static_capacity=N)``): ``write`` stores entries at their
    positions (``index_copy_``) and returns the whole buffer ``[1, KV, capacity, hd]``, so every call has
    the same shapes; the caller masks the slots past the block (:meth:`visible`). Nothing to commit or crop:
    a slot beyond the committed length is simply overwritten by the next round.
    """

    def __init__(self, capacity: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        self.capacity = int(capacity)
        self._k = torch.zeros(1, num_kv_heads, self.capacity, head_dim, dtype=dtype, device=device)
        self._v = torch.zeros_like(self._k)
        if self._k.is_cuda:  # CUDA graphs read and write these very buffers on every replay
            torch._dynamo.mark_static_address(self._k)
            torch._dynamo.mark_static_address(self._v)

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [1, KV, t, hd] at ``positions`` [t] (distinct) -> the whole buffers."""
        self._k.index_copy_(2, positions, k)
        self._v.index_copy_(2, positions, v)
        return self._k, self._v

    def commit(self, t: int) -> None:
        pass  # slots are positions: nothing to advance

    def crop(self, length: int) -> None:
        pass  # slots >= length are masked until a later round overwrites them

    @staticmethod
    def visible(end: torch.Tensor, capacity: int) -> torch.Tensor:
        """The attention mask ``[1, 1, 1, capacity]`` of slots < ``end`` (a 0-d tensor: no recompile per round)."""
        return (torch.arange(capacity, device=end.device) < end)[None, None, None]


def _as_batch_pos(pos: torch.Tensor, b: int) -> torch.Tensor:  # [n] | [1, n] | [b, n] -> [b, n]
    if pos.dim() == 1:
        pos = pos[None]
    return pos.expand(b, -1) if pos.shape[0] == 1 else pos


class Attention(nn.Module):
    """GQA attention with q/k RMSNorm per head, RoPE, and optional extra context keys.

    ``forward(x, x_pos, ctx, ctx_pos, mask, kv_cache)``: queries come from ``x``;
    keys/values are ``[cache (if any), k/v_proj(ctx), k/v_proj(x)]`` with the same
    projections for context and queries (DFlash context injection), each roped at
    its own absolute positions. ``in_dim`` may differ from ``out_dim`` (EAGLE-3's
    attention reads ``cat(embedding, hidden)``, 2d wide, and writes d).
    """

    def __init__(self, in_dim: int, out_dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rope_theta: float, eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)  # in -> H*hd
        self.k_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=False)  # in -> KV*hd
        self.v_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=False)  # in -> KV*hd
        self.o_proj = nn.Linear(num_heads * head_dim, out_dim, bias=False)  # H*hd -> out
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.rotary = Rotary(head_dim, rope_theta)

    def project_kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [b, t, in], pos [t]|[b, t] -> roped k, v [b, KV, t, hd]."""
        b, t, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)  # [b,KV,t,hd]
        v = self.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [b, KV, t, hd]
        cos, sin = self.rotary(_as_batch_pos(pos, b), k.dtype)  # [b|1, 1, t, hd]
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,  # [b, n, in] queries (already normed by the caller)
        x_pos: torch.Tensor,  # [n] | [b, n]
        ctx: torch.Tensor | None = None,  # [b, c, in] extra context (keys/values only)
        ctx_pos: torch.Tensor | None = None,  # [c] | [b, c]
        mask: torch.Tensor | BlockMask | StructuredAttention | None = None,  # bool [b|1, 1, n, m + c + n]; None = all
        kv_cache: KVCache | None = None,
        append_x: bool = False,
    ) -> torch.Tensor:  # [b, n, out]
        """With ``kv_cache``, ``ctx`` keys are appended to the cache permanently (and
        the queries' own keys too when ``append_x``, autoregressive use); keys are then
        ``[cache incl. new ctx, x]`` without copying the cache."""
        b, n, _ = x.shape
        x_pos = _as_batch_pos(x_pos, b)
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)  # [b, H, n, hd]
        cos, sin = self.rotary(x_pos, q.dtype)  # [b|1, 1, n, hd]
        q = apply_rope(q, cos, sin)
        if ctx is not None and ctx.shape[1] > 0:
            c = ctx.shape[1]
            # one projection for context and queries: [b, c+n, in] -> k, v [b, KV, c+n, hd]
            all_pos = torch.cat([_as_batch_pos(ctx_pos, b), x_pos], dim=1)  # [b, c+n]
            k, v = self.project_kv(torch.cat([ctx, x], dim=1), all_pos)
        else:
            c = 0
            k, v = self.project_kv(x, x_pos)  # [b, KV, n, hd]
        if kv_cache is not None:  # -> [b, KV, m + c + n, hd]; a StaticKVCache: all its [1, KV, capacity, hd] slots
            k, v = kv_cache.write(k, v, (all_pos if c else x_pos)[0])
            kv_cache.commit(c + (n if append_x else 0))
        gqa = self.num_heads != self.num_kv_heads
        if isinstance(mask, BlockMask):
            out = _flex(q, k, v, mask, gqa)  # [b, H, n, hd]
        elif isinstance(mask, StructuredAttention):
            out = mask(q, k, v)  # [b, H, n, hd]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)  # [b, H, n, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))  # [b, n, out]


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Qwen3MLP)."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inner, bias=False)  # d -> I
        self.up_proj = nn.Linear(dim, inner, bias=False)  # d -> I
        self.down_proj = nn.Linear(inner, dim, bias=False)  # I -> d

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., d]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``h = x + attn(norm(x), ctx)``; ``h + mlp(norm(h))``.

    The context (DFlash: fused target features) only supplies keys/values; it is
    not normed by this layer and never enters the residual stream.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                 rope_theta: float, eps: float = 1e-6):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.self_attn = Attention(hidden_size, hidden_size, num_heads, num_kv_heads, head_dim, rope_theta, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x, x_pos, ctx=None, ctx_pos=None, mask=None, kv_cache=None, append_x=False):
        # x [b, n, d], ctx [b, c, d] -> [b, n, d]
        h = x + self.self_attn(self.input_layernorm(x), x_pos, ctx, ctx_pos, mask, kv_cache, append_x)
        return h + self.mlp(self.post_attention_layernorm(h))


def memo_on_weights(owner, slot: str, tensors, build: Callable, extra: tuple = ()):
    """``build()``, kept in ``owner.__dict__[slot]`` (not a parameter or buffer: never in a state dict) until one of
    ``tensors`` is replaced, moved, cast or changed in place (an optimizer step or ``load_state_dict`` bumps a
    tensor's version), or ``extra`` changes: what is derived from weights once and read at every round (Domino's
    decode tables, a predictor's fused head, a drafter's key). A copy's tensors are new ones, so it rebuilds; an
    owner whose memo is large drops it from its pickles itself (Domino's ``__getstate__``)."""
    key = (tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device) for t in tensors), extra)
    cached = owner.__dict__.get(slot)
    if cached is None or cached[0] != key:
        cached = (key, build())
        owner.__dict__[slot] = cached
    return cached[1]


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """HF-style init: Linear/GRU weights ~ N(0, std), norms = 1 (call via ``model.apply``)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.GRU):
        for name, p in module.named_parameters():
            if "weight" in name:
                nn.init.normal_(p, std=std)
            else:
                nn.init.zeros_(p)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
