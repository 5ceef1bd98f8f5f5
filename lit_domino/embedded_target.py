"""The embedded target's recipes, and the built copy the suite ships.

The field trains a target once and ships it; so does this suite. ``TARGET_PRESETS`` holds the recipes
(every field of a :class:`TinyTargetConfig` determines the build, and its hash keys the artifact cache);
:mod:`lit_domino.tiny_target` builds one from scratch. The ``default`` recipe's build ships with the package
under ``lit_domino/assets/targets/default/`` (weights, tokenizer, ``target_card.json`` with the recipe,
the build report and a SHA-256 per file, and ``TARGET_CARD.md``), so ``load_target("embedded:default")``
loads it in seconds instead of training it, and every machine measures against the same target.

Target specs: ``embedded:<preset>`` is the shipped build when one exists for exactly that recipe, else the
recipe's own build (cached); ``embedded:<preset>@recipe`` always the recipe's own build.
``python experiments/build_target.py --preset default --ship`` rebuilds the shipped copy.

This module is light (no torch, no Lightning): the shipped copy is resolved before anything heavy loads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from lit_domino.cache import config_hash, to_jsonable
from lit_domino.runtime.command import UsageError

SHIPPED_ROOT = Path(__file__).resolve().parent / "assets" / "targets"
"""Where the shipped builds live: one folder per recipe name (package data)."""
CARD_NAME = "target_card.json"
RECIPE_SUFFIX = "@recipe"
"""``embedded:default@recipe``: the recipe's own build, never the shipped copy."""
REBUILD_HINT = ("reinstall lit_domino, rebuild the shipped copy with `python experiments/build_target.py --preset "
                "{name} --ship` (about an hour on 2 CPU cores), or use the recipe's own build: "
                "data.target=embedded:{name}@recipe")


class ShippedTargetError(UsageError):
    """A shipped target file that is missing or does not match its recorded SHA-256."""


