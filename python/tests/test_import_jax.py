"""`hl.import_jax` against `hyperlens import jax`: the same checkpoint bytes and the same logits."""

from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl
from conftest import run_cli

PARAMS = Path("crates/model/tests/fixtures/paper-jax/hyla_params.npz")


def test_import_jax_equals_the_cli(cli, tmp_path, ood_small):
    cli_dir = tmp_path / "cli"
    run_cli(cli, "import", "jax", "--params", str(PARAMS), "--mixer", "hyla", "--out", str(cli_dir))
    py_dir = tmp_path / "py"
    written = hl.import_jax(PARAMS, "hyla", out=py_dir)
    for name in ("config.json", "model.safetensors"):
        assert (py_dir / name).read_bytes() == (cli_dir / name).read_bytes(), name
    in_memory = hl.import_jax(PARAMS, "linear_hypatt")  # the paper's method string for HYLA
    loaded = hl.load(cli_dir)
    assert in_memory.cfg.mixer == loaded.cfg.mixer == "hyla"
    assert in_memory.cfg.n_params == loaded.cfg.n_params
    x = ood_small.x[:64]
    want = loaded.logits(x)
    np.testing.assert_array_equal(in_memory.logits(x), want)
    np.testing.assert_array_equal(written.logits(x), want)


def test_import_jax_errors(tmp_path):
    with pytest.raises(hl.InputError, match="mixer"):
        hl.import_jax(PARAMS, "no-such-mixer")
    (tmp_path / "taken").mkdir()
    with pytest.raises(hl.InputError, match="force=True"):
        hl.import_jax(PARAMS, "hyla", out=tmp_path / "taken")
    with pytest.raises(FileNotFoundError):
        hl.import_jax(tmp_path / "none.npz", "hyla")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(hl.CheckpointError):
        hl.import_jax(bad, "hyla")
