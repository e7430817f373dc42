"""Token language models through hl.load: the hooked pass against `hyperlens cache --tokens`."""

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, run_cli

LM = ROOT / "data/induction/attn-only-2l"


@pytest.fixture(scope="module")
def lm():
    return hl.load(LM)


def test_load_and_cfg(lm):
    assert isinstance(lm, hl.LanguageModel)
    assert (lm.cfg.kind, lm.cfg.n_layers, lm.cfg.n_heads, lm.cfg.d_vocab, lm.cfg.n_ctx) == ("token", 2, 4, 256, 64)
    assert lm.hook_names()[0] == "hook_embed"


def test_run_with_cache_equals_cli_cache(lm, cli, tmp_path):
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 256, size=12)
    tokens = np.concatenate([seq, seq])  # a repeated segment: what induction heads complete
    out = tmp_path / "c.npz"
    hooks = "blocks.*.attn.hook_pattern,blocks.1.hook_resid_post,hook_embed"
    run_cli(cli, "cache", "--checkpoint", str(LM), "--tokens", ",".join(map(str, tokens)), "--hooks", hooks, "--out", str(out))
    z = np.load(out)
    logits, cache = lm.run_with_cache(tokens, names_filter=hooks.split(","))
    assert logits.shape == (1, 24, 256)
    np.testing.assert_allclose(logits, z["logits"], rtol=1e-6, atol=1e-6)
    assert sorted(cache) == sorted(k for k in z.keys() if k not in ("logits", "tokens"))
    for k in cache:
        np.testing.assert_allclose(cache[k], z[k], rtol=1e-6, atol=1e-6, err_msg=k)
    _, pats = lm.patterns(tokens[None, :])
    np.testing.assert_allclose(pats[:, 1], cache["pattern", 1], atol=1e-6)
    # the induction heads of layer 1 look back at the token after the earlier copy
    second = pats[0, 1, :, 12 + 3]  # [H, T] at query 15
    assert second.argmax(-1).tolist().count(3 + 1) >= 2


def test_language_model_hooks_and_errors(lm):
    tokens = np.arange(10)[None, :]
    base = lm(tokens)
    ablated = lm.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", lambda a, n: a * 0)])
    assert np.abs(ablated - base).max() > 1e-3
    with pytest.raises(hl.InputError, match="tokens"):
        lm(np.array([[0, 300]]))
    with pytest.raises(hl.ShapeError, match="tokens"):
        lm(np.zeros((1, 65), dtype=np.int64))