@dataclass(frozen=True)
class TinyTargetConfig:
    """Everything that determines the embedded target (its hash keys the cache)."""

    name: str = "default"
    """Human-readable tag in the cache directory name."""
    vocab_size: int = 4096
    """BPE vocabulary; 4096 keeps the LM head cheap on CPU while words stay whole."""
    hidden_size: int = 192
    """Model width d (drafters share it). 192: the width at which 2,000 steps reach ~80 % greedy math accuracy
    on two CPU cores (the 128-wide recipe, preset ``small``, reached 20 % in 1,600 steps). Affordable since
    the default target ships built (``shipped_target``): the first command no longer trains it."""
    num_layers: int = 8
    """Depth: 8 gives distinct DFlash ([1, 3, 5]) and EAGLE-3 ([1, 3, 4]) feature layers, and a
    target step costs several draft steps, as it does at 8B scale."""
    num_heads: int = 4
    num_kv_heads: int = 2
    """Grouped-query attention as in Qwen3 (2 query heads per KV head)."""
    head_dim: int = 48
    intermediate_size: int = 576
    """SwiGLU width, 3 x hidden."""
    max_positions: int = 1024
    """Context length: prompt + response of every embedded example fits."""
    rope_theta: float = 10000.0
    examples_per_domain: tuple[tuple[str, int | None], ...] = (("math", 20000), ("code", None), ("chat", None))
    """Training examples per corpus domain (None = all of the train split)."""
    corpus_seed: int = 0
    seq_len: int = 256
    """Training window length (documents packed back to back)."""
    batch_size: int = 16
    """Windows per step (16 x 256 = 4,096 tokens)."""
    max_steps: int = 2000
    """Optimizer steps: ~8.2M tokens (~2.7 passes over the corpora). Measured on the 128-wide recipe (math
    accuracy on 50 held-out problems): 0 % at step 400, 2 % at 800, 12 % at 1200, 20 % at 1600: width and
    tokens, not steps alone, make the target competent."""
    lr: float = 3e-3
    """Peak AdamW learning rate; tiny models tolerate (and need) a high one."""
    warmup_ratio: float = 0.05
    weight_decay: float = 0.1
    seed: int = 0
    eval_examples: int = 200
    """Held-out examples per domain for perplexity and math accuracy (200: ~3 % standard error)."""

    def __post_init__(self):
        if min(self.hidden_size, self.num_layers, self.head_dim, self.max_steps, self.seq_len) <= 0:
            raise ValueError(f"sizes must be positive: {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    def tokenizer_config(self) -> dict:
        return {"vocab_size": self.vocab_size, "examples": self.examples_per_domain, "seed": self.corpus_seed}


TARGET_PRESETS: dict[str, TinyTargetConfig] = {
    # CI-sized: trains in about a minute; competent enough to give drafters structure.
    "smoke": TinyTargetConfig(
        name="smoke",
        vocab_size=2048,
        hidden_size=96,
        num_layers=6,
        num_heads=2,
        num_kv_heads=1,
        head_dim=48,
        intermediate_size=288,
        max_positions=1024,
        examples_per_domain=(("math", 3000), ("code", 1500), ("chat", 1500)),
        seq_len=192,
        batch_size=16,
        max_steps=150,
        eval_examples=30,
    ),
    # 4.3M params, ~80 % greedy math accuracy; shipped built (lit_domino/assets/targets/default/).
    "default": TinyTargetConfig(),
    # The default target of 2026-12-01..03 (2.1M params, ~9 min on 2 cores, 11.5 % greedy math accuracy):
    # cheap enough to build inside the first command, too weak for the papers' regime.
    "small": TinyTargetConfig(name="small", hidden_size=128, head_dim=32, intermediate_size=384, batch_size=8,
                              max_steps=1600),
}


def preset_config(name: str) -> TinyTargetConfig:
    if name not in TARGET_PRESETS:
        raise UsageError(f"unknown embedded target preset {name!r}; choose one of {sorted(TARGET_PRESETS)}")
    return TARGET_PRESETS[name]




def parse_spec(tail: str) -> tuple[TinyTargetConfig, bool]:
    """``"default"`` → (its recipe, False); ``"default@recipe"`` → (its recipe, True: never the shipped copy)."""
    from_recipe = tail.endswith(RECIPE_SUFFIX)
    return preset_config(tail[: -len(RECIPE_SUFFIX)] if from_recipe else tail), from_recipe


def recipe_tag(cfg: TinyTargetConfig) -> str:
    """The recipe's cache tag, ``<name>-<hash>`` (the folder :func:`lit_domino.tiny_target.target_dir` builds)."""
    return f"{cfg.name}-{config_hash(cfg)}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_card(folder: Path) -> dict | None:
    card = folder / CARD_NAME
    return json.loads(card.read_text()) if card.is_file() else None


def shipped_target(cfg: TinyTargetConfig, *, root: Path = SHIPPED_ROOT) -> Path | None:
    """The verified shipped build of ``cfg``, or None when none ships for exactly this recipe.

    Every file listed in the card is hashed (~20 ms for the default's): a missing or altered file is a
    :class:`ShippedTargetError` naming it and the rebuild command, never a silently different target.
    """
    folder = root / cfg.name
    card = read_card(folder)
    if card is None:
        return None
    if card.get("recipe") != to_jsonable(cfg):
        return None  # the preset's recipe changed since the copy was built: the recipe's own build serves
    hint = REBUILD_HINT.format(name=cfg.name)
    for name, digest in card["files"].items():
        path = folder / name
        if not path.is_file():
            raise ShippedTargetError(f"the shipped target file {path} is missing; {hint}")
        if _sha256(path) != digest:
            raise ShippedTargetError(f"the shipped target file {path} is corrupt (its SHA-256 differs from "
                                     f"{CARD_NAME}'s); {hint}")
    return folder


def identity(tail: str) -> str:
    """What names the target ``embedded:<tail>`` in cache keys: the recipe's tag, plus the shipped weights'
    hash when the shipped copy serves (another machine's rebuild is another target: its drafters differ)."""
    cfg, from_recipe = parse_spec(tail)
    folder = None if from_recipe else shipped_target(cfg)
    if folder is None:
        return recipe_tag(cfg)
    return f"{recipe_tag(cfg)}+shipped-{read_card(folder)['files']['model.safetensors'][:12]}"
