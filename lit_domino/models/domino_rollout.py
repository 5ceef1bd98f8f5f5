"""Domino's decode-time rollout as plain tensor functions: the GRU update, the corrected logits ``base + W_up ·
SiLU(z)`` and the sequential block draft (what ``compile`` compiles: dynamo does not trace into an ``nn.GRU``
module; :class:`lit_domino.models.domino.DominoHead` calls them)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from lit_domino.models.sessions import compile_for, compile_mode


def gru_gates(gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """GRU update (``nn.GRU``'s equations, gate order r, z, n) from the input/hidden projections
    gi, gh [..., 3*d_s] and state h [..., d_s]. Written in five kernels: the decode loop runs it once
    per drafted token, where each op costs a fixed dispatch overhead on a CPU."""
    d = h.shape[-1]
    (i_rz, i_n), (h_rz, h_n) = gi.split([2 * d, d], -1), gh.split([2 * d, d], -1)
    r, z = torch.sigmoid(i_rz + h_rz).split(d, -1)  # reset and update gates at once
    n = torch.tanh(torch.addcmul(i_n, r, h_n))  # i_n + r * h_n
    if n.dtype != h.dtype:  # bf16-mixed training: autocast's matmuls gave bf16 gates, the state stays in its dtype
        n, z = n.to(h.dtype), z.to(h.dtype)
    return torch.lerp(n, h, z)  # (1 - z) * n + z * h


def corrected_logits(z: torch.Tensor, w_up_t: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``W_up · SiLU(z)`` for z [..., r] and ``w_up_t`` [r, V or P], W_upᵀ or some of its columns; with ``base``,
    ``base + ΔL`` in one kernel and the base's dtype (the equation's output side, which every form shares)."""
    a = F.silu(z)
    if base is None:
        return a @ w_up_t
    if a.dtype != base.dtype:
        a, w_up_t = a.to(base.dtype), w_up_t.to(base.dtype)
    return torch.addmm(base, a, w_up_t)


def draft_block(H: torch.Tensor, base: torch.Tensor, anchor_gi: torch.Tensor, w_down_h: torch.Tensor,
                w_down_s: torch.Tensor, w_hh: torch.Tensor, gi: torch.Tensor, ups_t: torch.Tensor,
                ids: torch.Tensor | None, noise: torch.Tensor | None, temperature: float):
    """:meth:`DominoHead.draft`'s sequential loop as a pure function of tensors (what ``compile`` compiles;
    dynamo does not trace into an ``nn.GRU`` module) -> (picks [K] into each row, logits [K, P]).

    H [K, d], base [K, P] (P = V without a pool), ``anchor_gi`` [1, 3d_s] the GRU input projection of x_a;
    :class:`DecodeTables`' ``w_down_h`` [d, r], ``w_down_s`` [d_s, r], W_hh [3d_s, d_s] and ``gi`` [V, 3d_s]
    (passed as they are, so a CUDA graph reads them in place). ``ups_t``: W_upᵀ [r, V] shared by every
    position, or with a pool each position's columns [K, r, P], whose token ids are ``ids`` [K, P] (None
    without a pool). ``noise`` [K, P] (T > 0, the exponential race's ``-log E``) or None (greedy). A position
    costs six ops: W_down's S-part, ``base + W_up·SiLU(z)`` (:func:`corrected_logits`: two), the pick, the
    pick's row of the input-projection table (with a pool, first its token id: a seventh) and one fused
    ``gru_cell``. Nothing V-sized runs per position with a pool."""
    K = H.shape[0]
    h_part = (H @ w_down_h).unsqueeze(1).unbind(0)  # K x [1, r] W_down's H-part, every position at once
    bases = base.unsqueeze(1).unbind(0)  # K x [1, P]
    ups_t = ups_t.unbind(0) if ups_t.dim() == 3 else [ups_t] * K  # K x [r, P]
    pool_ids = None if ids is None else ids.unbind(0)  # K x [P] the pool's token ids
    noises = None if noise is None else noise.unsqueeze(1).unbind(0)
    # gru_cell with an empty input: its input projection is then just b_ih, the table row [1, 3d_s] passed there
    no_x, no_w = H.new_empty(1, 0), w_hh.new_empty(w_hh.shape[0], 0)
    s = torch.gru_cell(no_x, H.new_zeros(1, w_hh.shape[1]), no_w, w_hh, anchor_gi)  # S_0: consumed x_a
    picks, rows = [], []
    for i in range(K):
        L = corrected_logits(torch.addmm(h_part[i], s, w_down_s), ups_t[i], bases[i])  # [1, P] L_base + ΔL
        j = (L if noises is None else L.float() / temperature + noises[i]).argmax(-1)  # [1] index into the pool
        picks.append(j), rows.append(L)
        if i < K - 1:
            token = j if pool_ids is None else pool_ids[i].index_select(0, j)  # [1] the pick's token id
            s = torch.gru_cell(no_x, s, no_w, w_hh, gi.index_select(0, token))  # consumed the pick
    return torch.cat(picks), torch.cat(rows)


_COMPILED_DRAFT_BLOCK: dict[str, Callable] = {}


def compiled_draft_block(device) -> Callable:
    """:func:`draft_block` under ``torch.compile`` (:func:`compile_for`), one per mode: a pure function, so
    every drafter shares it (one graph per K, pool size and temperature)."""
    mode = compile_mode(device)
    if mode not in _COMPILED_DRAFT_BLOCK:
        _COMPILED_DRAFT_BLOCK[mode] = compile_for(draft_block, device)
    return _COMPILED_DRAFT_BLOCK[mode]
