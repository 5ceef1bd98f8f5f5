"""EAGLE-3-style autoregressive baseline, trained with training-time test (TTT)."""

from __future__ import annotations

import torch

from lit_domino.lit.base import DrafterModule, StepOutput, check_positive
from lit_domino.models import Eagle3Config, Eagle3Drafter
from lit_domino.models.objectives import IGNORE_INDEX


class Eagle3Module(DrafterModule):
    """EAGLE-3: one decoder layer over ``[embed(token); fused feature]``, unrolled ``ttt_steps`` steps.

    Loss ``Σ_s decay^s · L_s`` (decay 0.8, EAGLE-3's), or a selected ``objective`` over the TTT chains (one that
    needs the target's distribution is refused: the EAGLE-3 features do not carry it). Per-position metrics treat
    TTT step s as draft position ``s+1`` of a chain (``metric_block_size = ttt_steps + 1``).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s; ``block_size`` and ``num_layers``
    are unused here):
        ttt_steps: training-time-test unroll depth (= trained chain length; EAGLE-3: 7).
        step_decay: weight of step s in the loss is ``step_decay**s`` (EAGLE-3: 0.8).
    """

    variant = "eagle3"
    drafter_class = Eagle3Drafter
    uses_blocks = False
    supports_objective = True

    def __init__(self, ttt_steps: int = Eagle3Config.ttt_steps, step_decay: float = 0.8, **kwargs):
        check_positive(ttt_steps=ttt_steps)
        if not 0.0 < step_decay <= 1.0:
            raise ValueError(f"step_decay must be in (0, 1], got {step_decay}")
        super().__init__(**kwargs)

    @property
    def metric_block_size(self) -> int:
        return int(self.hparams.ttt_steps) + 1

    def drafter_options(self) -> dict:
        return {"ttt_steps": int(self.hparams.ttt_steps)}

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        out = self.drafter.forward_train(
            batch["input_ids"], batch["features"], loss_mask=batch["loss_mask"],
            attention_mask=batch["attention_mask"], with_logits=False,
        )
        loss, per_step, preds = self.drafter.train_loss(out, self.hparams.step_decay, with_preds=stage != "train",
                                                        chunk_size=self.hparams.loss_chunk_size,
                                                        objective=self.objective)
        logs = {f"loss_step_{s}": l.detach() for s, l in enumerate(per_step)}
        chains = chain_view(preds, out.labels) if preds else (None, None)
        return StepOutput(loss=loss, logs=logs, preds=chains[0], labels=chains[1])


def chain_view(step_preds: list[torch.Tensor], step_labels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """TTT steps → chains ``[b, T, S+1]``: chain m (real prefix ends at m) has at position k = s+1 the
    step-s output at position m+s (which predicts x_{m+s+1}); position 0 is the known token (no label).

    Step s at m+s attends exactly to what a decoding session has after s own steps from m,
    and its token input is the true x_{m+s}, equal to the draft's own pick whenever the
    chain so far was right: the leading run of correct positions is the greedy acceptance.
    """
    first = step_labels[0]
    b, T = first.shape
    preds = [torch.zeros_like(step_preds[0])]
    labels = [torch.full_like(first, IGNORE_INDEX)]
    for s, (p, l) in enumerate(zip(step_preds, step_labels)):
        pad = torch.full((b, s), IGNORE_INDEX, dtype=l.dtype, device=l.device)
        labels.append(torch.cat([l[:, s:], pad], dim=1)[:, :T])
        preds.append(torch.cat([p[:, s:], torch.zeros_like(pad)], dim=1)[:, :T])
    return torch.stack(preds, dim=-1), torch.stack(labels, dim=-1)
