"""One decode loop over a proposer (gpt-fast style): prefill, then rounds of draft, verify once, accept, roll back.

One round, with the committed sequence ending in the *anchor* token x at position ``start`` (committed, but not
yet fed to the target):

1. draft: the proposer drafts below x (:class:`Proposer`): a chain of stages d_1..d_m (:mod:`.chain`: plain
   speculative decoding, DLoop's stages under a gate) or a tree of nodes (:mod:`.tree`);
2. verify: ONE target forward over ``[x, drafts]`` with the KV cache (a tree adds its positions and 4-D mask);
   ``logits[u]`` is the target's next-token distribution after verified row u;
3. accept: the proposer walks the logits (greedy, rejection sampling, the tree walk, the multi-draft walk):
   ``acc`` accepted drafts on a path from x, then one bonus token from the target;
4. roll back: the target's cache keeps x and the accepted path (``start + acc + 1`` slots; a tree's path is moved
   to the front first), the draft session is cropped to ``start`` and extended with those ``acc + 1`` tokens and
   their target features; the bonus becomes the next anchor.

This module also holds the pieces every decoder shares: the target runner (:class:`TargetRunner`: its forward and
KV cache), the phase clock (:class:`Clock`), :func:`commit` and :func:`close_round`.
Label convention: DFlash's (block position k predicts the token at position start+k), so a block of size B drafts
B-1 tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import StaticCache

from lit_domino.decoding.kv import compact_cache, crop_cache
from lit_domino.decoding.result import GenerationResult
from lit_domino.decoding.sampling import pick
from lit_domino.models.sessions import compile_decode_step
from lit_domino.target.load import select_features


def feature_layers(drafter) -> list[int] | None:
    """The target decoder layers whose features ``drafter`` consumes (None: it needs none)."""
    return list(drafter.config.feature_layers or ()) or None


class Clock:
    """Phase timing. CPU: ``perf_counter`` laps. CUDA: an event recorded at each phase boundary and no
    synchronise between phases; :meth:`totals` synchronises once and sums the event intervals per phase, so
    the totals stay honest (the last event closes the last phase). :meth:`round` hands out the seconds per phase
    since its previous call: what a round cost, for a proposer that prices its next rounds by them."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, float] = {}
        self.fresh: dict[str, float] = {}  # seconds per phase not yet handed out by round()
        self.marks: list[tuple[str | None, object]] = []  # CUDA: (phase that ends at this event, event)
        self.t = self._mark(None)

    def _mark(self, phase):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.marks.append((phase, event))
        return event

    def _add(self, phase: str, seconds: float) -> None:
        self.spans[phase] = self.spans.get(phase, 0.0) + seconds
        self.fresh[phase] = self.fresh.get(phase, 0.0) + seconds

    def _drain(self) -> None:
        """CUDA: fold the event intervals recorded so far into the spans (their events must have completed)."""
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
            self._add(phase, a.elapsed_time(b) / 1e3)
        self.marks = self.marks[-1:]

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap to ``phase``."""
        t = self._mark(phase)
        if not self.cuda:
            self._add(phase, t - self.t)
            self.t = t

    def round(self) -> dict[str, float] | None:
        """Seconds per phase since the previous call. CUDA: None while the last event has not completed (it
        never waits for the device: the round's walk has usually synchronised already)."""
        if self.cuda:
            if not self.marks[-1][1].query():
                return None
            self._drain()
        out, self.fresh = self.fresh, {}
        return out

    def totals(self) -> dict[str, float]:
        """Seconds per phase (CUDA: one synchronise, here)."""
        if self.cuda:
            torch.cuda.synchronize()
            self._drain()
        return self.spans


class TargetRunner:
    """The target's forward and KV cache for one sequence: a ``DynamicCache`` (cropped on rollback), or a
    ``StaticCache`` of fixed capacity (``static``: rollback only moves its write position) whose shapes
    never change, so ``compiled`` (``torch.compile(mode="reduce-overhead")``, CUDA graphs) can replay the
    verify step of each fixed width. The committed length is tracked on the host: no device read."""

    def __init__(self, target, capacity: int, static: bool, compiled: bool):
        self.model, self.length, self.capacity, self.static, self.compiled = target.model, 0, capacity, static, compiled
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity) if static else None
        self.step = compiled_forward(target) if compiled else self.model

    def prefill(self, prompt, hidden: bool):
        out = self.model(input_ids=prompt[None], cache=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=hidden)
        self.cache, self.length = out.cache, prompt.shape[0]
        return out

    def forward(self, ids, hidden: bool, last_only: bool = False, width: int | None = None, **tree):
        """``ids [n]`` in slots ``length .. length+n-1`` (at those positions unless ``tree`` gives the tree
        rounds' ``position_ids`` and 4-D ``attention_mask``). ``width`` (compiled, a chain): a shorter verify is
        padded to it, so one graph serves every round of a stage count; the padding comes after the n rows, which
        the causal mask keeps from seeing it, its slots are past the kept ones, and its outputs are dropped."""
        n = ids.shape[0]
        if self.compiled and width is not None and n < width and self.length + width <= self.capacity:
            ids = torch.cat([ids, ids[-1:].expand(width - n)])
        kw = {"logits_to_keep": 1, **tree} if last_only else tree
        out = self.step(input_ids=ids[None], cache=self.cache, use_cache=True, output_hidden_states=hidden, **kw)
        self.length += ids.shape[0]  # the cache's own write position (padding included; rollback crops it)
        if ids.shape[0] > n:
            out.logits = out.logits[:, :n]
            out.hidden_states = None if out.hidden_states is None else tuple(h[:, :n] for h in out.hidden_states)
        return out

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length, current=self.length)
        self.length = length

    def keep(self, start: int, path: list[int] | None, acc: int) -> None:
        """Keep the anchor at ``start`` and the accepted path: verified rows ``path`` (None: rows 1..acc, a
        prefix, already in place) move to slots ``start+1 ..``, then the cache ends at ``start + acc + 1``."""
        if path is not None:
            compact_cache(self.cache, [start + i for i in path], start + 1)
        self.crop(start + acc + 1)


