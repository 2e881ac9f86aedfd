"""One prepared GPU run in stages; benchmarks/gpu_check.sh runs each stage in its own bounded
process and then merges their results into one JSON and a summary table.

Stages, most important first (a short budget still gets the first ones):
  a env        versions, the GPU, every module the stages import, one op on the device
  b kernels    the Triton kernels against the torch oracle, bf16/fp16/fp32
  c selection  sketch + walk + select of one layer (defaults, `fast`) against one layer of dense
               SDPA at 32k and 128k tokens, Llama-3.1-8B heads, bf16 (target: at most 10%)
  d attention  prefill 32k/64k/128k and decode 32k/128k at density 0.2 (then 0.1 while time
               is left): our Triton kernel, SDPA and FlexAttention on the same lists
  e model      a random-weight Llama-3.1-8B-shaped model (`sketchwalk bench model
               --random-weights`): 32k tokens x 16 layers, 128k x 8, dense beside sparse

Why stages in processes: a lent GPU comes with minutes, so one hung compile or one wrong kernel
must cost its own stage only. Each stage writes its items to WORK/<stage>.json as they come (a
stage killed at its timeout keeps what it measured); `merge` reads them with the rc and log tail
the shell script recorded. Only public entry points are called (block_sparse_attention_triton,
prefill_selection, run_attention_bench, run_model_bench), so kernel and engine changes flow in.
`--smoke --device cpu` (TRITON_INTERPRET=1) runs every stage on tiny inputs; CI runs it.

  gpu_check.py stage NAME --work DIR [--smoke] [--device D]
  gpu_check.py merge --work DIR --stages a,b,... --out FILE [--smoke] [--device D]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# (batch, heads, kv_heads, lq, lk, head_dim, block, groups, with seq_start)
CASES = [
    (1, 32, 8, 2048, 2048, 128, 64, 1, False),  # Llama-3.1-8B heads, shared lists
    (2, 9, 3, 1500, 1500, 64, 64, 3, True),  # SmolLM2 heads, per-group lists, left padding
    (1, 32, 8, 700, 3000, 128, 128, 8, False),  # chunked prefill, block 128, unaligned chunk
    (2, 16, 4, 1, 4099, 128, 64, 4, True),  # decode, batch 2 with different counts
    (4, 32, 8, 1, 2048, 128, 128, 1, False),  # decode, block 128
    (1, 8, 8, 1000, 1000, 64, 64, 8, False),  # GQA ratio 1
]
SMOKE_CASES = [  # the same situations at interpreter sizes
    (1, 4, 2, 70, 70, 32, 16, 1, False),
    (2, 6, 3, 50, 50, 16, 16, 3, True),
    (1, 4, 2, 20, 60, 32, 32, 2, False),
    (2, 4, 2, 1, 75, 32, 16, 2, True),
]
SELECTION_TARGET = 0.10  # selection time / one dense layer's attention time
FAULT_ENV = "GPU_CHECK_FAULT"  # tests only: "b=fail,c=hang" makes those stages fail or hang


@dataclass
class Context:
    """What a stage runs with and writes to: its items and errors, flushed after each one."""

    name: str
    path: Path
    device: str
    smoke: bool
    items: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: bool = False

    def add(self, item: dict) -> None:
        self.items.append(item)
        self.flush()

    def error(self, where: str, exc: BaseException) -> None:
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.errors.append(
            {
                "where": where,
                "error": f"{type(exc).__name__}: {exc}"[:500],
                "tail": "".join(tb)[-2000:],
            }
        )
        print(f"gpu_check: {self.name}: {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        self.flush()

    def time_left(self) -> float:
        """Seconds until the shell script kills this stage (GPU_CHECK_DEADLINE, epoch s)."""
        deadline = os.environ.get("GPU_CHECK_DEADLINE")
        return float(deadline) - time.time() if deadline else float("inf")

    @property
    def ok(self) -> bool:
        return not self.errors and all(i.get("ok", True) for i in self.items)

    def flush(self) -> None:
        data = {
            "stage": self.name,
            "finished": self.finished,
            "seconds": round(time.time() - self.started, 1),
            "items": self.items,
            "errors": self.errors,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(self.path)  # a stage killed mid-write leaves the last whole file


def _dev(ctx: Context):
    import torch

    return torch.device(ctx.device)


def _free() -> None:
    """Between the big cases: give the GPU's cached memory back (128k cases need it)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- a: environment ----------------------------------------------------------------------------

