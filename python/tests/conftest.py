"""Shared fixtures: the repository root, a shipped checkpoint, the `hyperlens` binary."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = "sraven-hyla"


@pytest.fixture(scope="session", autouse=True)
def _in_repo_root():
    """Run every test from the repository root, where shipped checkpoints resolve by name."""
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)


@pytest.fixture(scope="session")
def model() -> hl.Model:
    os.chdir(ROOT)
    return hl.load(CHECKPOINT)


@pytest.fixture(scope="session")
def cli() -> Path:
    """The release binary that scripts/test.sh's cargo half built (or $HYPERLENS_BIN)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    exe = Path(os.environ.get("HYPERLENS_BIN", target / "release" / "hyperlens"))
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: build it with `cargo build --release -p hyperlens` (scripts/test.sh does)")
    return exe


def run_cli(exe: Path, *args: str) -> str:
    r = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"hyperlens {' '.join(args)} failed:\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="session")
def ood_small() -> hl.ProblemSet:
    return hl.tasks.sample(split="paper-seed0", set="ood", n=96, seed=3, unpermuted=False)


def sidecar(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def assert_codes_equal(a: dict, b: dict, rtol: float = 0.0, atol: float = 0.0) -> None:
    """The arrays of two code sets: ints and bools equal, codes within the tolerance."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    for k in a:
        if k == "codes":
            assert a[k].dtype == b[k].dtype == np.float32
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol)
        else:
            assert a[k].dtype == b[k].dtype, k
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
