"""``generate``: speculative decoding of a target with a drafter, or plain autoregressive decoding without one.

The round loop is :func:`lit_domino.decoding.round.decode`, over a proposer: chain rounds
(:class:`lit_domino.decoding.chain.ChainProposer`: plain speculative decoding, DLoop's stages under a gate) or tree
rounds (:class:`lit_domino.decoding.tree.TreeProposer`). ``drafter=None`` runs plain autoregressive decoding with
the same model calls and KV cache (:func:`_autoregressive`, the speedup baseline). Every argument is checked
before decoding (:mod:`lit_domino.decoding.validate`).
"""

from __future__ import annotations

import torch

from lit_domino.decoding.acceptance import AcceptancePredictor
from lit_domino.decoding.chain import ChainProposer
from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.decoding.gates import round_policy
from lit_domino.decoding.result import GenerationResult
from lit_domino.decoding.round import (Clock, TargetRunner, charge, commit, compiled_forward, decode, feature_layers,
                                       pick_first, static_capacity)
from lit_domino.decoding.sampling import effective_temperature, pick
from lit_domino.decoding.tree import TreeProposer, observed
from lit_domino.decoding.validate import (as_batch, as_int, check_compile, context_limit, integer, padding_token,
                                          prompts_of, validate)
from lit_domino.models.capabilities import capabilities_of
from lit_domino.runtime.inference import eval_mode
from lit_domino.runtime.threads import bounded_threads, cpp_compiler, usable_cpus

__all__ = ["GenerationResult", "TargetRunner", "as_batch", "check_compile", "compiled_forward", "context_limit",
           "cpp_compiler", "feature_layers", "generate", "padding_token", "prompts_of", "static_capacity",
           "usable_cpus", "validate"]
"""Names other modules import from here (the engine's public surface; most are defined in the round, validation
and runtime modules)."""


def _autoregressive(target, prompt, max_new_tokens, temperature, generator, runner: TargetRunner):
    """Plain decoding, one target forward per token, same KV cache; no hidden states, last logits only."""
    eos = set(target.eos_token_ids)
    clock = Clock(prompt.device)
    tok, _ = pick_first(runner.prefill(prompt, False), temperature, generator, None)
    clock.lap("prefill")
    res = GenerationResult(tokens=[], num_target_forwards=1)
    done = commit(res, [int(tok)], eos, max_new_tokens)
    while not done:
        out = runner.forward(tok.reshape(1), False, last_only=True)
        tok = pick(out.logits[0, -1:], temperature, generator)
        res.num_target_forwards += 1
        done = commit(res, [int(tok)], eos, max_new_tokens)
    clock.lap("verify")
    charge(res, clock)
    res.accepted_per_round = [0] * (res.num_target_forwards - 1)
    res.stages_per_round = [0] * len(res.accepted_per_round)
    res.drafted_per_round = [0] * len(res.accepted_per_round)
    return res.finish()


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
    predictor: AcceptancePredictor | None = None,
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
    ``predictor`` (an :class:`~lit_domino.decoding.acceptance.AcceptancePredictor`): what the gates that read
    one (``conf``, ``cost``, truncation ``trunc``) read; None: the drafter's own confidence head, uncalibrated,
    where it declares one (DSpark's), else none (those gates are then refused,
    :class:`~lit_domino.decoding.acceptance.NoAcceptancePredictor`). One given is checked against the drafter
    before decoding (built for it: its ``drafter_key``; a head it can read; refused without a drafter) and is
    ignored by a decode whose gate reads none (DLoop off, the log-probability gates), so one predictor per drafter
    serves every setting; it is never kept on the drafter.
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
    threads spin: a small call on a busy 2-core machine ran many times slower; docs/results.md). Tiny models
    decode fastest on 1 thread on a shared machine (the studies pin it).
    ``tree`` (a :class:`lit_domino.decoding.tree.TreeConfig`): tree rounds instead of chain rounds (one target
    forward over a draft tree, the accepted path walked from its root; lossless at every temperature); with
    ``dloop`` the stages drafted while the gate is open stay a chain and the last stage becomes the tree.
    Parallel drafters (backbone, domino, dspark) and EAGLE-3 (its ``eagle`` tree: EAGLE-2's); eager only (no
    ``compile``); sdpa or eager attention.
    All inputs are validated before any decoding (ValueError with the reason); integer arguments may be numpy
    integers.
    """
    pool_size, threads = as_int(pool_size), as_int(threads)
    prompts, max_new_tokens, block_size, dloop = validate(
        target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, block_size=block_size,
        dloop=dloop, pool_size=pool_size, attention_mask=attention_mask, seed=seed, compile=compile, tree=tree,
        predictor=predictor)
    static_cache = bool(static_cache or compile)
    temperature = effective_temperature(temperature)  # below GREEDY_BELOW: exactly the T = 0 path
    device, limit = target.device, context_limit(target, drafter)
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    generator = torch.Generator(device=device).manual_seed(integer(seed))
    # the most a round drafts beyond the committed tokens: DLoop's chain stages, a tree's nodes in the last one
    budget = 0 if drafter is None else (dloop.max_stages if dloop else 1) * (block_size - 1)
    if tree is not None:
        budget = (budget - block_size + 1 if dloop else 0) + max(tree.budget, block_size - 1)
    results = []
    with eval_mode(target.model, drafter), bounded_threads(threads):
        # None: no gate (a tree round's chain stages read the log-probability gates only)
        policy = round_policy(dloop, target, drafter, block_size, predictor) if tree is None else None
        for row in prompts:
            row = row.to(device)
            capacity = row.shape[0] + max_new_tokens + budget + 1
            if static_cache:  # a shared capacity per bucket: the compiled graphs fit every prompt in it
                capacity = static_capacity(capacity, limit)
            elif limit is not None:
                capacity = min(capacity, limit)  # rounds near the context's end draft less (context_limit)
            runner = TargetRunner(target, capacity, static_cache, compile)
            if drafter is None:
                results.append(_autoregressive(target, row, max_new_tokens, temperature, generator, runner))
                continue
            options = {} if pool_size is None else {"pool_size": pool_size}
            if static_cache and capabilities_of(drafter).static_block:
                # the drafter's fixed-shape block forward: the target's capacity + one padded context block
                options.update(static_capacity=capacity + int(drafter.config.block_size), compile=compile)
            if tree is not None:
                memory = None if tree.cost is None else observed(drafter, target, tree, temperature, dloop)
                proposer = TreeProposer(tree, block_size, runner, limit, target.model.dtype, temperature, generator,
                                        dloop, memory)
            else:
                proposer = ChainProposer(policy, block_size, limit, temperature, generator, record_stages)
            results.append(decode(target, drafter, row, proposer, runner, max_new_tokens=max_new_tokens,
                                  temperature=temperature, generator=generator, options=options))
    return results[0] if len(results) == 1 else results