def compiled_forward(target):
    """The target's forward under ``torch.compile``, compiled once per target model, dtype and device
    (:func:`compile_decode_step` says how).

    Shapes are static (``dynamic=False``): one graph per verify width, hidden-state flag and cache capacity
    (:func:`static_capacity` buckets it), replayed from then on. Those combinations outnumber dynamo's default
    of 8 recompiles per function (a benchmark's AR step and block widths over two capacities already reach
    it, and past the limit dynamo silently runs the forward eagerly), so the limit is raised to 64.
    """
    owner, fn = getattr(target, "_compiled_forward", (None, None))
    key = (id(target.model), target.model.dtype, target.model.device)
    if owner != key:  # none yet, a deep copy's (it compiles its own model's forward), or a cast or moved model
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        fn = compile_decode_step(target.model.forward, target.device)
        target._compiled_forward = (key, fn)
    return fn


def static_capacity(needed: int, limit: int | None) -> int:
    """A ``StaticCache``'s capacity for ``needed`` positions: the next power of two (at least 256), so that
    prompts of different lengths share the compiled graphs of one capacity; at most ``limit`` (the context)."""
    capacity = max(256, 1 << (int(needed) - 1).bit_length())
    return capacity if limit is None else min(capacity, limit)


def pick_first(out, temperature, generator, layers):
    """The prefill's output → (first token [1], features [T, n*d] | None)."""
    x0 = pick(out.logits[0, -1:], temperature, generator)
    feats = select_features(out.hidden_states, layers)[0] if layers is not None else None
    return x0, feats


def commit(res: GenerationResult, new: list[int], eos: set[int], max_new_tokens: int) -> bool:
    """Emit ``new`` up to EOS (included) or max_new_tokens; True when generation is over."""
    for tok in new:
        res.tokens.append(tok)
        if tok in eos:
            res.stop_reason = "eos"
            return True
        if len(res.tokens) >= max_new_tokens:
            return True
    return False


def close_round(res: GenerationResult, committed: list[int], eos: set[int], max_new_tokens: int, device):
    """End a round: count its target forward, emit its committed tokens; returns the next round's anchor (the
    bonus token) and whether generation is over."""
    res.num_target_forwards += 1
    emitted = len(res.tokens)
    done = commit(res, committed, eos, max_new_tokens)
    # tau counts emitted tokens (acc + 1, fewer when EOS or the budget cuts the last round; as dflash_generate)
    res.accepted_per_round.append(len(res.tokens) - emitted - 1)
    return torch.tensor([committed[-1]], device=device), done


def charge(res: GenerationResult, clock: Clock) -> None:
    """The clock's phase totals into the result (``decode_time_s``: draft + verify + other)."""
    spans = clock.totals()
    res.prefill_time_s = spans.get("prefill", 0.0)
    res.draft_time_s, res.verify_time_s, res.other_time_s = (spans.get(k, 0.0) for k in ("draft", "verify", "other"))
    res.decode_time_s = res.draft_time_s + res.verify_time_s + res.other_time_s


