"""DFlash 2: the DFlash backbone with a grouped dynamic causal convolution around each draft layer's attention
and MLP, and a candidate selector that reranks the backbone's top-k tokens by a low-rank transition score
(z-lab's DFlash 2; vLLM's ``speculators`` ``DFlash2DraftModel``).

Shapes: b batch, A anchors, B block size, K = B-1 drafted positions, N rows, d width, G = d / g channel groups
of g channels, t taps, r rank, c top-k candidates, V vocabulary.

**Convolution.** Each draft layer is ``h = x + conv_a.finish(attn(conv_a.prepare(norm(x))))``, then the same with
the MLP (``conv_m``). A :class:`GroupedDynamicConv` projects its input ``u = norm(x)`` [N, d] to two sets of
dynamic taps ``δ = W_k·u`` [N, 2, t, G] (input side, output side); side s maps a sequence y to
``y'_p = Σ_{τ < t, k_p ≥ τ} y_{p-τ} ⊙ (β_s[τ] + δ_{p,s,τ})`` over the block's own earlier positions (k_p: p's
block position; each group of g channels shares one dynamic tap), ``β`` [2, t, d] static taps. At init
``β[:, 0] = 1``, the rest and ``W_k`` are 0: every convolution is the identity and the layer is DFlash's.
Block positions count from the first query every ``B`` rows (speculators' ``positions % block_size``), so a
decode block of ``n <= B`` queries is one block.

**Windowed layers** (``sliding_layers``; speculators' ``sliding_attention`` layer type, which its trainer gives
every layer by default): the block anchored at a sees the context positions ``a-W .. a-1`` only, and itself
bidirectionally (``sliding_non_causal``, DFlash 2's default) or causally; the other layers see the whole context
before a. The same masks hold at decode time, where every cache is position-indexed.

**Selector.** From the block's hidden state ``H_k`` and the token before position k, ``x_{k-1}`` (the anchor
for k = 1, then the previous pick while drafting): the backbone's unary logits ``U_k = lm_head(H_k)``, its
top-c candidates ``C_k``, and each candidate's score ``s_k(v) = U_k[v] + ⟨P[x_{k-1}] ⊙ W_h·H_k, S[v]⟩``
(``P``, ``S``: V x r predecessor / successor codebooks, ``W_h``: d -> r). Drafting picks
``argmax_v∈C_k s_k(v)`` at T = 0 and samples ``q_k = softmax(s_k / T)`` over ``C_k`` at T > 0 (0 outside):
the q that rejection sampling divides by, so decoding stays exact.

**Objective** (speculators' DFlash 2 recipe, teacher forced on the true previous tokens): with p_k the target's
distribution at ``a+k-1`` (what predicted ``x_{a+k}``),
``KL(p_k ‖ softmax(U_k)) + α·CE_c(s_k(C'_k), argmax p_k)``: the selector's c-way cross-entropy over the unary
top-c candidates, the target's argmax put in the weakest candidate's slot when it is missing (``C'_k``); each
term weighted by the block position weights ``exp(−(k−1)/γ)`` (γ = 4, speculators' fixed-exp-decay), α = 1.
The sums are normalised by the weight sum (the suite's convention; speculators divides by the label count).

The target's distribution comes with the features exactly as for DSpark (feature rule ``dspark``: the DFlash
layers, then the target's last decoder layer, whose final-normed output the LM head turns into p).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, and_masks

from lit_domino.models.backbone import BackboneConfig, BlockOutput
from lit_domino.models.parallel_session import ParallelSession
from lit_domino.models.distill import DistilledDrafter, previous_tokens
from lit_domino.models.layers import DecoderLayer, StaticKVCache, call_layer, flex_block_mask, init_weights
from lit_domino.models.registry import register
from lit_domino.models.sessions import StageDraft, is_greedy, pool_stage
from lit_domino.models.objectives import IGNORE_INDEX, LossSettings, chunked_row_sums, label_rows
from lit_domino.models.objectives.blocks import block_objective, dense, objective_rows
from lit_domino.models.objectives.registry import weighted_mean


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass
class DFlash2HeadConfig:
    """DFlash 2's local convolutions and its candidate selector."""

    rank: int = 256
    """Rank r of the selector's transition score ``⟨P[x_{k-1}] ⊙ W_h·H_k, S[v]⟩``. Default 256, the paper's
    (speculators' ``selector_rank``)."""

    top_k: int = 16
    """Candidates c the selector reranks: the unary top-c of each position, at most V. Default 16 (speculators'
    ``selector_top_k``)."""

    conv_kernel_size: int = 2
    """Causal taps t of each dynamic convolution, at most ``block_size``. Default 2 (speculators')."""

    conv_group_size: int = 16
    """Channels g sharing one dynamic tap; must divide ``hidden_size``. Default 16 (speculators')."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> "DFlash2HeadConfig":
        """Raise ``ValueError`` naming the bad field (at construction: Python, YAML and ``--set`` alike); the
        bounds that need the drafter's widths are :meth:`DFlash2Config.validate`'s."""
        for name, what in (("rank", "the DFlash 2 selector's rank r"), ("top_k", "the selector's candidates"),
                           ("conv_kernel_size", "the convolutions' taps"),
                           ("conv_group_size", "channels per dynamic tap")):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"head.{name} must be a positive integer ({what}), got {getattr(self, name)!r}")
        return self


@dataclass
class DFlash2Config(BackboneConfig):
    """The backbone's config plus DFlash 2's head; ``feature_layers`` end with the target's last layer."""

    head: DFlash2HeadConfig = field(default_factory=DFlash2HeadConfig)
    """The convolutions and the candidate selector."""

    sliding_layers: list[int] = field(default_factory=list)
    """Draft layers (0-based) whose attention is windowed (speculators' ``layer_types`` ``sliding_attention``;
    its trainer windows every layer by default). Default none: every layer attends to the whole context."""

    sliding_window: int | None = None
    """W: a windowed layer's block anchored at a sees the context positions ``a-W .. a-1`` only (None: all of
    them, the window then only sets the block mask below). Default None."""

    sliding_non_causal: bool = True
    """A windowed layer's block attends bidirectionally inside itself (True, DFlash 2's
    ``sliding_window_non_causal``) or causally (False: block position k sees positions <= k). Full-attention
    layers always attend bidirectionally. Default True."""

    feature_rule: ClassVar[str | None] = "dspark"  # DFlash's layers, then the distribution layer

    def validate(self) -> "DFlash2Config":
        super().validate()
        h = self.head.validate()  # again: a field may have been set after construction
        if not _positive_int(h.top_k) or h.top_k > self.vocab_size:
            raise ValueError(f"top_k (the selector's candidates per position) must be an integer in "
                             f"1..{self.vocab_size} (the vocabulary size), got {h.top_k!r}")
        if not _positive_int(h.conv_kernel_size) or h.conv_kernel_size > self.block_size:
            raise ValueError(f"conv_kernel_size must be an integer in 1..{self.block_size} (the block size: the "
                             f"convolution stays inside a block), got {h.conv_kernel_size!r}")
        if not _positive_int(h.conv_group_size) or self.hidden_size % h.conv_group_size:
            raise ValueError(f"conv_group_size must be a positive divisor of hidden_size ({self.hidden_size}), "
                             f"got {h.conv_group_size!r}")
        layers = list(self.sliding_layers)
        if any(isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < self.num_layers for j in layers) \
                or len(set(layers)) != len(layers):
            raise ValueError(f"sliding_layers must be distinct draft layer ids in 0..{self.num_layers - 1}, "
                             f"got {layers}")
        if self.sliding_window is not None and not _positive_int(self.sliding_window):
            raise ValueError(f"sliding_window must be None (no window) or a positive integer, got "
                             f"{self.sliding_window!r}")
        if len(self.feature_layers) < 2:
            raise ValueError(f"a DFlash 2 drafter's feature_layers are the fused layers followed by the target's "
                             f"last layer (its distribution): need at least 2, got {self.feature_layers}")
        return self


