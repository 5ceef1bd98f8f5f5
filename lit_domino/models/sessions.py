"""Per-sequence decoding state of each drafter (the ``DraftSession`` protocol).

Batch size 1. A session holds the committed context (positions ``0 .. length-1``,
whose target features are known) and, between ``draft`` and the next
``crop``/``extend``, the speculative stages drafted on top of it.

* ``extend(tokens [n], features [n, n*d] | None)`` appends committed tokens at
  positions ``length .. length+n-1`` (and drops any speculative stages first).
* ``draft(anchor_token, num_tokens, temperature, generator) -> StageDraft``
  drafts ``num_tokens`` tokens after ``anchor_token``. The first stage's anchor
  sits at position ``length``; a second call before ``crop``/``extend`` (DLoop)
  must pass the previous stage's last drafted token as its anchor and continues
  from there, the drafter's own hidden states standing in for the target
  features of the unverified positions.
* ``crop(length)`` drops every position >= ``length`` and all speculative stages.

Shapes: K drafted tokens, V vocabulary, d width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lit_domino.models.layers import KVCache


@dataclass
class StageDraft:
    """One drafting stage."""

    tokens: torch.Tensor
    """[K] long, the drafted tokens."""
    logprobs: torch.Tensor
    """[K] log q(token): log_softmax(logits / T) at T > 0, log_softmax(logits) at T = 0 (DLoop's confidence)."""
    probs: torch.Tensor | None = None
    """[K, V] the draft distributions q = softmax(logits / T) the tokens were sampled from (T > 0 only)."""
    logits: torch.Tensor | None = None
    """[K, V] the (final) logits each token was picked from, before temperature (diagnostics, tests)."""


@dataclass
class _Stage:
    start: int  # anchor position
    tokens: torch.Tensor  # [K]
    hidden: torch.Tensor | None = None  # [K+1, d] parallel drafters: block hidden after the final norm


def pick_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """logits [K, V] -> (tokens [K], logprobs [K], probs [K, V] | None): argmax at T = 0, else sample q."""
    if temperature is None or temperature <= 0:
        tokens = logits.argmax(-1)  # [K]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]
        return tokens, logprobs, None
    logq = torch.log_softmax(logits.float() / temperature, -1)  # [K, V]
    probs = logq.exp()
    tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]  # [K]
    return tokens, logq.gather(-1, tokens[:, None])[:, 0], probs


def _stage(toks: list, rows: list, lps: list, qs: list) -> StageDraft:
    """Assemble a sequential stage; greedy stages (no per-step log-probs) get theirs in one batched pass."""
    tokens, logits = torch.cat(toks), torch.cat(rows)  # [K], [K, V]
    if not lps:
        lps = [torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]]
    return StageDraft(tokens, torch.cat(lps), torch.cat(qs) if qs else None, logits)


def _as_ids(tokens, device) -> torch.Tensor:  # -> [n] long
    return torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(-1)


class _Rows:
    """A growable [n, ...] tensor (capacity doubling) for committed per-position data."""

    def __init__(self, empty: torch.Tensor):
        self.data = empty  # [0, ...] until the first append
        self.n = 0

    def append(self, x: torch.Tensor) -> None:
        end = self.n + x.shape[0]
        if end > self.data.shape[0] or self.data.shape[1:] != x.shape[1:]:
            new = x.new_empty((max(64, 2 * end),) + tuple(x.shape[1:]))
            if self.n:
                new[: self.n] = self.data[: self.n]
            self.data = new
        self.data[self.n:end] = x
        self.n = end

    def crop(self, n: int) -> None:
        self.n = min(self.n, n)

    def __getitem__(self, idx):
        return self.data[: self.n][idx]


