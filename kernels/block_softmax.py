"""Softmax mass per key block of score rows: the sampled estimator's inner loop.

`block_softmax_sums(scores, lo, hi, block_size)`: row i's softmax over its columns lo .. hi - 1,
summed per block of `block_size` columns. On CPU it runs block_softmax.c, compiled on first use
with the machine's C compiler (`$CC`, else `cc`) into `$SKETCHWALK_CACHE/native` (default
~/.cache/sketchwalk/native), one library per source, compiler and CPU; elsewhere, without a
compiler, or with SKETCHWALK_NATIVE=0 it runs the torch reference below. Why C: torch's mask,
softmax and block sum are three passes that write and re-read every probability; the C loop reads
each row twice while it is in cache (docs/speed.md has the measurements).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("block_softmax.c")
# -ffast-math's parts that let the loops vectorise, not -ffast-math itself: linked with it, gcc adds
# crtfastmath.o, whose constructor turns on flush-to-zero for the whole process at load (every
# subnormal float in torch, numpy and Python became 0; hypothesis refused to run)
_FLAGS = ("-O3", "-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros", "-fno-trapping-math",
          "-fassociative-math", "-freciprocal-math", "-fPIC", "-shared", "-std=c11")  # fmt: skip
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def block_softmax_sums_reference(
    scores: torch.Tensor, lo: torch.Tensor | int, hi: torch.Tensor | int, block_size: int
) -> torch.Tensor:
    """The torch reference: scores [..., W] with lo, hi broadcastable to scores.shape[:-1] ->
    float32 [..., ceil(W / b)]; rows that see no column are 0."""
    width = scores.shape[-1]
    nb = -(-width // block_size)
    cols = torch.arange(width, device=scores.device)
    lo, hi = torch.as_tensor(lo, device=scores.device), torch.as_tensor(hi, device=scores.device)
    seen = (cols >= lo[..., None]) & (cols < hi[..., None])
    logits = scores.float().masked_fill(~seen, float("-inf"))
    probs = torch.softmax(logits, -1).nan_to_num(0.0)  # rows that see nothing: NaN -> 0
    probs = torch.nn.functional.pad(probs, (0, nb * block_size - width))
    return probs.unflatten(-1, (nb, block_size)).sum(-1)


def block_softmax_sums(
    scores: torch.Tensor, lo: torch.Tensor | int, hi: torch.Tensor | int, block_size: int
) -> torch.Tensor:
    """block_softmax_sums_reference, in C where it can be (CPU, float32 or bfloat16 scores).
    The scores must be finite where they are seen."""
    lib = native_library() if scores.device.type == "cpu" else None
    fn = None
    if lib is not None and scores.dtype == torch.float32:
        fn = lib.block_softmax_sums_f32
    elif lib is not None and scores.dtype == torch.bfloat16:
        fn = lib.block_softmax_sums_bf16
    if fn is None:
        return block_softmax_sums_reference(scores, lo, hi, block_size)
    *lead, width = scores.shape
    nb = -(-width // block_size)
    flat = scores.contiguous()
    lo_rows = torch.as_tensor(lo, dtype=torch.int64).expand(lead).contiguous()
    hi_rows = torch.as_tensor(hi, dtype=torch.int64).expand(lead).contiguous()
    out = torch.empty(*lead, nb, dtype=torch.float32)
    rows = flat.numel() // max(width, 1)
    # ctypes releases the GIL for the call: the estimator's parts run it on both cores at once
    status = fn(flat.data_ptr(), rows, width, lo_rows.data_ptr(), hi_rows.data_ptr(),
                block_size, out.data_ptr())  # fmt: skip
    if status != 0:
        raise MemoryError(f"block_softmax_sums: no memory for a scratch row of {width} scores")
    return out


def native_library() -> ctypes.CDLL | None:
    """The compiled block_softmax.c, built on first use; None where it cannot be (no compiler,
    SKETCHWALK_NATIVE=0), after one warning that says why."""
    if os.environ.get("SKETCHWALK_NATIVE", "1") == "0":
        return None
    key = _build_key()
    if key in _loaded:
        return _loaded[key]
    with _lock:
        if key not in _loaded:
            _loaded[key] = _load(key)
    return _loaded[key]


def _compiler() -> str:
    return os.environ.get("CC") or "cc"


def _cpu_line() -> str:
    """The CPU's model and feature flags: a library built with -march=native belongs to them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.split(":")[0].strip() in ("model name", "flags")]
        return "".join(lines[:2])
    except OSError:
        return platform.processor()


@functools.lru_cache(maxsize=1)
def _build_key() -> str:
    text = "\n".join(
        [_SOURCE.read_text(), _compiler(), " ".join(_FLAGS), platform.machine(), _cpu_line()]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir() -> Path:
    """Where engine/models.py keeps converted models too: $SKETCHWALK_CACHE, else
    $XDG_CACHE_HOME/sketchwalk, else ~/.cache/sketchwalk."""
    root = os.environ.get("SKETCHWALK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sketchwalk"
    )
    return Path(root) / "native"


def _load(key: str) -> ctypes.CDLL | None:
    path = _cache_dir() / f"block_softmax-{key}.so"
    try:
        if not path.exists():
            _compile(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(
            f"sketchwalk: the C block softmax is unavailable ({first}); using torch",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    for fn in (lib.block_softmax_sums_f32, lib.block_softmax_sums_bf16):
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _compile(path: Path) -> None:
    """Build into a temporary file beside `path` and rename it into place, so concurrent
    processes never load a half-written library; -march=native where the compiler takes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        errors = ""
        for arch in (["-march=native"], []):
            cmd = [_compiler(), *_FLAGS, *arch, str(_SOURCE), "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, path)
                return
            errors = done.stderr.strip() or f"{cmd[0]} exited with {done.returncode}"
        raise OSError(f"compiling {_SOURCE.name} failed: {errors}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
