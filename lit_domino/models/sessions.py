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

import types
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._pytree import tree_map


@dataclass
class StageDraft:
    """One drafting stage."""

    tokens: torch.Tensor
    """[K] long, the drafted tokens."""
    _logprobs: torch.Tensor | None
    """[K] log q(token) (read :attr:`logprobs`); None at T = 0 until someone asks: plain greedy decoding never
    pays for a log-softmax over the vocabulary (the official DFlash loop does not either)."""
    probs: torch.Tensor | None = None
    """[K, V] the draft distributions q = softmax(logits / T) the tokens were sampled from (T > 0 only; 0 outside
    a candidate pool)."""
    logits: torch.Tensor | None = None
    """[K, V] the (final) logits each token was picked from, before temperature (diagnostics, tests); -inf
    outside a candidate pool."""

    @property
    def logprobs(self) -> torch.Tensor:
        """[K] log q(token): log_softmax(logits / T) at T > 0, log_softmax(logits) at T = 0 (DLoop's confidence);
        with a candidate pool the softmax runs over the pool. Computed on first use at T = 0."""
        if self._logprobs is None:
            self._logprobs = torch.log_softmax(self.logits.float(), -1).gather(-1, self.tokens[:, None])[:, 0]
        return self._logprobs


@dataclass
class Stage:
    """One drafted stage kept by a session until the next crop/extend."""

    start: int  # anchor position
    tokens: torch.Tensor  # [K]
    hidden: torch.Tensor | None = None  # [K+1, d] parallel drafters: block hidden after the final norm