class GroupedDynamicConv(nn.Module):
    """The input-side and output-side causal convolutions of one sublayer, their dynamic taps projected from
    the sublayer's (normed) input."""

    def __init__(self, hidden_size: int, block_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.block_size, self.kernel_size, self.group_size = block_size, kernel_size, group_size
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))  # β [2, t, d]
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)  # W_k
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity: tap 0 = 1, every other static tap and every dynamic one 0."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def conv(self, y: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """y [b, N, d], delta [b, N, t, G] -> [b, N, d]: ``Σ_τ y_{p-τ} ⊙ (β[side, τ] + δ_{p,τ})`` over block
        positions ``k_p ≥ τ`` (k_p = p mod B)."""
        b, N, d = y.shape
        G, g = self.num_groups, self.group_size
        yg = y.view(b, N, G, g)
        k = torch.arange(N, device=y.device).remainder(self.block_size)  # [N] block position of each row
        out = torch.zeros_like(yg)
        for tau in range(self.kernel_size):
            shifted = yg if tau == 0 else torch.cat([yg.new_zeros(b, tau, G, g), yg[:, :-tau]], dim=1)
            coef = self.base_kernel[side, tau].to(y.dtype).view(G, g) + delta[:, :, tau, :, None]  # [b, N, G, g]
            out = out + shifted * coef * (k >= tau).view(1, N, 1, 1)
        return out.view(b, N, d)

    def prepare(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input u [b, N, d] -> (its convolution, the output side's taps [b, N, t, G])."""
        delta = self.kernel_projection(u).view(*u.shape[:-1], 2, self.kernel_size, self.num_groups)
        return self.conv(u, delta[..., 0, :, :], 0), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The sublayer's output y [b, N, d] through the output-side convolution."""
        return self.conv(y, delta, 1)


