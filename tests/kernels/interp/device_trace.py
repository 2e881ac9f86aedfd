"""Two counters that stand in for a GPU on this CPU: host round trips and mixed-device ops of the
engine's device path, and the aten ops it dispatches.

Why not FakeTensorMode with a fake "cuda" device: the engine's device path reads data
(topk widths, list widths), syncs the clock through torch.cuda and moves host index tensors with
`.to(device)`; under fake tensors each of those fails before a layer runs. So this follows data
instead. `DeviceTrace` marks the model's input (and, with `put`, a model's weights) as "on the
device", and everything computed from those. A device tensor's `.device` answers `DEVICE`
("cpu:0", still a CPU for every op), a host tensor's plain "cpu", so what a GPU run does with
`device=q.device` or `.to(x.device)` is followed: created on or moved to the device where x is
a device tensor, kept on the host where x is a host one. Then:
- a `.item()`, `bool()`, `int()`, `.tolist()`, `.numpy()` or `.cpu()` of a device tensor, from the
  project's code, is a host round trip (on a GPU: a sync that stalls the launch queue);
- an op from the project's code mixing device tensors with host tensors of more than 0 dims is
  what crashed the first sparse layer on a GPU ("Expected all tensors to be on the same device").
- a `.to()` of a device tensor onto the host is a read too (on a GPU: a copy and a sync).
Limits: a tensor created without `device=` and never mixed is invisible (as it is harmless).
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

ROOT = str(Path(__file__).resolve().parents[3]) + "/"
_FACTORIES = {
    torch.ones, torch.zeros, torch.empty, torch.full, torch.arange, torch.tensor, torch.randn,
    torch.rand, torch.randint, torch.eye, torch.linspace, torch.as_tensor,
}  # fmt: skip
_LIKE = {torch.ones_like, torch.zeros_like, torch.empty_like, torch.full_like}
_READS = {
    torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
}  # fmt: skip
_DEVICE_OF = torch.Tensor.device.__get__  # the `.device` getter, as a torch function sees it
DEVICE = torch.device("cpu", 0)  # where a device tensor says it is


def _names_device(target) -> bool | None:
    """True where `target` (a `device=` or `.to()` argument) is the device, False where it is
    the host, None where it names no device (a dtype, nothing, or "meta": transformers builds a
    model there and asks `.device` whether a weight is still unloaded; a meta tensor taken for
    the device answered "cpu:0", so the rotary buffers were never initialised)."""
    if not isinstance(target, torch.device | str):
        return None
    try:
        d = torch.device(target)
    except (RuntimeError, TypeError):
        return None  # a dtype name such as "float32" is not a device
    if d.type == "meta":
        return None
    return d == DEVICE or d.type != "cpu"


def _project_site(depth: int = 2) -> tuple[str, str] | None:
    """(file, function) of the innermost caller in the project's own code (tests excluded)."""
    f = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(ROOT) and "/tests/" not in name and "/.venv/" not in name:
            return name[len(ROOT) :], f.f_code.co_name
        f = f.f_back
    return None


class DeviceTrace(TorchFunctionMode):
    """reads / mixed: Counters of (file, function) sites. Pause around Triton launches
    (the interpreter copies its arguments to the host: on a GPU that is the kernel itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_device = WeakTensorKeyDictionary()
        self.reads: collections.Counter = collections.Counter()
        self.mixed: collections.Counter = collections.Counter()
        self.paused = False

    def put(self, tree) -> None:
        for x in tree_flatten(tree)[0]:
            if isinstance(x, torch.Tensor):
                self.on_device[x] = True

    def _host_copy(self, out, source):
        """`out` as a host tensor: on this CPU a move to the host may return `source` itself,
        still marked; on a GPU it is a copy off the device."""
        if out is source and out in self.on_device:
            self.paused = True
            out = out.clone()
            self.paused = False
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        dev = [x for x in tensors if x in self.on_device]
        out = func(*args, **kwargs)
        if func == _DEVICE_OF:
            return DEVICE if dev else out
        if func in _READS:
            if dev and (site := _project_site()):
                self.reads[site] += 1
            return self._host_copy(out, args[0]) if func is torch.Tensor.cpu else out
        if func in _FACTORIES:
            if _names_device(kwargs.get("device")):
                self.put(out)
            return out
        if func in _LIKE or func is torch.Tensor.to:
            where = _names_device(kwargs.get("device"))
            if func is torch.Tensor.to and where is None:
                where = next((w for a in args[1:] if (w := _names_device(a)) is not None), None)
                like = [a for a in args[1:] if isinstance(a, torch.Tensor)]  # .to(other)
                if where is None and like:
                    where = like[0] in self.on_device
            if where is False:  # onto the host: a copy off the device, read back
                if dev and func is torch.Tensor.to and (site := _project_site()):
                    self.reads[site] += 1
                return self._host_copy(out, args[0])
            if where or dev:
                self.put(out)
            return out
        if dev:
            host = [x for x in tensors if x not in self.on_device and x.dim() > 0]
            if host and (site := _project_site()):
                self.mixed[site] += 1
            self.put(out)
        return out


class OpCount(TorchDispatchMode):
    """aten ops dispatched (each one a kernel launch on a GPU, give or take views), and the
    Triton kernels launched (counted by pause_in_triton_launches)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.launches: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def pause_in_triton_launches(monkeypatch, modes: list) -> None:
    """Triton's interpreter runs kernels with torch ops of its own: none of them is the engine's.
    Each active DeviceTrace pauses, each OpCount counts one launch instead. A second call in one
    test replaces the first (it wraps the interpreter's own run, not the first wrapper)."""
    import triton.runtime.interpreter as interpreter

    run = interpreter.InterpretedFunction.run
    run = getattr(run, "unwrapped", run)

    def launch(self, *args, **kwargs):
        for m in modes:
            if isinstance(m, OpCount):
                m.launches[self.fn.__name__] += 1
            else:
                m.paused = True
        try:
            with _disable_current_modes():
                return run(self, *args, **kwargs)
        finally:
            for m in modes:
                if isinstance(m, DeviceTrace):
                    m.paused = False

    launch.unwrapped = run
    monkeypatch.setattr(interpreter.InterpretedFunction, "run", launch)
