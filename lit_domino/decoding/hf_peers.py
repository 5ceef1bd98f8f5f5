"""Hugging Face peers, timed like our engine: plain ``generate``, assisted generation, prompt lookup.

Each function returns a :class:`GenerationResult` per prompt row with ``tokens`` and
times; acceptance fields stay empty (``tau`` NaN) because ``generate`` does not report
them. **Prefill is excluded by subtraction**: ``generate`` cannot be timed per phase,
so each prompt is also generated with ``max_new_tokens=1`` (prefill + first token, the
same arguments, so assisted generation's assistant prefill is included) and
``decode_time_s = t(full) - t(1 token)``, ``tpot_ms = decode_time_s / (len(tokens) - 1)``:
the same definition as :func:`lit_domino.decoding.generate`. The subtraction is noisy
for short generations; compare over many prompts.
"""

from __future__ import annotations

import torch

from lit_domino.decoding.result import GenerationResult
from lit_domino.decoding.round import Clock
from lit_domino.decoding.validate import as_batch


def _generate_kwargs(target, temperature: float) -> dict:
    cfg = target.model.config
    eos = target.eos_token_ids
    pad = getattr(cfg, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    kwargs = dict(pad_token_id=pad, eos_token_id=eos or None)
    if temperature > 0:  # pure softmax(logits / T) sampling, no top-k/top-p truncation
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return kwargs


def _timed(target, input_ids, *, max_new_tokens, temperature=0.0, seed=None, **extra) -> list[GenerationResult]:
    """Run ``target.model.generate`` per row twice (1 token, then full) and time the decode phase."""
    model = target.model
    kwargs = {**_generate_kwargs(target, temperature), **extra}
    results = []
    for row in as_batch(input_ids).to(target.device):
        ids = row[None]
        mask = torch.ones_like(ids)
        clock = Clock(ids.device)
        with torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            model.generate(ids, attention_mask=mask, max_new_tokens=1, **kwargs)
            clock.lap("first")
            if seed is not None:
                torch.manual_seed(seed)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, **kwargs)
            clock.lap("rest")
        spans = clock.totals()
        t_first, t_rest = spans["first"], spans["rest"]
        tokens = out[0, ids.shape[1]:].tolist()
        eos = set(target.eos_token_ids)
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))  # padding after EOS
        res = GenerationResult(tokens=tokens[:cut], prefill_time_s=t_first, decode_time_s=max(t_rest - t_first, 0.0),
                               num_target_forwards=0, stop_reason="eos" if cut < len(tokens) or
                               (tokens and tokens[-1] in eos) else "length")
        results.append(res.finish())
    return results


def _one_or_list(results):
    return results[0] if len(results) == 1 else results


def hf_generate(target, input_ids, *, max_new_tokens: int, temperature: float = 0.0, seed: int | None = None):
    """Plain Hugging Face ``generate`` (greedy at T = 0), prefill subtracted."""
    return _one_or_list(_timed(target, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed))


def hf_assisted(target, assistant_model, input_ids, *, max_new_tokens: int, temperature: float = 0.0,
                seed: int | None = None):
    """HF assisted generation with a small draft LM (same tokenizer/vocabulary), prefill subtracted.

    ``assistant_model`` is a Hugging Face causal LM (e.g. the ``.model`` of a small-LM drafter).
    """
    if assistant_model is None:
        raise ValueError("hf_assisted needs an assistant_model (a small Hugging Face causal LM)")
    assistant_model.eval()
    return _one_or_list(_timed(target, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                               assistant_model=assistant_model))


def hf_prompt_lookup(target, input_ids, *, max_new_tokens: int, prompt_lookup_num_tokens: int = 10,
                     temperature: float = 0.0, seed: int | None = None):
    """HF prompt-lookup decoding (n-gram drafts copied from the prompt), prefill subtracted."""
    return _one_or_list(_timed(target, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                               prompt_lookup_num_tokens=int(prompt_lookup_num_tokens)))