class _Session:
    """Shared bookkeeping: committed length, position limit, argument checks."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.config = drafter.config
        self.device = next(drafter.parameters()).device
        self._len = 0
        self.stages: list[_Stage] = []

    @property
    def length(self) -> int:
        """Committed positions (extended and not cropped)."""
        return self._len

    def _check_crop(self, length: int) -> int:
        length = int(length)
        if not 0 <= length <= self._len:
            raise ValueError(f"crop({length}) is outside the committed context 0..{self._len}")
        return length

    def _check_draft(self, anchor_token, num_tokens: int, start: int) -> torch.Tensor:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        limit = self.config.max_position_embeddings
        if start + num_tokens >= limit:
            raise ValueError(
                f"drafting {num_tokens} tokens after position {start} reaches position {start + num_tokens}, "
                f"beyond the drafter's max_position_embeddings ({limit}); stop generation earlier"
            )
        anchor = _as_ids(anchor_token, self.device)
        if anchor.numel() != 1:
            raise ValueError(f"anchor_token must be one token id, got {anchor.numel()} ids")
        if self.stages and int(anchor) != int(self.stages[-1].tokens[-1]):
            raise ValueError(
                f"a DLoop stage continues from the previous stage's last drafted token "
                f"{int(self.stages[-1].tokens[-1])}, got anchor {int(anchor)}; crop() before drafting a new round"
            )
        return anchor

    def _check_extend(self, tokens, features, need_features: bool):
        ids = _as_ids(tokens, self.device)
        if need_features:
            if features is None:
                raise ValueError(f"{type(self.drafter).__name__} needs the target features of extended tokens")
            features = torch.as_tensor(features, device=self.device)
            if features.dim() == 3 and features.shape[0] == 1:
                features = features[0]
            want = self.config.num_features * self.config.hidden_size
            if features.shape != (ids.numel(), want):
                raise ValueError(f"features must be [{ids.numel()}, {want}] for {ids.numel()} tokens, "
                                 f"got {tuple(features.shape)}")
        return ids, features


class ParallelSession(_Session):
    """Backbone session: per-layer context K/V cache (computed from fused features once).

    A round computes only the new context positions and the block. ``stages[i].hidden``
    holds each stage's block hidden states (after the final norm); for a DLoop stage,
    the previous stage's ``hidden[k+1]`` stands in as the fused feature at ``start + k``.
    """

    def __init__(self, drafter):
        super().__init__(drafter)
        self.caches = [KVCache() for _ in drafter.layers]
        self._cached = 0  # committed positions whose context K/V are in the caches
        self._pending: list[torch.Tensor] = []  # raw features of positions _cached .. _len-1

    def _drop_stages(self) -> None:
        if self.stages:
            for c in self.caches:
                c.crop(self._cached)
            self.stages = []

    @torch.no_grad()
    def extend(self, tokens, features) -> None:
        ids, features = self._check_extend(tokens, features, need_features=True)
        self._drop_stages()
        if ids.numel():
            self._pending.append(features)
            self._len += ids.numel()

    @torch.no_grad()
    def crop(self, length: int) -> None:
        length = self._check_crop(length)
        self._drop_stages()
        if length < self._cached:
            for c in self.caches:
                c.crop(length)
            self._cached, self._pending = length, []
        elif self._pending and length < self._len:
            self._pending = [torch.cat(self._pending)[: length - self._cached]]
        self._len = length

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> StageDraft:
        drafter, dev = self.drafter, self.device
        if self.stages:  # DLoop: previous stage's hidden states stand in for the unverified features
            prev = self.stages[-1]
            k_prev = prev.tokens.numel()
            start = prev.start + k_prev
            ctx = prev.hidden[1:][None]  # [1, K_prev, d]
            ctx_pos = torch.arange(prev.start, start, device=dev)  # [K_prev]
        else:
            start = self._len
            if self._pending:
                ctx = drafter.fuse(torch.cat(self._pending))[None]  # [1, new, d]
                ctx_pos = torch.arange(self._cached, self._len, device=dev)
            else:
                ctx, ctx_pos = None, None
        anchor = self._check_draft(anchor_token, num_tokens, start)
        ids = torch.full((num_tokens + 1,), self.config.mask_token_id, dtype=torch.long, device=dev)
        ids[0] = anchor[0]
        pos = torch.arange(start, start + num_tokens + 1, device=dev)  # [K+1]
        hidden = drafter.block_hidden(drafter.embed_tokens(ids)[None], pos, ctx, ctx_pos, None, self.caches)[0]
        if not self.stages:
            self._cached, self._pending = self._len, []
        out = self._pick(hidden, anchor, temperature, generator)  # hidden [K+1, d]
        self.stages.append(_Stage(start, out.tokens, hidden))
        return out

    def _pick(self, hidden, anchor, temperature, generator) -> StageDraft:
        logits = self.drafter.compute_logits(hidden[1:])  # [K, V]
        tokens, logprobs, probs = pick_tokens(logits, temperature, generator)
        return StageDraft(tokens, logprobs, probs, logits)


class DominoSession(ParallelSession):
    """Backbone block once, then the sequential Domino loop over block positions 1..K."""

    def _pick(self, hidden, anchor, temperature, generator) -> StageDraft:
        from lit_domino.models.domino import gru_gates

        drafter, head = self.drafter, self.drafter.head
        K, d, r = hidden.shape[0] - 1, hidden.shape[1], head.down.weight.shape[0]
        # Everything that does not depend on the previous draft token is computed for the whole block
        # first; the loop is then one state matmul, the rank-r correction, a pick and one GRU update
        # per token (~12 kernels; the paper's point: +2.8 % draft latency over the backbone).
        base = drafter.compute_logits(hidden[1:])  # [K, V] backbone logits
        w_down = head.down.weight  # [r, d + d_s]
        h_part = hidden[1:] @ w_down[:, :d].T  # [K, r] W_down's H-part, all positions at once
        w_state = torch.cat([w_down[:, d:].T, head.gru.weight_hh_l0.T], dim=1)  # [d_s, r + 3d_s]: S's two uses
        w_up = head.up.weight.T.to(base.dtype)  # [r, V]
        w_ih = head.gru.weight_ih_l0.T  # [d, 3d_s]
        emb_w = drafter.embed.weight

        s = hidden.new_zeros(1, head.gru_hidden)  # [1, d_s]
        s = gru_gates(emb_w[anchor].to(hidden.dtype) @ w_ih, s @ w_state[:, r:], s)  # S_0: consumed x_anchor
        greedy = temperature is None or temperature <= 0
        toks, lps, rows, qs = [], [], [], []
        for i, (h_i, base_i) in enumerate(zip(h_part.split(1), base.split(1))):  # block position i+1
            s_down, s_hh = (s @ w_state).split([r, w_state.shape[1] - r], -1)  # [1, r], [1, 3d_s]
            corr = F.silu(h_i + s_down)  # [1, r]
            logits = torch.addmm(base_i, corr.to(base.dtype), w_up)  # [1, V] = base + ΔL
            rows.append(logits)
            if greedy:
                tok = logits.argmax(-1)  # [1]; log-probs are computed for all positions after the loop
            else:
                tok, lp, q = pick_tokens(logits, temperature, generator)
                lps.append(lp), qs.append(q)
            toks.append(tok)
            if i < K - 1:
                s = gru_gates(emb_w[tok].to(hidden.dtype) @ w_ih, s_hh, s)  # S_{i+1}: consumed the draft x_{i+1}
        return _stage(toks, rows, lps, qs)


class _ChainSession(_Session):
    """Token-by-token drafters: committed token ids kept for feeding the chain's cache later.

    Subclasses say how features are kept (``_append_features``) and how their cache
    follows a crop (``_crop_to``); ``_drop_stages`` forgets a round's drafted steps."""

    needs_features = False

    def __init__(self, drafter):
        super().__init__(drafter)
        self._tokens = _Rows(torch.zeros(0, dtype=torch.long, device=self.device))  # committed token ids [len]

    def _append_features(self, features: torch.Tensor | None) -> None:
        pass  # a drafter that reads no target features keeps none

    @torch.no_grad()
    def extend(self, tokens, features=None) -> None:
        ids, features = self._check_extend(tokens, features, need_features=self.needs_features)
        self._drop_stages()
        if ids.numel():
            self._tokens.append(ids)
            self._append_features(features)
            self._len += ids.numel()

    @torch.no_grad()
    def crop(self, length: int) -> None:
        length = self._check_crop(length)
        self._drop_stages()
        self._len = length
        self._tokens.crop(length)
        self._crop_to(length)