class ConvDecoderLayer(DecoderLayer):
    """DFlash's decoder layer with a :class:`GroupedDynamicConv` around its attention and around its MLP. The
    context (fused target features) enters the attention's keys/values unconvolved."""

    def __init__(self, *args, block_size: int, kernel_size: int, group_size: int):
        super().__init__(*args)
        d = self.input_layernorm.weight.shape[0]
        self.attention_conv = GroupedDynamicConv(d, block_size, kernel_size, group_size)
        self.mlp_conv = GroupedDynamicConv(d, block_size, kernel_size, group_size)

    def forward(self, x, x_pos, ctx=None, ctx_pos=None, mask=None, kv_cache=None, append_x=False):
        u, delta = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(self.self_attn(u, x_pos, ctx, ctx_pos, mask, kv_cache, append_x), delta)
        u, delta = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(u), delta)


class CandidateSelector(nn.Module):
    """The low-rank transition score of candidates ``v`` after a predecessor token, given the hidden state."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int, std: float = 0.02):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # P [V, r]
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # S [V, r]
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)  # W_h: d -> r
        for p in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
            nn.init.normal_(p, std=std)

    def scores(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor, cand: torch.Tensor):
        """unary [..., V], hidden [..., d], prev [...] ids, cand [..., c] ids -> s [..., c] (unary's dtype)."""
        pred = self.predecessor_codebook[prev]  # [..., r]
        context = pred * self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype)).to(pred.dtype)
        trans = (context.unsqueeze(-2) * self.successor_codebook[cand]).sum(-1)  # [..., c]
        return unary.gather(-1, cand) + trans.to(unary.dtype)

    def candidates(self, unary: torch.Tensor) -> torch.Tensor:
        """[..., V] -> the unary top-c ids [..., c] (never differentiated: an index set)."""
        return unary.detach().topk(self.top_k, dim=-1).indices

    @torch.no_grad()
    def draft(self, hidden: torch.Tensor, unary: torch.Tensor, anchor: torch.Tensor, temperature: float = 0.0,
              generator: torch.Generator | None = None):
        """The decode-time chain over one block: hidden [K, d] and unary [K, V] of positions 1..K, anchor [1] ->
        (tokens [K], picks [K] in their rows, candidate ids [K, c], scores [K, c]). Position i's predecessor is
        the anchor (i = 0) or position i-1's pick."""
        cand = self.candidates(unary)  # [K, c]
        # everything but the predecessor's codebook row is known before the chain: one batched op each
        proj = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        proj = proj.to(self.predecessor_codebook.dtype)  # [K, r]
        succ, base = self.successor_codebook[cand], unary.gather(-1, cand)  # [K, c, r], [K, c]
        prev, toks, picks, rows = anchor, [], [], []
        for i in range(unary.shape[0]):
            context = self.predecessor_codebook[prev] * proj[i: i + 1]  # [1, r]
            s = base[i: i + 1] + (context.unsqueeze(-2) * succ[i: i + 1]).sum(-1).to(base.dtype)  # [1, c]
            if is_greedy(temperature):
                j = s.argmax(-1)
            else:
                j = torch.multinomial(torch.softmax(s.float() / temperature, -1), 1, generator=generator)[:, 0]
            prev = cand[i: i + 1].gather(-1, j[:, None])[:, 0]  # [1]
            toks.append(prev), picks.append(j), rows.append(s)
        return torch.cat(toks), torch.cat(picks), cand, torch.cat(rows)


