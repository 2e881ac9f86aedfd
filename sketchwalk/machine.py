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

from sketchwalk.engine.method.estimators.sampled import score_dtype
from sketchwalk.kernels.native import library


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
        "c_kernels": c_kernels(device),
    }
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def c_kernels(device: torch.device | str = "cpu") -> str:
    """ "on" where the C kernels run (kernels/native.py: CPU with a C compiler), else "off":
    without them the estimator's block softmax and decode's attention run in torch, slower."""
    on_cpu = torch.device(device).type == "cpu"
    return "on" if on_cpu and library() is not None else "off"


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
    C kernels on, torch 2.13.0'."""
    parts = [
        info["cpu"],
        f"{info['cores']} cores",
        f"{info['threads']} threads",
        info["isa"],
        f"score product {info['score_dtype']}",
        *([f"C kernels {info['c_kernels']}"] if info.get("c_kernels") else []),
        f"torch {info['torch']}",
    ]
    if info.get("gpu"):
        parts.insert(0, info["gpu"])
    return "machine: " + ", ".join(parts)


__all__ = ["c_kernels", "cpu_model", "describe", "machine_info", "run_fields"]
