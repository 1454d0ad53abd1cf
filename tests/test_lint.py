"""The lint the Makefile's `lint` target runs, as part of the suite: `.ci/run` is the README's
test command and nothing else, so a lint error that lands would otherwise go unnoticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes_on_the_code_the_makefile_lints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "ruff check src tests workflow bench" in makefile  # the same paths as `make lint`
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "workflow", "bench"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
