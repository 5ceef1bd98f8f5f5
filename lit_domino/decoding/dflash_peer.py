"""z-lab's official DFlash decoding loop (``dflash.model.dflash_generate``) as a benchmark peer.

It decodes our backbone, converted in memory to their ``DFlashDraftModel`` (the same config and tensors
:func:`lit_domino.interop.export_drafter` writes as ``dflash``), on the target's Hugging Face model,
and its stats become a :class:`GenerationResult` timed like ours: prefill excluded, ``tpot_ms`` =
decode time / (tokens - 1). ``dflash_generate`` calls ``torch.cuda.synchronize`` in its timer, which
fails without CUDA: on CPU it is patched to a no-op for the duration of the call only (their package is
never edited).

Their loop is ours in every full round (same context cache, same block, same greedy acceptance), so the
tokens and per-round acceptance are identical; near ``max_new_tokens`` it verifies a shorter block
(``min(block_size, tokens left)``) and counts only the tokens it emits, so the last round's acceptance
(and hence τ) may differ slightly from ours, which always drafts a full block.
"""

from __future__ import annotations

import contextlib

import torch

from lit_domino.decoding.result import GenerationResult


@contextlib.contextmanager
def cuda_sync_noop_on_cpu(device: torch.device):
    """``torch.cuda.synchronize`` as a no-op while decoding on a non-CUDA device (restored afterwards)."""
    if torch.device(device).type == "cuda":
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *args, **kwargs: None
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def to_dflash_model(drafter):
    """Our backbone as z-lab's ``DFlashDraftModel`` (needs the ``dflash`` package: requirements-peers.txt)."""
    from dflash.model import DFlashDraftModel

    from lit_domino.interop.common import target_record
    from lit_domino.interop.dflash import KINDS, layout_config

    if drafter.kind not in KINDS:
        raise ValueError(f"dflash_generate decodes a DFlash backbone, not a {drafter.kind!r} drafter")
    model = DFlashDraftModel(layout_config(drafter, target_record(drafter)))
    model.load_state_dict(drafter.state_dict(), strict=False)  # rotary buffers are their own
    missing = set(model.state_dict()) - set(drafter.state_dict()) - {k for k in model.state_dict() if "rotary" in k}
    if missing:
        raise ValueError(f"DFlashDraftModel has parameters the backbone lacks: {sorted(missing)}")
    return model.to(device=drafter.fc.weight.device, dtype=drafter.dtype).eval()


def dflash_official(target, model, input_ids, *, max_new_tokens: int, temperature: float = 0.0,
                    seed: int | None = None) -> GenerationResult:
    """One prompt ``[1, T]`` decoded by ``dflash_generate`` with ``model`` (:func:`to_dflash_model`)."""
    from dflash.model import dflash_generate

    ids = input_ids.reshape(1, -1).to(target.device)
    if seed is not None:
        torch.manual_seed(seed)  # their sampler draws from torch's global RNG
    with cuda_sync_noop_on_cpu(target.device):
        stats = dflash_generate(model, target.model, ids, max_new_tokens=max_new_tokens,
                                stop_token_ids=target.eos_token_ids or None, temperature=float(temperature),
                                return_stats=True)
    tokens = stats.output_ids[0, ids.shape[1]:].tolist()
    eos = set(target.eos_token_ids)
    res = GenerationResult(tokens=tokens, prefill_time_s=float(stats.time_to_first_token),
                           decode_time_s=float(stats.time_per_output_token) * stats.num_output_tokens,
                           accepted_per_round=[int(a) - 1 for a in stats.acceptance_lengths],
                           drafted_per_round=[int(model.block_size) - 1] * len(stats.acceptance_lengths),
                           stages_per_round=[1] * len(stats.acceptance_lengths),
                           num_target_forwards=len(stats.acceptance_lengths) + 1,
                           stop_reason="eos" if tokens and tokens[-1] in eos else "length")
    return res.finish()
