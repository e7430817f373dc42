"""hl.patching against `hyperlens patch heads / acts / dla / transplant` on the same problems.

The shipped SRAVEN models take minutes for activation patching on two cores, so the comparisons
run on a tiny SRAVEN model (2 layers, 2 heads, d_model 16) that the CLI trains in two seconds;
the code path (the probe crate's interventions on the hooked pass) is the same for any size.
"""

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import run_cli


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory) -> hl.Model:
    out = tmp_path_factory.mktemp("tiny") / "sraven-tiny"
    run_cli(
        cli, "train", "--task", "sraven", "--mixer", "hyla", "--split", "paper-seed0", "--steps", "60",
        "--batch", "32", "--layers", "2", "--d-model", "16", "--heads", "2", "--d-head", "8",
        "--d-mlp", "16", "--lr", "0.01", "--warmup", "10", "--eval-n", "64", "--out", str(out), "--quiet",
    )
    return hl.load(out)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=24, seed=3, unpermuted=True)
    path = tmp_path_factory.mktemp("probs") / "p.npz"
    ps.save(path)
    return ps, path


def _cli_patch(cli, tiny, out, sub, *args):
    run_cli(cli, "patch", sub, "--checkpoint", str(tiny.path), "--out", str(out), *args)
    return out


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_head_ablation_equals_cli(cli, tiny, clean, tmp_path, ablation):
    ps, path = clean
    out = _cli_patch(cli, tiny, tmp_path / "o", "heads", "--problems", str(path), "--ablation", ablation, "--batch", "10")
    ref = json.loads((out / "head_ablation.json").read_text())["report"]
    got = hl.patching.head_ablation(tiny, ps, ablation=ablation, batch=10)
    assert got.ablation == ablation
    assert got.base == ref["base"]
    assert got.accuracy.shape == got.loss.shape == (2, 2) and got.loss.dtype == np.float64
    for h in ref["heads"]:
        assert got.accuracy[h["layer"], h["head"]] == h["accuracy"]
        assert got.loss[h["layer"], h["head"]] == h["loss"]
    csv = (out / "head_ablation.csv").read_text()
    assert list(got.table.columns) == csv.splitlines()[0].split(",")
    np.testing.assert_allclose(got.table["delta_loss"], (got.loss - got.base["loss"]).ravel(), atol=5e-7)


def test_activation_patching_equals_cli(cli, tiny, clean, tmp_path):
    ps, path = clean
    out = _cli_patch(cli, tiny, tmp_path / "o", "acts", "--problems", str(path), "--slot", "2", "--batch", "24")
    z = np.load(out / "activation_patching.npz")
    meta = json.loads((out / "activation_patching.json").read_text())
    got = hl.patching.activation_patching(tiny, ps, slot=2, batch=24)
    for k in z.keys():
        np.testing.assert_array_equal(getattr(got, k), z[k], err_msg=k)
    assert got.resid_pre.shape == (2, 36) and got.head_out.shape == (2, 2)
    assert (got.n, got.slot) == (meta["n_pairs"], meta["slot"])
    assert got.clean_logit_diff == meta["clean_logit_diff"]
    assert got.corrupted_logit_diff == meta["corrupted_logit_diff"]
    # the TransformerLens-named accessors return the same grids
    np.testing.assert_array_equal(hl.patching.get_act_patch_attn_head_out_all_pos(tiny, ps, slot=2, batch=24), z["head_out"])
    np.testing.assert_array_equal(hl.patching.get_act_patch_mlp_out(tiny, ps, slot=2, batch=24), z["mlp_out"])


def test_dla_equals_cli(cli, tiny, clean, tmp_path):
    ps, path = clean
    for slot_args, slots in (([], None), (["--slot", "1"], [1])):
        out = _cli_patch(cli, tiny, tmp_path / f"o{len(slot_args)}", "dla", "--problems", str(path), "--batch", "10", *slot_args)
        ref = json.loads((out / "dla.json").read_text())
        got = hl.patching.direct_logit_attribution(tiny, ps, slots=slots, batch=10)
        assert got.slots == ref["slots"] and got.n == ref["n"]
        for k in ("logit", "logit_centred", "max_error"):
            assert getattr(got, k) == ref[k], k
        assert [got.embed, got.embed_centred] == ref["embed"]
        assert [got.constant, got.constant_centred] == ref["constant"]
        for k in ("heads", "heads_centred", "mlp", "mlp_centred", "attn_bias", "attn_bias_centred"):
            np.testing.assert_array_equal(getattr(got, k), np.array(ref[k]), err_msg=k)
        # the parts add up to the answer logit (centred)
        total = got.heads_centred.sum() + got.mlp_centred.sum() + got.attn_bias_centred.sum() + got.embed_centred + got.constant_centred
        assert total == pytest.approx(got.logit_centred, abs=1e-4)


def test_latent_transplant_equals_cli(cli, tiny, tmp_path):
    out = _cli_patch(cli, tiny, tmp_path / "o", "transplant", "--split", "paper-seed0", "--n", "64", "--seed", "2", "--slot", "3", "--batch", "20")
    rows = json.loads((out / "transplant.json").read_text())["rows"]
    id_ = hl.tasks.sample(split="paper-seed0", set="id", n=64, seed=2, unpermuted=True)
    ood = hl.tasks.sample(split="paper-seed0", set="ood", n=64, seed=2, unpermuted=True)
    got = hl.patching.latent_transplant(tiny, id_, ood, slot=3, batch=20, seed=2)
    assert len(got) == len(rows)
    for i, r in enumerate(rows):
        for k, v in r.items():
            assert got[k][i] == v, (i, k)
    assert set(got["kind"]) >= {"mean_id", "identity", "random", "zero_ablation"}


def test_patching_errors(tiny, clean, model):
    ps, _ = clean
    with pytest.raises(hl.InputError, match="unpermuted"):
        hl.patching.activation_patching(tiny, hl.tasks.sample(n=8, seed=1), slot=2)
    with pytest.raises(hl.InputError, match="slot"):
        hl.patching.activation_patching(tiny, ps, slot=4)
    with pytest.raises(hl.InputError, match="ablation"):
        hl.patching.head_ablation(tiny, ps, ablation="resample")
    with pytest.raises(hl.InputError, match="slot 7"):
        hl.patching.direct_logit_attribution(tiny, ps, slots=[7])
    with pytest.raises(hl.InputError, match="SRAVEN model"):
        hl.patching.head_ablation(hl.load("logic-hyla"), ps)
    with pytest.raises(hl.InputError, match="unpermuted"):
        hl.patching.latent_transplant(tiny, hl.tasks.sample(n=8), ps)
    with pytest.raises(hl.InputError, match="batch"):
        hl.patching.head_ablation(tiny, ps, batch=0)
