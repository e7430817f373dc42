"""Model: config, logits, evaluation, the hooked pass against `hyperlens cache`."""

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, run_cli


def test_cfg(model):
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.d_model, c.d_head, c.d_mlp) == (4, 16, 128, 4, 256)
    assert (c.n_ctx, c.d_vocab, c.n_outputs, c.d_out) == (36, 8, 4, 8)
    assert (c.task, c.split, c.mixer) == ("sraven", "paper-seed0", "hyla")
    assert c.n_params == 402_824
    assert hl.find_checkpoint("sraven-hyla") == ROOT / "data/checkpoints/sraven-hyla"


def test_logits_and_zero_copy_input(model, ood_small):
    x = np.ascontiguousarray(ood_small.x)
    lg = model(x)
    assert lg.shape == (96, 4, 8) and lg.dtype == np.float32
    np.testing.assert_array_equal(lg, model.logits(ood_small, batch=7))
    # other one-hot dtypes give the same logits
    np.testing.assert_array_equal(lg, model.logits(x.astype(np.uint8)))
    np.testing.assert_array_equal(lg, model.logits(x.astype(bool)))
    np.testing.assert_array_equal(lg, model.logits(x.astype(np.float64)))


def test_evaluate_equals_cli_eval(model, cli):
    got = json.loads(run_cli(cli, "eval", "--checkpoint", str(model.path), "--split", "paper-seed0", "--set", "ood", "--n", "512", "--seed", "5", "--json"))
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=512, seed=5)
    mine = model.evaluate(ps, batch=100)
    assert set(mine) == set(got)
    assert mine["n"] == 512
    assert mine["accuracy"] == got["accuracy"]
    assert mine["per_feature_accuracy"] == got["per_feature_accuracy"]
    assert mine["loss"] == pytest.approx(got["loss"], rel=1e-9)


HOOKS = ["blocks.*.attn.hook_pattern", "blocks.1.hook_resid_pre", "blocks.3.mlp.hook_post", "ln_final.hook_normalized"]


def test_run_with_cache_equals_cli_cache(model, cli, tmp_path, ood_small):
    ps = ood_small[:20]
    probs = tmp_path / "p.npz"
    ps.save(probs)
    out = tmp_path / "cache.npz"
    run_cli(cli, "cache", "--checkpoint", str(model.path), "--problems", str(probs), "--hooks", ",".join(HOOKS), "--out", str(out))
    z = np.load(out)
    logits, cache = model.run_with_cache(ps, names_filter=HOOKS)
    names = [k for k in z.keys() if k != "logits"]
    assert sorted(cache) == sorted(names)
    assert list(cache) == [n for n in model.hook_names() if n in cache]  # pass order
    for n in names:
        assert cache[n].dtype == np.float32
        np.testing.assert_allclose(cache[n], z[n], rtol=1e-6, atol=1e-6, err_msg=n)
    np.testing.assert_allclose(logits, z["logits"], rtol=1e-6, atol=1e-6)
    assert cache["pattern", 3].shape == (20, 16, 36, 36)
    assert cache["pattern", 3] is cache["blocks.3.attn.hook_pattern"]


def test_cache_pattern_equals_patterns_and_codes(model, ood_small):
    ps = ood_small[:10]
    logits, cache = model.run_with_cache(ps, names_filter=lambda n: n.endswith("hook_pattern"))
    assert len(cache) == 4
    lg2, pat = model.patterns(ps)
    assert pat.shape == (10, 4, 16, 36, 36)
    np.testing.assert_allclose(pat[:, 2], cache["pattern", 2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lg2, logits, rtol=1e-5, atol=1e-5)
    codes = model.latent_codes(ps)
    np.testing.assert_allclose(codes.codes[:, :, :, 0, :], pat[:, :, :, 35, [27, 31]], atol=1e-6)


def test_run_with_hooks_reads_and_replaces(model, ood_small):
    ps = ood_small[:16]
    base = model.logits(ps)
    seen = []
    same = model.run_with_hooks(ps, fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, n: seen.append((n, a.shape)))])
    np.testing.assert_allclose(same, base, rtol=1e-5, atol=1e-5)
    assert seen == [("blocks.0.hook_resid_pre", (16, 36, 128))]
    # zero-ablating every head's output of every layer changes the answer; a float64 return is converted
    ablated = model.run_with_hooks(ps, fwd_hooks=[(lambda n: n.endswith("attn.hook_z"), lambda a, n: np.zeros(a.shape))])
    assert np.abs(ablated - base).max() > 1e-2
    # replacing with the activation itself changes nothing
    ident = model.run_with_hooks(ps, fwd_hooks=[("blocks.*.hook_resid_post", lambda a, n: a)])
    np.testing.assert_allclose(ident, base, rtol=1e-5, atol=1e-5)


def test_run_with_hooks_errors_name_the_hook(model, ood_small):
    ps = ood_small[:4]
    with pytest.raises(hl.HookError, match="blocks.2.attn.hook_z"):
        model.run_with_hooks(ps, fwd_hooks=[("blocks.2.attn.hook_z", lambda a, n: a[:, :1])])
    with pytest.raises(hl.HookError, match="hook_q"):
        model.run_with_hooks(ps, fwd_hooks=[("blocks.0.attn.hook_q", lambda a, n: a.astype(np.complex64))])

    class Boom(Exception):
        pass

    def boom(a, n):
        raise Boom(n)

    with pytest.raises(Boom, match="blocks.1.hook_resid_mid"):
        model.run_with_hooks(ps, fwd_hooks=[("blocks.1.hook_resid_mid", boom)])
    with pytest.raises(hl.InputError, match="matches no hook"):
        model.run_with_hooks(ps, fwd_hooks=[("blocks.9.hook_nothing", lambda a, n: None)])


def test_hook_names_and_get_act_name(model):
    names = model.hook_names()
    assert names[0] == "hook_embed" and names[-1] == "ln_final.hook_normalized"
    assert "blocks.3.attn.hook_value_hidden" in names
    g = hl.utils.get_act_name
    assert g("pattern", 3) == "blocks.3.attn.hook_pattern"
    assert g("resid_pre", 0) == "blocks.0.hook_resid_pre"
    assert g("k", 6, "a") == "blocks.6.attn.hook_k"
    assert g("post", 2) == "blocks.2.mlp.hook_post"
    assert g("scale", 1, "ln2") == "blocks.1.ln2.hook_scale"
    assert g("normalized") == "ln_final.hook_normalized"
    assert g("embed") == "hook_embed"
    assert g("attn", 1) == "blocks.1.attn.hook_pattern"
    assert g("blocks.0.hook_resid_post") == "blocks.0.hook_resid_post"
    for l in range(4):
        for short in ("pattern", "attn_scores", "q", "k", "v", "z", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "pre", "post"):
            assert g(short, l) in names
