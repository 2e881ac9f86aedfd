"""The C kernels of this folder, compiled on first use and loaded through ctypes.

`library()` is one shared library built from every kernels/*.c (block_softmax.c: the sampled
estimator's softmax mass per key block; decode_attention.c and prefill_attention.c: attention
over listed blocks; token_sketch.c: a decode token into the sketch's block sums; hadamard.c: a
prefill's sketch of many rows with their block sums; block_lists.c: a kept mask as index lists;
take_best.c: a layer's budget spent best value first)
with the machine's C compiler (`$CC`, else `cc`) into `$SKETCHWALK_CACHE/native` (default
~/.cache/sketchwalk/native), one library per source, compiler and CPU. Where it cannot be built,
or with SKETCHWALK_NATIVE=0, it is None after one warning, and every caller runs its torch path.
ctypes releases the GIL during a call, so threads run the kernels on all cores at once.
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

_HERE = Path(__file__).parent
# -ffast-math's parts that let the loops vectorise, not -ffast-math itself: linked with it, gcc adds
# crtfastmath.o, whose constructor turns on flush-to-zero for the whole process at load (every
# subnormal float in torch, numpy and Python became 0; hypothesis refused to run); and fused
# multiply-adds, which -std=c11 turns off by default (the score product ran at half speed)
_FLAGS = ("-O3", "-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros", "-fno-trapping-math",
          "-fassociative-math", "-freciprocal-math", "-ffp-contract=fast", "-fPIC", "-shared",
          "-std=c11")  # fmt: skip
# Every exported function's arguments (p: pointer, i: int64, f: float), in the order of its C
# signature; each returns 0, or -1 when out of memory.
_SIGNATURES = {
    "block_softmax_sums_f32": "p i i p p i p",
    "block_softmax_sums_bf16": "p i i p p i p",
    "scored_block_mass_f32": "p p i i i i i p p i p",
    "scored_block_mass_amx": "p p i i i i i p p i p",
    "amx_available": "",
    "pack_keys_vnni_f32": "p i i i i i i i i p i",
    "decode_block_attention_f32": "p p i i i p i i i i i i i i i p p i i p f p",
    "prefill_block_attention_f32": "p i i i p p i i i i i i i i i i i i p p i i p f i i p",
    "srht_rows_f32": "p i i i i i i i i p p i f p i i i p p p",
    "block_lists_i32": "p i i i p",
    "take_best_f32": "p p i i i p i p",
    "absorb_token_f32": "p i i p i i p i i i i i p i i p i i p i i p i p i p i i",
}
_TYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_amx: dict[str, bool] = {}  # per library: whether it runs AMX tiles (amx())


def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be (no compiler,
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


def amx() -> bool:
    """Whether the library scores bfloat16 on AMX tiles (block_softmax.c): built for a CPU that
    has them and granted their state by Linux, as found when it was loaded."""
    return library() is not None and _amx.get(_build_key(), False)


def runs_on(*tensors: torch.Tensor) -> bool:
    """Whether the float32 kernels can take these tensors: on CPU, float32, the last dim
    contiguous, and the library built."""
    ok = all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in tensors
    )
    return ok and library() is not None


def _sources() -> list[Path]:
    return sorted(_HERE.glob("*.c"))


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
    code = [p.read_text() for p in [*_sources(), *sorted(_HERE.glob("*.h"))]]
    text = "\n".join([*code, _compiler(), " ".join(_FLAGS), platform.machine(), _cpu_line()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir() -> Path:
    """Where engine/run/models.py keeps converted models too: $SKETCHWALK_CACHE, else
    $XDG_CACHE_HOME/sketchwalk, else ~/.cache/sketchwalk."""
    root = os.environ.get("SKETCHWALK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sketchwalk"
    )
    return Path(root) / "native"


def _load(key: str) -> ctypes.CDLL | None:
    path = _cache_dir() / f"kernels-{key}.so"
    try:
        if not path.exists():
            _compile(path)
        lib = ctypes.CDLL(str(path))
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [_TYPES[a] for a in args.split()], ctypes.c_int
        _amx[key] = lib.amx_available() == 1  # asks Linux for the tile state, once
    except (OSError, AttributeError, subprocess.SubprocessError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(
            f"sketchwalk: the C kernels are unavailable ({first}); using torch",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
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
            cmd = [_compiler(), *_FLAGS, *arch, *map(str, _sources()), "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, path)
                return
            errors = done.stderr.strip() or f"{cmd[0]} exited with {done.returncode}"
        raise OSError(f"compiling the C kernels failed: {errors}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
