"""Peak resident memory of `sketchwalk run` against prompt length (16k, 32k, 64k tokens).

What it measures is the command a user runs, not a special path: for each length it starts
`sketchwalk run --model TINY --prompt-file FILE --density 0.2 --max-new-tokens 4 --db TMP --json`
(recording on, the run stored to a throwaway DuckDB file) as a child process and reads the
child's maximum resident set size from the kernel (`wait4`, what `/usr/bin/time -v` prints as
"Maximum resident set size", model load and store write included) and the run's own peak from
its JSON (`timings.peak_rss_mb`). The model is a 4-layer random Llama with a 128-wide hidden
state, GQA 4/2 heads, 65k positions and the default model's tokenizer (49k vocabulary); the
prompt is GPL-3 repeated to length.

    .venv/bin/python -m sketchwalk.benchmarks.run_memory --tokens 16384 32768 65536
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = "/usr/share/common-licenses/GPL-3"


def make_model(path: Path) -> Path:
    """The benchmark's tiny Llama (random weights: memory, not quality, is measured)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.run.models import convert_default

    if (path / "config.json").exists():
        return path
    tok = AutoTokenizer.from_pretrained(convert_default()[0])
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    path.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_prompt(model: Path, tokens: int, new_tokens: int, out: Path) -> Path:
    """GPL-3 repeated to `tokens` tokens in all (prompt + new tokens, within 65k positions)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = tok(Path(TEXT).read_text(), add_special_tokens=False).input_ids
    n = tokens - new_tokens - 8  # decoding back may merge a few tokens differently
    out.write_text(tok.decode((ids * (n // len(ids) + 1))[:n]))
    return out


def command(model: Path, prompt: Path, db: Path, new_tokens: int, density: float) -> list[str]:
    """The user's command: the installed `sketchwalk` beside this Python, else its module."""
    exe = Path(sys.executable).parent / "sketchwalk"
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "sketchwalk.cli.main"]
    return head + [
        "run",
        "--model",
        str(model),
        "--prompt-file",
        str(prompt),
        "--density",
        f"{density:g}",
        "--max-new-tokens",
        str(new_tokens),
        "--db",
        str(db),
        "--json",
    ]


def measure(cmd: list[str]) -> dict:
    """Run one command; its maximum resident set (MiB, the kernel's wait4 usage of that child),
    wall time and the run's own peak from its JSON."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    row: dict = {"rc": proc.returncode, "max_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall}
    if proc.returncode != 0:
        row["error"] = (stderr.strip().splitlines() or ["killed"])[-1][:200]
        return row
    summary = json.loads(stdout.strip().splitlines()[-1])
    row["tokens"] = summary.get("prompt_tokens")
    row["run_peak_mb"] = (summary.get("timings") or {}).get("peak_rss_mb")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--density", type=float, default=0.2)
    p.add_argument("--model-dir", default=None, help="where the tiny model is kept (cached)")
    args = p.parse_args()
    if args.model_dir is None:
        from sketchwalk.engine.run.models import cache_dir

        args.model_dir = str(cache_dir() / "models" / "bench-tiny-llama-h128-65k")
    model = make_model(Path(args.model_dir))
    work = Path(tempfile.mkdtemp(prefix="sketchwalk-run-memory-"))
    try:
        print("tokens  max resident MiB  run peak MiB  wall s")
        for n in args.tokens:
            prompt = write_prompt(model, n, args.new_tokens, work / f"prompt-{n}.txt")
            cmd = command(model, prompt, work / f"store-{n}.duckdb", args.new_tokens, args.density)
            print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
            r = measure(cmd)
            if r["rc"] != 0:
                print(f"{n:>6}  failed (exit {r['rc']}): {r['error']}", flush=True)
                continue
            print(
                f"{r['tokens']:>6}  {r['max_rss_mb']:>16.0f}  {r['run_peak_mb']:>12.0f}"
                f"  {r['wall_s']:>6.0f}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
