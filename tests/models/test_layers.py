"""layers.py: matches HF Qwen3, context keys, KV cache."""

import torch

from lit_domino.models.layers import Attention, DecoderLayer, KVCache, RMSNorm


def _hf_model(seed=0):
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1000.0,
                      max_position_embeddings=128)
    return Qwen3Model(cfg).eval(), cfg


def test_decoder_layer_matches_hf_qwen3():
    hf, cfg = _hf_model()
    layer = DecoderLayer(64, 4, 2, 16, 96, 1000.0, cfg.rms_norm_eps)
    layer.load_state_dict(hf.layers[0].state_dict())
    norm = RMSNorm(64, cfg.rms_norm_eps)
    norm.load_state_dict(hf.norm.state_dict())
    ids = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        ref = hf(input_ids=ids).last_hidden_state
        x = hf.embed_tokens(ids)
        causal = torch.ones(11, 11, dtype=torch.bool).tril()[None, None]
        ours = norm(layer(x, torch.arange(11), mask=causal))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_context_keys_equal_joint_attention_and_cache():
    torch.manual_seed(0)
    attn = Attention(32, 32, 4, 2, 8, 10000.0)
    ctx, x = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    ctx_pos, x_pos = torch.arange(5), torch.arange(7, 10)  # a gap: positions are absolute
    with torch.no_grad():
        ours = attn(x, x_pos, ctx, ctx_pos)
        joint = attn(torch.cat([ctx, x], 1), torch.cat([ctx_pos, x_pos]))[:, 5:]
        torch.testing.assert_close(ours, joint, atol=1e-6, rtol=1e-6)
        # the same through a cache filled in two chunks (ctx keys committed, x keys transient)
        cache = KVCache()
        attn(x[:, :1], x_pos[:1], ctx[:, :2], ctx_pos[:2], kv_cache=cache)
        assert len(cache) == 2
        cached = attn(x, x_pos, ctx[:, 2:], ctx_pos[2:], kv_cache=cache)
        assert len(cache) == 5
        torch.testing.assert_close(cached, ours, atol=1e-6, rtol=1e-6)


def test_attention_in_dim_differs_from_out_dim():
    attn = Attention(64, 32, 4, 4, 8, 10000.0)
    assert attn(torch.randn(1, 3, 64), torch.arange(3)).shape == (1, 3, 32)
