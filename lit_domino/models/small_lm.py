"""The small draft LM: an independent tiny ``Qwen3ForCausalLM`` with the target's vocabulary.

It has its own embeddings and LM head (tied) and reads no target features: the
classic "small model drafts for a large one" baseline. Shapes: b batch, T
sequence length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from lit_domino.models.base import Drafter, DrafterConfig, DrafterMismatchError
from lit_domino.models.registry import register
from lit_domino.models.sessions import ChainSession, Stage, StageDraft, draft_chain
from lit_domino.models.objectives import DEFAULT_CHUNK_SIZE, IGNORE_INDEX, chunked_ce, token_ce
from lit_domino.target.qwen3 import qwen3_config as build_qwen3_config


@dataclass
class LMOutput:
    logits: torch.Tensor | None
    """[b, T, V] next-token logits at each position; None on the lean path (``with_logits=False``)."""
    labels: torch.Tensor
    """[b, T] x_{t+1} where t+1 < T and loss_mask[t+1] = 1, else -100."""
    hidden: torch.Tensor | None = None
    """[b, T, d] the LM's last hidden states (after its final norm), what its LM head reads."""


@dataclass
class SmallLMConfig(DrafterConfig):
    """A standalone LM's config: its own widths (``from_target`` sizes it from the target), no feature layers."""

    feature_rule: ClassVar[str | None] = None

    @staticmethod
    def shape_for(hidden_size: int, target) -> dict:
        """Heads and MLP width of an LM ``hidden_size`` wide: the target's head width (at least one head)
        and the target's MLP ratio."""
        hf = target.config
        head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
        num_heads = max(1, hidden_size // head_dim)
        return dict(
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
            head_dim=head_dim if num_heads * head_dim == hidden_size else hidden_size // num_heads,
            intermediate_size=max(1, int(round(hidden_size * hf.intermediate_size / hf.hidden_size))),
        )

    @classmethod
    def target_values(cls, target) -> dict:
        """Two layers, half the target's width rounded to its head width (``shape_for``); the target's
        vocabulary, RoPE and position limit."""
        values = super().target_values(target)
        head_dim = values["head_dim"]
        half = max(head_dim, (target.hidden_size // 2) // head_dim * head_dim)
        return {**values, "num_layers": 2, **cls.shape_for(half, target)}

    @classmethod
    def from_target(cls, target, **overrides) -> "SmallLMConfig":
        """As ``DrafterConfig.from_target``; a ``hidden_size`` override re-derives the heads and MLP width
        from it (``shape_for``) unless those are overridden too."""
        if "hidden_size" in overrides:
            overrides = {**cls.shape_for(int(overrides["hidden_size"]), target), **overrides}
        return super().from_target(target, **overrides)

    def qwen3_config(self) -> Qwen3Config:
        """The ``transformers.Qwen3Config`` of this drafter's LM (:func:`lit_domino.target.qwen3.qwen3_config`)."""
        return build_qwen3_config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_positions=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_embeddings=True,
            pad_token_id=None,  # no padding_idx: id 0 may be a real token
        )


class SmallLMSession(ChainSession):
    """Small-LM chain on a Hugging Face ``DynamicCache`` (features are ignored)."""

    def __init__(self, drafter):
        super().__init__(drafter)
        self.cache = DynamicCache(config=drafter.lm.config)
        self._cached = 0  # committed tokens fed into the cache

    def _crop_cache(self, length: int) -> None:
        remove = self.cache.get_seq_length() - length
        if remove > 0:
            self.cache.crop(-remove)  # transformers 5: crop takes a negative count of tokens to remove

    def _drop_stages(self) -> None:
        if self.stages:
            self._crop_cache(self._cached)
            self.stages = []

    def _crop_to(self, length: int) -> None:
        self._cached = min(self._cached, length)
        self._crop_cache(self._cached)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:  # ids [n] -> next-token logits [1, V]
        out = self.drafter.lm(input_ids=ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1:]

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> StageDraft:
        if self.stages:
            start = self.stages[-1].start + self.stages[-1].tokens.numel()
            anchor = self._check_draft(anchor_token, num_tokens, start)
            first = anchor
        else:
            start = self._len
            anchor = self._check_draft(anchor_token, num_tokens, start)
            first = torch.cat([self._tokens[self._cached: self._len], anchor])
            self._cached = self._len
        # the first call feeds the uncached context + anchor, then each pick; the last pick is fed by the
        # next DLoop stage (as its anchor)
        out = draft_chain(lambda prev: self._logits(first if prev is None else prev), num_tokens, temperature,
                          generator)
        self.stages.append(Stage(start, out.tokens))
        return out


@register("small_lm")
class SmallLMDrafter(Drafter):
    """A standalone tiny causal LM drafting token by token; loss: next-token CE on the response tokens."""

    config_class = SmallLMConfig
    session_class = SmallLMSession

    def __init__(self, config: SmallLMConfig):
        super().__init__(config)
        self.lm = Qwen3ForCausalLM(config.qwen3_config())

    def bind_target(self, target) -> "SmallLMDrafter":
        super().bind_target(target)
        if target.vocab_size != self.config.vocab_size:
            raise DrafterMismatchError(f"small LM vocabulary {self.config.vocab_size} != target's {target.vocab_size}")
        return self

    def hf_model(self) -> Qwen3ForCausalLM:
        """The Hugging Face LM itself (what HF assisted generation takes as its assistant)."""
        return self.lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # [b, T, V]

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        loss_mask: torch.Tensor | None = None,  # [b, T]
        attention_mask: torch.Tensor | None = None,  # [b, T]
        with_logits: bool = True,
    ) -> LMOutput:
        """Hidden states and labels; ``with_logits=False`` (the lean path) skips the ``[b, T, V]`` logits
        (``train_loss`` applies the LM head at the labelled positions, chunk by chunk)."""
        if self.train_options.checkpoint_layers != self.lm.is_activation_checkpointing:  # HF's per-layer recompute
            if self.train_options.checkpoint_layers:
                self.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.lm.activation_checkpointing_disable()
        hidden = self.lm.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        logits = self.lm.lm_head(hidden) if with_logits else None
        nxt = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], IGNORE_INDEX)], dim=1)
        ok = nxt != IGNORE_INDEX
        if loss_mask is not None:
            ok &= torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1).bool()
        if attention_mask is not None:
            ok &= torch.cat([attention_mask[:, 1:], torch.zeros_like(attention_mask[:, :1])], dim=1).bool()
        return LMOutput(logits=logits, labels=torch.where(ok, nxt, torch.full_like(nxt, IGNORE_INDEX)), hidden=hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., V]
        return self.lm.lm_head(hidden)

    def batch_loss(self, batch, features, settings, causal_inputs: str = "teacher_forced"):
        """Its next-token CE on the batch's response tokens (no features, no anchors)."""
        out = self.forward_train(batch["input_ids"], batch.get("loss_mask"), batch.get("attention_mask"),
                                 with_logits=settings.chunk_size is None)
        return self.train_loss(out, settings.chunk_size), {}

    def train_loss(self, out: LMOutput, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
        """Mean next-token CE over the labelled (response) tokens: from the materialised logits when the
        forward made them, else the LM head on the labelled rows, ``chunk_size`` at a time."""
        n = (out.labels != IGNORE_INDEX).sum().clamp_min(1)
        if out.logits is not None:
            return token_ce(out.logits, out.labels).sum() / n
        keep = out.labels != IGNORE_INDEX
        y = out.labels[keep]
        (total,), _ = chunked_ce(self.row_logits, [out.hidden[keep]], y, torch.ones_like(y, dtype=torch.float32),
                                 chunk_size)
        return total / n

    @torch.no_grad()
    def next_token_preds(self, out: LMOutput, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
        """Argmax ``[b, T]`` of the next-token logits (at the labelled positions only on the lean path)."""
        if out.logits is not None:
            return out.logits.argmax(-1)
        keep = out.labels != IGNORE_INDEX
        y = out.labels[keep]
        _, picks = chunked_ce(self.row_logits, [out.hidden[keep]], y, torch.ones_like(y, dtype=torch.float32),
                              chunk_size, argmax=0)
        return torch.zeros_like(out.labels).masked_scatter(keep, picks)

    def save_pretrained(self, directory: str | Path) -> Path:
        """config.json + model.safetensors, plus the HF model under ``lm/`` (loadable by transformers)."""
        directory = super().save_pretrained(directory)
        self.lm.save_pretrained(str(directory / "lm"))
        return directory
