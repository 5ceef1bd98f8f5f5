"""The rehearsal target: Qwen3-8B's shape where the pipeline sees it, narrow and shallow enough for a CPU.

The ``rehearsal`` preset (``lit_domino/configs/presets/rehearsal.yaml``) runs every setting of ``paper`` on this
target (``data.target: embedded:rehearsal``) instead of ``Qwen/Qwen3-8B``. What it keeps of Qwen3-8B
(:data:`QWEN3_8B`, its ``config.json`` values as stated in ``docs/paper-rehearsal.md``; nothing is fetched):

* the vocabulary: 151,936 embedding and LM-head rows, untied, most of them padding beyond the tokenizer as in
  Qwen3 (whose tokenizer ends at 151,668): the drafters' MASK token (``<|MASK|>``, added by
  ``lit_domino.target.load.resolve_mask_token``) gets a row there, as DFlash's does on Qwen3-8B;
* the attention layout: grouped-query attention with 32 query heads over 8 KV heads, q/k RMSNorm (Qwen3's), no
  bias; ``head_dim`` 128 at the GPU check's size (``embedded:rehearsal-large``), 16 at the CPU size (see
  :attr:`ShapedTargetConfig.head_dim`);
* RoPE: ``rope_theta`` 1e6, no scaling, ``max_position_embeddings`` 40,960, ``rms_norm_eps`` 1e-6;
* the tokenizer's special tokens (Qwen3's 26, in Qwen3's order; EOS ``<|im_end|>``, pad ``<|endoftext|>``, no BOS,
  generation stops at either) and the chat template with the thinking toggle (:data:`CHAT_TEMPLATE`:
  ``enable_thinking=False`` closes an empty ``<think>`` block in the generation prompt; the reasoning of past
  assistant turns is dropped, as Qwen3's template does).

What it scales: the width (``hidden_size`` 64, not 4,096), the depth (8 layers, not 36: the least depth at which the
paper's DFlash rule with ``num_feature_layers: 5`` picks 5 distinct layers, ``[1, 2, 3, 4, 5]``, as it picks
``[1, 9, 17, 25, 33]`` on 36; 4 to 7 layers repeat some), the MLP (3 x width, Qwen3-8B's 12,288 = 3 x 4,096) and
the tokenizer's merges (byte-level BPE with none: 256 byte tokens, then Qwen3's special tokens at 256..281 instead of
151,643..151,668; a served answer's text re-tokenizes to exactly the ids the target generated, which a BPE with
merges does not promise for an untrained model's output).

Built here, offline, in seconds, with random weights (:func:`build_model`): its greedy answers are gibberish that
varies with the prompt, repeats in places and sometimes ends with ``<|im_end|>``. Cached like the embedded targets
(``target/<name>-<hash>/``) and named ``embedded:<name>`` (``lit_domino.target.embedded.preset_config`` finds
:data:`SHAPED_TARGETS`).

Importing this module is light (no torch): the embedded targets' registry reads :data:`SHAPED_TARGETS`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "rope_scaling": None, "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False,
    "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}
"""Qwen3-8B's ``config.json`` (the values that shape a model), as the docs state them; the rehearsal keeps those
of :data:`KEPT_FROM_QWEN3_8B` and scales the rest."""

KEPT_FROM_QWEN3_8B = ("vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                      "max_position_embeddings", "rope_theta", "rope_scaling", "rms_norm_eps", "attention_bias",
                      "tie_word_embeddings", "use_sliding_window")
"""The Qwen3-8B config values every shaped target keeps (checked by the tests against the saved config)."""

QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
"""Qwen3's added tokens in id order (151,643 .. 151,668 there; 256 .. 281 here, after the 256 byte tokens). The
``<|...|>`` ones are special (dropped by ``skip_special_tokens``); the tool and think tags are not, as in Qwen3."""

EOS, PAD = "<|im_end|>", "<|endoftext|>"
"""Qwen3's tokenizer: ``<|im_end|>`` ends a turn, ``<|endoftext|>`` pads; no BOS."""

CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- set reasoning = '' -%}"
    "{%- if m.reasoning_content is defined and m.reasoning_content is not none -%}"
    "{%- set reasoning = m.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = ((content.split('</think>') | first).rstrip('\\n').split('<think>') | last).lstrip('\\n') -%}"
    "{%- set content = (content.split('</think>') | last).lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
"""Qwen3's chat format without tool calls: ``<|im_start|>role\\n...<|im_end|>\\n`` turns, a system turn first,
the reasoning of assistant turns before the last user turn dropped (kept, in ``<think>``, after it), and the
generation prompt ``<|im_start|>assistant\\n`` followed by an empty ``<think>\\n\\n</think>\\n\\n`` when
``enable_thinking`` is false (the suite's setting: ``lit_domino.target.load.CHAT_TEMPLATE_KWARGS``)."""

@dataclass(frozen=True)
class ShapedTargetConfig:
    """A Qwen3-8B-shaped random target at a chosen width and depth (every field is in its cache key)."""

    name: str = "rehearsal"
    """Its ``embedded:<name>`` and the tag of its cache folder."""
    hidden_size: int = 64
    """Width d (Qwen3-8B: 4,096): the LM head's 151,936 x d is what a CPU step pays for."""
    num_layers: int = 8
    """Depth (Qwen3-8B: 36): 8 is the least at which the paper's 5 DFlash feature layers are distinct."""
    intermediate_size: int = 192
    """SwiGLU width: 3 x d, Qwen3-8B's ratio."""
    num_heads: int = QWEN3_8B["num_attention_heads"]
    """Query heads: Qwen3-8B's 32."""
    num_kv_heads: int = QWEN3_8B["num_key_value_heads"]
    """KV heads: Qwen3-8B's 8 (4 query heads per KV head)."""
    head_dim: int = 16
    """Qwen3-8B's is 128; at 128 the 32 heads make attention 64x wider than d = 64, and a training step of this
    model was several times slower than at 16 (measured: docs/results.md), so the CPU size narrows the heads,
    keeping their number and grouping; the GPU check's size keeps 128."""
    vocab_size: int = QWEN3_8B["vocab_size"]
    max_positions: int = QWEN3_8B["max_position_embeddings"]
    rope_theta: float = QWEN3_8B["rope_theta"]
    rms_norm_eps: float = QWEN3_8B["rms_norm_eps"]
    layer_std: float = 0.2
    """Std of the redrawn decoder matrices (see :func:`build_model`)."""
    embed_std: float = 0.3
    """Std of the redrawn embedding and LM-head rows."""
    seed: int = 0

    def build(self, root: Path | None = None, progress: bool = True, callbacks=()) -> Path:
        """Build (or reuse) this target; the embedded-target loader calls it with the recipe's arguments
        (``progress``, ``callbacks``: unused, the build is seconds)."""
        return build_shaped_target(self, root=root)


SHAPED_TARGETS: dict[str, ShapedTargetConfig] = {
    "rehearsal": ShapedTargetConfig(),
    # the GPU check's size (experiments/gpu/check.py): Qwen3-8B's attention whole (32 x 128 over 8 KV heads)
    "rehearsal-large": ShapedTargetConfig(name="rehearsal-large", hidden_size=512, num_layers=12,
                                          intermediate_size=1536, head_dim=128),
}
"""The shaped targets by name (``embedded:rehearsal``, ``embedded:rehearsal-large``)."""


# --------------------------------------------------------------------------- the build (torch from here on)


