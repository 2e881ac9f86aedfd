"""Does reusing decode selections across steps cost quality? Measured, not assumed.

For each prompt one sparse prefill is made; its cache and session are copied for each re-select
rule (the config's decode_reselect: 1 = every token, 0 = when a key block starts, k = every k
tokens; "K:S" also sets decode_reselect_span S, else the config's default span applies; "K:S:0"
also turns decode_stagger off; "+knob=value" after a rule sets any other knob for decode, e.g.
"0+query_samples=2"), so the rules differ only in decode. Two measures:
- teacher-forced: every rule is fed the dense model's greedy continuation; per step KL(dense ||
  sparse) of the next-token distribution and agreement of the top-1 token with dense;
- retrieval (eval/retrieval.py passkey and kv prompts): free greedy answers, exact match.

Run: python -m sketchwalk.benchmarks.decode_fidelity [--lengths 2048 4096] [--new-tokens 48]
     [--rules 1 0 0:0 8 0+query_samples=2]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

from sketchwalk.openmp import short_spin_waits

os.environ.update(short_spin_waits(os.environ))

import torch  # noqa: E402

from sketchwalk.engine.hf.cache import cache_kwarg, new_cache  # noqa: E402
from sketchwalk.engine.hf.hook import NAME  # noqa: E402
from sketchwalk.engine.hf.session import bind_session, sketch_walk_session  # noqa: E402
from sketchwalk.engine.method.config import SketchWalkConfig  # noqa: E402


@torch.no_grad()
def _prefill(model, ids, cfg):
    model.set_attn_implementation(NAME)
    with sketch_walk_session(cfg) as s:
        out = model(ids, use_cache=True, logits_to_keep=1, **new_cache(model))
    return s, out.past_key_values, out.logits[0, -1].float()


@torch.no_grad()
def _steps(model, session, cache, first_logits, feed: list[int] | None, n: int) -> list:
    """Decode n steps under session; feed: tokens to force (teacher forcing), else greedy."""
    model.set_attn_implementation(NAME)
    logits, out_logits, toks = first_logits, [first_logits], []
    with bind_session(session):
        for i in range(n):
            tok = feed[i] if feed is not None else int(logits.argmax())
            toks.append(tok)
            out = model(torch.tensor([[tok]]), use_cache=True, **{cache_kwarg(model): cache})
            logits = out.logits[0, -1].float()
            out_logits.append(logits)
    return toks, torch.stack(out_logits)


@torch.no_grad()
def _dense(model, ids, n):
    model.set_attn_implementation("sdpa")
    out = model(ids, use_cache=True, logits_to_keep=1, **new_cache(model))
    cache, logits = out.past_key_values, out.logits[0, -1].float()
    toks, all_logits = [], [logits]
    for _ in range(n):
        toks.append(int(logits.argmax()))
        out = model(torch.tensor([[toks[-1]]]), use_cache=True, **{cache_kwarg(model): cache})
        logits = out.logits[0, -1].float()
        all_logits.append(logits)
    return toks, torch.stack(all_logits)


def with_rule(cfg: SketchWalkConfig, rule: str) -> SketchWalkConfig:
    """The config under a rule "K" (decode_reselect K), "K:S" (and decode_reselect_span S) or
    "K:S:T" (and decode_stagger T, 0 or 1), each optionally followed by "+knob=value" changes; a
    malformed rule is a one-line ValueError (ConfigError for unknown knobs or values out of
    range)."""
    head, *extra = rule.split("+")
    parts = head.split(":")
    names = ("decode_reselect", "decode_reselect_span", "decode_stagger")
    try:
        if len(parts) > 3 or not all(p.strip() for p in parts):
            raise ValueError
        values = [int(p) for p in parts]
        if len(values) == 3 and values[2] not in (0, 1):
            raise ValueError
        changes = dict(_knob_value(e) for e in extra)
    except ValueError:
        raise ValueError(
            f"a rule is K, K:S or K:S:T with whole numbers (T 0 or 1), then any +knob=value, "
            f"got {rule!r}"
        ) from None
    if len(values) == 3:
        values[2] = bool(values[2])
    changes.update(zip(names, values, strict=False))
    return SketchWalkConfig.from_dict({**cfg.to_dict(), **changes})


def _knob_value(text: str) -> tuple[str, int | float | str]:
    """ "name=value" -> (name, the value as an int, a float or the text)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError
    for kind in (int, float):
        try:
            return name.strip(), kind(value)
        except ValueError:
            pass
    return name.strip(), value.strip()


