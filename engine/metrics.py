"""Quality of the sparse model against the dense one, from next-token distributions."""

from __future__ import annotations

import math

import torch


def kl_per_position(dense_logits: torch.Tensor, sparse_logits: torch.Tensor) -> torch.Tensor:
    """KL(dense || sparse) of next-token distributions, [T] for logits [T, V]."""
    p = torch.log_softmax(dense_logits.float(), dim=-1)
    q = torch.log_softmax(sparse_logits.float(), dim=-1)
    return (p.exp() * (p - q)).sum(-1).clamp(min=0.0)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[t] | logits[t]) for logits [T, V], targets [T]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def perplexity(logprobs: torch.Tensor) -> float:
    return math.exp(-float(logprobs.mean())) if logprobs.numel() else float("nan")


def prompt_metrics(
    dense_logits: torch.Tensor, sparse_logits: torch.Tensor, ids: torch.Tensor
) -> dict:
    """Teacher-forced metrics over a prompt: logits [T, V] predict ids[1:]."""
    d, s, tgt = dense_logits[:-1], sparse_logits[:-1], ids[1:]
    kl = kl_per_position(d, s)
    return {
        "kl_mean": float(kl.mean()) if kl.numel() else float("nan"),
        "kl_max": float(kl.max()) if kl.numel() else float("nan"),
        "top1_agreement": float((d.argmax(-1) == s.argmax(-1)).float().mean())
        if kl.numel()
        else float("nan"),
        "ppl_dense": perplexity(token_logprobs(d, tgt)),
        "ppl_sparse": perplexity(token_logprobs(s, tgt)),
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
