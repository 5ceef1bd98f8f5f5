"""The one builder of ``transformers.Qwen3Config`` the suite's own models share: the embedded target's recipe, the
small-LM drafter's LM and the Qwen3-style layers the interop exports write.

Every field our decoder layers depend on is named here (q/k RMSNorm and SwiGLU come with the Qwen3 architecture;
no attention bias, SiLU); what differs between the callers is their shape, whether the LM head is the embedding
table, and the token ids.
"""

from __future__ import annotations

from transformers import Qwen3Config


def qwen3_config(*, vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, max_positions: int, rope_theta: float, tie_embeddings: bool,
                 rms_norm_eps: float = 1e-6, **extra) -> Qwen3Config:
    """A ``Qwen3Config`` of this shape (``rms_norm_eps``: Qwen3's default unless given); ``extra`` are further
    fields as ``Qwen3Config`` takes them (token ids, ``use_sliding_window``, ...)."""
    return Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       head_dim=head_dim, max_position_embeddings=max_positions, rope_theta=rope_theta,
                       rms_norm_eps=rms_norm_eps, attention_bias=False, hidden_act="silu",
                       tie_word_embeddings=tie_embeddings, **extra)