MODULES = [
    "torch", "triton", "transformers",
    "sketchwalk.kernels", "sketchwalk.kernels.reference", "sketchwalk.kernels.triton_dispatch",
    "sketchwalk.engine.method.pipeline", "sketchwalk.engine.hf.hook", "sketchwalk.engine.run.timing",
    "sketchwalk.benchmarks.attention", "sketchwalk.kernels.flex", "sketchwalk.benchmarks.model",
    "sketchwalk.benchmarks.random_model", "sketchwalk.cli.bench",
]  # fmt: skip
OPTIONAL = ["sketchwalk.kernels.triton_block_mass", "flash_attn", "sqlalchemy", "duckdb"]


def stage_env(ctx: Context) -> None:
    import importlib

    for name in MODULES + OPTIONAL:
        try:
            importlib.import_module(name)
            ctx.add({"module": name, "ok": True})
        except Exception as exc:  # a broken install fails at import with anything
            ctx.add({"module": name, "ok": name in OPTIONAL, "missing": f"{exc}"[:300]})
    import torch

    import sketchwalk
    from sketchwalk.kernels.flex import available as flex_available

    dev = _dev(ctx)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.randn(256, 256, device=dev, dtype=dt)
    ref = x.float() @ x.float()
    err = float(((x @ x).float() - ref).abs().max() / ref.abs().max())
    free = torch.cuda.mem_get_info(dev)[0] / 2**30 if dev.type == "cuda" else None
    ctx.add(
        {
            "check": f"matmul on {dev.type}",
            "ok": err < 2e-2,
            "rel_err": err,
            "free_gib": None if free is None else round(free, 1),  # another tenant shows here
            "sketchwalk": str(Path(sketchwalk.__file__).parent),
            "shim": os.environ.get("GPU_CHECK_SHIM"),
            "flex_available": flex_available(),
            "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        }
    )


# ---- b: kernels --------------------------------------------------------------------------------


def check_kernels(
    dev, smoke: bool = False, emit: Callable[[dict], None] | None = None
) -> list[dict]:
    """The Triton kernels against the torch oracle on random lists; rows with their rel_err."""
    import torch

    from sketchwalk.kernels.lists import BlockLists, dense_lists
    from sketchwalk.kernels.reference import block_sparse_attention_reference
    from sketchwalk.kernels.testing import random_block_index
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
    emit = emit or (lambda row: None)
    gen = torch.Generator().manual_seed(0)
    rows = []

    def add(row: dict) -> None:
        rows.append(row)
        emit(row)
        print(f"check {row['case']} {row['dtype']:9s} rel_err {row['rel_err']:.2e} "
              f"{'ok' if row['ok'] else 'FAIL'}")  # fmt: skip

    dtypes = (
        (torch.float16, torch.float32) if smoke else (torch.bfloat16, torch.float16, torch.float32)
    )
    for case in SMOKE_CASES if smoke else CASES:
        bsz, h, hkv, lq, lk, d, b, g, pad = case
        idx, cnt = (x.to(dev) for x in random_block_index(bsz, g, lq, lk, b, 0.3, gen))
        starts = torch.tensor([0, 333, 17, 64][:bsz], device=dev) if pad else None
        for dt in dtypes:
            q = torch.randn(bsz, h, lq, d, generator=gen).to(dev, dt)
            k = torch.randn(bsz, hkv, lk, d, generator=gen).to(dev, dt)
            v = torch.randn(bsz, hkv, lk, d, generator=gen).to(dev, dt)
            out = torch.full_like(q, float("nan"))
            block_sparse_attention_triton(
                q, k, v, BlockLists(idx, cnt, b, seq_start=starts), True, None, out=out
            )
            ref = block_sparse_attention_reference(
                q, k, v, BlockLists(idx, cnt, b, seq_start=starts)
            ).float()
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(out).all()) and err < tol[dt]
            add({"case": str(case), "dtype": str(dt)[6:], "rel_err": err, "ok": ok})
    length, b, dt = (64, 16, torch.float16) if smoke else (1024, 64, torch.bfloat16)
    every = dense_lists(1, 1, length, length, b, dev)
    q = torch.randn(1, 32, length, 128, generator=gen).to(dev, dt)
    k = torch.randn(1, 8, length, 128, generator=gen).to(dev, dt)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), k.float(), is_causal=True, enable_gqa=True
    )
    full = block_sparse_attention_triton(q, k, k, every)
    err = float((full.float() - dense).abs().max() / dense.abs().max())
    add({"case": "density 1.0 vs SDPA", "dtype": str(dt)[6:], "rel_err": err, "ok": err < tol[dt]})
    return rows