def shaped_tokenizer():
    """Byte-level BPE without merges, Qwen3's special tokens after the 256 bytes, Qwen3's chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in enumerate(_byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=t.startswith("<|"), normalized=False) for t in QWEN3_SPECIAL_TOKENS])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                      clean_up_tokenization_spaces=False, padding_side="left")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _byte_chars() -> list[str]:
    """The byte-level alphabet in byte order (byte b -> token id b): printable bytes stand for themselves, the
    others for the code points from 256 up (the mapping every byte-level BPE uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def emitted_ids(tokenizer) -> list[int]:
    """The ids the target may generate: printable ASCII, newline and EOS (whole characters only, so a served
    answer's text re-tokenizes to the generated ids, and never a special token that decoding would drop)."""
    return [10, *range(32, 127), tokenizer.convert_tokens_to_ids(EOS)]


def build_model(cfg: ShapedTargetConfig, tokenizer):
    """The random Qwen3 (fp32) with Qwen3-8B's layout at ``cfg``'s width and depth.

    Transformers' own init (std 0.02) makes every answer one repeated token; the decoder's matrices are redrawn
    with std :attr:`~ShapedTargetConfig.layer_std` and the embeddings with :attr:`~ShapedTargetConfig.embed_std`
    so that answers vary with the prompt and mix repeats (which drafters learn) with changes (which they miss).
    The LM head is zero outside :func:`emitted_ids`: the padding rows (MASK's included) score 0, below the
    emitted rows' best, so they are never a greedy pick, as in a trained Qwen3."""
    import torch
    from transformers import Qwen3ForCausalLM

    from lit_domino.target.qwen3 import qwen3_config

    torch.manual_seed(cfg.seed)
    config = qwen3_config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_positions=cfg.max_positions, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_embeddings=False, use_sliding_window=False, eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD), bos_token_id=tokenizer.convert_tokens_to_ids(PAD))
    model = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    keep = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    keep[emitted_ids(tokenizer)] = True
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * cfg.layer_std)
        for w in (model.model.embed_tokens.weight, model.lm_head.weight):
            w.copy_(torch.randn(w.shape, generator=gen) * cfg.embed_std)
        model.lm_head.weight[~keep] = 0.0
    return model


def target_dir(cfg: ShapedTargetConfig, root: Path | None = None) -> Path:
    """Where ``cfg``'s build lives: the embedded targets' folder scheme (``lit_domino.target.recipe.target_dir``)."""
    from lit_domino.runtime import cache

    return cache.artifact_dir("target", cfg, name=cfg.name, root=root)


def build_shaped_target(cfg: ShapedTargetConfig | str = "rehearsal", root: Path | None = None) -> Path:
    """Build (or reuse) a shaped target; returns its ``save_pretrained`` directory (weights, tokenizer,
    ``report.json``). One process builds it, the others wait and reuse it; the caller's random state is kept."""
    from lit_domino.runtime import cache

    cfg = SHAPED_TARGETS[cfg] if isinstance(cfg, str) else cfg
    path = target_dir(cfg, root)
    if cache.is_complete(path):
        return path
    with cache.building(path):
        if cache.is_complete(path, warn=False):
            return path
        t0 = time.time()
        with cache.staging(path) as tmp:
            tokenizer = shaped_tokenizer()
            model = build_model(cfg, tokenizer)
            eos, pad = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(PAD)
            model.generation_config.eos_token_id = [eos, pad]  # Qwen3's pair
            model.generation_config.pad_token_id = pad
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            report = {"parameters": sum(p.numel() for p in model.parameters()),
                      "mask_token": "<|MASK|> added at load, id len(tokenizer) = "
                                    f"{len(tokenizer)} < vocab_size {cfg.vocab_size}",
                      "build_seconds": round(time.time() - t0, 1),
                      "kept_from_qwen3_8b": {k: QWEN3_8B[k] for k in KEPT_FROM_QWEN3_8B}}
            (tmp / "report.json").write_text(json.dumps(report, indent=2))
            cache.mark_complete(tmp, asdict(cfg))
    return path


def shaped_target_report(cfg: ShapedTargetConfig | str = "rehearsal", root: Path | None = None) -> dict:
    """The build report of a built shaped target."""
    cfg = SHAPED_TARGETS[cfg] if isinstance(cfg, str) else cfg
    return json.loads((target_dir(cfg, root) / "report.json").read_text())
