"""``SmallLMDrafter``: an independent tiny ``Qwen3ForCausalLM`` with the target's vocabulary.

It has its own embeddings and LM head (tied) and reads no target features: the
classic "small model drafts for a large one" baseline. Shapes: b batch, T
sequence length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lit_domino.models.backbone import IGNORE_INDEX
from lit_domino.models.config import DrafterConfig
from lit_domino.models.io import DrafterBase


@dataclass
class LMOutput:
    logits: torch.Tensor
    """[b, T, V] next-token logits at each position."""
    labels: torch.Tensor
    """[b, T] x_{t+1} where t+1 < T and loss_mask[t+1] = 1, else -100."""


def qwen3_config(config: DrafterConfig):
    """The ``transformers.Qwen3Config`` of a small-LM drafter config."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=True,
        pad_token_id=None,  # no padding_idx: id 0 may be a real token
    )


class SmallLMDrafter(DrafterBase):
    """A standalone tiny causal LM drafting token by token."""

    kind = "small_lm"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        from transformers import Qwen3ForCausalLM

        self.lm = Qwen3ForCausalLM(qwen3_config(config))

    @classmethod
    def from_target(cls, target, num_layers: int = 2, hidden_size: int | None = None, **overrides) -> "SmallLMDrafter":
        """A fresh small LM for ``target``'s vocabulary.

        ``hidden_size`` defaults to half the target's (rounded to the target's head
        width, at least one head); heads keep the target's head width; the MLP keeps
        the target's width ratio.
        """
        hf = target.config
        head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
        if hidden_size is None:
            hidden_size = max(head_dim, (target.hidden_size // 2) // head_dim * head_dim)
        num_heads = max(1, hidden_size // head_dim)
        values = dict(
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
            head_dim=head_dim if num_heads * head_dim == hidden_size else hidden_size // num_heads,
            intermediate_size=max(1, int(round(hidden_size * hf.intermediate_size / hf.hidden_size))),
        )
        values.update(overrides)
        config = DrafterConfig.from_target(target, "small_lm", **values)
        return cls(config).bind_target(target)

    def bind_target(self, target) -> "SmallLMDrafter":
        super().bind_target(target)
        if target.vocab_size != self.config.vocab_size:
            from lit_domino.models.io import DrafterMismatchError

            raise DrafterMismatchError(f"small LM vocabulary {self.config.vocab_size} != target's {target.vocab_size}")
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # [b, T, V]

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        loss_mask: torch.Tensor | None = None,  # [b, T]
        attention_mask: torch.Tensor | None = None,  # [b, T]
    ) -> LMOutput:
        logits = self(input_ids, attention_mask)
        nxt = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], IGNORE_INDEX)], dim=1)
        ok = nxt != IGNORE_INDEX
        if loss_mask is not None:
            ok &= torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1).bool()
        if attention_mask is not None:
            ok &= torch.cat([attention_mask[:, 1:], torch.zeros_like(attention_mask[:, :1])], dim=1).bool()
        return LMOutput(logits=logits, labels=torch.where(ok, nxt, torch.full_like(nxt, IGNORE_INDEX)))

    def save_pretrained(self, directory: str | Path) -> Path:
        """config.json + model.safetensors, plus the HF model under ``lm/`` (loadable by transformers)."""
        directory = super().save_pretrained(directory)
        self.lm.save_pretrained(str(directory / "lm"))
        return directory

    def new_session(self):
        from lit_domino.models.sessions import SmallLMSession

        return SmallLMSession(self)