def stage_kernels(ctx: Context) -> None:
    check_kernels(_dev(ctx), ctx.smoke, ctx.add)


# ---- c: selection ------------------------------------------------------------------------------


def _selection_configs() -> dict[str, object]:
    """The selections timed: the `gpu` preset's (what a CUDA run starts from: 4 sampled queries
    per 32-token block in every layer), the cheapest ones (`lean`'s block-mean layers, `fast`),
    and last, as it is the costliest, the CPU defaults' (8 sampled queries per 16-token block)."""
    from sketchwalk.engine.method.config import preset

    return {
        "gpu": preset("gpu", density=0.2),
        "lean, block-mean layer": preset("lean", density=0.2).at_depth(1.0, 1.0),
        "fast": preset("fast", density=0.2),
        "default (CPU)": preset("default", density=0.2),
    }


def stage_selection(ctx: Context) -> None:
    import torch
    import torch.nn.functional as F

    from sketchwalk.benchmarks.attention import SHAPES
    from sketchwalk.engine.clock import timed
    from sketchwalk.engine.method.pipeline import prefill_selection

    dev = _dev(ctx)
    shape = SHAPES["smollm2" if ctx.smoke else "llama3-8b"]
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    warm, lengths, repeats = (128, [256, 512], 1) if ctx.smoke else (4096, [32768, 131072], 5)
    configs = _selection_configs()
    for t in [warm, *lengths]:
        try:
            gen = torch.Generator().manual_seed(t)
            q = torch.randn(1, shape.heads, t, shape.head_dim, generator=gen).to(dev, dtype)
            k = torch.randn(1, shape.kv_heads, t, shape.head_dim, generator=gen).to(dev, dtype)
            v = torch.randn(1, shape.kv_heads, t, shape.head_dim, generator=gen).to(dev, dtype)

            def dense(q=q, k=k, v=v) -> object:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

            dense()  # warm-up
            dense_once = timed(dense, dev)[1]
        except Exception as exc:  # an OOM at 128k must not lose the other lengths
            ctx.error(f"dense attention at {t} tokens", exc)
            _free()
            continue
        for name, cfg in configs.items():
            try:
                select = lambda cfg=cfg, q=q, k=k: prefill_selection(q, k, cfg, 5)  # noqa: E731
                sel, once = timed(select, dev)  # warm-up; at the first length, the compiles
                if t == warm:
                    continue
                # as many repeats as fit in a third of the time left: a slow estimator must not
                # eat the configs and lengths after it
                fit = int(ctx.time_left() / 3 / max((once + dense_once) / 1e3, 1e-3))
                reps = max(1, min(repeats, fit))
                dense_ms, sel_ms = _interleaved(dense, select, dev, reps)
                ratio = sel_ms / dense_ms
                ctx.add(
                    {
                        "seq_len": t, "config": name, "estimator": cfg.estimator,
                        "block_size": cfg.block_size, "density": cfg.density,
                        "achieved_density": round(float(sel.density), 4),
                        "selection_ms": round(sel_ms, 3), "dense_ms": round(dense_ms, 3),
                        "ratio": round(ratio, 4), "target": SELECTION_TARGET,
                        "meets_target": ratio <= SELECTION_TARGET, "repeats": reps,
                        "dtype": str(dtype)[6:], "shape": shape.name,
                    }
                )  # fmt: skip
                print(f"selection {t:>7} {name:26s} {sel_ms:8.2f} ms vs dense {dense_ms:8.2f} ms"
                      f" = {100 * ratio:.1f}%")  # fmt: skip
            except Exception as exc:
                ctx.error(f"selection {name!r} at {t} tokens", exc)
            _free()
        del q, k, v
        _free()


