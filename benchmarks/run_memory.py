"""Peak resident memory of `sketchwalk run` against prompt length (8k, 16k, 32k tokens).

Each length runs in its own process (so peaks do not mix) on a 4-layer random Llama with a
128-wide hidden state, GQA 4/2 heads, 65k positions and the default model's tokenizer (49k
vocabulary), recording on, 8 new tokens. The prompt is GPL-3 repeated to length. Prints, per
length, the run's own peak (`peak_rss_mb`, reset at the run's start) and the process's peak
(model load included), in MiB.

    .venv/bin/python -m sketchwalk.benchmarks.run_memory --tokens 8192 16384 32768
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TEXT = "/usr/share/common-licenses/GPL-3"


def make_model(path: Path) -> Path:
    """The benchmark's tiny Llama (random weights: memory, not quality, is measured)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sketchwalk.engine.models import convert_default

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


def one(model: str, tokens: int, new_tokens: int) -> dict:
    """One run in this process: a prompt of about `tokens` tokens, with recording."""
    from sketchwalk.engine.config import SketchWalkConfig
    from sketchwalk.engine.memory import rss_peak_mb
    from sketchwalk.engine.models import load_model
    from sketchwalk.engine.runner import RunOptions, run

    lm = load_model(model)
    ids = lm.tokenizer(Path(TEXT).read_text(), add_special_tokens=False).input_ids
    ids = (ids * (tokens // len(ids) + 1))[:tokens]
    prompt = lm.tokenizer.decode(ids)
    res = run(lm, prompt, SketchWalkConfig(), RunOptions(max_new_tokens=new_tokens))
    layers = sum(
        sum(
            getattr(r, k).nbytes
            for k in ("sketch", "walk", "exact", "selected")
            if getattr(r, k) is not None
        )
        for r in res.layers
    )
    return {
        "tokens": res.prompt_tokens,
        "run_peak_mb": res.timings["peak_rss_mb"],
        "process_peak_mb": round(rss_peak_mb(), 1),
        "records_mb": round(layers / 2**20, 1),
        "prefill_s": round(res.timings["sparse_prefill_ms"] / 1e3, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--model-dir", default=None, help="where the tiny model is kept (cached)")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model_dir is None:
        from sketchwalk.engine.models import cache_dir

        args.model_dir = str(cache_dir() / "models" / "bench-tiny-llama-h128-65k")
    if args.one is not None:
        print(json.dumps(one(args.model_dir, args.one, args.new_tokens)))
        return
    make_model(Path(args.model_dir))
    print("tokens  run peak MiB  process peak MiB  records MiB  sparse prefill s")
    for n in args.tokens:
        cmd = [sys.executable, "-m", "sketchwalk.benchmarks.run_memory", "--one", str(n)]
        cmd += ["--new-tokens", str(args.new_tokens), "--model-dir", args.model_dir]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["killed"])[-1]
            print(f"{n:>6}  failed (exit {out.returncode}): {tail}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['tokens']:>6}  {r['run_peak_mb']:>12.0f}  {r['process_peak_mb']:>16.0f}"
            f"  {r['records_mb']:>11.1f}  {r['prefill_s']:>16.1f}"
        )


if __name__ == "__main__":
    main()
