"""latent_codes against `hyperlens probe` and the committed report's code files."""

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, assert_codes_equal, run_cli, sidecar


def test_latent_codes_equal_the_committed_report_codes(model):
    """reports/default/codes/sraven-hyla_ood.npz was written by `hyperlens report` from the
    problems its sidecar names; the package's codes of the same problems agree to float32
    rounding (another CPU's vector width may change the last digits)."""
    path = ROOT / "reports/default/codes/sraven-hyla_ood.npz"
    meta = sidecar(path)
    ps = hl.tasks.sample(split=meta["split"], set=meta["set"], n=meta["n_problems"], seed=meta["seed"], unpermuted=meta["unpermuted"])
    got = model.latent_codes(ps, site=meta["site"])
    ref = hl.CodeSet.load(path)
    assert got.codes.shape == (2048, 4, 16, 1, 2) and got.codes.dtype == np.float32
    assert got.layers == meta["layers"] == ref.layers
    np.testing.assert_allclose(got.codes, ref.codes, rtol=1e-5, atol=1e-6)
    for k in ("label", "rules", "inputs", "target", "slot", "problem"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
    # predictions may only differ where two logits tie within rounding: none here
    assert (got.prediction != ref.prediction).mean() < 0.002
    assert got.accuracy == pytest.approx(ref.accuracy, abs=0.002)


@pytest.mark.parametrize("site,layers", [("paper", None), ("all-slots", [3, 1]), ("query:35;keys:27,31,3", [0])])
def test_latent_codes_equal_cli_probe(model, cli, tmp_path, ood_small, site, layers):
    probs = tmp_path / "p.npz"
    ood_small.save(probs)
    out = tmp_path / "codes.npz"
    args = ["probe", "--checkpoint", str(model.path), "--problems", str(probs), "--site", site, "--out", str(out), "--batch", "40"]
    if layers:
        args += ["--layers", ",".join(map(str, layers))]
    run_cli(cli, *args)
    got = model.latent_codes(ood_small, site=site, layers=layers, batch=33)
    z = dict(np.load(out))
    assert_codes_equal(got.as_dict(), z)
    assert got.layers == sidecar(out)["layers"]
    n_rows = len(ood_small) * (4 if site == "all-slots" else 1)
    assert got.codes.shape[0] == n_rows and got.label.shape == (n_rows,)


def test_codeset_save_load_is_the_cli_format(model, tmp_path, ood_small):
    c = model.latent_codes(ood_small)
    path = tmp_path / "c.npz"
    c.save(path)
    z = np.load(path)
    assert list(z.keys()) == ["codes", "label", "rules", "inputs", "target", "prediction", "correct", "slot", "problem"]
    back = hl.CodeSet.load(path)
    assert_codes_equal(back.as_dict(), c.as_dict())


def test_codes_are_owned_writable_arrays(model, ood_small):
    c = model.latent_codes(ood_small)
    assert c.codes.flags.writeable and c.codes.flags.c_contiguous
    assert c.features(2).shape == (96, 32) and c.features().shape == (96, 128)
    np.testing.assert_array_equal(c.features(1)[5], c.codes[5, 1].ravel())


def test_the_sidecar_is_read_as_the_probes_type(tmp_path):
    """CodeSet.load takes site and layers from codes.json as hyperlens_probe::ProbeMeta reads it:
    none without a sidecar, a FileFormatError naming a sidecar that is not a code file's."""
    p = tmp_path / "c.npz"
    hl.CodeSet(np.zeros((2, 1, 1, 1, 2), np.float32), np.array([0, 7])).save(p)
    back = hl.CodeSet.load(p)
    assert back.site is None and back.layers is None
    (tmp_path / "c.json").write_text('{"site": "paper"}')
    with pytest.raises(hl.FileFormatError, match=r"c\.json"):
        hl.CodeSet.load(p)