def _interleaved(a: Callable, b: Callable, device, repeats: int) -> tuple[float, float]:
    """Medians of a and b timed in turns (drift on a shared GPU hits both alike)."""
    from sketchwalk.engine.clock import timed

    ta, tb = [], []
    for _ in range(repeats):
        ta.append(timed(a, device)[1])
        tb.append(timed(b, device)[1])
    return statistics.median(ta), statistics.median(tb)


# ---- d: attention ------------------------------------------------------------------------------


def stage_attention(ctx: Context) -> None:
    from sketchwalk.benchmarks.attention import run_attention_bench
    from sketchwalk.engine.method.config import preset
    from sketchwalk.kernels.flex import available as flex_available

    dev = _dev(ctx)
    # the interpreter has no bf16; compiling Flex on a CPU takes minutes
    prefill, decode = ([96], [200]) if ctx.smoke else ([32768, 65536, 131072], [32768, 131072])
    shape, dtype, repeats = ("smollm2", "fp16", 1) if ctx.smoke else ("llama3-8b", "bf16", 3)
    flex = flex_available() and not ctx.smoke
    knobs = preset("gpu")  # the blocks, tiles and estimator a CUDA run starts from
    plan = [("prefill", t) for t in prefill] + [("decode", t) for t in decode]
    took: dict[tuple[str, int], float] = {}

    def bench(phase: str, t: int, density: float, with_flex: bool) -> list[dict]:
        reps = repeats if phase == "prefill" else max(repeats, 10)
        return run_attention_bench(
            dev, [t], [density], [shape], reps, "triton", dtype, (phase,), flex=with_flex,
            knobs=knobs,
        )  # fmt: skip

    for density in (0.2, 0.1):
        for phase, t in plan:
            # density 0.1 is optional: only while the same case at 0.2 would fit again
            fits = ctx.time_left() >= 1.3 * took.get((phase, t), float("inf")) + 5
            if density != 0.2 and not fits:
                print(f"attention: {phase} {t} at density {density} left out (time)")
                continue
            t0 = time.time()
            with_flex = flex and phase == "prefill"
            try:
                rows = bench(phase, t, density, with_flex)
            except Exception as exc:
                ctx.error(f"{phase} {t} density {density}{' with Flex' if with_flex else ''}", exc)
                _free()
                if not with_flex:
                    continue
                flex = False  # Flex failed once: the cases after it run without it
                try:
                    rows = bench(phase, t, density, False)
                except Exception as exc2:
                    ctx.error(f"{phase} {t} density {density}", exc2)
                    _free()
                    continue
            for row in rows:
                row["selection"] = "gpu"
                ctx.add(row)
                note = f", Flex {row['flex_ms']:.2f} ms" if "flex_ms" in row else ""
                ours = f"ours {row['sparse_ms']:.2f} ms ({row['speedup']:.2f}x)"
                dense = f"dense {row['dense_ms']:.2f} ms"
                print(f"attention {phase} {t:>7} {density}: {dense}, {ours}{note}")
            took[(phase, t)] = time.time() - t0
            _free()


