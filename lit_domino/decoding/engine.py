"""The speculative decoding engine (gpt-fast style): prefill, draft, verify once, commit, roll back.

One round, with the committed sequence ending in the *anchor* token x at position
``start`` (committed, but not yet fed to the target):

1. draft: ``session.draft(x, B-1)`` proposes d_1..d_{B-1} for positions start+1..;
   DLoop drafts further stages anchored at the last draft token while confident;
2. verify: ONE target forward on ``[x, d_1..d_m]`` at positions ``start..start+m``
   with the KV cache; ``logits[k]`` is the target's next-token distribution after d_k;
3. accept: greedy ``acc = sum(cumprod(d == argmax(logits)[:-1]))`` or rejection
   sampling at T > 0 (:mod:`lit_domino.decoding.sampling`), commit ``d_1..d_acc`` + bonus;
4. roll back: crop the target KV cache to ``start+acc+1`` (anchor + accepted drafts),
   crop the draft session to ``start`` and extend it with those ``acc+1`` tokens and
   their target features; the bonus becomes the next anchor.

``drafter=None`` runs plain autoregressive decoding with the same model calls and KV
cache (the speedup baseline). Label convention: DFlash's (block position k predicts
the token at position start+k), so a block of size B drafts B-1 tokens.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import StaticCache

from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.decoding.gates import RoundPolicy, round_policy
from lit_domino.decoding.kv import crop_cache
from lit_domino.decoding.sampling import (GREEDY_BELOW, accept_greedy, effective_temperature, one_hot_probs, pick,
                                          verify_sampling)
from lit_domino.models.sessions import check_pool_size, compile_decode_step, is_greedy
from lit_domino.target.load import check_layer_ids, select_features


@dataclass
class GenerationResult:
    """One decoded sequence and how it was decoded.

    ``tau`` is the mean number of tokens committed per verification round *including*
    the bonus (``mean(accepted_per_round) + 1``; NaN when no round ran). A final round cut by
    ``max_new_tokens`` or EOS counts the tokens it emitted, as ``dflash_generate`` does (counting
    what the target accepted beyond them flattered τ by up to 7 % at 128 tokens); the verification
    outcome of every stage stays in ``stage_records``.
    ``drafted_per_round`` is the number of draft tokens verified in each round.
    Times are seconds (``time.perf_counter``); ``decode_time_s`` excludes the prefill
    (which produces the first token), and ``tpot_ms`` is
    ``decode_time_s / (len(tokens) - 1)`` in milliseconds: the same definition for the
    AR baseline and every drafter, so their ratio is the speedup.
    """

    tokens: list[int]
    tau: float = float("nan")
    rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    stages_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    other_time_s: float = 0.0
    decode_time_s: float = 0.0
    prefill_time_s: float = 0.0
    tpot_ms: float = float("nan")
    num_target_forwards: int = 0
    stop_reason: str = "length"  # "eos" or "length"
    accepted_ranks: list[int] = field(default_factory=list)
    """Tree rounds (``generate(..., tree=...)``): the sibling rank of every accepted node (0 = its parent's top
    candidate), the statistic of how often a tree's branches pay."""
    repeat_tpot_ms: list[float] = field(default_factory=list)
    """``benchmark(..., repeats=R)``: the time per output token of each of the R decodes (``tpot_ms`` is their mean),
    what the rows' repeat-to-repeat noise is measured from."""
    stage_records: list[tuple[float, float, int, int]] = field(default_factory=list)
    """``generate(..., record_stages=True)``: per drafted stage ``(sum log q, last log q, K, accepted)`` — the
    stage's draft log-probabilities (for any DLoop gate's confidence) and how many of its K tokens the target
    then accepted (K: the whole stage): DLoop's calibration data."""

    def finish(self) -> GenerationResult:
        self.rounds = len(self.accepted_per_round)
        self.tau = (sum(self.accepted_per_round) / self.rounds + 1.0) if self.rounds else float("nan")
        n = len(self.tokens) - 1
        self.tpot_ms = 1e3 * self.decode_time_s / n if n > 0 else float("nan")
        return self


