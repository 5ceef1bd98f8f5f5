"""The Domino head: a lightweight causal correction of the backbone's logits.

Shapes: b batch, A anchors, B block size, d width, d_s GRU state, r rank, V vocabulary.

``ΔL_i = W_up · SiLU(W_down · [H_i ; S_{i-1}])`` where H_i is the backbone
hidden state at block position i and S_{i-1} is a 1-layer GRU state (no bias)
that has consumed the frozen target embeddings of ``x_a, x_{a+1} .. x_{a+i-1}``.
Final logits ``L_i = L_base_i + ΔL_i`` for i >= 1; position 0 gets ΔL = 0.
``W_up`` starts at zero, so a fresh Domino drafter equals its backbone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lit_domino.models.backbone import BlockOutput, ParallelDrafter
from lit_domino.models.config import DrafterConfig
from lit_domino.models.layers import init_weights

CAUSAL_INPUTS = ("teacher_forced", "training_time_test")


class DominoHead(nn.Module):
    """GRU over previous tokens + low-rank logit correction."""

    def __init__(self, hidden_size: int, gru_hidden: int, rank: int, vocab_size: int):
        super().__init__()
        self.hidden_size, self.gru_hidden = hidden_size, gru_hidden
        self.gru = nn.GRU(hidden_size, gru_hidden, num_layers=1, bias=False, batch_first=True)  # d -> d_s
        self.down = nn.Linear(hidden_size + gru_hidden, rank, bias=False)  # W_down: d + d_s -> r
        self.up = nn.Linear(rank, vocab_size, bias=False)  # W_up: r -> V
        self.apply(init_weights)
        self.reset_up()

    def reset_up(self) -> None:
        """Zero ``W_up``: the correction vanishes, the drafter equals backbone-only."""
        nn.init.zeros_(self.up.weight)

    def delta(self, H: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """H [..., d], S [..., d_s] -> ΔL [..., V]."""
        return self.up(F.silu(self.down(torch.cat([H, S], dim=-1))))

    def cell(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One GRU step with the ``nn.GRU`` weights (gate order r, z, n): x [N, d], h [N, d_s] -> [N, d_s]."""
        gi = x @ self.gru.weight_ih_l0.T  # [N, 3*d_s]
        gh = h @ self.gru.weight_hh_l0.T  # [N, 3*d_s]
        return gru_gates(gi, gh, h)


def gru_gates(gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """GRU update (``nn.GRU``'s equations, gate order r, z, n) from the input/hidden projections
    gi, gh [..., 3*d_s] and state h [..., d_s]. Written in five kernels (was twelve): the Domino
    decode loop runs it once per drafted token, where each op costs ~4 µs of dispatch on a CPU."""
    d = h.shape[-1]
    (i_rz, i_n), (h_rz, h_n) = gi.split([2 * d, d], -1), gh.split([2 * d, d], -1)
    r, z = torch.sigmoid(i_rz + h_rz).split(d, -1)  # reset and update gates at once
    n = torch.tanh(torch.addcmul(i_n, r, h_n))  # i_n + r * h_n
    return torch.lerp(n, h, z)  # (1 - z) * n + z * h


class DominoDrafter(ParallelDrafter):
    """DFlash backbone + Domino head."""

    kind = "domino"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        c = config
        self.head = DominoHead(c.hidden_size, c.gru_hidden, c.rank, c.vocab_size)

    def reset_head(self) -> None:
        """Re-initialise the head with W_up = 0 (the drafter becomes backbone-only again)."""
        self.head.apply(init_weights)
        self.head.reset_up()

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        features: torch.Tensor,  # [b, T, n*d]
        anchors: torch.Tensor,  # [b, A]
        anchor_mask: torch.Tensor,  # [b, A]
        loss_mask: torch.Tensor | None = None,  # [b, T]
        attention_mask: torch.Tensor | None = None,  # [b, T]
        causal_inputs: str = "teacher_forced",
    ) -> BlockOutput:
        """Backbone forward + the head; ``final_logits`` = base + ΔL.

        ``teacher_forced``: GRU inputs are the true tokens ``x_a .. x_{a+B-2}``, one
        parallel GRU pass. ``training_time_test``: sequential, the GRU input after
        position i is the argmax of the final logits at i (no gradient through the pick).
        """
        if causal_inputs not in CAUSAL_INPUTS:
            raise ValueError(f"causal_inputs must be one of {CAUSAL_INPUTS}, got {causal_inputs!r}")
        out = super().forward_train(input_ids, features, anchors, anchor_mask, loss_mask, attention_mask)
        out.final_logits = self.head_logits(out, causal_inputs)
        return out

    def head_logits(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> torch.Tensor:
        """Final logits ``[b, A, B, V]`` = ``out.logits + ΔL`` of a backbone block output (ΔL = 0 at k = 0).

        The GRU starts fresh at each block's anchor ``out.block_tokens[..., 0]`` (as a session's
        stage does); ``causal_inputs`` as in :meth:`forward_train`. Also used by DLoop's
        loop-aware training (``lit_domino.models.loop``) for the blocks of later stages.
        """
        if causal_inputs not in CAUSAL_INPUTS:
            raise ValueError(f"causal_inputs must be one of {CAUSAL_INPUTS}, got {causal_inputs!r}")
        b, A, B, d = out.hidden.shape
        H = out.hidden[:, :, 1:].reshape(b * A, B - 1, d)  # [b*A, B-1, d] H_1 .. H_{B-1}
        if causal_inputs == "teacher_forced":
            x = self.embed_tokens(out.block_tokens[:, :, : B - 1]).reshape(b * A, B - 1, d)  # x_a .. x_{a+B-2}
            S, _ = self.head.gru(x)  # [b*A, B-1, d_s]: S_0 .. S_{B-2}
            delta = self.head.delta(H, S)  # [b*A, B-1, V]
        else:
            base = out.logits[:, :, 1:].reshape(b * A, B - 1, -1)  # [b*A, B-1, V]
            h = H.new_zeros(b * A, self.config.gru_hidden)  # [b*A, d_s]
            h = self.head.cell(self.embed_tokens(out.block_tokens[:, :, 0].reshape(-1)), h)  # S_0 (consumed x_a)
            deltas = []
            for i in range(B - 1):  # block position i+1
                dl = self.head.delta(H[:, i], h)  # [b*A, V]
                deltas.append(dl)
                if i < B - 2:
                    pick = (base[:, i] + dl).detach().argmax(-1)  # [b*A]
                    h = self.head.cell(self.embed_tokens(pick), h)
            delta = torch.stack(deltas, dim=1)  # [b*A, B-1, V]
        delta = delta.view(b, A, B - 1, -1).to(out.logits.dtype)
        zero = torch.zeros_like(out.logits[:, :, :1])  # [b, A, 1, V]
        return out.logits + torch.cat([zero, delta], dim=2)  # [b, A, B, V]

    def new_session(self):
        from lit_domino.models.sessions import DominoSession

        return DominoSession(self)
