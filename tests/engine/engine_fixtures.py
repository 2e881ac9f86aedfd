"""Small in-memory models for engine tests (no tokenizer needed)."""

from __future__ import annotations

import torch


def tiny_llama(
    layers: int = 3, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, seed: int = 0
):
    from transformers import LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.hook import register

    register()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=heads * head_dim,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=2048,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Random init gives near-uniform attention; sharper queries make selection matter.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    return model