# --------------------------------------------------------------------------- validation


def _drafter_block_size(drafter) -> int:
    return int(drafter.config.block_size)


def feature_layers(drafter) -> list[int] | None:
    """The target decoder layers whose features ``drafter`` consumes (None: it needs none)."""
    for obj in (drafter, getattr(drafter, "config", None)):
        ids = getattr(obj, "feature_layers", None)
        if ids is not None:
            return list(ids) or None
    return None


INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _integer(value) -> int | None:
    """``value`` as an int when it is an integer scalar (a Python int, numpy's ``np.int64``, a 0-d integer tensor),
    else None: bools and floats (5.0 included) are not token counts."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _as_int(value):
    """An integer scalar (``np.int64``...) as a Python int; anything else unchanged, for its check to name it."""
    n = _integer(value)
    return value if n is None else n


def _row_lengths(rows) -> list[int] | None:
    """The lengths of a list of rows (lists, tuples, arrays, tensors); None when ``rows`` is not one."""
    if not isinstance(rows, (list, tuple)) or not rows:
        return None
    if not all(isinstance(r, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(r) == 1 for r in rows):
        return None
    return [len(r) for r in rows]


def _as_batch(input_ids, name: str = "input_ids") -> torch.Tensor:
    """``input_ids`` as a LongTensor ``[b, T]``: a tensor or numpy array ``[b, T]`` / ``[T]``, a list of ints or
    a list of equal-length rows. Ragged rows and anything that is not integer ids are a ``ValueError``."""
    if not isinstance(input_ids, torch.Tensor):
        lengths = _row_lengths(input_ids)
        if lengths is not None and len(set(lengths)) > 1:
            raise ValueError(f"{name} rows have different lengths {lengths}: pass equal-length prompts, pad them to "
                             "one length and pass attention_mask (1 on real tokens, 0 on padding), or decode row "
                             "by row")
        try:
            if lengths is not None and any(isinstance(r, torch.Tensor) for r in input_ids):
                input_ids = torch.stack([torch.as_tensor(r) for r in input_ids])
            else:
                input_ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{name} must be token ids (a LongTensor [b, T] or [T], a list of ints or a list of "
                             f"equal-length lists of ints), got {type(input_ids).__name__}: {err}") from err
        if input_ids.numel() == 0:
            input_ids = input_ids.long()  # [] gets a float dtype; "empty prompt" is the error that matters
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"{name} must be a LongTensor [b, T] (or [T]), got shape {tuple(input_ids.shape)}")
    if input_ids.dtype == torch.bool and name == "attention_mask":
        input_ids = input_ids.long()
    if input_ids.dtype not in INTEGER_DTYPES:
        raise ValueError(f"{name} must hold integer {'token ids' if name == 'input_ids' else 'values'}, got dtype "
                         f"{input_ids.dtype}")
    return input_ids.long()


def padding_token(target) -> int | None:
    """The tokenizer's pad id where a prompt never legitimately starts or ends with it, else None.

    None without a tokenizer or a pad token, and when the pad id is also an EOS or BOS id (Qwen3's tokenizer pads
    with ``<|endoftext|>``, one of its EOS ids; many tokenizers pad with their EOS): a prompt may end with an EOS
    (a finished turn) or start with a BOS, so those are never taken for padding."""
    tok = target.tokenizer
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    if pad is None:
        return None
    legit = set(target.eos_token_ids) | {getattr(tok, "eos_token_id", None), getattr(tok, "bos_token_id", None)}
    return None if pad in legit else int(pad)


def _refuse_padding(target, input_ids: torch.Tensor) -> None:
    """Without an attention mask every row is a full prompt: a row that starts or ends with the pad token
    (:func:`padding_token`) is a padded batch, which would be decoded with its pads as part of the prompt."""
    pad = padding_token(target)
    if pad is None:
        return
    for i, row in enumerate(input_ids.tolist()):
        for side, run in (("ends", row[::-1]), ("starts", row)):
            n = next((k for k, t in enumerate(run) if t != pad), len(run))
            if n:
                name = getattr(target.tokenizer, "pad_token", None)
                raise ValueError(
                    f"input_ids row {i} {side} with {n} pad token{'s' if n > 1 else ''} (id {pad}"
                    f"{f', {name!r}' if name else ''}): a padded batch would be decoded with its pads as part of the "
                    "prompt. Pass attention_mask (1 on real tokens, 0 on padding: the tokenizer's), pass "
                    "equal-length prompts, or decode row by row")


def prompts_of(target, input_ids, attention_mask=None) -> list[torch.Tensor]:
    """The prompts ``[T_i]`` that ``generate`` decodes, one per row of ``input_ids``.

    Without ``attention_mask`` every row is a full prompt (pad-ended rows refused, :func:`_refuse_padding`). With
    it (``[b, T]`` of 0/1, as a tokenizer returns), each row's real tokens are its prompt: they must be contiguous
    (left or right padding) and at least one."""
    input_ids = _as_batch(input_ids)
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; give at least one token")
    if attention_mask is None:
        _refuse_padding(target, input_ids)
        return list(input_ids)
    mask = _as_batch(attention_mask, "attention_mask").cpu()
    if tuple(mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}: they "
                         "must match (1 on real tokens, 0 on padding)")
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError("attention_mask must hold 0 (padding) and 1 (real tokens) only")
    prompts = []
    for i, row in enumerate(mask.bool()):
        real = row.nonzero()[:, 0].tolist()
        if not real:
            raise ValueError(f"attention_mask row {i} is all padding: every row needs at least one real token")
        first, last = real[0], real[-1]
        if last - first + 1 != len(real):
            raise ValueError(f"attention_mask row {i} has padding between real tokens (positions {first}..{last}); "
                             "only left or right padding is supported: each row's real tokens are one prompt")
        prompts.append(input_ids[i, first: last + 1])
    return prompts


def _position_limits(target, drafter) -> dict[str, int | None]:
    limits = {"target": getattr(target.model.config, "max_position_embeddings", None)}
    if drafter is not None:
        limits["drafter"] = getattr(drafter.config, "max_position_embeddings", None)
    return limits


def context_limit(target, drafter) -> int | None:
    """Positions the target and the drafter both have (None: unbounded). A verify step puts the anchor
    at position ``start`` and the drafts after it, so a round may draft at most ``limit - 1 - start``."""
    limits = [v for v in _position_limits(target, drafter).values() if v is not None]
    return min(limits) if limits else None


def validate(target, drafter, input_ids, *, max_new_tokens, temperature, block_size, dloop, pool_size=None,
             attention_mask=None):
    """Check everything before decoding; returns ``(prompts [T_i] per row, max_new_tokens, block_size, dloop)``
    (integer arguments as Python ints: numpy's ``np.int64`` is accepted)."""
    prompts = prompts_of(target, input_ids, attention_mask)
    vocab = target.vocab_size
    ids = torch.cat(prompts)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"input_ids hold ids outside the target's vocabulary [0, {vocab})")
    n = _integer(max_new_tokens)
    if n is None or n <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    max_new_tokens = n
    if (isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real)
            or math.isnan(temperature) or temperature < 0):
        raise ValueError(f"temperature must be >= 0 (0 = greedy; below {GREEDY_BELOW:g} decodes greedily), "
                         f"got {temperature!r}")
    if dloop is not None and not isinstance(dloop, DLoopConfig):
        raise ValueError(f"dloop must be a DLoopConfig or None, got {type(dloop).__name__}")
    if drafter is None and pool_size is not None:
        raise ValueError(f"pool_size={pool_size!r} is a drafter option; plain decoding (drafter=None) has no draft")
    if drafter is not None:
        drafter.bind_target(target)  # raises when the drafter was trained for another target
        trained = _drafter_block_size(drafter)
        block_size = trained if block_size is None else _as_int(block_size)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not 2 <= block_size <= trained:
            raise ValueError(
                f"block_size={block_size!r} is invalid for this drafter: need 2 <= block_size <= {trained} "
                "(the drafter's trained block size; a block drafts block_size - 1 tokens)"
            )
        if pool_size is not None and "pool_size" not in getattr(drafter, "draft_options", ()):
            raise ValueError(f"pool_size={pool_size!r} needs a drafter whose head corrects its base logits (domino, "
                             "dspark); "
                             f"this {getattr(drafter, 'kind', type(drafter).__name__)} drafter picks from its "
                             "own logits")
        check_pool_size(pool_size, vocab)
        if (layers := feature_layers(drafter)) is not None:
            check_layer_ids(layers, target.num_layers)
    # what autoregressive decoding needs; near the end of the context the drafter drafts less
    # (see context_limit), so the draft budget never makes a request that fits fail
    longest = max(p.shape[0] for p in prompts)
    need = longest + max_new_tokens
    for who, limit in _position_limits(target, drafter).items():
        if limit is not None and need > limit:
            raise ValueError(
                f"prompt length {longest} + max_new_tokens {max_new_tokens} = {need} exceeds the "
                f"{who}'s max_positions {limit}; shorten the prompt or lower max_new_tokens"
            )
    return prompts, max_new_tokens, block_size, dloop