# ---- e: model ----------------------------------------------------------------------------------


def model_cases(smoke: bool) -> list[tuple[str, int, int, int]]:
    """(shape, layers, warm-up tokens, timed tokens) of the whole-model runs."""
    if smoke:
        return [("tiny", 3, 128, 256), ("tiny", 4, 128, 320)]
    return [("llama3-8b", 16, 4096, 32768), ("llama3-8b", 8, 4096, 131072)]


def stage_model(ctx: Context) -> None:
    from sketchwalk.cli import bench

    parser = argparse.ArgumentParser(prog="sketchwalk")
    bench.register(parser.add_subparsers())
    dtype = "float32" if ctx.smoke else "bfloat16"
    new, repeats = ("2", "1") if ctx.smoke else ("8", "3")
    for shape, layers, warm, t in model_cases(ctx.smoke):
        argv = ["bench", "model", "--random-weights", shape, "--layers", str(layers)]
        argv += ["--seq-len", str(warm), str(t), "--dtype", dtype, "--device", ctx.device]
        argv += ["--density", "0.2", "--new-tokens", new, "--repeats", repeats]
        try:
            # the short prompt first: Triton compiles and the allocators warm up there
            rows = bench.model_rows(parser.parse_args(argv))
        except Exception as exc:
            ctx.error(f"model {shape} x {layers} layers at {t} tokens", exc)
            _free()
            continue
        for row in rows:
            row["warmup"] = row["seq_len"] == warm
            ctx.add(row)
            print(f"model {shape} x{layers} {row['seq_len']:>7}: prefill "
                  f"{row['dense_prefill_ms']:.0f}/{row['sparse_prefill_ms']:.0f} ms "
                  f"({row['prefill_speedup']:.2f}x), decode "
                  f"{row['dense_decode_ms']:.1f}/{row['sparse_decode_ms']:.1f} ms"
                  f"{' (warm-up)' if row['warmup'] else ''}")  # fmt: skip
        _free()


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    run: Callable[[Context], None]


STAGES = {
    "a": Stage("env", "environment and imports", stage_env),
    "b": Stage("kernels", "Triton kernels vs the torch oracle", stage_kernels),
    "c": Stage("selection", "one layer's selection vs its dense attention", stage_selection),
    "d": Stage("attention", "attention kernels: Triton, SDPA, FlexAttention", stage_attention),
    "e": Stage("model", "whole random-weight model, dense vs sparse", stage_model),
}


