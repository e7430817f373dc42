"""hyperlens.tasks against the CLI's problem files."""

import numpy as np
import pytest

import hyperlens as hl
from conftest import run_cli


def test_splits_match_the_paper():
    s = hl.tasks.splits()
    assert [d["name"] for d in s] == ["paper-seed0", "paper-seed1", "paper-seed2", "paper-seed2024"]
    assert all((d["id_tasks"], d["ood_tasks"]) == (248, 82) for d in s)


@pytest.mark.parametrize("unpermuted", [False, True])
def test_sample_equals_cli(cli, tmp_path, unpermuted):
    out = tmp_path / "p.npz"
    args = ["tasks", "sample", "--split", "paper-seed1", "--set", "ood", "--n", "300", "--seed", "7", "--out", str(out)]
    if unpermuted:
        args.append("--unpermuted")
    run_cli(cli, *args)
    ps = hl.tasks.sample(split="paper-seed1", set="ood", n=300, seed=7, unpermuted=unpermuted)
    z = np.load(out)
    assert z["x"].dtype == np.uint8 and ps.x.dtype == np.float32
    assert ps.x.shape == (300, 36, 8) and ps.y.shape == (300, 4) and ps.perms.shape == (300, 3, 4)
    np.testing.assert_array_equal(ps.x, z["x"].astype(np.float32))
    for k in ("y", "rules", "perms"):
        assert z[k].dtype == getattr(ps, k).dtype == np.int64
        np.testing.assert_array_equal(getattr(ps, k), z[k], err_msg=k)
    if unpermuted:
        np.testing.assert_array_equal(ps.perms, np.broadcast_to(np.arange(4), (300, 3, 4)))


def test_save_load_round_trip_and_cli_reads_it(cli, tmp_path, model):
    ps = hl.tasks.sample(split="paper-seed0", set="id", n=64, seed=1)
    path = tmp_path / "ps.npz"
    ps.save(path)
    z = np.load(path)
    assert z["x"].dtype == np.uint8 and z["y"].dtype == np.int64
    back = hl.ProblemSet.load(path)
    for k in ("x", "y", "rules", "perms"):
        np.testing.assert_array_equal(getattr(back, k), getattr(ps, k))
    # the CLI evaluates the file the package wrote; the numbers equal model.evaluate's
    import json

    got = json.loads(run_cli(cli, "eval", "--checkpoint", str(model.path), "--problems", str(path), "--json"))
    mine = model.evaluate(back)
    assert mine["n"] == got["n"] == 64
    assert mine["accuracy"] == pytest.approx(got["accuracy"], abs=0)
    assert mine["loss"] == pytest.approx(got["loss"], rel=1e-12)
    assert mine["per_feature_accuracy"] == got["per_feature_accuracy"]


def test_problem_set_from_arrays_converts_dtypes_safely():
    ps = hl.tasks.sample(n=8, seed=2)
    for dt in (np.uint8, np.bool_, np.float64, np.int64):
        q = hl.ProblemSet(ps.x.astype(dt), ps.y.astype(np.int32), ps.rules, ps.perms)
        assert q.x.dtype == np.float32 and q.y.dtype == np.int64
        np.testing.assert_array_equal(q.x, ps.x)
    assert len(ps[2:5]) == 3


def test_problem_set_refuses_bad_arrays():
    ps = hl.tasks.sample(n=8, seed=2)
    with pytest.raises(hl.InputError, match="rules"):
        hl.ProblemSet(ps.x, ps.y, ps.rules + 8, ps.perms)
    with pytest.raises(hl.InputError, match="x"):
        hl.ProblemSet(ps.x.astype(np.complex64), ps.y, ps.rules)
    with pytest.raises(hl.ShapeError, match="x"):
        hl.ProblemSet(ps.x[0], ps.y, ps.rules)
    with pytest.raises(hl.InputError, match="`x`"):
        hl.ProblemSet(ps.x * 0.5, ps.y, ps.rules)


@pytest.mark.parametrize("task", ["sraven", "logic"])
def test_a_prefix_in_any_index_form_keeps_how_the_set_was_made(task):
    """hyperlens_report::code_explorer::ProblemOrigin::keeps_origin decides: rows 0..k in order
    (a slice, an index array, a mask) are the set sampled with n = k, which the sample confirms;
    anything else is marked as a subset."""
    ps = hl.tasks.sample(task=task, n=6, seed=2)
    small = hl.tasks.sample(task=task, n=3, seed=2)
    np.testing.assert_array_equal(ps[:3].x, small.x)
    for prefix in (slice(0, 3), np.array([0, 1, 2]), np.arange(6) < 3, slice(-6, 3)):
        assert ps[prefix].meta == ps.meta, prefix
    for other in (np.array([1, 0]), np.array([0, 2]), slice(None, None, -1), np.arange(6) > 2):
        assert ps[other].meta == {**ps.meta, "subset": True}, other
    assert ps[1:][:1].meta["subset"] is True