def is_greedy(temperature: float | None) -> bool:
    """T = 0 (or None) means greedy argmax picks everywhere, drafter and target alike; T < 0 is rejected by
    ``generate``'s validation before any decoding."""
    return temperature is None or temperature <= 0


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """``logits [..., V]`` → the argmax ids ``[...]`` (the first maximum; a NaN counts as the maximum): every greedy
    pick of a decode, drafter and target alike. A CPU float32 tensor goes through NumPy's argmax, which returns the
    same index: torch 2.13's CPU argmax over a vocabulary-wide row is several times slower, a measurable share of a
    compiled round (measured: docs/results.md, 2026-12-07 afternoon)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return torch.as_tensor(logits.numpy().argmax(-1))
    return logits.argmax(-1)


def pick_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """logits [K, V] -> (tokens [K], logprobs [K] | None, probs [K, V] | None): argmax at T = 0 (log q left to
    ``StageDraft.logprobs``), else sample q."""
    if is_greedy(temperature):
        return greedy_ids(logits), None, None  # log q on demand (StageDraft.logprobs)
    logq = torch.log_softmax(logits.float() / temperature, -1)  # [K, V]
    probs = logq.exp()
    tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]  # [K]
    return tokens, logq.gather(-1, tokens[:, None])[:, 0], probs


def draft_chain(next_logits: Callable[[torch.Tensor | None], torch.Tensor], num_tokens: int, temperature: float,
                generator: torch.Generator | None) -> StageDraft:
    """The sequential draft loop of the autoregressive drafters (EAGLE-3, the small LM).

    ``next_logits(prev)`` returns the next position's logits ``[1, V]``; ``prev`` is None for the first one,
    else the token just drafted (``[1]``), which the drafter feeds to its state first.
    """
    greedy = is_greedy(temperature)
    toks, rows, lqs = [], [], []
    prev = None
    for _ in range(num_tokens):
        logits = next_logits(prev)  # [1, V]
        if greedy:
            prev = greedy_ids(logits)  # [1]; log q on demand (StageDraft.logprobs)
        else:
            lqs.append(torch.log_softmax(logits.float() / temperature, -1))  # [1, V]
            prev = torch.multinomial(lqs[-1].exp(), 1, generator=generator)[:, 0]
        rows.append(logits), toks.append(prev)
    tokens, logits = torch.cat(toks), torch.cat(rows)  # [K], [K, V]
    if greedy:
        return StageDraft(tokens, None, None, logits)
    logq = torch.cat(lqs)  # [K, V]
    return StageDraft(tokens, logq.gather(-1, tokens[:, None])[:, 0], logq.exp(), logits)


def pool_stage(tokens: torch.Tensor, picks: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor | None,
               temperature: float, vocab_size: int) -> StageDraft:
    """A stage picked from candidate pools: ``logits`` [K, P] on the token ids ``ids`` [K, P] (None: P = V, the
    whole vocabulary), ``picks`` [K] the index of each pick in its row, ``tokens`` [K] the ids. The pick's
    log-probability is taken on the pool, and the stage's dense ``logits`` are ``-inf`` and ``probs`` (q) 0
    outside it, so rejection sampling with q stays exact."""
    greedy = is_greedy(temperature)
    if ids is None:
        if greedy:
            return StageDraft(tokens, None, None, logits)  # log q on demand (StageDraft.logprobs)
        logq = torch.log_softmax(logits.float() / temperature, -1)  # [K, V]
        return StageDraft(tokens, logq.gather(-1, picks[:, None])[:, 0], logq.exp(), logits)
    dense = logits.new_full((logits.shape[0], vocab_size), float("-inf")).scatter_(-1, ids, logits)  # [K, V]
    if greedy:
        return StageDraft(tokens, None, None, dense)  # log q on demand: the softmax over dense is the pool's
    logq = torch.log_softmax(logits.float() / temperature, -1)  # [K, P]: cheap on the pool
    probs = torch.zeros_like(dense, dtype=logq.dtype).scatter_(-1, ids, logq.exp())
    return StageDraft(tokens, logq.gather(-1, picks[:, None])[:, 0], probs, dense)


def compile_mode(device: torch.device) -> str:
    """``torch.compile``'s mode for the decode path on ``device``: ``"reduce-overhead"`` on CUDA (each fixed
    shape replays as a CUDA graph), ``"default"`` on a CPU (inductor's fused C++ kernels; on the default
    preset's target they make the verify step faster than eager, whose time is mostly per-op dispatch)."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def compile_decode_step(fn: Callable, device) -> Callable:
    """``fn``, a fixed-shape decode step, under ``torch.compile`` in :func:`compile_mode` (``dynamic=False``), with no
    guards on nn.Module attributes (parameters included): the guards still check the inputs' shapes, dtypes and
    devices and the global state (grad mode, autocast), but not the ~100 modules and parameters of a target. Those
    guards ran on every call and cost a sizeable share of the default target's compiled verify on a CPU
    (measured: docs/results.md), the same host time in front of every CUDA-graph replay. Sound because a decode
    step's modules are frozen while it decodes, and every caller keys its compiled step by the module's identity, dtype
    and device, so a cast or moved model compiles anew (new weights in the same tensors are read at each call).

    A bound method (a model's ``forward``, a drafter's step) is compiled for its object alone (:func:`own_code`):
    dynamo keeps its graphs per code object, and without the module guards two models of one class (another
    drafter's layer count, ``anchor_predicts`` or mask id) would replay each other's graphs."""
    fn = own_code(fn)
    options = {**torch._inductor.list_mode_options(compile_mode(device)),
               "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    if torch.device(device).type == "cpu":
        # the compiled graph calls its kernels from generated C++ instead of Python: a decode step is dozens of
        # tiny kernels, and the Python wrapper's per-call cost is host time on every one (measured on the default
        # preset, the compiled verify and Domino's compiled head loop both got faster: docs/results.md); a CUDA
        # graph's replay has no wrapper to pay
        options["cpp_wrapper"] = True
    return torch.compile(fn, dynamic=False, options=options)


def own_code(fn: Callable) -> Callable:
    """A bound method ``fn`` as the same method of the same object with a code object of its own (what dynamo
    keys its compiled graphs on); any other callable unchanged."""
    if not isinstance(fn, types.MethodType):
        return fn
    f = fn.__func__
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    copy.__kwdefaults__, copy.__wrapped__ = f.__kwdefaults__, f
    return types.MethodType(copy, fn.__self__)


def compile_for(fn: Callable, device) -> Callable:
    """``fn`` (a drafter's fixed-shape decode step) under :func:`compile_decode_step`. On CUDA its tensor outputs
    are cloned out of the CUDA graph's memory, which the next replay reuses: a DLoop round keeps every stage's
    tokens and logits until the verify."""
    compiled = compile_decode_step(fn, device)
    if torch.device(device).type != "cuda":
        return compiled

    def replay(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, compiled(*args))

    return replay


def check_pool_size(pool_size, vocab_size: int | None) -> int | None:
    """A decode-time candidate pool P: None (the full vocabulary) or an integer 1 <= P <= V (``vocab_size``
    None: V not known yet, as when a study is planned before its target loads; then only P >= 1)."""
    if pool_size is None:
        return None
    top = vocab_size if vocab_size is not None else float("inf")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= top:
        bound = f"in 1..{vocab_size} (the vocabulary size)" if vocab_size is not None else ">= 1"
        raise ValueError(f"pool_size must be None (the full vocabulary) or an integer {bound}, got {pool_size!r}")
    return pool_size



def as_ids(tokens, device) -> torch.Tensor:  # -> [n] long
    return torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(-1)


class Rows:
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


class DraftSession:
    """Shared bookkeeping: committed length, position limit, argument checks."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.config = drafter.config
        self.device = next(drafter.parameters()).device
        self._len = 0
        self.stages: list[Stage] = []

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
        anchor = as_ids(anchor_token, self.device)
        if anchor.numel() != 1:
            raise ValueError(f"anchor_token must be one token id, got {anchor.numel()} ids")
        if self.stages and int(anchor) != int(self.stages[-1].tokens[-1]):
            raise ValueError(
                f"a DLoop stage continues from the previous stage's last drafted token "
                f"{int(self.stages[-1].tokens[-1])}, got anchor {int(anchor)}; crop() before drafting a new round"
            )
        return anchor

    def _check_extend(self, tokens, features, need_features: bool):
        ids = as_ids(tokens, self.device)
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


class ChainSession(DraftSession):
    """Token-by-token drafters: committed token ids kept for feeding the chain's cache later.

    Subclasses say how features are kept (``_append_features``) and how their cache
    follows a crop (``_crop_to``); ``_drop_stages`` forgets a round's drafted steps."""

    needs_features = False

    def __init__(self, drafter):
        super().__init__(drafter)
        self._tokens = Rows(torch.zeros(0, dtype=torch.long, device=self.device))  # committed token ids [len]

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
