"""A gpu_check.json (benchmarks/gpu_check.sh) as the README's GPU tables, in markdown.

Why a script of its own: the numbers come back from a lent GPU as one JSON file, and they should
reach the README unedited and with the machine they came from (GPU, driver, versions, date) in
the header. Standard library only, so it runs anywhere:

  python benchmarks/gpu_table.py gpu_check.json [> table.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _f(x: object, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def header(report: dict) -> str:
    v = report.get("versions", {})
    gpu = v.get("gpu") or f"no GPU ({report.get('device', '?')})"
    parts = [
        gpu,
        f"driver {v.get('driver') or '-'}",
        f"CUDA {v.get('cuda') or '-'}",
        f"torch {v.get('torch') or '-'}",
        f"Triton {v.get('triton') or '-'}",
        f"transformers {v.get('transformers') or '-'}",
        f"Python {v.get('python') or '-'}",
    ]
    smoke = ", smoke run (tiny inputs: the numbers mean nothing)" if report.get("smoke") else ""
    return f"GPU check: {', '.join(parts)}; {report.get('date', '?')}{smoke}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _stage(report: dict, name: str) -> dict:
    for s in report.get("stages", {}).values():
        if s.get("name") == name:
            return s
    return {}


def _ok_items(stage: dict) -> list[dict]:
    return [i for i in stage.get("items", []) if "injected" not in i]


def stages_table(report: dict) -> list[str]:
    rows = []
    for letter, s in report.get("stages", {}).items():
        note = s["errors"][0]["error"] if s.get("errors") else ""
        if s.get("status") == "timeout":
            note = f"killed at its {s.get('timeout_s')} s timeout" + (f"; {note}" if note else "")
        rows.append(
            [f"{letter} {s.get('name')}", s.get("status", "?"), _f(s.get("seconds"), "{}"),
             _f(s.get("timeout_s"), "{}"), note.replace("|", "/")[:120]]
        )  # fmt: skip
    return _table(["stage", "status", "seconds", "timeout s", "note"], rows)


def kernels_line(report: dict) -> list[str]:
    items = _ok_items(_stage(report, "kernels"))
    if not items:
        return []
    worst: dict[str, float] = {}
    for i in items:
        worst[i["dtype"]] = max(worst.get(i["dtype"], 0.0), i["rel_err"])
    ok = sum(bool(i["ok"]) for i in items)
    errs = ", ".join(f"{d} {e:.1e}" for d, e in worst.items())
    return [f"Triton kernels against the torch oracle: {ok} of {len(items)} checks ok; the "
            f"largest relative error per dtype: {errs}."]  # fmt: skip


def selection_table(report: dict) -> list[str]:
    items = [i for i in _ok_items(_stage(report, "selection")) if "ratio" in i]
    if not items:
        return []
    rows = [
        [str(i["seq_len"]), i["config"], str(i["block_size"]), _f(i["selection_ms"], "{:.2f}"),
         _f(i["dense_ms"], "{:.2f}"), f"**{100 * i['ratio']:.1f}%**" if i["meets_target"]
         else f"{100 * i['ratio']:.1f}%"]
        for i in items
    ]  # fmt: skip
    head = ["tokens", "selection", "block", "sketch + walk + select ms", "dense SDPA ms",
            f"share (target <= {100 * items[0]['target']:.0f}%)"]  # fmt: skip
    shape, dtype = items[0].get("shape", "?"), items[0].get("dtype", "?")
    return [f"One layer's selection against its dense attention ({shape} heads, {dtype}):", "",
            *_table(head, rows)]  # fmt: skip


def attention_table(report: dict) -> list[str]:
    items = [i for i in _ok_items(_stage(report, "attention")) if "dense_ms" in i]
    if not items:
        return []
    rows = []
    for i in items:
        flex = "flex_ms" in i
        rows.append(
            [i["phase"], str(i["seq_len"]), f"{i['density']:.2f} ({i['achieved_density']:.3f})",
             _f(i["dense_ms"], "{:.2f}"),
             f"{i['overhead_ms']:.2f} + {i['kernel_ms']:.2f}", f"{i['speedup']:.2f}x",
             _f(i.get("flex_ms"), "{:.2f}"), f"{i['flex_speedup']:.2f}x" if flex else "-"]
        )  # fmt: skip
    head = ["phase", "tokens", "density (achieved)", "dense SDPA ms", "ours ms (selection + "
            "kernel)", "ours", "FlexAttention ms", "FlexAttention"]  # fmt: skip
    shape, dtype = items[0]["shape"], items[0]["dtype"]
    return [f"One layer of attention ({shape}, {dtype}; decode lists without selection):", "",
            *_table(head, rows)]  # fmt: skip


def model_table(report: dict) -> list[str]:
    items = [i for i in _ok_items(_stage(report, "model")) if not i.get("warmup")]
    items = [i for i in items if "dense_prefill_ms" in i]
    if not items:
        return []
    rows = []
    for i in items:
        sel = sum(v for k, v in i["sparse_stages_ms"].items()
                  if k.startswith("prefill_") and k != "prefill_attention")  # fmt: skip
        dec = "-" if i["decode_speedup"] is None else f"{i['decode_speedup']:.2f}x"
        rows.append(
            [f"{i['shape']} x {i['layers']}", str(i["seq_len"]),
             f"{i['dense_prefill_ms']:.0f} / {i['sparse_prefill_ms']:.0f}",
             f"{i['prefill_speedup']:.2f}x", f"{sel:.0f}",
             f"{i['dense_decode_ms']:.2f} / {i['sparse_decode_ms']:.2f}", dec,
             "yes" if i["same_first_token"] else "no"]
        )  # fmt: skip
    head = ["model (random weights) x layers", "tokens", "prefill ms, dense / sparse", "prefill",
            "selection ms", "decode ms per token, dense / sparse", "decode",
            "same first token"]  # fmt: skip
    dtype, dens = items[0].get("dtype", "?"), items[0].get("density", "?")
    return [f"Whole model, random weights ({dtype}, density {dens}, default knobs):", "",
            *_table(head, rows)]  # fmt: skip


def markdown(report: dict) -> str:
    """The README's GPU section body for this report: header line, then one table per stage."""
    parts = [[header(report)], stages_table(report), kernels_line(report),
             selection_table(report), attention_table(report), model_table(report)]  # fmt: skip
    return "\n\n".join("\n".join(p) for p in parts if p)


def summary(report: dict) -> str:
    """A plain one-line-per-stage summary for the end of a run's log."""
    lines = [header(report)]
    for letter, s in report.get("stages", {}).items():
        n = len(s.get("items", []))
        err = f"  {s['errors'][0]['error'][:100]}" if s.get("errors") else ""
        lines.append(
            f"  {letter} {s.get('name', '?'):10s} {s.get('status', '?'):8s} "
            f"rc {_f(s.get('rc'), '{}'):>4}  {_f(s.get('seconds'), '{}'):>4} s  {n:3d} items{err}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a gpu_check.json")
    args = ap.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text())
    except (OSError, ValueError) as exc:
        print(f"gpu_table: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(report, dict) or "stages" not in report:
        print(f"gpu_table: {args.report} is not a gpu_check.json (no stages)", file=sys.stderr)
        return 2
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
