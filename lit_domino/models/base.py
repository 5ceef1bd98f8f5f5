"""What every drafter shares: the config fields taken from the target, target binding, saving.

A method (``backbone.py``, ``domino.py``, ``eagle.py``, ``small_lm.py``) subclasses
:class:`DrafterConfig` with its own fields and :class:`Drafter` with its module, its
decoding session and its loss, and registers the drafter class (``registry.register``).

A drafter directory holds ``config.json`` (``config.to_dict()``, which names the kind)
and ``model.safetensors`` (the drafter's own parameters only: the target's embedding and
LM head are never saved); ``lit_domino.models.io`` reads it back.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import save_model
from torch import nn

from lit_domino.models import registry
from lit_domino.models.capabilities import Capabilities
from lit_domino.models.layers import TrainOptions
from lit_domino.models.objectives import DEFAULT_CHUNK_SIZE, chunked_ce, label_rows
from lit_domino.runtime.command import UsageError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FINGERPRINT_FIELDS = ("hidden_size", "vocab_size", "tokenizer_hash", "mask_token_id")
"""Fingerprint fields ``bind_target`` compares (a drafter trained for one target must not run on another)."""

LEGACY_FIELDS = ("rank", "gru_hidden", "ttt_steps")
"""Method-specific keys that the flat config of lit_domino <= 0.1 wrote for every kind; ``from_dict`` moves
them to the method that owns them and drops them elsewhere, so older drafter directories still load."""


class DrafterMismatchError(UsageError):
    """A drafter bound to a target it was not built for (fingerprint mismatch)."""


class DrafterLoadError(UsageError):
    """A drafter directory that exists but cannot be read (corrupt config or weights)."""


def default_num_feature_layers(num_target_layers: int) -> int:
    """How many DFlash feature layers ``from_target`` picks: 5 for deep targets (the papers'), fewer for tiny ones.

    ``min(5, max(1, L // 4))``: Qwen3-8B (36 layers) → 5, an 8-layer target → 2,
    a 4-layer target → 1 (the DFlash rule degenerates to duplicates below 8 layers).
    """
    return min(5, max(1, num_target_layers // 4))


def _replace_nested(config, overrides: dict):
    """``dataclasses.replace`` that merges dict values into nested dataclass fields (``head={"rank": 8}``)."""
    known = {f.name for f in dataclasses.fields(config)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown {type(config).__name__} fields {sorted(unknown)}; known: {sorted(known)}")
    values = {}
    for name, value in overrides.items():
        current = getattr(config, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            value = _replace_nested(current, value)
        values[name] = value
    return dataclasses.replace(config, **values)


@dataclass
class DrafterConfig:
    """The fields every drafter has. ``from_target`` fills them from a target so a drafter built
    from it can share the target's embedding and LM head; methods add their own fields."""

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
    """Tokens per verification B: a parallel block ``[x_last, MASK x (B-1)]`` drafts B-1 tokens, a chain drafter
    drafts B-1 tokens per round by default. Default 16, the papers'."""

    feature_layers: list[int] = field(default_factory=lambda: [1])
    """Target decoder-layer ids (0-based) whose outputs are concatenated into the features. Default ``[1]``
    (valid for any target with >= 2 layers); ``from_target`` applies the method's rule (``feature_rule``)."""

    mask_token_id: int = 255
    """The MASK token id (a row of the target's embedding). Default: the random test target's (last id)."""

    target_fingerprint: dict = field(default_factory=dict)
    """``Target.fingerprint()`` of the target the drafter was built for; checked by ``bind_target``.
    Empty = not yet bound (the first bind fills it)."""

    feature_rule: ClassVar[str | None] = "dflash"
    """How ``from_target`` picks ``feature_layers``: ``"dflash"`` (evenly spaced, ``default_num_feature_layers``),
    ``"eagle3"`` (low, middle, high) or None (the drafter reads no target features)."""

    # ------------------------------------------------------------------ construction

    @property
    def kind(self) -> str:
        """The registered kind of the drafter this config builds."""
        for kind in registry.kinds():
            if registry.config_class(kind) is type(self):
                return kind
        raise ValueError(f"{type(self).__name__} is the config of no registered drafter")

    @property
    def reads_features(self) -> bool:
        """Whether the drafter reads target features (and shares the target's embedding and LM head)."""
        return self.feature_rule is not None

    @property
    def num_features(self) -> int:
        """n: how many target layers are concatenated in the features (under the ``dspark`` rule every feature
        layer but the last, which carries the target's distribution)."""
        return len(self.feature_layers) - (1 if self.feature_rule == "dspark" else 0)

    @classmethod
    def target_values(cls, target) -> dict:
        """The fields ``from_target`` takes from ``target`` (widths, heads, RoPE, eps, fingerprint, layers)."""
        hf = target.config
        num_heads = int(hf.num_attention_heads)
        rope = getattr(hf, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", None) if isinstance(rope, dict) else None
        if theta is None:
            theta = getattr(hf, "rope_theta", 10000.0)
        if cls.feature_rule == "eagle3":
            layers = target.layer_ids("eagle3")
        elif cls.feature_rule in ("dflash", "dspark"):
            layers = target.layer_ids(cls.feature_rule, default_num_feature_layers(target.num_layers))
        else:
            layers = []
        return dict(
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

    @classmethod
    def from_target(cls, target, **overrides) -> "DrafterConfig":
        """A config whose shared fields come from ``target`` (``target_values``); any field can be overridden
        by keyword, nested method sections by a dict (``head={"rank": 8}``)."""
        config = _replace_nested(cls(**cls.target_values(target)), overrides)
        return config.validate()

    def replace(self, **overrides) -> "DrafterConfig":
        """A validated copy with ``overrides`` (nested sections merge from dicts)."""
        return _replace_nested(self, overrides).validate()

    def validate(self) -> "DrafterConfig":
        """Raise ``ValueError`` naming the bad field; returns self when valid. Methods extend it."""
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a block is [x_last, MASK x (B-1)]), got {self.block_size}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        for name in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.reads_features:
            if not self.feature_layers:
                raise ValueError(f"feature_layers is empty: a {self.kind!r} drafter reads target features; "
                                 "name at least one target decoder layer (0-based)")
            if any(int(j) < 0 for j in self.feature_layers):
                raise ValueError(f"feature_layers must be >= 0, got {self.feature_layers}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict:
        """JSON-ready dict, ``kind`` first (what ``from_dict`` dispatches on)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}

    @staticmethod
    def from_dict(data: dict) -> "DrafterConfig":
        """The config of ``data["kind"]``'s method (older flat configs included, see ``LEGACY_FIELDS``)."""
        data = dict(data)
        kind = data.pop("kind", None)
        if kind is None:
            raise ValueError("the config names no drafter kind ('kind' is missing)")
        cls = registry.config_class(kind)
        known = {f.name for f in dataclasses.fields(cls)}
        legacy = {k: data.pop(k) for k in LEGACY_FIELDS if k in data and k not in known}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)} (written by a newer lit_domino?)")
        config = cls()
        nested = {f.name: data.pop(f.name) for f in dataclasses.fields(cls)
                  if f.name in data and dataclasses.is_dataclass(getattr(config, f.name))}
        config = dataclasses.replace(config, **{k: (list(v) if k == "feature_layers" else v) for k, v in data.items()})
        config = _replace_nested(config, {**cls.from_legacy(legacy), **nested})
        return config.validate()

    @classmethod
    def from_legacy(cls, legacy: dict) -> dict:
        """Overrides for this method from the flat fields of an older config (``LEGACY_FIELDS``); none by default."""
        return {}


class Drafter(nn.Module):
    """Common drafter plumbing: config, target binding, saving, sessions.

    The bound target's embedding and LM head live in a plain tuple attribute, so
    they are neither parameters nor ``state_dict`` entries (frozen, never saved).

    A method sets ``config_class`` and ``session_class`` and implements its training
    forward and loss; the capability attributes below tell generic code what it can do.
    """

    kind: ClassVar[str] = "?"
    """Set by ``registry.register``."""

    config_class: ClassVar[type] = DrafterConfig
    session_class: ClassVar[type | None] = None
    """The per-sequence decoding state (``lit_domino.models.sessions``)."""

    supports_loop_training: ClassVar[bool] = False
    """Whether DLoop's loop-aware training applies (the drafter's own hidden states can stand in for target
    features): ``loop_forward`` and ``block_loss`` exist."""

    uses_curriculum: ClassVar[bool] = False
    """Whether the method's loss has a λ-weighted base term (Domino's base-anchored curriculum)."""

    draft_options: ClassVar[tuple[str, ...]] = ()
    """Decoding options the method's session takes (``new_session(**options)``; Domino: ``pool_size``)."""

    keeps_block_hidden: ClassVar[bool] = False
    """Whether its sessions keep each stage's block hidden states (``session.stages[-1].hidden``, a
    ``ParallelSession``'s): what an acceptance predictor reads."""

    tree_builders: ClassVar[tuple[str, ...]] = ()
    """Tree builders (:mod:`lit_domino.decoding.tree`) the method's session supports: ``chain`` and ``ddtree``
    need a parallel block (``draft_hidden``), ``path`` a causal head (``path_head``), ``eagle`` (and ``path`` on
    EAGLE-3) the drafter's own steps over the tree (``tree_head``); none: no tree rounds."""

    def capabilities(self):
        """What this drafter can do (:class:`lit_domino.models.capabilities.Capabilities`), from the declarations
        above; a method with an instance-dependent capability (a configured head) extends it."""
        builders, options = tuple(self.tree_builders), tuple(self.draft_options)
        return Capabilities(
            kind=self.kind, tree_builders=builders, path_head="path" in builders and "eagle" not in builders,
            tree_head="eagle" in builders, block_hidden=bool(self.keeps_block_hidden),
            pool="pool_size" in options, static_block="static_capacity" in options, compile="compile" in options,
            loop_training=bool(self.supports_loop_training))

    @classmethod
    def stage_tokens(cls, config: DrafterConfig, requested: int | None = None) -> int:
        """Tokens K one DLoop stage drafts (loop-capable methods): ``block_size - 1`` unless the method lets
        a caller choose (``requested``)."""
        K = config.block_size - 1
        if requested not in (None, K):
            raise ValueError(f"a {cls.kind} stage drafts block_size - 1 = {K} tokens, got stage_tokens={requested}")
        return K

    def __init__(self, config: DrafterConfig):
        super().__init__()
        if type(config) is not self.config_class:  # a DominoConfig builds a Domino drafter, never a bare backbone
            raise ValueError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        config.validate()
        self.config = config
        self._bound: tuple = ()  # (embed, lm_head, target) once bound
        self.train_options = TrainOptions()  # how the training forward computes (not saved: never changes results)

    # ------------------------------------------------------------------ target binding

    def bind_target(self, target) -> "Drafter":
        """Check the fingerprint and attach the target's frozen embedding and LM head; returns self."""
        cfg = self.config
        if cfg.target_fingerprint:
            check_fingerprint(cfg.target_fingerprint, target)
        else:
            fp = target.fingerprint()
            if cfg.reads_features and (fp["hidden_size"] != cfg.hidden_size or fp["vocab_size"] != cfg.vocab_size):
                raise DrafterMismatchError(
                    f"drafter widths (hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size}) do not match "
                    f"target {target.name!r} (hidden_size={fp['hidden_size']}, vocab_size={fp['vocab_size']})"
                )
            cfg.target_fingerprint = dict(fp)
        if cfg.reads_features:
            bad = [j for j in cfg.feature_layers if not 0 <= j < target.num_layers]
            if bad:
                raise DrafterMismatchError(
                    f"feature layers {bad} do not exist in target {target.name!r} ({target.num_layers} layers)"
                )
        self._bound = (target.embed, target.lm_head, target)
        return self

    @property
    def is_bound(self) -> bool:
        return bool(self._bound)

    def _need_bound(self):
        if not self._bound:
            raise RuntimeError(f"{type(self).__name__} is not bound to a target: call drafter.bind_target(target) "
                               "(or load_drafter(dir, target=target)) first")
        return self._bound

    @property
    def embed(self) -> nn.Module:
        """The target's (frozen) input embedding."""
        return self._need_bound()[0]

    @property
    def lm_head(self) -> nn.Module:
        """The target's (frozen) LM head."""
        return self._need_bound()[1]

    @property
    def target(self):
        return self._need_bound()[2]

    def __getstate__(self):  # pickling never drags the target along (re-bind after unpickling)
        state = dict(self.__dict__)
        state["_bound"] = ()
        return state

    def __deepcopy__(self, memo):  # copies (e.g. EMA) share the bound target instead of copying it
        memo[id(self._bound)] = self._bound
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    # ------------------------------------------------------------------ views, sessions, saving

    # ------------------------------------------------------------------ lean training outputs

    def batch_loss(self, batch: dict, features: torch.Tensor | None, settings, causal_inputs: str = "teacher_forced"):
        """One training step's loss on a DataModule batch (``input_ids``, ``loss_mask``, ``attention_mask``,
        ``anchors``, ``anchor_mask``) and its target ``features`` -> (loss, parts): the method's forward and loss,
        lean unless ``settings.chunk_size`` is None (what the memory benchmark runs for every method)."""
        raise NotImplementedError(f"{type(self).__name__} has no batch_loss")

    def row_inputs(self, out) -> list[torch.Tensor]:
        """What :meth:`row_logits` reads per position of a block output, each ``[..., B, *]`` (``hidden``)."""
        return [out.hidden]

    def row_logits(self, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rows of :meth:`row_inputs` → their logits, the drafted-from ones last (default: ``compute_logits``)."""
        return (self.compute_logits(rows[0]),)

    @torch.no_grad()
    def block_preds(self, out, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
        """Argmax ``[b, A, B]`` of the drafted-from logits of a block output (validation metrics); on the lean
        path (no logits materialised) only at the labelled positions, chunk by chunk (0 elsewhere, which the
        metrics never read)."""
        if out.logits is not None:
            return out.draft_logits.argmax(-1)
        keep, y, w = label_rows(out.labels)
        rows = [x[keep] for x in self.row_inputs(out)]
        _, picks = chunked_ce(self.row_logits, rows, y, w, chunk_size, argmax=-1)
        return torch.zeros_like(out.labels).masked_scatter(keep, picks)

    def base_view(self) -> "Drafter | None":
        """The drafter without its correction, decoded alone (does Domino's backbone stand on its own?);
        None for methods that have no such part."""
        return None

    def hf_model(self):
        """A Hugging Face causal LM that HF assisted generation can take as its assistant; None for methods that
        are no standalone LM."""
        return None

    def new_session(self, **options):
        """A fresh per-sequence decoding state (``lit_domino.models.sessions``); ``options``: the method's
        ``draft_options`` (anything else is an error naming the options it takes)."""
        unknown = sorted(set(options) - set(self.draft_options))
        if unknown:
            takes = ", ".join(self.draft_options) or "none"
            raise ValueError(f"a {self.kind} drafter takes no decoding option {unknown} (it takes: {takes})")
        return self.session_class(self, **options)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (own parameters only) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2, sort_keys=True))
        save_model(self, str(directory / WEIGHTS_NAME), metadata={"kind": self.kind, "format": "lit_domino"})
        return directory

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


def check_fingerprint(expected: dict, target) -> None:
    """Raise ``DrafterMismatchError`` naming every mismatching fingerprint field with both values."""
    actual = target.fingerprint()
    bad = [f"{k}: drafter was built for {expected.get(k)!r}, target has {actual.get(k)!r}"
           for k in FINGERPRINT_FIELDS if k in expected and expected.get(k) != actual.get(k)]
    if bad:
        raise DrafterMismatchError(
            f"drafter does not match target {getattr(target, 'name', '?')!r}: " + "; ".join(bad)
        )
