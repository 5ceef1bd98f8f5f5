"""The benchmark harness: :func:`benchmark` decodes prompt sets with several drafters and settings
(temperatures, DLoop gates, candidate pools, repeats) interleaved in one process, and reports each method's
:func:`~lit_domino.decoding.metrics.summarize` row (``tau``, ``speedup`` vs our AR baseline on the same
prompts, ``speedup_vs_hf_generate``); :func:`markdown_table` renders rows.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import replace
from collections.abc import Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from lit_domino.decoding import hf_peers
from lit_domino.decoding.acceptance import check_predictor
from lit_domino.decoding.dloop import DLoopConfig, dloop_label
from lit_domino.decoding.engine import GenerationResult, check_compile, generate
from lit_domino.decoding.metric_names import COMPILED_AR, MethodKey
from lit_domino.decoding.metrics import merge_results, summarize
from lit_domino.models.capabilities import capabilities_of
from lit_domino.models.sessions import check_pool_size

def prompt_ids(item) -> list[int] | None:
    """A prompt given as token ids (a tensor or a list of ints) as a list; None for anything else (a text item)."""
    if isinstance(item, torch.Tensor):
        return item.reshape(-1).tolist()
    if isinstance(item, (list, tuple)) and all(isinstance(t, int) for t in item):
        return list(item)
    return None


def run_prompt(target, decode: Callable, item, *, max_new_tokens: int, budget: int = 0) -> GenerationResult:
    """Decode one prompt: token ids, or an object with ``.turns`` (user messages answered in order).

    Multi-turn prompts are rendered with the target's chat template; each answer (decoded
    text) joins the conversation before the next turn. A turn's ``max_new_tokens`` is cut
    to fit ``target.max_positions`` (minus the draft ``budget``); turns that no longer fit
    are skipped.
    """
    ids = prompt_ids(item)
    limit = int(getattr(target.model.config, "max_position_embeddings", 10**9))
    if ids is not None:
        return decode(torch.tensor([ids]), max(1, min(max_new_tokens, limit - len(ids) - budget)))
    turns = getattr(item, "turns", None)
    if not turns:
        raise ValueError(f"a benchmark prompt must be token ids or have .turns, got {type(item).__name__}")
    if target.tokenizer is None:
        raise ValueError("multi-turn/text prompts need a target with a tokenizer")
    messages, results = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        ids = target.chat_ids(messages)
        n = min(max_new_tokens, limit - len(ids) - budget)
        if n < 1:
            break
        res = decode(torch.tensor([ids]), n)
        results.append(res)
        messages.append({"role": "assistant",
                         "content": target.tokenizer.decode(res.tokens, skip_special_tokens=True)})
    if not results:
        raise ValueError(f"prompt {getattr(item, 'uid', '?')!r} does not fit in max_positions {limit}")
    return merge_results(results)


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    return tqdm(total=total, desc=desc, leave=False)


def _per_drafter(values, drafters: Mapping, what: str) -> dict:
    """A setting every drafter decodes with (a sequence), or per drafter name (a mapping; a name it lacks gets
    ``[None]``, the setting off) -> {name: [values]}; a mapping naming a drafter not in ``drafters`` is refused."""
    if isinstance(values, Mapping):
        unknown = sorted(MethodKey.of(k).label() for k in set(values) - set(drafters))
        if unknown:
            raise ValueError(f"{what} names drafters {unknown} that are not in drafters "
                             f"{sorted(MethodKey.of(k).label() for k in drafters)}")
        return {name: list(values.get(name) or [None]) for name in drafters}
    return {name: list(values) or [None] for name in drafters}


def benchmark(
    target,
    drafters: Mapping[str | MethodKey, object],
    prompts: dict[str, Sequence],
    *,
    max_new_tokens: int = 256,
    temperatures: Sequence[float] = (0.0,),
    dloops: Sequence[DLoopConfig | None] | Mapping[str, Sequence[DLoopConfig | None]] = (None,),
    pool_sizes: Sequence[int | None] | Mapping[str, Sequence[int | None]] = (None,),
    block_size: int | None = None,
    static_cache: bool = False,
    compile: bool = False,
    compiled_baseline: bool = False,
    record_stages: bool = False,
    peers: Sequence[str] = (),
    assistant_model=None,
    prompt_lookup_num_tokens: int = 10,
    hf_baseline: bool = True,
    seed: int = 0,
    warmup: bool = True,
    progress: bool = True,
    external: Mapping[str, Callable] | None = None,
    repeats: int = 1,
    trees: Sequence = (None,),
    predictors: Mapping[str | MethodKey, object] | None = None,
) -> list[dict]:
    """Decode every prompt set with our AR baseline, every drafter x temperature x DLoop, and peers.

    ``prompts``: benchmark name → prompts (token-id lists/tensors, or objects with
    ``.turns``). ``drafters``: name (a :class:`MethodKey`, or a string: ``MethodKey(name)``) → drafter.
    ``peers``: any of ``"prompt_lookup"``, ``"assisted"`` (needs
    ``assistant_model``, a small Hugging Face LM). Returns one row per
    (benchmark, temperature, method) with :func:`summarize`'s metrics plus
    ``benchmark``, ``key`` (a drafter row's :meth:`MethodKey.as_dict`, its decode settings included; None for
    the others), ``method`` (the key's label), ``kind`` (``ar``/``hf``/``drafter``), ``drafter`` (the label of
    the drafter's own key),
    ``temperature``, ``dloop``, ``pool_size``, ``block_size``. ``dloops``: the DLoop settings every drafter
    decodes with, or a mapping name -> its own (a name it lacks: DLoop off only). ``pool_sizes``: the candidate pools P
    (``generate``'s ``pool_size``; None = the full vocabulary) each drafter that takes one runs with
    (others run once, with none); a mapping gives them per drafter name (a name it lacks: the full
    vocabulary). ``static_cache`` / ``compile``: :func:`generate`'s GPU-ready path for our AR baseline and
    every drafter alike (``compile``: a CUDA or CPU target; its untimed warm-up decodes every prompt in full,
    so every graph is compiled before the timed decodes). ``compiled_baseline``: one more plain decoder, the
    compiled one (``ar_compiled``: :func:`generate`'s compiled path with no drafter, the fastest plain decoder
    the suite has; its warm-up decodes every prompt in full, untimed, and its row's ``warmup_s`` says how long
    that took), and every row gains ``speedup_vs_compiled_ar`` beside ``speedup`` (over the eager plain
    decoder, ``ar``). ``record_stages``: drafter rows carry
    ``stage_records`` (:class:`GenerationResult`; DLoop's calibration data). The AR baseline (``speedup`` 1) and
    ``hf_generate`` rows come first. Everything runs in this process, one method after
    another on each prompt in turn (interleaved, so drifting background load hits every
    method alike), after one untimed warm-up decode per method. ``external``: label →
    ``decode(ids [1, T], max_new_tokens, temperature, seed) -> GenerationResult``, other
    projects' decoding loops (e.g. ``dflash_generate``), rows of kind ``peer`` after the drafters.
    ``repeats`` R: every prompt is decoded R times per method, the method order reversed on every other
    repeat (whoever runs first or after whom is no longer one method's luck); a prompt's times are its fastest
    decode's (:func:`fastest_times`), whose tokens must agree with the others' (they do: decoding is deterministic
    per seed).
    ``trees``: the tree settings each drafter decodes with (:class:`lit_domino.decoding.tree.TreeConfig`; None: the
    chain engine), rows ``<drafter>+tree(<label>)``; a tree whose builder a drafter lacks is skipped for it.
    ``predictors``: drafter name -> its acceptance predictor (:func:`generate`'s ``predictor``, passed to each of
    its decodes; read by the conf, cost and trunc gates); a name it lacks: the drafter's own head's, if any. A
    name not in ``drafters`` is refused, and each predictor is checked against its drafter before any decoding.
    """
    check_repeats(repeats)
    unknown = set(peers) - {"prompt_lookup", "assisted"}
    if unknown:
        raise ValueError(f"unknown peers {sorted(unknown)}; choose from prompt_lookup, assisted")
    if "assisted" in peers and assistant_model is None:
        raise ValueError("the 'assisted' peer needs assistant_model (a small Hugging Face causal LM)")
    if not prompts or any(len(v) == 0 for v in prompts.values()):
        raise ValueError("benchmark needs at least one non-empty prompt set")
    check_compile(compile or compiled_baseline, target.device)
    pools_of = _per_drafter(pool_sizes, drafters, "pool_sizes")  # a name it lacks: the full vocabulary
    for P in {P for pools in pools_of.values() for P in pools}:
        check_pool_size(P, target.vocab_size)
    dloops_of = _per_drafter(dloops, drafters, "dloops")  # the gates a drafter can use; a name it lacks: DLoop off
    predictors = dict(predictors or {})
    unknown = sorted(MethodKey.of(k).label() for k in set(predictors) - set(drafters))
    if unknown:
        raise ValueError(f"predictors names drafters {unknown} that are not in drafters "
                         f"{sorted(MethodKey.of(k).label() for k in drafters)}")
    for name, pred in predictors.items():  # another drafter's predictor: refused before the first decode
        if pred is not None and drafters[name] is not None:
            drafters[name].bind_target(target)  # its key is the bound drafter's (generate binds it too)
            check_predictor(drafters[name], pred)
    budget = 0
    for name, d in drafters.items():
        if d is None:
            raise ValueError(f"drafter {name!r} is None (the AR baseline always runs; do not pass it)")
        bs = block_size or int(d.config.block_size)
        budget = max(budget, max((dl.max_stages if dl else 1) for dl in dloops_of[name]) * (bs - 1))
    trees = list(trees) or [None]
    budget += max([0] + [t.budget for t in trees if t is not None])  # room for DLoop's stages and a tree

    def ours(drafter, temperature, dloop, i, pool_size=None, tree=None, predictor=None):
        return lambda ids, n: generate(target, drafter, ids, max_new_tokens=n, temperature=temperature,
                                       block_size=block_size if drafter is not None else None,
                                       dloop=dloop if drafter is not None else None, seed=seed + i,
                                       pool_size=pool_size, static_cache=static_cache, compile=compile,
                                       record_stages=record_stages and drafter is not None, tree=tree,
                                       predictor=predictor)

    def peer(fn, temperature, i, **kw):
        return lambda ids, n: fn(target, ids, max_new_tokens=n, temperature=temperature, seed=seed + i, **kw)

    methods: list[tuple[str, str, object, float, DLoopConfig | None, Callable]] = []
    keys: dict[str, MethodKey] = {}  # method label -> its key (the label is rendered from it, never parsed)
    def compiled_ar(temperature, i):
        return lambda ids, n: generate(target, None, ids, max_new_tokens=n, temperature=temperature, seed=seed + i,
                                       compile=True)

    for temperature in temperatures:
        methods.append(("ar", "ar", None, temperature, None, lambda i, t=temperature: ours(None, t, None, i)))
        if compiled_baseline and not compile:  # with compile on, "ar" is the compiled plain decoder already
            methods.append((COMPILED_AR, "ar", None, temperature, None, lambda i, t=temperature: compiled_ar(t, i)))
        if hf_baseline:
            methods.append(("hf_generate", "hf", None, temperature, None,
                            lambda i, t=temperature: peer(hf_peers.hf_generate, t, i)))
        for name, drafter in drafters.items():
            caps = capabilities_of(drafter)
            takes_pool, builds = caps.pool, caps.tree_builders
            for pool_size in (pools_of[name] if takes_pool else [None]):
                for dloop in dloops_of[name]:
                    for tree in (t for t in trees if t is None or t.builder in builds):
                        key = replace(MethodKey.of(name), pool=pool_size, gate=None if dloop is None else dloop.label(),
                                      tree=None if tree is None else tree.label())
                        label = key.label()
                        keys[label] = key
                        methods.append((label, "drafter", name, temperature, dloop,
                                        lambda i, d=drafter, t=temperature, dl=dloop, P=pool_size, tr=tree,
                                        pr=predictors.get(name): ours(d, t, dl, i, P, tr, pr)))
        for label, fn in (external or {}).items():
            methods.append((label, "peer", None, temperature, None,
                            lambda i, f=fn, t=temperature: (lambda ids, n: f(ids, n, t, seed + i))))
        if "prompt_lookup" in peers:
            methods.append(("hf_prompt_lookup", "hf", None, temperature, None,
                            lambda i, t=temperature: peer(hf_peers.hf_prompt_lookup, t, i,
                                                          prompt_lookup_num_tokens=prompt_lookup_num_tokens)))
        if "assisted" in peers:
            methods.append(("hf_assisted", "hf", None, temperature, None,
                            lambda i, t=temperature: peer(lambda tg, ids, **kw: hf_peers.hf_assisted(
                                tg, assistant_model, ids, **kw), t, i)))

    rows = []
    bar = _progress(repeats * len(methods) * sum(len(v) for v in prompts.values()), progress, "benchmark")
    for bench, items in prompts.items():
        warmup_s: dict[str, float] = {}  # each method's untimed warm-up on this benchmark
        if warmup:  # untimed: lazy initialisation, allocator growth; compiled: every graph the timed decodes use
            #            (each prompt's verify widths and cache capacity), so no compilation is timed
            for label, *_, make in methods:
                in_full = compile or label == COMPILED_AR
                t0 = time.perf_counter()
                for item in (items if in_full else items[:1]):
                    run_prompt(target, make(0), item, max_new_tokens=max_new_tokens if in_full else
                               min(8, max_new_tokens), budget=budget)
                warmup_s[label] = warmup_s.get(label, 0.0) + time.perf_counter() - t0
        outputs: list[list[GenerationResult]] = [[] for _ in methods]
        for i, item in enumerate(items):  # methods interleaved per prompt: background load hits all alike
            decodes: list[list[GenerationResult]] = [[] for _ in methods]
            for rep in range(repeats):
                order = list(range(len(methods)))[:: -1 if rep % 2 else 1]
                for j in order:
                    label, _, _, temperature, _, make = methods[j]
                    decodes[j].append(run_prompt(target, make(i), item, max_new_tokens=max_new_tokens,
                                                 budget=budget))
                    if bar is not None:
                        bar.set_postfix_str(f"{bench} {label} T={temperature:g}")
                        bar.update(1)
            for (label, *_), out, runs_i in zip(methods, outputs, decodes):
                out.append(fastest_times(runs_i, f"{label} on {bench} prompt {i}"))
        runs = [(*m[:5], out) for m, out in zip(methods, outputs)]
        base = {t: res for label, _, _, t, _, res in runs if label == "ar"}
        hf = {t: res for label, _, _, t, _, res in runs if label == "hf_generate"}
        fastest = {t: res for label, _, _, t, _, res in runs if label == (COMPILED_AR if compiled_baseline and
                                                                          not compile else "ar")}
        for label, kind, dname, temperature, dloop, results in runs:
            row = summarize(results, base.get(temperature), hf.get(temperature),
                            compiled_baseline=fastest.get(temperature) if compiled_baseline else None)
            if temperature > 0:  # sampled outputs differ from the baseline's by design
                row["match_baseline"] = float("nan")
            bs = (block_size or int(drafters[dname].config.block_size)) if kind == "drafter" else None
            key = keys.get(label) if kind == "drafter" else None
            row = {"benchmark": bench, "key": key.as_dict() if key else None, "method": label, "kind": kind,
                   "drafter": key.base().label() if key else None, "temperature": float(temperature),
                   "dloop": dloop_label(dloop), "pool_size": key.pool if key else None, "block_size": bs, **row}
            if label == COMPILED_AR:
                row["warmup_s"] = warmup_s.get(label, 0.0)  # untimed: the compile and a full decode of each prompt
            if kind == "hf":  # generate() reports no rounds
                row.update(tau=float("nan"), tau_per_round=float("nan"), accepted_per_round=float("nan"),
                           stages_per_round=float("nan"))
            rows.append(row)
    if bar is not None:
        bar.close()
    return rows


def check_repeats(repeats) -> int:
    """``repeats``: decodes per prompt and method, a positive integer (studies check it when they plan)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer (decodes per prompt and method), got {repeats!r}")
    return repeats


def fastest_times(results: Sequence[GenerationResult], what: str = "a prompt") -> GenerationResult:
    """Repeated decodes of one prompt → the fastest (least decode time, its parts with it; the tokens must agree),
    every repeat's time per token kept in ``repeat_tpot_ms``. The decodes are deterministic, so what varies between
    them is interference, which only ever slows a decode: two identical settings interleaved on default-preset
    prompts differed less in total time with the fastest of 3 repeats than with the mean of 2 or 3
    (measured: docs/results.md, 'figures behind the code's comments')."""
    first = results[0]
    if len(results) == 1:
        return first
    if any(r.tokens != first.tokens for r in results[1:]):
        raise RuntimeError(f"repeated decodes of {what} gave different tokens: decoding is not deterministic")
    out = copy.copy(min(results, key=lambda r: r.decode_time_s))
    out.repeat_tpot_ms = [r.tpot_ms for r in results]
    return out


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of benchmark rows (floats to 3 significant decimals, NaN as '–')."""
    columns = list(columns or ["benchmark", "method", "temperature", "tau", "accepted_per_round", "speedup",
                               "speedup_vs_hf_generate", "tpot_ms", "match_baseline"])

    def fmt(v):
        if isinstance(v, float):
            return "–" if math.isnan(v) else f"{v:.3f}"
        return "–" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