@dataclass
class Proposal:
    """What a proposer drafted for one round: what the target verifies, and what the proposer walks it with."""

    ids: torch.Tensor
    """``[n+1]``: the anchor and the n drafts (row u of the verify's logits is the target's distribution after
    ``ids[u]``)."""
    verify: dict = field(default_factory=dict)
    """The verify forward's extra arguments: a tree's ``position_ids`` and 4-D ``attention_mask``; a chain none
    (consecutive positions under the target's causal mask)."""
    drafts: object = None
    """The proposer's own record of the round (a chain's stages, a tree)."""
    width: int | None = None
    """A chain's full verify width (its stages of block_size - 1 drafts and the anchor): what a compiled target
    pads a shorter last stage to (:meth:`TargetRunner.forward`); None: no padding (a tree)."""


@dataclass
class Verdict:
    """How a round's verification ended: the accepted path and the tokens it commits."""

    acc: int
    """Accepted drafts (the path's length)."""
    committed: list[int]
    """The accepted drafts' tokens and the bonus (``acc + 1`` tokens)."""
    path: list[int] | None = None
    """The accepted verified rows in order (1..n); None: rows 1..acc (a chain's prefix)."""


class Proposer(Protocol):
    """A round's drafting and walking (:func:`decode` runs the rest). Chains: :class:`lit_domino.decoding.chain.
    ChainProposer`; trees: :class:`lit_domino.decoding.tree.TreeProposer`."""

    def begin(self) -> None:
        """A new sequence starts (its prompt prefilled)."""

    def draft(self, session, anchor: torch.Tensor, start: int, wanted: int) -> Proposal:
        """The round's drafts below ``anchor`` (at position ``start``); ``wanted``: tokens still to emit."""

    def accept(self, proposal: Proposal, logits: torch.Tensor, temperature: float, generator) -> Verdict:
        """Walk the verify's ``logits [n+1, V]``: the accepted path and the committed tokens."""

    def observe(self, res: GenerationResult, proposal: Proposal, verdict: Verdict, spent: dict | None) -> None:
        """Record the round (its per-round fields of ``res``, a gate's state); ``spent``: the round's seconds per
        phase as the decode's clock timed them (``draft``, ``verify``, ``other``; None: not known yet, on CUDA)."""


def decode(target, drafter, prompt, proposer: Proposer, runner: TargetRunner, *, max_new_tokens: int,
           temperature: float, generator, options: dict) -> GenerationResult:
    """Speculative decoding of one prompt ``[T]`` with ``drafter``'s session, rounds drafted by ``proposer``."""
    eos, layers = set(target.eos_token_ids), feature_layers(drafter)
    hidden = layers is not None
    clock = Clock(prompt.device)
    anchor, feats = pick_first(runner.prefill(prompt, hidden), temperature, generator, layers)
    session = drafter.new_session(**options)
    session.extend(prompt, feats)
    clock.lap("prefill")
    clock.round()  # the prefill is no round
    res = GenerationResult(tokens=[], num_target_forwards=1)
    start = prompt.shape[0]  # position of the anchor = committed tokens already in the target cache
    done = commit(res, [int(anchor)], eos, max_new_tokens)
    proposer.begin()
    while not done:
        # 1. draft: the drafts d_1..d_n below the anchor (a chain: stage after stage while the gate is open;
        #    a tree: nodes at positions start + depth). None at the context's end: a plain target step.
        prop = proposer.draft(session, anchor, start, max_new_tokens - len(res.tokens))
        clock.lap("draft")
        # 2. verify: the target sees [anchor, d_1..d_n] in one forward (slots start..start+n);
        #    logits[u] is its distribution for the token after row u (the one row u's children claim).
        out = runner.forward(prop.ids, hidden, width=prop.width, **prop.verify)
        clock.lap("verify")
        # 3. accept: acc drafts on a path from the anchor + one bonus token from the target
        #    (greedy: d_k == argmax while it holds; T > 0: rejection sampling, see sampling.py and tree.py).
        v = proposer.accept(prop, out.logits[0], temperature, generator)
        # 4. roll back: the cache keeps anchor + the accepted path (start+acc+1 slots; the bonus has no KV
        #    yet); the session forgets its speculative drafts and receives the newly committed tokens, whose
        #    target features are now known.
        runner.keep(start, v.path, v.acc)
        clock.lap("other")
        session.crop(start)
        rows = slice(0, v.acc + 1) if v.path is None else torch.tensor([0] + v.path, device=prompt.device)
        session.extend(prop.ids[rows], select_features(out.hidden_states, layers)[0, rows] if hidden else None)
        clock.lap("draft")
        start += v.acc + 1
        anchor, done = close_round(res, v.committed, eos, max_new_tokens, prompt.device)
        clock.lap("other")
        # 5. the proposer records the round, with what its phases cost (what it prices its next rounds by)
        proposer.observe(res, prop, v, clock.round())
    charge(res, clock)
    return res.finish()
