"""Teacher-forced prefill quality of sparse configs against dense, on the first N tokens of a text.

    python -m sketchwalk.eval.prefill_quality --tokens 2000 6000 \\
        --config '{"density": 0.4}' --config '{"density": 0.4, "window": 0.1, "dense_tail_blocks": 0}'

Prints achieved density (sparse layers / all layers), mean KL(dense || sparse), top-1 agreement and
perplexity dense -> sparse for each config: the numbers in the README's quality table (--where:
also where the perplexity goes, by position and worst tokens).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import torch

from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig, preset
from sketchwalk.engine.run.metrics import compare_prompt_chunked
from sketchwalk.engine.run.models import load_model, parse_rope_scale
from sketchwalk.engine.run.runner import LMParts
from sketchwalk.errors import SketchWalkError


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, configs: list[dict]) -> Iterator[dict]:
    """One row per config, each as soon as it is measured (long runs report as they go)."""
    # final hidden states, the head applied a chunk of positions at a time: whole logits are
    # T x 49k floats (3.2 GB at 16k tokens, twice over), which ran a 16k comparison out of memory
    parts = LMParts.of(model)
    model.set_attn_implementation("sdpa")
    dense = parts.forward_hidden(ids)
    model.set_attn_implementation(NAME)
    try:
        for kw in configs:
            with sketch_walk_session(config_of(kw)) as s:
                sparse = parts.forward_hidden(ids)
            cmp = compare_prompt_chunked(parts.logits, dense, sparse, ids[0].cpu())
            del sparse
            yield {
                "tokens": ids.shape[1],
                "config": kw,
                "density": s.density("prefill"),
                "density_all": s.density("prefill", sparse_only=False),
                **cmp.summary(),
                "where": cmp.where_lost(),
            }
    finally:
        model.set_attn_implementation("sdpa")


def config_of(knobs: dict) -> SketchWalkConfig:
    """The config a --config's knobs name: a preset (default: the defaults) with knobs changed."""
    knobs = dict(knobs)
    return preset(knobs.pop("preset", "default"), **knobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument(
        "--rope-scale",
        default=None,
        metavar="[TYPE:]FACTOR",
        help="RoPE-scale the model (yarn:4, linear:2; sparse and dense alike)",
    )
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--tokens", type=int, nargs="+", default=[2000, 6000])
    p.add_argument(
        "--bytes",
        type=int,
        default=None,
        help="score the first N bytes of the text instead (0: the whole text); overrides --tokens",
    )
    p.add_argument(
        "--config",
        action="append",
        default=None,
        help='knobs as JSON, e.g. {"density": 0.2} or {"preset": "paper", "density": 0.2}',
    )
    p.add_argument(
        "--where",
        action="store_true",
        help="also print where the perplexity goes: the NLL increase per span of positions and "
        "the share the 10 and 100 worst tokens carry",
    )
    args = p.parse_args()
    try:  # every config checked before the model loads: a typo is one line, not a traceback
        configs = [json.loads(c) for c in (args.config or ['{"density": 0.2}'])]
        for c in configs:
            if not isinstance(c, dict):
                raise ValueError(f"--config must be a JSON object, got {json.dumps(c)}")
            config_of(c)
        scale = parse_rope_scale(args.rope_scale)
    except (ValueError, TypeError, SketchWalkError) as exc:
        p.exit(2, f"prefill_quality: error: {exc}\n")
    lm = load_model(args.model, rope_scale=scale)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    if args.bytes:
        text = text[: args.bytes]
    all_ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    for n in [all_ids.shape[1]] if args.bytes is not None else args.tokens:
        for r in evaluate(lm.model, all_ids[:, :n], configs):
            print(
                f"{r['tokens']:6d}  {json.dumps(r['config']):60s}  density {r['density']:.3f} "
                f"(all {r['density_all']:.3f})  KL {r['kl_mean']:.4f}  top-1 {r['top1_agreement']:.3f}  "
                f"ppl {r['ppl_dense']:.2f} -> {r['ppl_sparse']:.2f}",
                flush=True,
            )
            if args.where:
                parts = ", ".join(f"{k} {v:+.2f}" for k, v in r["where"].items() if k != "total")
                print(f"        NLL {r['where']['total']:+.2f}% of it: {parts}", flush=True)


if __name__ == "__main__":
    main()
