"""The fuzzy-logic task: problem sets, evaluation and latent codes against the CLI's files."""

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, run_cli, sidecar

LOGIC = "logic-hyla"


@pytest.fixture(scope="module")
def logic_model() -> hl.Model:
    return hl.load(LOGIC)


@pytest.mark.parametrize(
    "set_,flags,kwargs",
    [
        ("ood", [], {}),
        ("unknown", ["--fixed-query"], {"fixed_query": True}),
        ("id", ["--fixed-context", "--logic-samples", "16"], {"fixed_context": True, "samples": 16}),
    ],
)
def test_logic_sample_equals_cli(cli, tmp_path, set_, flags, kwargs):
    out = tmp_path / "p.npz"
    run_cli(cli, "tasks", "sample", "--task", "logic", "--split", "seed2", "--set", set_, "--n", "300", "--seed", "7", "--out", str(out), *flags)
    ps = hl.tasks.sample("logic", split="seed2", set=set_, n=300, seed=7, **kwargs)
    z = np.load(out)
    assert list(z.keys()) == ["x", "y", "targets", "terms", "term_ids"]
    for k in z.keys():
        assert z[k].dtype == ps.as_dict()[k].dtype, k
        np.testing.assert_array_equal(z[k], ps.as_dict()[k], err_msg=k)
    t = 16 if "samples" in kwargs else 32
    assert ps.x.shape == (300, t, 5) and ps.terms.shape == (300, 2, 4)
    # the file reads back through the crates' reader, and a save writes the same arrays
    back = hl.LogicProblemSet.load(out, samples=t)
    again = tmp_path / "q.npz"
    back.save(again)
    z2 = np.load(again)
    for k in z.keys():
        np.testing.assert_array_equal(z[k], z2[k], err_msg=k)


def test_logic_split_counts():
    # 16 terms, 4 unknown; C(12, 2) = 66 known pairs, int(66 * 0.7) = 46 held out, C(4, 2) = 6
    assert hl.tasks.logic_split("seed0") == {"id": 20, "ood": 46, "unknown": 6}
    assert hl.tasks.logic_split("seed0", frac_test=0.3) == {"id": 47, "ood": 19, "unknown": 6}


def test_logic_evaluate_equals_cli_eval(logic_model, cli, tmp_path):
    ps = hl.tasks.sample("logic", split="seed0", set="ood", n=300, seed=7)
    path = tmp_path / "p.npz"
    ps.save(path)
    line = run_cli(cli, "eval", "--checkpoint", str(logic_model.path), "--problems", str(path), "--json", "--batch", "64")
    ref = json.loads(line)
    got = logic_model.evaluate(hl.LogicProblemSet.load(path), batch=64)
    assert got == ref  # every number bit for bit, and the set named by its path
    # sampled by the CLI itself (chunks of 256): the same numbers on the same sequences
    line = run_cli(cli, "eval", "--checkpoint", str(logic_model.path), "--set", "unknown", "--n", "300", "--seed", "4", "--json")
    ref = json.loads(line)
    got = logic_model.evaluate(hl.tasks.sample("logic", split="seed0", set="unknown", n=300, seed=4))
    assert got == ref
    assert 0.9 < logic_model.evaluate(ps)["r2"] <= 1.0


@pytest.mark.parametrize("site,layers", [("paper", None), ("query:31;keys:0,7,31", [1]), ("query:3;keys:3", [1, 0])])
def test_logic_latent_codes_equal_cli_probe(logic_model, cli, tmp_path, site, layers):
    ps = hl.tasks.sample("logic", split="seed0", set="ood", n=150, seed=3)
    path = tmp_path / "p.npz"
    ps.save(path)
    out = tmp_path / "codes.npz"
    args = ["probe", "--checkpoint", str(logic_model.path), "--problems", str(path), "--site", site, "--out", str(out), "--batch", "40"]
    if layers:
        args += ["--layers", ",".join(map(str, layers))]
    run_cli(cli, *args)
    got = logic_model.latent_codes(ps, site=site, layers=layers, batch=33)
    assert isinstance(got, hl.LogicCodeSet)
    z = np.load(out)
    assert list(z.keys()) == list(got.as_dict())
    for k in z.keys():
        assert z[k].dtype == got.as_dict()[k].dtype, k
        np.testing.assert_array_equal(z[k], got.as_dict()[k], err_msg=k)
    meta = sidecar(out)
    assert got.site == meta["site"] and got.layers == meta["layers"]
    n_keys = len(site.split("keys:")[1].split(",")) if "keys:" in site else 1
    assert got.codes.shape == (150, len(layers or [0, 1]), 8, 1, n_keys)


