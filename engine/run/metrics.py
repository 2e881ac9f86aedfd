"""Quality of the sparse model against the dense one, from next-token distributions."""

from __future__ import annotations

import math
from collections.abc import Callable
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
    """log p(targets[t] | logits[t]) for logits [T, V], targets [T] (on any device: the ids
    are often host values beside logits on the GPU)."""
    tgt = targets.to(logits.device)[:, None]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt).squeeze(-1)


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

    def nll_increase(self) -> torch.Tensor:
        """Per position, how much more the sparse model is surprised by the true token (nats;
        their mean is the log of the perplexity ratio)."""
        return self.logprob_dense - self.logprob_sparse

    def where_lost(self, worst: tuple[int, ...] = (10, 100)) -> dict[str, float]:
        """Where the perplexity goes, as points of the mean NLL increase (x100): per span of
        positions (0-1023, 1024-2047, then doubling) and carried by the `worst` positions.
        A loss spread over every position and one carried by a few tokens call for different
        fixes (docs/quality.md)."""
        d = self.nll_increase().double()
        t = d.numel()
        out = {"total": 100 * float(d.mean()) if t else float("nan")}
        start, end = 0, 1024
        while start < t:
            label = f"{start}-{min(end, t) - 1}"
            out[label] = 100 * float(d[start:end].sum()) / t
            start, end = end, 2 * end
        ranked = d.sort(descending=True).values
        for k in worst:
            out[f"worst {k}"] = 100 * float(ranked[:k].sum()) / t if t else float("nan")
        return out


def _compare_rows(
    dense_logits: torch.Tensor, sparse_logits: torch.Tensor, targets: torch.Tensor
) -> PromptComparison:
    """Row t of the logits predicts targets[t]; each log-softmax is computed once."""
    d = torch.log_softmax(dense_logits.float(), dim=-1)
    return _compare_logprobs(d, torch.log_softmax(sparse_logits.float(), dim=-1), targets)


def _compare_logprobs(d: torch.Tensor, s: torch.Tensor, targets: torch.Tensor) -> PromptComparison:
    """_compare_rows from the two sides' log-probabilities."""
    tgt = targets[:, None].to(d.device)
    return PromptComparison(
        kl=kl_from_logprobs(d, s).cpu(),
        logprob_dense=d.gather(-1, tgt).squeeze(-1).cpu(),
        logprob_sparse=s.gather(-1, tgt).squeeze(-1).cpu(),
        agree=(d.argmax(-1) == s.argmax(-1)).cpu(),
    )


def compare_prompt(
    dense_logits: torch.Tensor, sparse_logits: torch.Tensor, ids: torch.Tensor
) -> PromptComparison:
    """Logits [T, V] predict ids[1:] (all positions at once: for short inputs and tests)."""
    return _compare_rows(dense_logits[:-1], sparse_logits[:-1], ids[1:])


# Positions per chunk so one chunk's fp32 logits stay near 32 MiB (x ~6 live temporaries): small
# enough that the allocator reuses them chunk after chunk (an 8k-token recorded run of the tiny
# Llama compared in 0.84 GB, where chunks of 128 MiB took 1.9 GB, 4.7 GB with per-chunk results).
CHUNK_ELEMS = 1 << 23


def chunk_rows(logits_fn: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor) -> int:
    """Positions per chunk of the comparison, from the vocabulary (CHUNK_ELEMS)."""
    return max(1, CHUNK_ELEMS // int(logits_fn(hidden[:1]).shape[-1]))


def prompt_logprobs_into(
    out: torch.Tensor, logits_fn: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor
) -> torch.Tensor:
    """The log-probabilities [T - 1, V] of a prompt's positions written into `out`, in the
    comparison's chunks: the same rows `compare_prompt_chunked` computes for its dense side, so a
    comparison handed them (`dense_logprobs`) gives the same numbers."""
    chunk = chunk_rows(logits_fn, hidden)
    for s in range(0, out.shape[0], chunk):
        e = min(out.shape[0], s + chunk)
        out[s:e] = torch.log_softmax(logits_fn(hidden[s:e]).float(), dim=-1)
    return out


def compare_prompt_chunked(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    dense_hidden: torch.Tensor,
    sparse_hidden: torch.Tensor,
    ids: torch.Tensor,
    chunk: int | None = None,
    dense_logprobs: torch.Tensor | None = None,
    keep_dense: torch.Tensor | None = None,
) -> PromptComparison:
    """`compare_prompt` from final hidden states [T, H], a chunk of positions at a time.

    `logits_fn` maps hidden states to logits (the LM head); only one chunk's logits and
    log-softmax copies are alive at once, so memory does not grow with T x vocabulary.

    The dense side of a prompt is the same for every sparse run on it: `keep_dense`, a
    [T - 1, V] float32 buffer, receives its log-probabilities, and a later comparison on the
    same prompt hands them back as `dense_logprobs`, so that only the sparse side's head and
    log-softmax run (the same numbers: the rows are the ones the first comparison computed).
    """
    t = ids.shape[0]
    if t < 2:
        empty = torch.empty(0)
        return PromptComparison(empty, empty, empty, empty.bool())
    if chunk is None:
        chunk = chunk_rows(logits_fn, sparse_hidden)
    # The per-position results go into buffers allocated once, before any chunk: small results
    # kept per chunk would be carved out of the chunk's just-freed logits, and the next chunk's
    # logits then no longer fit there (glibc with raised thresholds, sketchwalk/allocator.py):
    # an 8k-token run's comparison grew to 4.7 GB that way instead of 1.5 GB.
    out = PromptComparison(
        kl=torch.empty(t - 1),
        logprob_dense=torch.empty(t - 1),
        logprob_sparse=torch.empty(t - 1),
        agree=torch.empty(t - 1, dtype=torch.bool),
    )
    for s in range(0, t - 1, chunk):
        e = min(t - 1, s + chunk)  # row t-1 predicts past the prompt: not compared
        sp = torch.log_softmax(logits_fn(sparse_hidden[s:e]).float(), dim=-1)
        if dense_logprobs is not None:
            d = dense_logprobs[s:e]
        else:
            d = torch.log_softmax(logits_fn(dense_hidden[s:e]).float(), dim=-1)
            if keep_dense is not None:
                keep_dense[s:e] = d
        part = _compare_logprobs(d, sp, ids[s + 1 : e + 1])
        del d, sp
        out.kl[s:e] = part.kl
        out.logprob_dense[s:e] = part.logprob_dense
        out.logprob_sparse[s:e] = part.logprob_sparse
        out.agree[s:e] = part.agree
        del part
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