def training_candidates(cand: torch.Tensor, target_ids: torch.Tensor):
    """cand [N, c], target ids [N] -> (cand' [N, c] with the target in the last slot where it was missing, the
    target's slot [N], whether the unary top-c held it [N])."""
    hit = cand.eq(target_ids[:, None])
    held = hit.any(-1)
    slot = torch.where(held, hit.long().argmax(-1), torch.full_like(target_ids, cand.shape[-1] - 1))
    out = cand.clone()
    out[:, -1] = torch.where(held, cand[:, -1], target_ids)
    return out, slot, held


class SelectorPathHead:
    """DFlash 2's selector over a tree's frontier (:class:`lit_domino.decoding.tree.PathHead`): each node's children
    are its position's unary top-c candidates, rescored by the transition from the node's own token (the chain's
    rule of :meth:`CandidateSelector.draft`, one row per frontier node); the scores are over the c candidates
    only, so the tree's q is the chain's (the softmax over them, 0 elsewhere)."""

    def __init__(self, drafter, hidden: torch.Tensor, anchor: torch.Tensor):
        sel = drafter.selector
        self.selector, self.anchor = sel, anchor
        unary = drafter.compute_logits(hidden[1:])  # [K, V]; hidden [K+1, d] of draft_hidden
        self.vocab_size = unary.shape[-1]
        self.cand = sel.candidates(unary)  # [K, c]
        # the predecessor-free parts, once per block (as the chain does)
        self.proj = sel.hidden_projection(hidden[1:].to(sel.hidden_projection.weight.dtype)).to(
            sel.predecessor_codebook.dtype)  # [K, r]
        self.succ, self.base = sel.successor_codebook[self.cand], unary.gather(-1, self.cand)  # [K, c, r], [K, c]

    def start(self):
        return self.anchor  # the root's token [1]

    def step(self, i: int, prev: torch.Tensor):
        """Frontier tokens [F] at depth i → (children's scores [F, c] on position i's candidates, their token ids
        [1, c], nothing inherited but the token)."""
        context = self.selector.predecessor_codebook[prev] * self.proj[i: i + 1]  # [F, r]
        return self.base[i: i + 1] + (context @ self.succ[i].T).to(self.base.dtype), self.cand[i: i + 1], None

    def child(self, inherited, rows: torch.Tensor, tokens: torch.Tensor):
        return tokens


class DFlash2Session(ParallelSession):
    """Backbone block once (through the convolution layers), then the selector's chain over positions 1..K.
    The stage's logits are the candidates' scores (−inf elsewhere), q its softmax over them. The target features
    it is given may include the distribution layer (as DSpark's): only the fused layers' columns are kept."""

    @torch.no_grad()
    def extend(self, tokens, features) -> None:
        if features is not None:
            features = torch.as_tensor(features, device=self.device)
            width = self.config.num_features * self.config.hidden_size
            if features.shape[-1] == width + self.config.hidden_size:
                features = features[..., :width]
        super().extend(tokens, features)

    def path_head(self, hidden: torch.Tensor, anchor: torch.Tensor) -> SelectorPathHead:
        """The selector over a tree's frontier, for the block ``hidden`` [K+1, d] of :meth:`draft_hidden`."""
        return SelectorPathHead(self.drafter, hidden, anchor)

    def _pick(self, hidden, anchor, unary, temperature, generator, picks=None) -> StageDraft:
        drafter = self.drafter  # unary [K, V]: the backbone's logits
        tokens, picks, cand, scores = drafter.selector.draft(hidden[1:], unary, anchor, temperature, generator)
        return pool_stage(tokens, picks, scores, cand, temperature, unary.shape[-1])


@dataclass
class DFlash2Output(BlockOutput):
    """A DFlash 2 block output: the backbone's, ``head_state`` = the predecessor ids [b, A, B] (the true previous
    tokens), ``final_logits`` the selector's scores on the unary top-c (−inf elsewhere) when materialised."""

    target_hidden: torch.Tensor | None = None
    """[b, A, B, d] the target's final hidden state at ``a+k-1``: p_k = softmax(lm_head(·))."""