# --------------------------------------------------------------------------- the loop


class _Clock:
    """Phase timing. CPU: ``perf_counter`` laps. CUDA: an event recorded at each phase boundary and no
    synchronise between phases; :meth:`totals` synchronises once and sums the event intervals per phase, so
    the totals stay honest (the last event closes the last phase)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, float] = {}
        self.marks: list[tuple[str | None, object]] = []  # CUDA: (phase that ends at this event, event)
        self.t = self._mark(None)

    def _mark(self, phase):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.marks.append((phase, event))
        return event

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap to ``phase``."""
        t = self._mark(phase)
        if not self.cuda:
            self.spans[phase] = self.spans.get(phase, 0.0) + t - self.t
            self.t = t

    def totals(self) -> dict[str, float]:
        """Seconds per phase (CUDA: one synchronise, here)."""
        if self.cuda:
            torch.cuda.synchronize()
            for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
                self.spans[phase] = self.spans.get(phase, 0.0) + a.elapsed_time(b) / 1e3
            self.marks = self.marks[-1:]
        return self.spans


class _TargetRunner:
    """The target's forward and KV cache for one sequence: a ``DynamicCache`` (cropped on rollback), or a
    ``StaticCache`` of fixed capacity (``static``: rollback only moves its write position) whose shapes
    never change, so ``compiled`` (``torch.compile(mode="reduce-overhead")``, CUDA graphs) can replay the
    verify step of each fixed width. The committed length is tracked on the host: no device read."""

    def __init__(self, target, capacity: int, static: bool, compiled: bool):
        self.model, self.length, self.capacity, self.static = target.model, 0, capacity, static
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity) if static else None
        self.step = compiled_forward(target) if compiled else self.model

    def prefill(self, prompt, hidden: bool):
        out = self.model(input_ids=prompt[None], cache=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=hidden)
        self.cache, self.length = out.cache, prompt.shape[0]
        return out

    def forward(self, ids, hidden: bool, last_only: bool = False, **tree):
        """``ids [n]`` in slots ``length .. length+n-1`` (at those positions unless ``tree`` gives the tree
        rounds' ``position_ids`` and 4-D ``attention_mask``)."""
        kw = {"logits_to_keep": 1, **tree} if last_only else tree
        out = self.step(input_ids=ids[None], cache=self.cache, use_cache=True, output_hidden_states=hidden, **kw)
        self.length += ids.shape[0]
        return out

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length, current=self.length)
        self.length = length


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


