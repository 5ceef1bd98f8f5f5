"""The embedded tokenizer: a byte-level BPE trained offline on the embedded corpora.

Digits are split one per token (numbers then tokenise the same way wherever they
appear, which a tiny model needs to learn arithmetic). The chat template is the
Qwen3 one without the thinking block (thinking is off throughout the suite).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, IM_START, MASK = "<|endoftext|>", "<|im_end|>", "<|pad|>", "<|im_start|>", "<|MASK|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, MASK]
"""Fixed ids 0..4 in this order: pad, BOS/document separator, EOS (ends a turn), role marker, MASK."""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
"""Qwen3's chat format (``<|im_start|>role\\n…<|im_end|>\\n``); ``enable_thinking`` is accepted and ignored."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
        padding_side="left",  # batched generation pads on the left
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