@register("dflash2")
class DFlash2Drafter(DistilledDrafter):
    """DFlash backbone with grouped dynamic convolutions + candidate selector; KL + selector-CE objective."""

    config_class = DFlash2Config
    session_class = DFlash2Session
    draft_options = ("static_capacity", "compile")
    tree_builders = ("chain", "ddtree", "path")
    method_name = "DFlash 2"

    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        c, h = config, config.head
        self.layers = nn.ModuleList(
            ConvDecoderLayer(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                             c.rope_theta, c.rms_norm_eps, block_size=c.block_size, kernel_size=h.conv_kernel_size,
                             group_size=h.conv_group_size)
            for _ in range(c.num_layers))
        self.layers.apply(init_weights)
        for layer in self.layers:  # identity convolutions: a fresh DFlash 2 layer is DFlash's
            layer.attention_conv.reset_parameters()
            layer.mlp_conv.reset_parameters()
        self.selector = CandidateSelector(c.vocab_size, c.hidden_size, h.rank, h.top_k)

    def block_hidden(self, block_emb, block_pos, ctx=None, ctx_pos=None, mask=None, caches=None) -> torch.Tensor:
        """The backbone's block forward, the windowed layers (``sliding_layers``) under the base mask AND the
        window (:meth:`window_mask`)."""
        sliding = set(self.config.sliding_layers)
        windowed = self.window_mask(block_emb.shape[0], block_pos, ctx, ctx_pos, mask, caches) if sliding else None
        h = block_emb
        recompute = self.training and caches is None and self.train_options.checkpoint_layers
        for i, layer in enumerate(self.layers):
            h = call_layer(layer, h, block_pos, ctx, ctx_pos, windowed if i in sliding else mask,
                           caches[i] if caches is not None else None, recompute=recompute)
        return self.norm(h)

    def window_mask(self, b, block_pos, ctx, ctx_pos, mask, caches):
        """``mask`` (dense, flex or None = all) AND the window: a query at position q of the block starting at s
        (q's block position = its row mod B) sees a key at position p iff ``p >= s - W`` and, for a causal
        window, ``p <= q``. Every key layout here is position-indexed: training's ``[ctx_pos, block_pos]``, a
        decode cache's ``[0 .. m-1, ctx_pos, block_pos]`` (committed positions in order), a static cache's slots."""
        c, B = self.config, self.config.block_size
        q = block_pos if block_pos.dim() == 2 else block_pos[None]  # [b|1, N]
        dev = q.device
        start = q - torch.arange(q.shape[1], device=dev).remainder(B)  # [b|1, N] each query's block start
        if caches is not None and isinstance(caches[0], StaticKVCache):
            keys = torch.arange(caches[0].capacity, device=dev)[None]  # [1, capacity] slot = position
        else:
            parts = [torch.arange(len(caches[0]), device=dev)[None]] if caches is not None else []
            if ctx is not None and ctx.shape[1] > 0:
                parts.append(ctx_pos if ctx_pos.dim() == 2 else ctx_pos[None])
            keys = torch.cat([p.expand(q.shape[0], -1) for p in parts] + [q], dim=1)  # [b|1, K]
        window = c.sliding_window  # None: no lower bound (the window only sets the block's own mask)
        lo = torch.full_like(start, torch.iinfo(torch.long).min) if window is None else start - window

        if isinstance(mask, BlockMask):
            bq = q.expand(b, -1)
            lo_b, keys_b = lo.expand(b, -1), keys.expand(b, -1)

            def window_mod(bi, h, qi, kv):
                ok = keys_b[bi, kv] >= lo_b[bi, qi]
                return ok if c.sliding_non_causal else ok & (keys_b[bi, kv] <= bq[bi, qi])

            return flex_block_mask(and_masks(mask.mask_mod, window_mod), b, q.shape[1], keys.shape[1], dev)
        extra = keys[:, None, :] >= lo[:, :, None]  # [b|1, N, K]
        if not c.sliding_non_causal:
            extra = extra & (keys[:, None, :] <= q[:, :, None])
        extra = extra[:, None]  # [b|1, 1, N, K]
        return extra if mask is None else mask & extra

    def add_head(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> DFlash2Output:
        if causal_inputs != "teacher_forced":
            raise ValueError(f"a DFlash 2 drafter trains teacher forced (its selector reads the true previous "
                             f"token), got causal_inputs={causal_inputs!r}")
        prev = previous_tokens(out.block_tokens)  # [b, A, B]
        final = None if out.logits is None else self.selector_logits(out.logits, out.hidden, prev)
        fields = {k: getattr(out, k) for k in ("hidden", "labels", "block_tokens", "logits")}
        return DFlash2Output(**fields, final_logits=final, head_state=prev,
                             target_hidden=getattr(out, "target_hidden", None))

    def selector_logits(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """[..., V] dense selector logits: the scores on the unary top-c, −inf elsewhere (what drafting picks
        from, teacher forced)."""
        cand = self.selector.candidates(unary)
        scores = self.selector.scores(unary, hidden, prev, cand)
        return torch.full_like(unary, float("-inf")).scatter(-1, cand, scores)

    def row_inputs(self, out: BlockOutput) -> list[torch.Tensor]:
        if out.head_state is None:
            raise ValueError("a DFlash 2 BlockOutput without head_state: run it through add_head")
        return [out.hidden, out.head_state]

    def row_logits(self, h: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of (H, x_{k-1}) -> (unary, dense selector) logits."""
        unary = self.compute_logits(h)
        return unary, self.selector_logits(unary, h, prev)

    def row_terms(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor,
                  target_logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-row terms, float32 [n]: KL(p ‖ softmax(U)), the selector's c-way CE, and (no gradient, for the
        logs) TV(p, q_unary) and whether the unary top-c held the target's argmax."""
        logq = torch.log_softmax(unary.float(), -1)
        logp = torch.log_softmax(target_logits.float(), -1)
        p = logp.exp()
        kl = (p * (logp - logq)).sum(-1)
        sel, held = self.selector_ce(unary, hidden, prev, target_logits)
        with torch.no_grad():
            tv = 0.5 * (logq.exp() - p).abs().sum(-1)
        return kl, sel, tv, held.float()

    def selector_ce(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor,
                    target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The selector's c-way CE per row (the target's argmax in the weakest slot when the unary top-c misses
        it) and whether the top-c held it (float, no gradient)."""
        cand, slot, held = training_candidates(self.selector.candidates(unary), target_logits.argmax(-1))
        return F.cross_entropy(self.selector.scores(unary, hidden, prev, cand).float(), slot, reduction="none"), held

    def block_loss(self, out: DFlash2Output, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """``KL + α·selector CE`` (α = ``settings.selector_weight``), each position-weighted over the labelled
        positions -> (loss, parts); from the materialised logits when the forward made them, else chunk by chunk
        (the LM head on the labelled rows only, the target's logits included). A selected objective:
        :meth:`objective_loss`."""
        if out.target_hidden is None:
            raise ValueError("a DFlash 2 loss needs the target's distribution: use drafter.forward_train")
        if settings.objective is not None:
            return self.objective_loss(out, settings)
        keep, y, w = label_rows(out.labels, settings.position_weights)
        if out.logits is not None:  # the reference path: every logit materialised
            terms = self.row_terms(out.logits[keep], out.hidden[keep], out.head_state[keep],
                                   self.compute_logits(out.target_hidden[keep]))
            sums = [(t * w).sum() for t in terms]
        else:
            def rows_fn(h, prev, th):
                return self.row_terms(self.compute_logits(h), h, prev, self.compute_logits(th))

            rows = [out.hidden[keep], out.head_state[keep], out.target_hidden[keep]]
            sums = chunked_row_sums(rows_fn, rows, w, settings.chunk_size)
        denom = w.sum()
        kl, sel, tv, held = (s * 0.0 if denom <= 0 else s / denom for s in sums)
        loss = kl + settings.selector_weight * sel
        return loss, {"loss_kl": kl.detach(), "loss_selector": sel.detach(), "unary_accept_rate": (1.0 - tv).detach(),
                      "candidate_recall": held.detach()}

    def objective_loss(self, out: DFlash2Output, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """A selected objective J on the unary logits (in place of the KL) plus the selector's CE ``α·CE_c``
        (position-weighted) -> (loss, parts); lean or from the materialised logits, as :meth:`block_loss`."""
        obj, keep, full = settings.objective, out.labels != IGNORE_INDEX, out.logits is not None

        def row_fn(*xs):
            unary, (h, prev, th) = (xs[0], xs[1:]) if full else (self.compute_logits(xs[0]), xs)
            p = self.compute_logits(th)
            return (unary,), (p if obj.needs_target else None), (self.selector_ce(unary, h, prev, p)[0],)

        rows = [x[keep] for x in ([out.logits] if full else []) + [out.hidden, out.head_state, out.target_hidden]]
        (stats,), (sel,) = objective_rows(obj, row_fn, rows, out.labels[keep], settings.chunk_size)
        loss, logs = block_objective(obj, stats, keep, settings.position_weights)
        sel = weighted_mean(dense(sel, keep), keep, settings.position_weights.to(keep.device).float())
        return loss + settings.selector_weight * sel, {"loss_objective": loss.detach(), "loss_selector": sel.detach(),
                                                       **logs}
