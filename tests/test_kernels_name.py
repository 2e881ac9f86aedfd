"""Run from the checkout's root, the kernels/ folder must not hide the installed `kernels`
distribution (Hugging Face's hub kernels, which transformers 5.25 on imports with a model):
imported under that name, the folder hands it over (kernels/handover.py), with no sys.path
rewrite anywhere and whether or not sketchwalk was imported first."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FIRST_TRANSFORMERS = """
import sys
assert sys.path[0] == ""  # python -c from the root: the root is found first
import transformers.integrations.hub_kernels  # what loading a model imports: fails if shadowed
import kernels
import sketchwalk.kernels as ours
print(kernels.__file__)
print(ours.__file__)
"""

NO_DISTRIBUTION = """
import sys
sys.path[:] = [p for p in sys.path if "-packages" not in p]
try:
    import kernels
except ModuleNotFoundError as e:
    print(e.name, "|", e)
assert "kernels" not in sys.modules and "kernels.handover" not in sys.modules
"""


def _run(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_from_the_root_the_kernels_name_is_the_distributions():
    assert _installed("kernels")  # transformers 5.25 on requires it
    theirs, ours = _run(FIRST_TRANSFORMERS)
    assert Path(ours) == ROOT / "kernels" / "__init__.py"  # sketchwalk.kernels is still ours
    assert ROOT / "kernels" not in Path(theirs).parents and "-packages" in theirs


def test_without_the_distribution_the_folder_says_what_it_is():
    (line,) = _run(NO_DISTRIBUTION)
    name, message = line.split(" | ")
    assert name == "kernels" and "sketchwalk.kernels" in message