def _rule(text: str) -> str:
    """argparse type: check a rule before any model is loaded."""
    try:
        with_rule(SketchWalkConfig(), text)
    except ValueError as e:  # ConfigError is a ValueError too
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def compare(model, ids, cfg, rules, n_new) -> dict:
    d_toks, d_logits = _dense(model, ids, n_new)
    session, cache, first = _prefill(model, ids, cfg)
    row = {}
    for rule in rules:
        s, c = copy.deepcopy(session), copy.deepcopy(cache)
        s.reconfigure(with_rule(s.cfg, rule))
        _, logits = _steps(model, s, c, first, d_toks, n_new)
        p = d_logits.log_softmax(-1)
        kl = (p.exp() * (p - logits.log_softmax(-1))).sum(-1)[1:]  # decode steps only
        top1 = (logits.argmax(-1) == d_logits.argmax(-1))[1:].float().mean()
        row[rule] = dict(kl_mean=float(kl.mean()), kl_max=float(kl.max()), top1=float(top1))
        row[rule]["reused"] = s.decode_reused
    return row


def answers(model, tok, item, cfg, rules, n_new=8) -> dict:
    from sketchwalk.eval.retrieval import is_correct

    ids = tok(item.prompt, return_tensors="pt", add_special_tokens=False).input_ids
    d_toks, _ = _dense(model, ids, n_new)
    session, cache, first = _prefill(model, ids, cfg)
    out = {"dense": is_correct(tok.decode(d_toks), item.answer)}
    for rule in rules:
        s, c = copy.deepcopy(session), copy.deepcopy(cache)
        s.reconfigure(with_rule(s.cfg, rule))
        toks, _ = _steps(model, s, c, first, None, n_new)
        out[rule] = is_correct(tok.decode(toks), item.answer)
    return out


def main(argv: list[str] | None = None) -> None:
    from sketchwalk.benchmarks.model import DEFAULT_TEXT, prompt_ids
    from sketchwalk.engine.run.models import load_model
    from sketchwalk.eval.retrieval import make_items

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rules", nargs="+", type=_rule, default=["1", "0", "0:0", "8"])
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--retrieval-length", type=int, default=2048, help="0: no retrieval items")
    args = ap.parse_args(argv)
    lm = load_model()
    cfg = SketchWalkConfig(density=args.density)
    if args.block_size:
        cfg = cfg.with_(block_size=args.block_size)
    text = DEFAULT_TEXT.read_text()
    for n in args.lengths:
        row = compare(lm.model, prompt_ids(lm.tokenizer, text, n), cfg, args.rules, args.new_tokens)
        print(json.dumps({"text": "GPL-3", "tokens": n, "block": cfg.block_size, **row}))
        sys.stdout.flush()
    if not args.retrieval_length:
        return
    items = make_items(lm.tokenizer, lengths=(args.retrieval_length,))
    totals = {r: 0 for r in ["dense", *args.rules]}
    for item in items:
        got = answers(lm.model, lm.tokenizer, item, cfg, args.rules)
        for r, ok in got.items():
            totals[r] += int(ok)
        print(
            json.dumps({"item": f"{item.kind}@{item.depth}", **{str(k): v for k, v in got.items()}})
        )
        sys.stdout.flush()
    print(
        json.dumps({"retrieval_correct": {str(k): v for k, v in totals.items()}, "of": len(items)})
    )


if __name__ == "__main__":
    main()