class EagleSession(_ChainSession):
    """EAGLE-3 chain: cached step K/V of the real prefix (positions 1..length-1) + the drafted chain."""

    needs_features = True

    def __init__(self, drafter):
        super().__init__(drafter)
        self.cache = KVCache()
        self._g = _Rows(torch.zeros(0, drafter.config.hidden_size, device=self.device))  # fused features [len, d]
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
        greedy = temperature is None or temperature <= 0
        toks, lps, rows, qs = [], [], [], []
        for j in range(num_tokens):  # h: the step at position start + j
            logits = drafter.compute_logits(h[0])  # [1, V]
            rows.append(logits)
            if greedy:
                tok = logits.argmax(-1)  # [1]
            else:
                tok, lp, q = pick_tokens(logits, temperature, generator)
                lps.append(lp), qs.append(q)
            toks.append(tok)
            if j < num_tokens - 1:
                h = drafter.step(drafter.embed_tokens(tok)[None], h, torch.tensor([start + j + 1], device=dev),
                                 None, self.cache)
        out = _stage(toks, rows, lps, qs)
        self._chain = (start + num_tokens, h)
        self.stages.append(_Stage(start, out.tokens))
        return out


class SmallLMSession(_ChainSession):
    """Small-LM chain on a Hugging Face ``DynamicCache`` (features are ignored)."""

    def __init__(self, drafter):
        super().__init__(drafter)
        from transformers import DynamicCache

        self.cache = DynamicCache(config=drafter.lm.config)
        self._cached = 0  # committed tokens fed into the cache

    def _crop_cache(self, length: int) -> None:
        remove = self.cache.get_seq_length() - length
        if remove > 0:
            self.cache.crop(-remove)

    def _drop_stages(self) -> None:
        if self.stages:
            self._crop_cache(self._cached)
            self.stages = []

    def _crop_to(self, length: int) -> None:
        self._cached = min(self._cached, length)
        self._crop_cache(self._cached)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:  # ids [n] -> next-token logits [1, V]
        out = self.drafter.lm(input_ids=ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1:]

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> StageDraft:
        if self.stages:
            start = self.stages[-1].start + self.stages[-1].tokens.numel()
            anchor = self._check_draft(anchor_token, num_tokens, start)
            feed = anchor
        else:
            start = self._len
            anchor = self._check_draft(anchor_token, num_tokens, start)
            feed = torch.cat([self._tokens[self._cached: self._len], anchor])
            self._cached = self._len
        greedy = temperature is None or temperature <= 0
        toks, lps, rows, qs = [], [], [], []
        for _ in range(num_tokens):
            logits = self._logits(feed)  # [1, V]
            rows.append(logits)
            if greedy:
                tok = logits.argmax(-1)  # [1]
            else:
                tok, lp, q = pick_tokens(logits, temperature, generator)
                lps.append(lp), qs.append(q)
            toks.append(tok)
            feed = tok  # the last one is fed by the next DLoop stage (as its anchor)
        out = _stage(toks, rows, lps, qs)
        self.stages.append(_Stage(start, out.tokens))
        return out
