"""Modules in eval mode under ``torch.inference_mode`` for a decode (their training flags restored after)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def eval_mode(*modules):
    """Eval mode + ``torch.inference_mode`` for the call; training flags are restored afterwards.

    Inference mode skips all autograd bookkeeping (no version counters, no view tracking), as
    dflash_generate's whole loop does; a round dispatches ~800 small ops on the default preset (~105 of
    them the backbone's draft), each cheaper so.
    Tensors a drafter caches on itself for later calls are built outside it
    (:func:`lit_domino.models.layers.outside_inference_mode`): an inference tensor saved for
    backward would break the drafter's training after the eval callback decodes mid-training.
    """
    # Only modules with a submodule in training mode are switched (and switched back): ``eval()`` walks every
    # submodule through ``train(False)``, and a short decode paid that four times per call, a visible share of
    # dflash_generate's whole time; the check walks them once, without a setattr per module
    # (measured: docs/results.md, 'figures behind the code's comments').
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
