"""Position weights of a block: ``w_0 = 0``, ``w_k = exp(-(k-1)/γ)`` (DFlash's, *public code*).

Conventions (``docs/ARCHITECTURE.md``): a block has ``B`` positions; position 0 holds the known token (never a
label), position ``k ≥ 1`` predicts the token at its own absolute position. Labels are ``-100``
(:data:`IGNORE_INDEX`) where there is nothing to learn. γ = 7 for B = 16 and γ = 4 for B = 8
(:func:`default_gamma`).
"""

from __future__ import annotations

import math

import torch

IGNORE_INDEX = -100
"""Label value that marks 'no label here' (the block's position 0, pads, prompt tokens)."""


def check_block_size(block_size: int) -> int:
    """A block must draft at least one token: ``B ≥ 2``."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        raise ValueError(
            f"block_size must be an integer >= 2 (position 0 is the known token, positions 1..B-1 are drafted), "
            f"got {block_size!r}"
        )
    return block_size


def default_gamma(block_size: int) -> float:
    """The decay γ of the position weights for a block size.

    The papers give two points, γ = 7 for B = 16 and γ = 4 for B = 8; other block
    sizes use the straight line through them, ``γ = 1 + 3·B/8`` (B = 4 → 2.5,
    B = 32 → 13, B = 2 → 1.75), always positive.
    """
    check_block_size(block_size)
    return 1.0 + 3.0 * block_size / 8.0


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """``[B]`` float32 weights: ``w_0 = 0``, ``w_k = exp(-(k-1)/γ)`` for ``k = 1..B-1``.

    ``gamma=None`` uses :func:`default_gamma`. ``γ ≤ 0`` raises ``ValueError``.
    """
    check_block_size(block_size)
    if gamma is None:
        gamma = default_gamma(block_size)
    gamma = float(gamma)
    if not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma (the decay of the position weights exp(-(k-1)/gamma)) must be > 0, got {gamma}")
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w
