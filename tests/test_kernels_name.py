"""Run from the checkout's root, the kernels/ folder must not hide the installed `kernels`
distribution (Hugging Face's hub kernels, which transformers 5.25 on imports with a model)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
sys.path.insert(0, {root!r})  # as `python -m` from the root does
import sketchwalk
import sketchwalk.kernels as ours
import transformers.integrations.hub_kernels  # what loading a model imports: fails if shadowed
print(ours.__file__)
print(sys.modules["kernels"].__file__ if "kernels" in sys.modules else "-")
"""


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_root_on_the_path_leaves_the_kernels_name_to_the_distribution():
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(root=str(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert Path(out[0]) == ROOT / "kernels" / "__init__.py"  # sketchwalk.kernels is still ours
    if _installed("kernels"):
        assert out[1] != "-" and Path(out[1]).parent != ROOT / "kernels"
    else:
        assert out[1] == "-"  # nothing to un-shadow: the name is left alone