def _pick_first(out, temperature, generator, layers):
    """The prefill's output → (first token [1], features [T, n*d] | None)."""
    x0 = pick(out.logits[0, -1:], temperature, generator)
    feats = select_features(out.hidden_states, layers)[0] if layers is not None else None
    return x0, feats


def _commit(res: GenerationResult, new: list[int], eos: set[int], max_new_tokens: int) -> bool:
    """Emit ``new`` up to EOS (included) or max_new_tokens; True when generation is over."""
    for tok in new:
        res.tokens.append(tok)
        if tok in eos:
            res.stop_reason = "eos"
            return True
        if len(res.tokens) >= max_new_tokens:
            return True
    return False


def _speculative(target, drafter, prompt, max_new_tokens, temperature, block_size, policy: RoundPolicy, generator,
                 options, runner: _TargetRunner, record_stages: bool = False):
    eos, layers = set(target.eos_token_ids), feature_layers(drafter)
    greedy, dloop = is_greedy(temperature), policy.dloop
    clock = _Clock(prompt.device)
    anchor, feats = _pick_first(runner.prefill(prompt, layers is not None), temperature, generator, layers)
    session = drafter.new_session(**options)
    session.extend(prompt, feats)
    clock.lap("prefill")
    res = GenerationResult(tokens=[], num_target_forwards=1)
    start = prompt.shape[0]  # position of the anchor = committed tokens already in the target cache
    done = _commit(res, [int(anchor)], eos, max_new_tokens)
    limit = context_limit(target, drafter)
    policy.begin()

    def room(drafted: int) -> int:
        """Drafts the next stage may add: block_size-1; fewer at the context's end, and without DLoop never more
        than the round could emit (acc + 1 <= the tokens still wanted: the official loop's shorter last block;
        DLoop's stages keep their length, its calibration records are per full stage, and none is drafted once
        the round's drafts and its bonus already cover the tokens still wanted)."""
        wanted = max_new_tokens - len(res.tokens)
        looping = dloop is not None and dloop.max_stages > 1  # one stage is plain speculative decoding
        if looping and drafted and drafted + 1 >= wanted:
            return 0
        n = block_size - 1 if looping else min(block_size - 1, wanted - 1)
        return n if limit is None else min(n, limit - 1 - start - drafted)

    while not done:
        # 1. draft: one stage of block_size-1 tokens; DLoop keeps drafting while the gate's confidence
        #    (papers: sum_k log q(d_k)) >= g, anchoring each stage at the previous last draft. At the
        #    end of the context a stage drafts fewer tokens (none: the round is a plain target step).
        #    (lit_domino.decoding.gates: the round's stages and where they end, under the DLoop gate)
        stages = policy.draft(session, anchor, room, temperature, generator)
        drafts = (torch.cat([s.tokens.reshape(-1) for s in stages]).to(prompt.device) if stages
                  else torch.zeros(0, dtype=torch.long, device=prompt.device))  # d_1..d_m
        clock.lap("draft")
        # 2. verify: the target sees [anchor, d_1..d_m] at positions start..start+m in one forward;
        #    logits[k] is its distribution for position start+k+1 (the one d_{k+1} claims).
        out = runner.forward(torch.cat([anchor.reshape(1), drafts]), layers is not None)
        logits = out.logits[0]
        clock.lap("verify")
        # 3. accept: acc drafts + one bonus token from the target (see sampling.py for the maths).
        #    Greedy: on the device, one host copy per round (the accepted drafts equal the target's
        #    own picks, so the picks up to the bonus are the committed tokens).
        if greedy:
            acc, committed = accept_greedy(drafts, logits)
        else:
            q = torch.cat([s.probs if s.probs is not None else one_hot_probs(s.tokens, logits.shape[-1])
                           for s in stages]) if stages else logits.new_zeros(0, logits.shape[-1])
            acc, bonus = verify_sampling(drafts, q, logits, temperature, generator)
            committed = drafts[:acc].tolist() + [bonus]
        # 4. roll back: the cache keeps anchor + accepted drafts (start+acc+1 positions; the bonus
        #    has no KV yet); the session forgets its speculative stages and receives the newly
        #    committed tokens whose target features are now known.
        runner.crop(start + acc + 1)
        clock.lap("other")
        session.crop(start)
        feats = select_features(out.hidden_states, layers)[0, : acc + 1] if layers is not None else None
        session.extend(torch.cat([anchor.reshape(1), drafts[:acc]]), feats)
        clock.lap("draft")
        if record_stages:
            offset = 0
            for st in stages:
                lp, k = st.logprobs.reshape(-1).tolist(), st.tokens.numel()
                res.stage_records.append((sum(lp), lp[-1], k, min(max(acc - offset, 0), k)))
                offset += k
        res.stages_per_round.append(len(stages))
        res.drafted_per_round.append(int(drafts.shape[0]))
        policy.observe(acc, len(stages), int(drafts.shape[0]) + 1)
        start += acc + 1
        anchor, done = _close_round(res, committed, eos, max_new_tokens, prompt.device)
        clock.lap("other")
    _charge(res, clock)
    return res.finish()


