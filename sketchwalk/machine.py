"""The machine a timing came from: for benchmark output (one line, JSON fields) and for a run's
stored versions, which the app's Speed page shows.

Why: the same commands gave different ratios on two CPUs of this project's machines (one with
AVX-512 and native bfloat16, where the sampled estimator's score product runs in bfloat16; one
with AVX2 only, where it stays float32), and a shared deployment's workers may differ too, so a
timing without its machine cannot be compared.
"""

from __future__ import annotations

import os
import platform

import torch

from sketchwalk.engine.sketch import score_dtype
from sketchwalk.kernels.block_softmax import native_library


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else platform.processor(), else 'unknown')."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_fields(device: torch.device | str = "cpu") -> dict[str, str]:
    """What a stored run keeps beside its library versions: CPU, instruction set, threads, and
    the GPU where the model ran on one."""
    out = {
        "cpu": cpu_model(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "threads": str(torch.get_num_threads()),
        "block_softmax": block_softmax_kind(device),
    }
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def block_softmax_kind(device: torch.device | str = "cpu") -> str:
    """ "C" where the sampled estimator's block softmax runs compiled (kernels/block_softmax.c:
    CPU with a C compiler), else "torch" (without a compiler the estimator is ~2x slower)."""
    on_cpu = torch.device(device).type == "cpu"
    return "C" if on_cpu and native_library() is not None else "torch"


def machine_info(device: str = "cpu", score: str = "auto") -> dict:
    """run_fields plus what a benchmark line needs: cores, the score product's dtype for knob
    value `score` (its "auto" resolves per machine), torch's version; threads as a number."""
    return run_fields(device) | {
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "score_dtype": str(score_dtype(score, device)).removeprefix("torch."),
        "torch": torch.__version__,
    }


def describe(info: dict) -> str:
    """One line, e.g. 'machine: AMD EPYC, 2 cores, 2 threads, AVX2, score product float32,
    block softmax C, torch 2.13.0'."""
    parts = [
        info["cpu"],
        f"{info['cores']} cores",
        f"{info['threads']} threads",
        info["isa"],
        f"score product {info['score_dtype']}",
        *([f"block softmax {info['block_softmax']}"] if info.get("block_softmax") else []),
        f"torch {info['torch']}",
    ]
    if info.get("gpu"):
        parts.insert(0, info["gpu"])
    return "machine: " + ", ".join(parts)


__all__ = ["block_softmax_kind", "cpu_model", "describe", "machine_info", "run_fields"]
