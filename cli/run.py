"""`sketchwalk run`: one prompt dense and sparse, side by side, with metrics and timings."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sketchwalk.cli import flags
from sketchwalk.cli.knobs import add_config_args, config_from_args
from sketchwalk.errors import SketchWalkError
from sketchwalk.text import terminal_safe, terminal_text


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from the argument, a file or stdin ('-'), which must be UTF-8 text."""
    if args.prompt_file is not None:
        if args.prompt is not None:
            raise SketchWalkError("give a prompt or --prompt-file, not both")
        path = Path(args.prompt_file)
        where = "stdin" if str(path) == "-" else f"prompt file {path}"
        try:
            raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
        except OSError as exc:
            raise SketchWalkError(f"cannot read {where}: {exc.strerror or exc}") from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SketchWalkError(
                f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                "give a text file"
            ) from None
    if args.prompt is None:
        raise SketchWalkError("no prompt: give PROMPT or --prompt-file FILE")
    return args.prompt


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one prompt dense and sparse and compare them")
    p.add_argument("prompt", nargs="?", help="prompt text (or use --prompt-file)")
    p.add_argument("--prompt-file", help="read the prompt from a file ('-' for stdin)")
    flags.add_model(p, None, "HF id or local folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    flags.add_device(p)
    p.add_argument("--max-new-tokens", type=flags.count("--max-new-tokens", 0, 1 << 20), default=32)
    p.add_argument(
        "--time-only",
        action="store_true",
        help="skip the per-layer records: keep generations, metrics and timings (a clean pass "
        "included); the app's explorer pages have nothing to draw for such a run",
    )
    p.add_argument(  # the name before --time-only, kept so scripts keep working
        "--no-record", dest="time_only", action="store_true", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--no-clean-timing",
        action="store_true",
        help="do not time a clean dense and sparse pass (no recorder) after a recorded run "
        "(about a third more time on CPU); a time-only run always times one",
    )
    p.add_argument(
        "--exact-max-tokens",
        type=flags.count("--exact-max-tokens", 0, flags.MAX_TOKENS),
        default=8192,
        help="compute exact block mass up to this context length",
    )
    p.add_argument(
        "--db", default=None, help="store URL (default $SKETCHWALK_DB or the user data dir)"
    )
    p.add_argument("--no-store", action="store_true", help="do not save the run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_args(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Check everything, then one lifecycle (worker.lifecycle.execute): a signal or an error
    marks the stored run failed with one line before the command exits."""
    from sketchwalk.engine.run.request import RunRequest, check_device
    from sketchwalk.settings import load as load_settings
    from sketchwalk.worker.lifecycle import execute, signals_interrupt

    request = RunRequest(  # validate everything before any loading
        prompt=read_prompt(args),
        config=config_from_args(args),
        model=args.model,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        time_only=args.time_only,
        clean_timing=False if args.no_clean_timing else None,
        exact_max_tokens=args.exact_max_tokens,
    )
    device = check_device(args.device, request)  # and its kernels' block size and dtype limits
    settings = load_settings()
    store = None
    if not args.no_store:
        from sketchwalk.store import open_store

        store = open_store(args.db)
    bar = _progress_bar()

    def load(model: str | None, dtype: str):
        from sketchwalk.engine.run.models import load_model

        return load_model(model, dtype, device)

    try:
        with signals_interrupt():
            outcome = execute(request, store, load, bar.update, heartbeat_s=settings.heartbeat_s)
    finally:
        bar.close()
        if store is not None:
            store.close()
    summary = summarize(outcome.result, outcome.run_id, request.time_only)
    if args.json:
        print(json.dumps(summary, default=float))
    else:
        print_human(summary)
    return 0


class _progress_bar:
    """tqdm on stderr, driven by the runner's (fraction, message) callback; drawn from the first
    report on, so an error found before the run starts stays one line."""

    def __init__(self) -> None:
        self.bar = None

    def update(self, fraction: float, message: str) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=100, file=sys.stderr, bar_format="{l_bar}{bar}| {elapsed}", leave=False
            )
        self.bar.n = int(fraction * 100)
        self.bar.set_description_str(message[:40])
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _density(m: dict) -> float | None:
    from sketchwalk.engine.run.speed import ceiling_density

    return ceiling_density(m.get("density_achieved"), m.get("density_target"))


def summarize(result, run_id: str | None, time_only: bool = False) -> dict:
    from sketchwalk.engine.run.speed import summary as speed_summary

    m = result.metrics
    return {
        "run_id": run_id,
        "time_only": time_only,
        "model": result.model_id,
        "prompt_tokens": result.prompt_tokens,
        "method": result.method,
        "density_target": m.get("density_target"),
        "density_achieved": m.get("density_achieved"),
        "density_achieved_all_layers": m.get("density_achieved_all"),
        "density_decode": m.get("density_decode"),
        "layer_densities": m.get("layer_densities"),
        "top1_agreement": m.get("top1_agreement"),
        "kl_mean": m.get("kl_mean"),
        "ppl_dense": m.get("ppl_dense"),
        "ppl_sparse": m.get("ppl_sparse"),
        "gen_kl_mean": m.get("gen_kl_mean"),
        "gen_common_prefix": m.get("gen_common_prefix"),
        "dense_text": result.dense_text,
        "sparse_text": result.sparse_text,
        "speed": speed_summary(result.timings, time_only, _density(m)),
        "layer_records": len(result.layers),
        "note": short_prompt_note(result.prompt_tokens, result.config.get("block_size")),
        "timings": {  # numbers rounded; a note (clean_failed) as it is
            k: round(v, 3) if isinstance(v, float) else v for k, v in result.timings.items()
        },
    }


def short_prompt_note(tokens: int, block_size: int | None) -> str | None:
    """One line for a prompt that fits in one key block: nothing to select, so every layer kept
    all of it (the run is stored so, at density 1.0); None otherwise."""
    if not block_size or tokens > block_size:
        return None
    return (
        f"the prompt ({tokens} tokens) fits in one block of {block_size}: nothing to select, "
        "every layer ran dense"
    )


def profile_line(layer_densities: dict | None) -> str:
    """How the run spread its density: the layer profile's range of shares, or uniform."""
    shares = [float(v) for groups in (layer_densities or {}).values() for v in groups]
    if not shares:
        return "layer profile  none: every sparse layer at the target"
    return (
        f"layer profile  {len(layer_densities)} sparse layers x {len(shares) // len(layer_densities)}"
        f" groups, shares {min(shares):.3f}-{max(shares):.3f} (mean {sum(shares) / len(shares):.3f})"
    )


def print_human(s: dict) -> None:
    def f(x, spec=".4f"):
        return "-" if x is None else format(x, spec)

    print(
        f"run {s['run_id'] or '(not stored)'}  model {terminal_safe(str(s['model']))}  prompt {s['prompt_tokens']} tokens  method {s['method']}"
    )
    print(
        f"density  target {f(s['density_target'], '.3f')}  achieved {f(s['density_achieved'], '.3f')} (sparse layers)"
        f"  {f(s['density_achieved_all_layers'], '.3f')} (all layers)  decode {f(s['density_decode'], '.3f')}"
    )
    print(profile_line(s["layer_densities"]))
    if s.get("note"):
        print(f"note  {s['note']}")
    print(
        f"quality  KL {f(s['kl_mean'])}  top-1 {f(s['top1_agreement'], '.3f')}  "
        f"ppl {f(s['ppl_dense'], '.2f')} -> {f(s['ppl_sparse'], '.2f')}  generation KL {f(s['gen_kl_mean'])}"
    )
    from sketchwalk.engine.run.speed import lines

    for line in lines(s["timings"], s["time_only"], _density(s)):
        print(line)
    if s["time_only"]:
        print("time-only run: no per-layer records were kept")
    dense, sparse = terminal_text(s["dense_text"]), terminal_text(s["sparse_text"])
    print("\n--- dense ---\n" + dense + "\n--- sparse ---\n" + sparse)  # model-made: escaped
