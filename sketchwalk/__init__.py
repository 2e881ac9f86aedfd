"""Sketch&Walk sparse attention: engine, kernels, store and app."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"


def _unshadow_kernels_distribution() -> None:
    """Import the installed `kernels` distribution where this checkout's kernels/ folder hides it.

    Why: kernels/ is installed as `sketchwalk.kernels`, but run from the checkout's root
    (`python -m pytest`, `python -m sketchwalk...`) the root is on sys.path and the folder is
    also the top-level `kernels`, the name of Hugging Face's hub-kernels package, which
    transformers (5.25 on) requires and imports while loading a model: it would get this folder
    and fail. Importing the real package first, without the root on the path, puts it in
    sys.modules, where transformers finds it. Nothing happens elsewhere (the folder is not on
    the path, or the name is already imported, or no such distribution is installed).
    """
    root = Path(__file__).resolve().parent.parent
    ours = root / "kernels" / "__init__.py"
    if "kernels" in sys.modules or not ours.is_file():
        return
    spec = importlib.util.find_spec("kernels")
    if spec is None or spec.origin is None or Path(spec.origin).resolve() != ours:
        return
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != root]
    try:
        if importlib.util.find_spec("kernels") is not None:
            importlib.import_module("kernels")
    except ImportError:
        pass  # a broken install fails where it is used, with its own message
    finally:
        sys.path[:] = saved


_unshadow_kernels_distribution()