def _close_round(res: GenerationResult, committed: list[int], eos: set[int], max_new_tokens: int, device):
    """End a round (chain or tree): count its target forward, emit its committed tokens; returns the next
    round's anchor (the bonus token) and whether generation is over."""
    res.num_target_forwards += 1
    emitted = len(res.tokens)
    done = _commit(res, committed, eos, max_new_tokens)
    # tau counts emitted tokens (acc + 1, fewer when EOS or the budget cuts the last round; as dflash_generate)
    res.accepted_per_round.append(len(res.tokens) - emitted - 1)
    return torch.tensor([committed[-1]], device=device), done


def _charge(res: GenerationResult, clock: _Clock) -> None:
    spans = clock.totals()
    res.prefill_time_s = spans.get("prefill", 0.0)
    res.draft_time_s, res.verify_time_s, res.other_time_s = (spans.get(k, 0.0) for k in ("draft", "verify", "other"))
    res.decode_time_s = res.draft_time_s + res.verify_time_s + res.other_time_s


def _autoregressive(target, prompt, max_new_tokens, temperature, generator, runner: _TargetRunner):
    """Plain decoding, one target forward per token, same KV cache; no hidden states, last logits only."""
    eos = set(target.eos_token_ids)
    clock = _Clock(prompt.device)
    tok, _ = _pick_first(runner.prefill(prompt, False), temperature, generator, None)
    clock.lap("prefill")
    res = GenerationResult(tokens=[], num_target_forwards=1)
    done = _commit(res, [int(tok)], eos, max_new_tokens)
    while not done:
        out = runner.forward(tok.reshape(1), False, last_only=True)
        tok = pick(out.logits[0, -1:], temperature, generator)
        res.num_target_forwards += 1
        done = _commit(res, [int(tok)], eos, max_new_tokens)
    clock.lap("verify")
    _charge(res, clock)
    res.accepted_per_round = [0] * (res.num_target_forwards - 1)
    res.stages_per_round = [0] * len(res.accepted_per_round)
    res.drafted_per_round = [0] * len(res.accepted_per_round)
    return res.finish()


