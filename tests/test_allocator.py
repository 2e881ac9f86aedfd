"""Freed memory kept for reuse: the thresholds really change what glibc does with a freed block."""

import os
import subprocess
import sys

from sketchwalk import allocator

# Allocates and fills 96 MiB, frees it, prints how much of it is still resident (MiB).
_PROBE = """
import sys
from sketchwalk.allocator import keep_freed_memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
base = rss()
block = b"\\x01" * (96 << 20)
del block
print(applied, round(rss() - base))
"""


def _probe(mode: str, **env: str) -> tuple[str, int]:
    clean = {
        k: v for k, v in os.environ.items() if k not in allocator.ENV and k != allocator.OPT_OUT
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env=clean | env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_block_stays_resident_only_when_kept():
    applied, kept = _probe("keep")
    assert applied == "True" and kept > 80  # the 96 MiB came from the heap and stayed
    applied, kept = _probe("default")
    assert applied == "False" and kept < 16  # glibc's own thresholds: mmapped, returned at free


def test_opt_out_and_the_users_own_thresholds_are_respected():
    applied, kept = _probe("keep", **{allocator.OPT_OUT: "0"})
    assert applied == "False" and kept < 16
    applied, kept = _probe("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False" and kept < 16
    assert allocator.wanted({}) and not allocator.wanted({allocator.OPT_OUT: "0"})
    assert not allocator.wanted({"MALLOC_MMAP_THRESHOLD_": "1"})


def test_the_sketchwalk_command_keeps_freed_memory_and_passes_it_on(tmp_path):
    """Every command applies it, and the environment carries it into the processes a command
    starts (the app's streamlit process is exec'd with this environment)."""
    probe = (
        "import os, sys\n"
        "from sketchwalk.cli.main import main\n"
        "code = main(['runs', '--db', sys.argv[1], '--json'])\n"
        "print(code, os.environ.get('MALLOC_TRIM_THRESHOLD_'), os.environ.get('MALLOC_MMAP_THRESHOLD_'))\n"
    )
    clean = {
        k: v for k, v in os.environ.items() if k not in allocator.ENV and k != allocator.OPT_OUT
    }
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "s.duckdb")],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[-3:] == [
        "0",
        allocator.ENV["MALLOC_TRIM_THRESHOLD_"],
        allocator.ENV["MALLOC_MMAP_THRESHOLD_"],
    ]
