"""`sketchwalk calibrate`: a model's layer profile from one dense prefill of a text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sketchwalk.cli import flags
from sketchwalk.cli.eval import add_model_args
from sketchwalk.cli.knobs import add_config_args, config_from_args
from sketchwalk.errors import SketchWalkError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="calibrate a model's layer profile (how density is spread over its layers)",
        description=(
            "One dense prefill of a text: every sparse layer's exact block attention mass is "
            "ranked together with the other layers' to find how much each layer needs, at "
            "target densities 0.05-0.5. Runs with layer_profile 'auto' (the default) then use "
            "it for this architecture; the mean density over the layers stays at the target."
        ),
    )
    add_model_args(p)
    p.add_argument(
        "--text",
        default="gpl-3",
        help="a text source (gpl-3, apache-2.0, ... as for `sketchwalk eval`) or a file path",
    )
    p.add_argument(
        "--tokens", type=flags.count("--tokens", 1, flags.MAX_TOKENS), default=6000,
        help="tokens of the text (default 6000)",
    )  # fmt: skip
    p.add_argument(
        "--out",
        metavar="PATH",
        help="where to write it (default: $SKETCHWALK_PROFILES or ~/.cache/sketchwalk/profiles)",
    )
    add_config_args(p, exclude=("method", "density", "phases", "layer_profile"))
    p.set_defaults(func=cmd_calibrate)


def _text(spec: str) -> tuple[str, str]:
    from sketchwalk.eval.texts import SOURCES, load_source, read_text

    if spec in SOURCES:
        name, text = load_source(spec)[0]
        return name, text
    return Path(spec).name, read_text(Path(spec))


def cmd_calibrate(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.tokens < 4 * cfg.block_size:
        raise SketchWalkError(f"--tokens must be at least {4 * cfg.block_size}, got {args.tokens}")
    name, text = _text(args.text)
    from sketchwalk.engine.method.layer_profile import save
    from sketchwalk.engine.run.models import load_model
    from sketchwalk.eval.calibrate import calibrate

    lm = load_model(args.model, args.dtype, args.device)
    if args.tokens > lm.max_context:
        raise SketchWalkError(
            f"--tokens {args.tokens} exceeds {lm.model_id}'s context of {lm.max_context} tokens"
        )
    ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    ids = ids[:, : args.tokens].to(lm.model.device)
    source = (
        f"{lm.model_id}, first {ids.shape[1]} tokens of {name}, block {cfg.block_size}, "
        f"{cfg.pool} pooling"
    )
    profile = calibrate(lm.model, ids, cfg, source)
    path = save(profile, args.out)
    at = profile.at(0.2)
    # at target 0.2, per layer the density of each selection group: "2:0.192/0.331/0.297 ..."
    print(" ".join(f"{k}:" + "/".join(f"{x:.3f}" for x in v) for k, v in sorted(at.items())))
    print(f"layer profile {profile.fingerprint} ({source}) written to {path}", file=sys.stderr)
    return 0