def device_problem(device: str) -> str | None:
    """Why the stages cannot run on this device (one line), or None."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        return f"unknown device {device!r}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device; nothing measured"
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "a CPU device needs TRITON_INTERPRET=1"
    return None


def run_stage(letter: str, work: Path, device: str, smoke: bool) -> int:
    """Runs one stage, its items flushed to work/<letter>.json; 0 when every item is ok."""
    ctx = Context(letter, work / f"{letter}.json", device, smoke)
    ctx.flush()
    faults = dict(kv.split("=", 1) for kv in os.environ.get(FAULT_ENV, "").split(",") if "=" in kv)
    try:
        if faults.get(letter) in ("fail", "hang"):
            ctx.add({"injected": faults[letter]})
            print(f"gpu_check: {letter}: injected {faults[letter]} ({FAULT_ENV})", flush=True)
            if faults[letter] == "hang":
                time.sleep(1e6)
            raise RuntimeError(f"injected failure ({FAULT_ENV})")
        problem = device_problem(device)
        if problem:
            raise RuntimeError(problem)
        STAGES[letter].run(ctx)
    except Exception as exc:
        ctx.error("stage", exc)
    ctx.finished = True
    ctx.flush()
    return 0 if ctx.ok else 1


# ---- merge -------------------------------------------------------------------------------------


def _cmd(*argv: str) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None


def versions(device: str) -> dict:
    """The machine and library versions the numbers come from."""
    info: dict = {"python": platform.python_version(), "host_cores": os.cpu_count()}
    for name in ("torch", "triton", "transformers", "flash_attn"):
        try:
            info[name] = __import__(name).__version__
        except Exception:
            info[name] = None
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available() and device.startswith("cuda"):
            dev = torch.device(device)
            props = torch.cuda.get_device_properties(dev)
            info["gpu"] = torch.cuda.get_device_name(dev)
            info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
            info["capability"] = f"{props.major}.{props.minor}"
        else:
            info["gpu"] = None
    except Exception as exc:
        info["torch_error"] = str(exc)[:300]
    smi = _cmd("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
    info["driver"] = smi.splitlines()[0].split(",")[-1].strip() if smi else None
    info["commit"] = _cmd("git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD")
    return info


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stage_record(letter: str, work: Path) -> dict:
    """One stage's entry: what it wrote, its rc and status, the log's tail when not ok."""
    try:
        data = json.loads((work / f"{letter}.json").read_text())
    except (OSError, ValueError):
        data = {}
    rc_text = _tail(work / f"{letter}.rc").strip()
    limit = _tail(work / f"{letter}.limit").strip()
    wall = _tail(work / f"{letter}.wall").strip()
    rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    if rc is None:
        status = "skipped" if rc_text == "skip" else "not run"
    elif rc == 0:
        status = "ok"
    elif rc in (124, 137):
        status = "timeout"
    else:
        status = "failed"
    rec = {
        "name": STAGES[letter].name,
        "title": STAGES[letter].title,
        "status": status,
        "rc": rc,
        "timeout_s": int(limit) if limit.isdigit() else None,
        "seconds": int(wall) if wall.isdigit() else None,  # the process's, imports included
        "stage_seconds": data.get("seconds"),  # the stage's own, to its last item
        "items": data.get("items", []),
        "errors": data.get("errors", []),
    }
    if status != "ok":
        rec["tail"] = _tail(work / f"{letter}.log")
    return rec


def merge(work: Path, letters: list[str], out: Path, device: str, smoke: bool) -> int:
    """Writes the one JSON report and prints the summary; 0 when every stage is ok."""
    from sketchwalk.benchmarks.gpu_table import markdown, summary

    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "smoke": smoke,
        "versions": versions(device),
        "stages": {letter: stage_record(letter, work) for letter in letters},
    }
    out.write_text(json.dumps(report, indent=1, default=str))
    table = markdown(report)
    out.with_name("gpu_table.md").write_text(table + "\n")
    print(summary(report))
    print()
    print(table)
    print(f"\ngpu_check: wrote {out} and {out.with_name('gpu_table.md')}")
    return 0 if all(s["status"] == "ok" for s in report["stages"].values()) else 1


def _letters(text: str) -> list[str]:
    letters = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in letters if s not in STAGES]
    if bad or not letters:
        raise SystemExit(f"gpu_check: unknown stage {','.join(bad) or '(none)'}; choose from a-e")
    return letters


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] not in (["stage"], ["merge"], ["-h"], ["--help"]):
        # `gpu_check.py --smoke --device cpu` and the like: the whole run, as gpu_check.sh does it
        # (every stage in its own bounded process), so both names start the same thing
        script = Path(__file__).with_name("gpu_check.sh")
        return subprocess.run(["bash", str(script), *argv], check=False).returncode
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("stage", "merge"):
        p = sub.add_parser(cmd)
        if cmd == "stage":
            p.add_argument("letter", choices=sorted(STAGES))
        else:
            p.add_argument("--stages", default=",".join(STAGES))
            p.add_argument("--out", required=True)
        p.add_argument("--work", required=True, help="the stages' folder (items, rc, logs)")
        p.add_argument("--device", default="cuda", help="cpu only with TRITON_INTERPRET=1 (smoke)")
        p.add_argument("--smoke", action="store_true", help="tiny inputs: tests the script")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.cmd == "stage":
        return run_stage(args.letter, work, args.device, args.smoke)
    return merge(work, _letters(args.stages), Path(args.out), args.device, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
