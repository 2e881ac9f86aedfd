"""Tiny models for tests: an in-memory Llama (no tokenizer) and one saved with the default
model's tokenizer, loadable by name like any local model folder."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_llama(
    layers: int = 3, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, seed: int = 0
):
    from transformers import LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.hf.hook import register

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


def make_tiny_model(path: str | Path, layers: int = 4, seed: int = 0) -> Path:
    """A tiny random Llama (GQA, 4 layers) with the default model's tokenizer, for fast tests.

    Quality numbers of such a model mean nothing; it exercises every code path in seconds.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.run.models import convert_default

    path = Path(path)
    if (path / "config.json").exists():
        return path
    default_path, _ = convert_default()
    tok = AutoTokenizer.from_pretrained(default_path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