def test_logic_latent_codes_of_a_cli_sampled_set(logic_model, cli, tmp_path):
    """`probe --set ood --n --seed` samples in chunks of 256 as `tasks sample` does; the package's
    sample of the same flags gives the same codes."""
    out = tmp_path / "codes.npz"
    run_cli(cli, "probe", "--checkpoint", str(logic_model.path), "--set", "ood", "--n", "300", "--seed", "9", "--out", str(out))
    got = logic_model.latent_codes(hl.tasks.sample("logic", split="seed0", set="ood", n=300, seed=9))
    z = np.load(out)
    for k in z.keys():
        np.testing.assert_array_equal(z[k], got.as_dict()[k], err_msg=k)
    assert got.mse == pytest.approx(float(np.mean((z["prediction"].astype(np.float64) - z["target"]) ** 2)))


def test_logic_codeset_save_load_is_the_cli_format(logic_model, cli, tmp_path):
    ps = hl.tasks.sample("logic", set="id", n=128, seed=1)
    c = logic_model.latent_codes(ps)
    path = tmp_path / "c.npz"
    c.save(path)
    z = np.load(path)
    assert list(z.keys()) == ["codes", "terms", "term_ids", "target", "prediction", "problem"]
    back = hl.LogicCodeSet.load(path)
    for k, v in c.as_dict().items():
        np.testing.assert_array_equal(getattr(back, k), v, err_msg=k)
    # the CLI's analyzer reads it as a logic code file (term decoding)
    run_cli(cli, "analyze", "--train", str(path), "--test", str(path), "--out", str(tmp_path / "an"))
    assert (tmp_path / "an").is_dir()


def test_logic_errors(logic_model, model):
    ps = hl.tasks.sample("logic", n=8, seed=0)
    with pytest.raises(hl.InputError, match="SRAVEN site"):
        logic_model.latent_codes(ps, site="all-slots")
    with pytest.raises(hl.InputError, match="query 40"):
        logic_model.latent_codes(ps, site="query:40;keys:0")
    with pytest.raises(hl.InputError):
        logic_model.latent_codes(ps, layers=[2])
    with pytest.raises(TypeError, match="LogicProblemSet"):
        logic_model.evaluate(hl.tasks.sample(n=4))
    with pytest.raises(TypeError, match="fuzzy-logic model"):
        model.latent_codes(ps)
    with pytest.raises(hl.InputError, match="seed"):
        hl.tasks.sample("logic", split="paper-seed0", n=4)
    with pytest.raises(hl.InputError, match="unknown"):
        hl.tasks.sample("logic", set="train", n=4)
    with pytest.raises(hl.InputError, match="apply to task"):
        hl.tasks.sample("sraven", n=4, fixed_query=True)
    with pytest.raises(hl.BudgetError):
        hl.tasks.sample("logic", n=10**12)
    bad = ps.as_dict()
    bad["terms"] = 1 - bad["terms"]
    with pytest.raises(hl.InputError, match="disagrees with term_ids"):
        hl.LogicProblemSet(**bad)
    with pytest.raises(hl.ShapeError, match="targets"):
        hl.LogicProblemSet(ps.x, ps.y, ps.targets[:, :5], ps.terms, ps.term_ids)
    x = ps.x.copy()
    x[0, 0, 0] = np.nan
    with pytest.raises(hl.InputError, match="NaN"):
        logic_model.evaluate(hl.LogicProblemSet(x, ps.y, ps.targets, ps.terms, ps.term_ids, validate=False))
    with pytest.raises(hl.ShapeError, match="x"):
        logic_model.latent_codes(hl.tasks.sample("logic", n=4, samples=16))


def test_term_decoding_equals_cli_analyze(logic_model, cli, tmp_path):
    pd = pytest.importorskip("pandas")
    sets = {}
    for s in ("id", "ood"):
        ps = hl.tasks.sample("logic", split="seed0", set=s, n=256, seed=2)
        sets[s] = logic_model.latent_codes(ps)
        sets[s].save(tmp_path / f"{s}.npz")
    run_cli(cli, "analyze", "--train", str(tmp_path / "id.npz"), "--test", str(tmp_path / "ood.npz"), "--out", str(tmp_path / "an"), "--seed", "3")
    got = hl.analysis.term_decoding(sets["id"], sets["ood"], seed=3)
    pd.testing.assert_frame_equal(got, pd.read_csv(tmp_path / "an" / "term_decoding.csv"))
    # analyze dispatches on logic codes to the same table
    pd.testing.assert_frame_equal(hl.analysis.analyze(sets["id"], sets["ood"], seed=3).term_decoding, got)
    assert list(got["layer"]) == ["0", "1", "all"] or list(got["layer"].astype(str)) == ["0", "1", "all"]
    with pytest.raises(TypeError, match="LogicCodeSet"):
        hl.analysis.term_decoding(sets["id"].codes, sets["ood"])
