"""``DrafterConfig``: one dataclass describing every drafter kind.

A config is plain data (JSON round-trippable through ``to_dict``/``from_dict``);
``DrafterConfig.from_target`` fills the widths from a target so a drafter built
from it can share the target's embedding and LM head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

KINDS = ("backbone", "domino", "eagle3", "small_lm")
"""The drafter kinds: DFlash backbone only, backbone + Domino head, EAGLE-3 chain, small standalone LM."""

FEATURE_KINDS = ("backbone", "domino", "eagle3")
"""Kinds that read target features (and share the target's embedding and LM head)."""


def default_num_feature_layers(num_target_layers: int) -> int:
    """How many DFlash feature layers ``from_target`` picks: 5 for deep targets (the papers'), fewer for tiny ones.

    ``min(5, max(1, L // 4))``: Qwen3-8B (36 layers) → 5, an 8-layer target → 2,
    a 4-layer target → 1 (the DFlash rule degenerates to duplicates below 8 layers).
    """
    return min(5, max(1, num_target_layers // 4))


@dataclass
class DrafterConfig:
    """Everything needed to rebuild a drafter (without its target's weights)."""

    kind: str = "backbone"
    """Drafter kind, one of ``KINDS``. Default: the plain DFlash backbone, the base every variant extends."""

    hidden_size: int = 64
    """Residual width d. Feature drafters must equal the target's (they share its embedding and LM head);
    the small LM has its own. Default 64 = ``lit_domino.testing.random_target``; ``from_target`` overwrites it."""

    vocab_size: int = 256
    """Vocabulary size V (rows of the target's embedding). Default matches the random test target."""

    num_layers: int = 1
    """Draft decoder layers. Default 1: suits a tiny target (DFlash uses 5 for 8B targets, EAGLE-3 exactly 1)."""

    num_heads: int = 4
    """Query heads per attention layer. Default: the random test target's; ``from_target`` copies the target's."""

    num_kv_heads: int = 2
    """Key/value heads (GQA); must divide ``num_heads``. Default: the random test target's."""

    head_dim: int = 16
    """Per-head width. Default hidden_size / num_heads of the random test target; copied by ``from_target``."""

    intermediate_size: int = 128
    """SwiGLU MLP inner width. Default: the random test target's; copied by ``from_target``."""

    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon. Default 1e-6, Qwen3's."""

    rope_theta: float = 10000.0
    """RoPE base. Default 1e4 (the test target's); ``from_target`` copies the target's (1e6 for Qwen3)."""

    max_position_embeddings: int = 512
    """Largest position (exclusive) a drafter may draft at; sessions raise beyond it. Copied from the target."""

    block_size: int = 16
    """Block size B of the parallel drafters: ``[x_last, MASK x (B-1)]`` drafts B-1 tokens. Default 16, the papers'."""

    feature_layers: list[int] = field(default_factory=lambda: [1])
    """Target decoder-layer ids (0-based) whose outputs are concatenated into the features. Default ``[1]``
    (valid for any target with >= 2 layers); ``from_target`` applies the DFlash / EAGLE-3 rule."""

    mask_token_id: int = 255
    """The MASK token id (a row of the target's embedding). Default: the random test target's (last id)."""

    rank: int = 256
    """Domino: rank r of the low-rank logit correction. Default 256, the paper's."""

    gru_hidden: int = 1024
    """Domino: GRU state size d_s. Default 1024, the paper's for an 8B target."""

    ttt_steps: int = 7
    """EAGLE-3: training-time-test unroll depth (= draft chain length trained). Default 7, EAGLE-3's."""

    target_fingerprint: dict = field(default_factory=dict)
    """``Target.fingerprint()`` of the target the drafter was built for; checked by ``bind_target``.
    Empty = not yet bound (the first bind fills it)."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_target(cls, target, kind: str = "backbone", **overrides) -> "DrafterConfig":
        """A config whose widths, heads, RoPE, eps, MLP width and fingerprint come from ``target``.

        Feature layers default to the DFlash rule (``default_num_feature_layers``) for
        backbone/Domino, the EAGLE-3 rule for ``eagle3`` and none for ``small_lm``.
        Any field can be overridden by keyword.
        """
        hf = target.config
        num_heads = int(hf.num_attention_heads)
        rope = getattr(hf, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", None) if isinstance(rope, dict) else None
        if theta is None:
            theta = getattr(hf, "rope_theta", 10000.0)
        if kind == "eagle3":
            layers = target.layer_ids("eagle3")
        elif kind == "small_lm":
            layers = []
        else:
            layers = target.layer_ids("dflash", default_num_feature_layers(target.num_layers))
        values = dict(
            kind=kind,
            hidden_size=int(hf.hidden_size),
            vocab_size=int(target.vocab_size),
            num_heads=num_heads,
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or num_heads),
            head_dim=int(getattr(hf, "head_dim", None) or hf.hidden_size // num_heads),
            intermediate_size=int(hf.intermediate_size),
            rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(hf.max_position_embeddings),
            feature_layers=list(layers),
            mask_token_id=int(target.mask_token_id),
            target_fingerprint=dict(target.fingerprint()),
        )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown DrafterConfig fields {sorted(unknown)}")
        values.update(overrides)
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> "DrafterConfig":
        """Raise ``ValueError`` naming the bad field; returns self when valid."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.rank <= 0:
            raise ValueError(f"rank must be > 0 (the Domino correction's rank r), got {self.rank}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a block is [x_last, MASK x (B-1)]), got {self.block_size}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.gru_hidden <= 0:
            raise ValueError(f"gru_hidden must be > 0 (the Domino GRU state size d_s), got {self.gru_hidden}")
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1 (EAGLE-3 training-time-test steps), got {self.ttt_steps}")
        for name in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.kind in FEATURE_KINDS:
            if not self.feature_layers:
                raise ValueError(f"feature_layers is empty: a {self.kind!r} drafter reads target features; "
                                 "name at least one target decoder layer (0-based)")
            if any(int(j) < 0 for j in self.feature_layers):
                raise ValueError(f"feature_layers must be >= 0, got {self.feature_layers}")
            if self.kind == "eagle3" and len(self.feature_layers) != 3:
                raise ValueError(f"an eagle3 drafter fuses exactly 3 feature layers (low, middle, high), "
                                 f"got {self.feature_layers}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self

    # ------------------------------------------------------------------ (de)serialisation

    @property
    def num_features(self) -> int:
        """n: how many target layers are concatenated in the features."""
        return len(self.feature_layers)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DrafterConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown DrafterConfig fields {sorted(unknown)} (written by a newer lit_domino?)")
        config = cls(**{k: (list(v) if k == "feature_layers" else v) for k, v in data.items()})
        return config.validate()
