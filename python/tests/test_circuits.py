"""hl.circuits against `hyperlens circuits` on the shipped two-layer attention-only model."""

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, run_cli

LM = ROOT / "data/induction/attn-only-2l"
OPTS = {"seq_len": 20, "seed": 1, "n_seqs": 4, "baseline_samples": 200, "top": 5}


@pytest.fixture(scope="module")
def lm():
    return hl.load(LM)


@pytest.fixture(scope="module")
def cli_out(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("circuits")
    run_cli(
        cli, "circuits", "--checkpoint", str(LM), "--out", str(out), "--seq-len", "20", "--seed", "1",
        "--n-seqs", "4", "--baseline-samples", "200", "--top", "5",
    )
    return out


@pytest.fixture(scope="module")
def report(lm):
    return hl.circuits.analyze(lm, **OPTS)


def test_eigenvalues_and_copying_equal_cli(report, cli_out):
    z = np.load(cli_out / "eigenvalues.npz")
    np.testing.assert_array_equal(report.ov.real, z["ov_re"])
    np.testing.assert_array_equal(report.ov.imag, z["ov_im"])
    np.testing.assert_array_equal(report.full_ov.real, z["full_ov_re"])
    np.testing.assert_array_equal(report.full_ov.imag, z["full_ov_im"])
    np.testing.assert_array_equal(report.ov_copying, z["ov_copying"])
    np.testing.assert_array_equal(report.full_ov_copying, z["full_ov_copying"])
    assert report.ov.shape == (2, 4, 16) and report.ov.dtype == np.complex128


def test_composition_with_baseline_equals_cli(report, cli_out):
    for k in ("q", "k", "v"):
        z = np.load(cli_out / f"composition_{k}.npz")
        np.testing.assert_array_equal(report.composition[k], z["scores"], err_msg=k)
        np.testing.assert_array_equal(report.baseline[k], z["baseline"], err_msg=k)
        assert report.composition[k].shape == (2, 4, 2, 4) and report.baseline[k].shape == (200,)


def test_composition_figure_is_the_notebooks(report, cli_out):
    """`hyperlens circuits` writes figures/composition.svg, the Q/K/V heatmaps with hover values:
    the very figure hl.viz.heatmap draws of the same analysis in a notebook, byte for byte."""
    svg = (cli_out / "figures" / "composition.svg").read_text()
    assert 'data-hl-kind="heatmap"' in svg
    assert svg == hl.viz.heatmap(report).svg


def test_tables_and_findings_equal_cli(report, cli_out):
    pd = pytest.importorskip("pandas")
    pd.testing.assert_frame_equal(report.heads, pd.read_csv(cli_out / "heads.csv"))
    pd.testing.assert_frame_equal(report.copying, pd.read_csv(cli_out / "copying.csv"))
    pd.testing.assert_frame_equal(report.composition_top, pd.read_csv(cli_out / "composition_top.csv"))
    summary = json.loads((cli_out / "summary.json").read_text())
    for k in ("induction_heads", "previous_token_heads", "induction_circuits", "top_induction_head", "strongest_pair", "composition"):
        assert report.summary[k] == summary[k], k
    # the shipped model's induction circuit (reports/circuits/attn-only-2l): L0H0 -> L1H2
    assert {"L1H1", "L1H2"} <= set(report.induction_heads) and report.previous_token_heads == ["L0H0"]
    np.testing.assert_allclose(report.heads["repeated_induction"].to_numpy().reshape(2, 4), report.rep_induction, atol=5e-7)


def test_head_circuits(lm, report):
    ov = hl.circuits.ov_circuit(lm, 1, 2)
    assert ov.A.shape == (64, 16) and ov.B.shape == (16, 64) and ov.shape == (64, 64)
    np.testing.assert_array_equal(ov.eigenvalues, report.ov[1, 2])
    assert ov.copying_score == report.ov_copying[1, 2]
    # the factors' spectrum is that of the full product (numpy's eigen-solver, float64)
    ref = np.linalg.eigvals(ov.BA)
    np.testing.assert_allclose(np.sort(np.abs(ref))[::-1], np.abs(ov.eigenvalues), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ov.singular_values, np.linalg.svd(ov.AB, compute_uv=False)[:16], rtol=1e-9, atol=1e-12)
    full = hl.circuits.ov_circuit(lm, 1, 2, full=True)
    assert full.shape == (256, 256)
    # the pipeline multiplies the factors in another order: equal to float64 rounding
    np.testing.assert_allclose(full.eigenvalues, report.full_ov[1, 2], rtol=1e-12)
    qk = hl.circuits.qk_circuit(lm, 0, 0)
    assert qk.shape == (64, 64) and qk.A.shape == (64, 16)
    ov_c, full_c = hl.circuits.copying_scores(lm)
    np.testing.assert_array_equal(ov_c, report.ov_copying)
    np.testing.assert_array_equal(full_c, report.full_ov_copying)


def test_circuit_errors(lm, model):
    with pytest.raises(hl.InputError, match="L2H0"):
        hl.circuits.ov_circuit(lm, 2, 0)
    with pytest.raises(hl.InputError, match="seq_len 40"):
        hl.circuits.analyze(lm, seq_len=40)
    with pytest.raises(hl.InputError, match="token language model"):
        hl.circuits.analyze(model)
    with pytest.raises(hl.InputError):
        hl.circuits.analyze(lm, baseline_samples=5)
