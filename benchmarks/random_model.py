"""Random-weight causal LMs of real models' shapes, for whole-model timing where no weights are.

Why: a lent GPU has no network and no Llama weights, and the project is not installed there. A
Llama-3.1-8B-shaped model with random (seeded) weights runs the same matmuls, attention, KV cache
and Sketch&Walk hook as the real one, so its prefill and decode times are honest; its outputs and
its selections mean nothing, so never use it for quality. Token ids are random too (no tokenizer).
Kept apart from engine/run/models.py, the loader of real models, which it shares nothing with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sketchwalk.errors import SketchWalkError


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes; `layers` is the real model's depth (a bench may build fewer)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int
    rope_theta: float
    tie_embeddings: bool


MODEL_SHAPES = {
    "llama3-8b": ModelShape("llama3-8b", 4096, 14336, 32, 8, 32, 128256, 500000.0, False),
    "smollm2": ModelShape("smollm2", 576, 1536, 9, 3, 30, 49152, 100000.0, True),  # SmolLM2-135M
    "tiny": ModelShape("tiny", 128, 256, 4, 2, 4, 1024, 10000.0, True),  # for tests
}
# The longest prompt a random model accepts: RoPE is computed, nothing was trained to a length.
MAX_POSITIONS = 262144


@dataclass
class RandomModel:
    model: torch.nn.Module
    shape: ModelShape
    layers: int

    @property
    def model_id(self) -> str:
        return f"random:{self.shape.name}"


def model_shape(name: str) -> ModelShape:
    """The shape of that name; an unknown one is a one-line error."""
    if name not in MODEL_SHAPES:
        raise SketchWalkError(
            f"unknown random-weights shape {name!r}; choose from {', '.join(MODEL_SHAPES)}"
        )
    return MODEL_SHAPES[name]


def build_random_model(
    name: str,
    layers: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> RandomModel:
    """A seeded random LlamaForCausalLM of the named shape with `layers` layers (default: the
    real model's), built straight on `device` in `dtype` (an 8B-shaped model never passes through
    CPU memory), on SDPA and registered for attn_implementation="sketch_walk"."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.hf.hook import register

    shape = model_shape(name)
    n = shape.layers if layers is None else layers
    if n < 1:
        raise SketchWalkError(f"layers must be at least 1, got {n}")
    cfg = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        num_hidden_layers=n,
        vocab_size=shape.vocab,
        rope_theta=shape.rope_theta,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=shape.tie_embeddings,
    )
    register()
    torch.manual_seed(seed)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(saved)
    model.set_attn_implementation("sdpa")
    return RandomModel(model.eval(), shape, n)


def random_token_ids(vocab: int, n: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """n seeded random token ids, shape [1, n] (the same ids for the same n and seed)."""
    gen = torch.Generator().manual_seed(seed + n)
    return torch.randint(0, vocab, (1, n), generator=gen).to(device)


__all__ = ["MAX_POSITIONS", "MODEL_SHAPES", "build_random_model", "model_shape", "random_token_ids"]
