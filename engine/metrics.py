"""Quality of the sparse model against the dense one, from next-token distributions."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def kl_from_logprobs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) along the last dim from log-probabilities."""
    return (p.exp() * (p - q)).sum(-1).clamp(min=0.0)


def kl_per_position(dense_logits: torch.Tensor, sparse_logits: torch.Tensor) -> torch.Tensor:
    """KL(dense || sparse) of next-token distributions, [T] for logits [T, V]."""
    return kl_from_logprobs(
        torch.log_softmax(dense_logits.float(), dim=-1),
        torch.log_softmax(sparse_logits.float(), dim=-1),
    )


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[t] | logits[t]) for logits [T, V], targets [T]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def perplexity(logprobs: torch.Tensor) -> float:
    return math.exp(-float(logprobs.mean())) if logprobs.numel() else float("nan")


@dataclass
class PromptComparison:
    """Teacher-forced comparison over a prompt: per-position arrays for positions 1..T-1."""

    kl: torch.Tensor
    logprob_dense: torch.Tensor
    logprob_sparse: torch.Tensor
    agree: torch.Tensor

    def summary(self) -> dict[str, float]:
        empty = self.kl.numel() == 0
        nan = float("nan")
        return {
            "kl_mean": nan if empty else float(self.kl.mean()),
            "kl_max": nan if empty else float(self.kl.max()),
            "top1_agreement": nan if empty else float(self.agree.float().mean()),
            "ppl_dense": perplexity(self.logprob_dense),
            "ppl_sparse": perplexity(self.logprob_sparse),
        }


def compare_prompt(
    dense_logits: torch.Tensor, sparse_logits: torch.Tensor, ids: torch.Tensor
) -> PromptComparison:
    """Logits [T, V] predict ids[1:]; each log-softmax over the vocabulary is computed once."""
    d = torch.log_softmax(dense_logits[:-1].float(), dim=-1)
    s = torch.log_softmax(sparse_logits[:-1].float(), dim=-1)
    tgt = ids[1:, None]
    return PromptComparison(
        kl=kl_from_logprobs(d, s),
        logprob_dense=d.gather(-1, tgt).squeeze(-1),
        logprob_sparse=s.gather(-1, tgt).squeeze(-1),
        agree=d.argmax(-1) == s.argmax(-1),
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
