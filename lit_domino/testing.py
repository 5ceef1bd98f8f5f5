"""Small random models for tests and examples: no training, no files, no network."""

from __future__ import annotations

import torch

from lit_domino.target import Target


def random_target(
    vocab_size: int = 256,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 512,
    seed: int = 0,
    tokenizer=None,
) -> Target:
    """A randomly initialised tiny Qwen3 target (fp32, eval, frozen).

    The last vocabulary id is the MASK token; no tokenizer unless one is given.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=2,
    )
    model = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    mask_id = tokenizer.mask_token_id if tokenizer is not None else vocab_size - 1
    return Target(model=model, tokenizer=tokenizer, mask_token_id=int(mask_id), name=f"random-{seed}")
