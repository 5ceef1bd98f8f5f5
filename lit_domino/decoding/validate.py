"""Everything ``generate`` is given, checked before any decoding (ValueError with the reason, one line).

Prompts (:func:`prompts_of`: a tensor, an array or lists of ids, an attention mask's padding), the token budget,
the temperature, DLoop, the block size and pool size a drafter allows, its feature layers, the acceptance predictor
(:func:`~lit_domino.decoding.acceptance.check_predictor`: built for this drafter, one it can read), the context's
positions (:func:`context_limit`) and ``compile`` (:func:`check_compile`). Integer arguments may be numpy integers.
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np
import torch

from lit_domino.decoding.acceptance import AcceptancePredictor, check_predictor
from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.decoding.round import feature_layers
from lit_domino.decoding.sampling import GREEDY_BELOW
from lit_domino.decoding.tree import check_tree
from lit_domino.models.capabilities import capabilities_of
from lit_domino.models.sessions import check_pool_size
from lit_domino.runtime.threads import cpp_compiler
from lit_domino.target.load import check_layer_ids


def drafter_block_size(drafter) -> int:
    return int(drafter.config.block_size)



INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def integer(value) -> int | None:
    """``value`` as an int when it is an integer scalar (a Python int, numpy's ``np.int64``, a 0-d integer tensor),
    else None: bools and floats (5.0 included) are not token counts."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_int(value):
    """An integer scalar (``np.int64``...) as a Python int; anything else unchanged, for its check to name it."""
    n = integer(value)
    return value if n is None else n


def _row_lengths(rows) -> list[int] | None:
    """The lengths of a list of rows (lists, tuples, arrays, tensors); None when ``rows`` is not one."""
    if not isinstance(rows, (list, tuple)) or not rows:
        return None
    if not all(isinstance(r, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(r) == 1 for r in rows):
        return None
    return [len(r) for r in rows]


def as_batch(input_ids, name: str = "input_ids") -> torch.Tensor:
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
    input_ids = as_batch(input_ids)
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; give at least one token")
    if attention_mask is None:
        _refuse_padding(target, input_ids)
        return list(input_ids)
    mask = as_batch(attention_mask, "attention_mask").cpu()
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
             attention_mask=None, seed=None, compile: bool = False, tree=None, predictor=None):
    """Check everything before decoding; returns ``(prompts [T_i] per row, max_new_tokens, block_size, dloop)``
    (integer arguments as Python ints: numpy's ``np.int64`` is accepted)."""
    prompts = prompts_of(target, input_ids, attention_mask)
    vocab = target.vocab_size
    ids = torch.cat(prompts)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"input_ids hold ids outside the target's vocabulary [0, {vocab})")
    n = integer(max_new_tokens)
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
    if predictor is not None and not isinstance(predictor, AcceptancePredictor):
        raise ValueError(f"predictor must be an AcceptancePredictor or None, got {type(predictor).__name__}")
    if drafter is None and predictor is not None:
        raise ValueError("predictor is a drafter's acceptance predictor; plain decoding (drafter=None) has no draft")
    if drafter is not None:
        drafter.bind_target(target)  # raises when the drafter was trained for another target
        trained = drafter_block_size(drafter)
        block_size = trained if block_size is None else as_int(block_size)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not 2 <= block_size <= trained:
            raise ValueError(
                f"block_size={block_size!r} is invalid for this drafter: need 2 <= block_size <= {trained} "
                "(the drafter's trained block size; a block drafts block_size - 1 tokens)"
            )
        caps = capabilities_of(drafter)
        if pool_size is not None and not caps.pool:
            raise ValueError(f"pool_size={pool_size!r} needs a drafter whose head corrects its base logits (domino, "
                             f"dspark: the 'pool' capability); this {caps.kind} drafter picks from its own logits")
        check_pool_size(pool_size, vocab)
        if (layers := feature_layers(drafter)) is not None:
            check_layer_ids(layers, target.num_layers)
        if predictor is not None:
            check_predictor(drafter, predictor)  # NoAcceptancePredictor: another drafter's, or one it cannot read
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
    if seed is not None and integer(seed) is None:
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    check_compile(compile, target.device)
    if tree is not None:
        check_tree(tree, target, drafter, compile=compile, longest_prompt=longest, limit=context_limit(target, drafter),
                   dloop=dloop)
    return prompts, max_new_tokens, block_size, dloop


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

