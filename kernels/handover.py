"""Give the top-level name `kernels` to the installed distribution of that name.

Python puts the working directory first on sys.path (`python -m ...`, `python -c ...`), so from
the checkout's root this folder is found as `kernels` before Hugging Face's hub-kernels package in
site-packages. Then this module finds the package the name belongs to on the rest of the path,
without changing sys.path, loads it and puts it in sys.modules["kernels"]: the import statement
that reached this folder returns it (the import system reads sys.modules after running a module).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import PathFinder
from pathlib import Path


def hand_over(init_file: str) -> None:
    """Replace the module being imported as `kernels` (this folder) by the distribution's."""
    folder = Path(init_file).resolve().parent
    sys.modules.pop("kernels.handover", None)  # this module: no part of whatever takes the name
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != folder.parent]
    spec = PathFinder.find_spec("kernels", elsewhere)
    if spec is None or spec.loader is None:
        del sys.modules["kernels"]
        raise ModuleNotFoundError(
            f"no module named 'kernels' is installed ({folder} is sketchwalk.kernels, "
            "not a top-level package)",
            name="kernels",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise
