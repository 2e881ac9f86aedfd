"""Explore at long context in a real browser: first load, then layer-slider moves, timed.

Writes one generated run per length (benchmarks/long_run.py, 12 layers, blocks of 64) to a fresh
DuckDB file, starts `sketchwalk app` on it, opens Explore on the run in Chromium (Debian's,
through playwright), and times: the first load (page open -> the four heatmaps drawn) and each
layer-slider step (key press -> the next layer's caption and heatmaps drawn, the script run
finished), first visit to a layer and a revisit (cached), and far jumps: End, Home or several
arrow presses at once, then one wait, to a layer not visited before (no neighbour was warm).
Prints the medians per length, with the page's own "data + figures" time (the server's share).

    .venv/bin/python -m sketchwalk.benchmarks.render_long --tokens 32768 131072
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sketchwalk.benchmarks.app_latency import CHROMIUM, _free_port, _wait_healthy


def _caption(page, text: str):
    """A caption holding text. Captions only: a text search of the whole page would also scan
    the prompt (half a megabyte at 128k tokens), which costs the browser more than the step."""
    return page.locator('[data-testid="stCaptionContainer"]').filter(has_text=text).first


def _build_ms(caption: str) -> float:
    """The page's own 'data + figures N ms': the server's share of a step, browser excluded."""
    return float(caption.split("data + figures ", 1)[1].split(" ms", 1)[0])


def _settled(page) -> None:
    page.wait_for_timeout(100)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden")
    # two animation frames: they run only once the browser has drawn what the run sent
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def _path(start: int, layers: int) -> list[tuple[list[str], str, int]]:
    """(keys pressed at once, kind, layer shown after): four neighbour steps up to new layers,
    four back (revisits), then far jumps to layers never shown: End, three ArrowLeft, Home."""
    top = min(start + 4, layers - 1)
    path = [(["ArrowRight"], "new", x) for x in range(start + 1, top + 1)]
    path += [(["ArrowLeft"], "cached", x) for x in range(top - 1, start - 1, -1)]
    if layers - 1 > top + 1:
        path.append((["End"], "far", layers - 1))
    if layers - 4 > top:
        path.append((["ArrowLeft"] * 3, "far", layers - 4))
    if start > 0:
        path.append((["Home"], "far", 0))
    return path


def measure(url: str, run_id: str, layers: int, shot: Path | None = None) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(600_000)
        t0 = time.monotonic()
        page.goto(f"{url}/explore?run={run_id}")
        _caption(page, "data + figures").wait_for()
        page.locator(".js-plotly-plot .heatmaplayer").nth(2).wait_for()  # sketch, walk, mask
        _settled(page)
        first = time.monotonic() - t0
        if shot is not None:  # the zoomed-out view, for the docs
            page.set_viewport_size({"width": 1400, "height": 2000})
            page.wait_for_timeout(1500)
            page.screenshot(path=str(shot))
            page.set_viewport_size({"width": 1400, "height": 1000})
        slider = (
            page.locator('[data-testid="stSlider"]').filter(has_text="Layer").get_by_role("slider")
        )
        moves: dict[str, list[float]] = {"new": [], "cached": [], "far": []}
        built: dict[str, list[float]] = {"new": [], "cached": [], "far": []}
        start = int(_caption(page, "data + figures").inner_text().split()[1])
        for keys, kind, target in _path(start, layers):
            slider.focus()
            t = time.monotonic()
            for key in keys:
                slider.press(key)
            caption = _caption(page, f"Layer {target} ·")
            caption.wait_for()
            _settled(page)
            moves[kind].append(time.monotonic() - t)
            built[kind].append(_build_ms(caption.inner_text()))
        browser.close()
    med = {k: statistics.median(v) if v else float("nan") for k, v in moves.items()}
    ms = {k: statistics.median(v) if v else float("nan") for k, v in built.items()}
    return {
        "built_ms": (ms["new"], ms["cached"], ms["far"]),
        "first_s": first,
        "new_layer_s": med["new"],
        "cached_layer_s": med["cached"],
        "far_jump_s": med["far"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--layers", type=int, default=12, help="12 leave room for far jumps")
    ap.add_argument("--screenshots", metavar="DIR", help="save explore-<tokens>.png there")
    args = ap.parse_args(argv)
    from sketchwalk.benchmarks.long_run import make_long_result
    from sketchwalk.store import open_store

    db = Path(tempfile.mkdtemp()) / "long.duckdb"
    ids = {}
    with open_store(str(db)) as store:
        for n in args.tokens:
            res = make_long_result(n, args.layers)
            rid = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
            store.save_result(rid, res)
            ids[n] = rid
    port = _free_port()
    url = f"http://localhost:{port}"
    script = Path(sys.executable).with_name("sketchwalk")
    proc = subprocess.Popen(
        [str(script), "app", "--db", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_healthy(url, proc)
        print(
            "tokens  blocks  first load s  layer step s (new layer)  layer step s (revisit)"
            "  far jump s (new layer)  data + figures ms (new/revisit/far)"
        )
        for n, rid in ids.items():
            shot = Path(args.screenshots) / f"explore-{n}.png" if args.screenshots else None
            r = measure(url, rid, args.layers, shot)
            print(
                f"{n:>6}  {-(-n // 64):>6}  {r['first_s']:>12.2f}  {r['new_layer_s']:>24.2f}"
                f"  {r['cached_layer_s']:>22.2f}  {r['far_jump_s']:>22.2f}"
                f"  {'/'.join(f'{v:.0f}' for v in r['built_ms']):>35}"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(db.parent)  # a 12-layer 128k store is about 250 MB
    return 0


if __name__ == "__main__":
    sys.exit(main())