def check_compile(compile: bool, device: torch.device | str) -> None:
    """``compile`` runs on a CUDA device (CUDA graphs) or a CPU (inductor's C++ kernels, which need a C++
    compiler on the PATH); other devices are refused before any decoding."""
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    if not compile:
        return
    device = torch.device(device).type
    if device not in ("cuda", "cpu"):
        raise ValueError(f"compile=True runs on a CUDA or CPU target; this target is on {device}. "
                         "Decode eagerly (compile=False)")
    if device == "cpu" and not cpp_compiler():
        raise ValueError("compile=True on a CPU needs a C++ compiler for torch.compile's inductor kernels "
                         "(set CXX, or install g++ or clang++); decode eagerly (compile=False) without one")


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU: ``$CXX``, else g++, c++ or clang++ on the PATH (None)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return next((path for name in names if (path := shutil.which(name))), None)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def _bounded_threads(threads: int | None):
    """torch's intra-op threads for the block: ``threads``, or at most the usable CPUs; restored after."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    before = torch.get_num_threads()
    wanted = threads if threads is not None else min(before, usable_cpus())
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def _eval_mode(*modules):
    """Eval mode + ``torch.inference_mode`` for the call; training flags are restored afterwards.

    Inference mode skips all autograd bookkeeping (no version counters, no view tracking), as
    dflash_generate's whole loop does; a round dispatches ~800 small ops on the default preset (~105 of
    them the backbone's draft), each cheaper so.
    Tensors a drafter caches on itself for later calls are built outside it
    (:func:`lit_domino.models.layers.outside_inference_mode`): an inference tensor saved for
    backward would break the drafter's training after the eval callback decodes mid-training.
    """
    # Only modules with a submodule in training mode are switched (and switched back): ``eval()`` walks every
    # submodule through ``train(False)``, 1.5 ms for the smoke target on a loaded CPU, and a decode of 128
    # tokens at ~1 ms/token paid it four times per call (3 % of dflash_generate's whole time); the check walks
    # them once, without a setattr per module.
    switched = [(m, m.training) for m in modules
                if isinstance(m, torch.nn.Module) and any(x.training for x in m.modules())]
    try:
        for m, _ in switched:
            m.eval()
        with torch.inference_mode():
            yield
    finally:
        for m, flag in switched:
            m.train(flag)


def generate(
    target,
    drafter,
    input_ids,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    block_size: int | None = None,
    dloop: DLoopConfig | None = None,
    seed: int | None = None,
    pool_size: int | None = None,
    static_cache: bool = False,
    compile: bool = False,
    record_stages: bool = False,
    threads: int | None = None,
    attention_mask=None,
    tree=None,
) -> GenerationResult | list[GenerationResult]:
    """Speculative decoding of ``target`` with ``drafter`` (None: plain autoregressive decoding).

    ``input_ids``: LongTensor ``[1, T]`` (or ``[T]``; a numpy array, a list of ints or of equal-length lists
    of ints also do) → one :class:`GenerationResult`; ``[b, T]`` with b > 1 → a list of b results, each row
    decoded independently. ``attention_mask`` (``[b, T]`` of 0/1, a tokenizer's): each row's real tokens are its
    prompt (left or right padding; prompts of different lengths decode as if each were passed alone). Without
    it every row is a full prompt, and a row that starts or ends with the tokenizer's pad token (unless that id
    is also an EOS or BOS id, :func:`padding_token`) is refused as padding; ragged lists are refused.
    ``block_size`` defaults to the drafter's
    trained block size (2 <= block_size <= it); ``dloop`` enables multi-stage drafting.
    At ``temperature`` 0 (or below ``sampling.GREEDY_BELOW`` = 1e-5: the same path, token for token) the output
    equals target greedy decoding; at T > 0 it is a
    sample of the target's softmax(logits / T), drawn from a ``torch.Generator`` seeded
    with ``seed`` (None: seeded from torch's global RNG). Generation stops after an EOS
    token (``target.eos_token_ids``, emitted) or exactly ``max_new_tokens`` tokens.
    ``pool_size`` P (drafters whose head corrects its base logits: Domino, DSpark): the correction, the pick and q on the
    top-P tokens of the base logits (1 <= P <= V; None = the full vocabulary, the exact head); the pool
    changes what is drafted, never the output.
    ``static_cache``: the target's KV cache is a ``StaticCache`` (fixed capacity, rollback by moving its write
    position; the same tokens as the default ``DynamicCache``), and a parallel drafter (backbone, Domino) drafts
    with its fixed-shape block forward over static K/V buffers (``ParallelSession``'s ``static_capacity``).
    ``compile`` (implies ``static_cache``): the target's forward, that block forward and Domino's rollout loop
    run under ``torch.compile`` (:func:`compile_mode`: CUDA graphs on a GPU, inductor's fused kernels on a CPU), one graph
    per fixed verify width (``stages x (block_size - 1) + 1``), the AR step and each cache capacity
    (:func:`static_capacity`); the first decode of each pays for its compilation.
    ``record_stages``: fill ``stage_records`` (one host copy per stage; DLoop's calibration data).
    ``threads``: torch intra-op threads for the call (restored after); None = torch's setting, bounded by
    the CPUs this process may use (a container's torch often counts the host's cores, and oversubscribed
    threads spin: one small call measured 17 s instead of 0.2 s on a busy 2-core machine). Tiny models
    decode fastest on 1 thread on a shared machine (the studies pin it).
    ``tree`` (a :class:`lit_domino.decoding.tree.TreeConfig`): tree rounds instead of chain rounds (one target
    forward over a draft tree, the accepted path walked from its root; lossless at every temperature); with
    ``dloop`` the stages drafted while the gate is open stay a chain and the last stage becomes the tree.
    Parallel drafters (backbone, domino, dspark) and EAGLE-3 (its ``eagle`` tree: EAGLE-2's); eager only (no
    ``compile``); sdpa or eager attention.
    All inputs are validated before any decoding (ValueError with the reason); integer arguments may be numpy
    integers.
    """
    pool_size, threads = _as_int(pool_size), _as_int(threads)
    prompts, max_new_tokens, block_size, dloop = validate(
        target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, block_size=block_size,
        dloop=dloop, pool_size=pool_size, attention_mask=attention_mask)
    if seed is not None and _integer(seed) is None:
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    options = {} if pool_size is None else {"pool_size": pool_size}
    check_compile(compile, target.device)
    if tree is not None:
        from lit_domino.decoding.tree import check_tree

        check_tree(tree, target, drafter, compile=compile, longest_prompt=max(p.shape[0] for p in prompts),
                   limit=context_limit(target, drafter), dloop=dloop)
    static_cache = bool(static_cache or compile)
    temperature = effective_temperature(temperature)  # below GREEDY_BELOW: exactly the T = 0 path
    device = target.device
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    generator = torch.Generator(device=device).manual_seed(_integer(seed))
    results = []
    with _eval_mode(target.model, drafter), _bounded_threads(threads):
        policy = round_policy(dloop, target, drafter, block_size) if drafter is not None else None
        if tree is not None and dloop is not None and (policy.predictor is not None or dloop.truncate is not None):
            from lit_domino.decoding.tree import TreeError

            raise TreeError(f"a tree round drafts its chain stages under the log-probability gates (sum, mean, scaled, "
                            f"last); the {dloop.label()!r} gate's calibrated survival does not cover tree nodes yet")
        budget = 0 if drafter is None else (dloop.max_stages if dloop else 1) * (block_size - 1)
        if tree is not None:  # DLoop's chain stages, then the last stage's tree
            budget = (budget - block_size + 1 if dloop else 0) + max(tree.budget, block_size - 1)
        for row in prompts:
            row = row.to(device)
            capacity = row.shape[0] + max_new_tokens + budget + 1
            if static_cache:  # a shared capacity per bucket: the compiled graphs fit every prompt in it
                capacity = static_capacity(capacity, context_limit(target, drafter))
            elif (limit := context_limit(target, drafter)) is not None:
                capacity = min(capacity, limit)  # rounds near the context's end draft less (context_limit)
            runner = _TargetRunner(target, capacity, static_cache, compile)
            if static_cache and "static_capacity" in getattr(drafter, "draft_options", ()):
                # the drafter's fixed-shape block forward: the target's capacity + one padded context block
                options = {**options, "static_capacity": capacity + int(drafter.config.block_size),
                           "compile": compile}
            if drafter is None:
                results.append(_autoregressive(target, row, max_new_tokens, temperature, generator, runner))
            elif tree is not None:
                from lit_domino.decoding.tree import tree_speculative

                results.append(tree_speculative(target, drafter, row, max_new_tokens, temperature, block_size, tree,
                                                generator, options, runner, capacity, dloop))
            else:
                results.append(_speculative(target, drafter, row, max_new_tokens, temperature, block_size,
                                            policy, generator, options, runner, record_stages))
    return results[0] if len(results) == 1 else results
