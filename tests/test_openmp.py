"""How idle OpenMP workers wait (sketchwalk/openmp.py), and that the command sets it before torch."""

import os
import subprocess
import sys

from sketchwalk.openmp import SPIN_COUNT, short_spin_waits


def test_a_short_spin_unless_the_environment_chose():
    assert short_spin_waits({}) == {"GOMP_SPINCOUNT": SPIN_COUNT}
    assert short_spin_waits({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert short_spin_waits({"GOMP_SPINCOUNT": "0", "PATH": "/bin"}) == {}


def test_the_command_sets_it_before_torch_loads():
    """Importing the command's entry point sets GOMP_SPINCOUNT while torch is not yet loaded
    (libgomp reads it once, when torch loads it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = (
        "import os, sys; import sketchwalk.cli.main; "
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    spin, torch_loaded = out.stdout.split()
    assert spin == SPIN_COUNT
    assert torch_loaded == "False"  # set first: a command loads torch only once it runs
