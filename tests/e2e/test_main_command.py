"""The README's main command, as a new user runs it (with --once so it ends by itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]


def test_run_reconciles_the_example_to_ready_and_cleans_up() -> None:
    result = subprocess.run([sys.executable, "-m", "stageset.cli", "run", "--once"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for stage in ("config", "backend", "frontend"):
        assert f"stage {stage:<10} Ready" in output, output
    assert "StageSet shop/shop: Ready=True (Succeeded)" in output, output
    assert "stopped the controller and the control plane" in output
