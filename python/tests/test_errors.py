"""One exception hierarchy: every bad input raises a HyperlensError subclass with a one-line
message naming the argument; no Rust panic reaches Python."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hyperlens as hl


def test_hierarchy_has_builtin_bases():
    assert issubclass(hl.InputError, ValueError) and issubclass(hl.ShapeError, hl.InputError)
    assert issubclass(hl.BudgetError, MemoryError) and issubclass(hl.NotFoundError, FileNotFoundError)
    for c in (hl.InputError, hl.CheckpointError, hl.FileFormatError, hl.NotFoundError, hl.BudgetError, hl.NumericalError, hl.HookError):
        assert issubclass(c, hl.HyperlensError)


def test_bad_dtype(model, ood_small):
    with pytest.raises(hl.InputError, match="`x` has dtype complex64"):
        model.logits(ood_small.x.astype(np.complex64))
    with pytest.raises(hl.InputError, match="`x` is float64"):
        model.logits(ood_small.x.astype(np.float64) * 0.1)
    with pytest.raises(hl.InputError, match="`y`"):
        hl.ProblemSet(ood_small.x, ood_small.y + 0.5, ood_small.rules)


def test_bad_shape_names_the_argument_and_the_shape(model, ood_small):
    with pytest.raises(hl.ShapeError, match=r"`x` must have shape \[N >= 1, 36, 8\].*\[3, 35, 8\]"):
        model.logits(ood_small.x[:3, :35])
    with pytest.raises(hl.ShapeError, match="`x` must have 3 axes"):
        model.logits(ood_small.x[0])
    with pytest.raises(hl.ShapeError):
        model.logits(ood_small.x[:0])


def test_nan_is_refused(model, ood_small):
    x = ood_small.x[:4].copy()
    x[2, 5, 1] = np.nan
    with pytest.raises(hl.InputError, match="`x` holds a NaN"):
        model.logits(x)
    with pytest.raises(hl.InputError, match="X"):
        hl.analysis.pca(np.array([[1.0, np.nan], [0.0, 1.0], [2.0, 2.0]]), 1)


def test_out_of_range_site_layers_and_batch(model, ood_small):
    with pytest.raises(hl.InputError, match="layer 7 out of range"):
        model.latent_codes(ood_small, layers=[7])
    with pytest.raises(hl.InputError, match="unknown site"):
        model.latent_codes(ood_small, site="nowhere")
    with pytest.raises(hl.InputError, match="batch"):
        model.logits(ood_small, batch=0)
    with pytest.raises(hl.InputError, match="split"):
        hl.tasks.sample(split="paper-seed9", n=4)


def test_missing_and_truncated_checkpoints(tmp_path):
    with pytest.raises(hl.NotFoundError, match="no-such-checkpoint"):
        hl.load("no-such-checkpoint")
    with pytest.raises(FileNotFoundError):
        hl.load(tmp_path / "nothing")
    bad = tmp_path / "truncated"
    shutil.copytree("data/checkpoints/sraven-hyla", bad, ignore=shutil.ignore_patterns("optimizer*", "metrics*"))
    st = bad / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    with pytest.raises(hl.CheckpointError, match="model.safetensors"):
        hl.load(bad)
    (bad / "config.json").write_text('{"d_in": 8}')
    with pytest.raises(hl.CheckpointError, match="config.json"):
        hl.load(bad)


def test_truncated_code_file(tmp_path, model, ood_small):
    p = tmp_path / "c.npz"
    model.latent_codes(ood_small).save(p)
    p.write_bytes(p.read_bytes()[:3000])
    with pytest.raises(hl.FileFormatError):
        hl.CodeSet.load(p)
    with pytest.raises(hl.NotFoundError):
        hl.CodeSet.load(tmp_path / "absent.npz")


def test_oversize_n_is_a_memory_error_before_allocating():
    with pytest.raises(MemoryError, match="over the memory budget") as e:
        hl.tasks.sample(n=10**12)
    assert isinstance(e.value, hl.BudgetError)
    assert "\n" not in str(e.value)


def test_budget_from_the_environment_applies_to_the_model(tmp_path):
    """HYPERLENS_MEMORY_BUDGET is read at import, as the CLI reads it at start-up."""
    code = (
        "import hyperlens as hl\n"
        "m = hl.load('sraven-hyla')\n"
        "ps = hl.tasks.sample(n=64)\n"
        "try:\n"
        "    m.patterns(ps)\n"
        "except MemoryError as e:\n"
        "    print('refused:', type(e).__name__, e)\n"
    )
    env = dict(os.environ, HYPERLENS_MEMORY_BUDGET="8M")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "refused: BudgetError" in r.stdout and "HYPERLENS_MEMORY_BUDGET" in r.stdout
