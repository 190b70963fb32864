"""The asv suite stays runnable: ``asv check`` finds no problem, and a quick dry run of
a small subset completes and reports a timing for every case.

This is how CI checks the benchmarks without measuring anything (the timings of a
dry run on a shared CI machine mean nothing, and none are stored).
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("asv")
pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(ROOT, ".git")) or shutil.which("git") is None,
    reason="asv needs the project's git repository")


def _asv(*args, home=None, timeout=600):
    env = dict(os.environ)
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_asv_check_finds_no_problem():
    proc = _asv("check", "--python=same")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout


def test_asv_quick_dry_run_of_a_subset(tmp_path):
    # asv run needs a machine description (~/.asv-machine.json), which a fresh machine
    # lacks: describe one under a throw-away HOME instead of writing to the user's.
    proc = _asv("machine", "--yes", home=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _asv("run", "--python=same", "--quick", "--dry-run", "--show-stderr",
                "--bench", r"bench_overhead\.SmallCall", home=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "failed" not in out.lower(), out
    # 2 sizes x 2 channel counts x 4 operators, each with a time in the table
    times = re.findall(r"\d+(?:\.\d+)?(?:±\S+)?(?:us|μs|ms|s)\b", out)
    assert len(times) >= 16, out
