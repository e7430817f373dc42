"""hl.analysis.analyze_lm on synthetic language-model code files written here with numpy (the
arrays of hyperlens_io::keys::lm_codes and the codes.json sidecar): a planted signal found at its
layer, the controls at chance without one, a signal in the distances found by the distance
baseline, the behaviour filter, one accuracy against scikit-learn, the CLI's tables, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import hyperlens as hl

OPS, DOMS, LAYERS = 4, 4, [0, 4, 8]


def write_codes(path: Path, n_per: int = 20, signal: str = "layer", seed: int = 0, correct=None,
                prompt_offset: int = 0, shuffled_seed=None, split=None) -> Path:
    """`n_per` prompts per (domain, operation); combinations with (op + dom) % 4 == 0 held out.
    Codes [N, 3, 2, 1, 4] of standard normal noise; `signal`: `layer` (class means in layer 4,
    weaker ones in layer 8), `distance` (the operation moves the keys) or `none`."""
    rng = np.random.default_rng(seed)
    n = OPS * DOMS * n_per
    combo = np.arange(n) // n_per
    dom, op = combo // OPS, combo % OPS
    factors = np.stack([dom, op], axis=1).astype(np.int64)
    if split is None:
        split = ((op + dom) % 4 == 0).astype(np.int64)
    codes = rng.normal(size=(n, 3, 2, 1, 4)).astype(np.float32)
    if signal == "layer":
        means = rng.normal(scale=2.0, size=(OPS, 8))
        codes[:, 1] += means[op].reshape(n, 2, 1, 4).astype(np.float32)
        codes[:, 2] += (0.35 * means[op]).reshape(n, 2, 1, 4).astype(np.float32)
    # the sites do not depend on `seed`: files of the same prompts share them
    pos = np.random.default_rng(12345)
    query_pos = 60 + pos.integers(0, 3, size=(n, 1))
    key_pos = np.arange(4)[None, :] * 6 + pos.integers(0, 3, size=(n, 4))
    if signal == "distance":
        key_pos += 12 * op[:, None]
    arrays = dict(
        codes=codes, label=op.astype(np.int64), factors=factors, split=split,
        prompt=np.arange(n, dtype=np.int64) + prompt_offset, length=np.full(n, 80, dtype=np.int64),
        query_pos=query_pos.astype(np.int64), key_pos=key_pos.astype(np.int64),
    )
    if correct is not None:
        arrays["correct"] = np.asarray(correct, dtype=bool)
    np.savez(path, **arrays)
    sidecar = dict(
        factors=[dict(name="domain", values=[f"d{i}" for i in range(DOMS)]),
                 dict(name="operation", values=[f"op{i}" for i in range(OPS)])],
        form="pattern", has_resid=False, kv_group=[0, 1], label_factor="operation", layers=LAYERS,
        model="synthetic", model_kind="gguf", n_heads=2, n_prompts=n, prepend_bos=True,
        prompts="prompts.jsonl", sites="query: last; keys: demo_output", tokenizer="gguf",
    )
    if shuffled_seed is not None:
        sidecar["shuffled_weights_seed"] = shuffled_seed
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    return path


def row(df, layer):
    return df[df["layer"] == layer].iloc[0]


def test_planted_signal_is_decoded_at_its_layer(tmp_path):
    r = hl.analysis.analyze_lm(write_codes(tmp_path / "codes.npz"), "operation", n_bootstrap=500)
    d = r.decoding
    assert list(d["layer"]) == [0, 4, 8, -1] and list(d["all_layers"]) == [False, False, False, True]
    assert (d["n_train"] == 240).all() and (d["n_test"] == 80).all()
    assert (d["chance"] == 0.25).all()
    assert row(d, 4)["codes"] > 0.9 and row(d, -1)["codes"] > 0.9
    assert row(d, 0)["codes"] < 0.45
    assert (d["shuffled_labels"] < 0.45).all() and (d["distance"] < 0.45).all()
    assert (d["codes_ci_low"] <= d["codes"]).all() and (d["codes"] <= d["codes_ci_high"]).all()
    assert d["shuffled_weights"].isna().all() and d["resid"].isna().all()
    assert r.summary["decoding"]["n_unseen_test"] == 0
    assert r.projections["layer4"].shape == (80, 3) and r.structure_label.shape == (80,)
    s = r.structure
    assert row(s, 4)["ari"] > 0.5 and row(s, 0)["ari"] < 0.2


def test_one_accuracy_equals_scikit_learn(tmp_path):
    path = write_codes(tmp_path / "codes.npz", seed=5)
    r = hl.analysis.analyze_lm(path, "operation", layers=[8], n_bootstrap=100)
    z = np.load(path)
    train, test = z["split"] == 0, z["split"] == 1
    x = z["codes"][:, 2].reshape(len(z["split"]), -1).astype(np.float64)
    y = z["factors"][:, 1]
    sc = StandardScaler().fit(x[train])
    sk = LogisticRegression(C=1.0, max_iter=100, tol=1e-4).fit(sc.transform(x[train]), y[train])
    acc = (sk.predict(sc.transform(x[test])) == y[test]).mean()
    ours = row(r.decoding, 8)["codes"]
    assert 0.4 < acc < 0.95, acc  # a layer where the probe is neither at chance nor perfect
    assert abs(ours - acc) <= 1 / 80 + 1e-12, (ours, acc)


def test_without_a_signal_the_controls_stay_at_chance(tmp_path):
    r = hl.analysis.analyze_lm(write_codes(tmp_path / "codes.npz", signal="none", seed=2), n_bootstrap=500)
    d = r.decoding
    # 12 intervals of 95%: each row within 3.3 binomial standard errors of chance (99.9%), and the
    # interval of the layers together (and of the one distance probe) holds chance
    se = np.sqrt(0.25 * 0.75 / 80)
    for probe in ("codes", "shuffled_labels", "distance"):
        assert (abs(d[probe] - 0.25) < 3.3 * se).all(), d[[probe, f"{probe}_ci_low"]]
        assert row(d, -1)[f"{probe}_ci_low"] <= 0.25 <= row(d, -1)[f"{probe}_ci_high"], d


def test_the_distance_baseline_finds_a_signal_in_the_distances(tmp_path):
    r = hl.analysis.analyze_lm(write_codes(tmp_path / "codes.npz", signal="distance", seed=3), n_bootstrap=200)
    assert (r.decoding["distance"] > 0.9).all()
    assert row(r.decoding, -1)["codes"] < 0.45


def test_intervals_shrink_with_more_prompts(tmp_path):
    def width(n_per):
        d = hl.analysis.analyze_lm(write_codes(tmp_path / f"c{n_per}.npz", n_per=n_per, signal="none", seed=4),
                                   layers=[0], n_bootstrap=1000).decoding
        assert ((d["codes_ci_low"] <= d["codes"]) & (d["codes"] <= d["codes_ci_high"])).all()
        return float((d["codes_ci_high"] - d["codes_ci_low"]).iloc[0])

    assert width(5) > 2 * width(60)


def test_behaviour_keeps_the_solved_combinations(tmp_path):
    n_per = 10
    combo = np.arange(16 * n_per) // n_per
    # combination c: accuracy (c % 5) / 4, as tenths rounded down
    acc10 = np.minimum((combo % 5) * 10 // 4, 10)
    correct = (np.arange(16 * n_per) % n_per) < acc10
    path = write_codes(tmp_path / "codes.npz", n_per=n_per, correct=correct)
    r = hl.analysis.analyze_lm(path, min_accuracy=0.7, n_bootstrap=100)
    b = r.behaviour
    assert list(b.columns) == ["domain", "operation", "n_prompts", "n_train", "n_test", "n_correct", "accuracy", "kept"]
    expected = (np.arange(16) % 5) * 10 // 4 >= 7
    np.testing.assert_array_equal(b["kept"].to_numpy(), expected)
    np.testing.assert_allclose(b["accuracy"], np.minimum((np.arange(16) % 5) * 10 // 4, 10) / 10)
    assert r.summary["n_dropped_combinations"] == int((~expected).sum())
    assert r.summary["n_dropped_prompts"] == n_per * int((~expected).sum())
    kept_prompts = int(b.loc[b["kept"], "n_prompts"].sum())
    assert r.decoding["n_train"].iloc[0] + r.decoding["n_test"].iloc[0] == kept_prompts
    # no `correct`: every combination kept, and said so
    r = hl.analysis.analyze_lm(write_codes(tmp_path / "plain.npz", n_per=n_per), min_accuracy=0.7, n_bootstrap=100)
    assert r.behaviour["kept"].all() and r.behaviour["accuracy"].isna().all()
    assert "no `correct` array" in r.summary["behaviour_note"]


def test_shuffled_weights_codes(tmp_path):
    path = write_codes(tmp_path / "codes.npz")
    (tmp_path / "sh").mkdir()
    shuffled = write_codes(tmp_path / "sh" / "codes.npz", signal="none", seed=9, shuffled_seed=1)
    r = hl.analysis.analyze_lm(path, shuffled_codes=shuffled, n_bootstrap=100)
    assert row(r.decoding, 4)["codes"] > 0.9 and row(r.decoding, 4)["shuffled_weights"] < 0.45
    (tmp_path / "other").mkdir()
    other = write_codes(tmp_path / "other" / "codes.npz", signal="none", prompt_offset=7, shuffled_seed=1)
    with pytest.raises(hl.InputError, match=r"other.*`prompt`"):
        hl.analysis.analyze_lm(path, shuffled_codes=other)


def test_bad_input_is_one_clear_error(tmp_path):
    path = write_codes(tmp_path / "codes.npz", n_per=3)
    with pytest.raises(hl.InputError, match=r"no factor `colour`.*domain, operation"):
        hl.analysis.analyze_lm(path, "colour")
    with pytest.raises(hl.InputError, match=r"no layer 5.*\[0, 4, 8\]"):
        hl.analysis.analyze_lm(path, layers=[5])
    lone = tmp_path / "lone.npz"
    lone.write_bytes(path.read_bytes())
    with pytest.raises(hl.HyperlensError, match=r"lone\.npz.*sidecar"):
        hl.analysis.analyze_lm(lone)
    all_train = write_codes(tmp_path / "train_only.npz", n_per=3, split=np.zeros(48, dtype=np.int64))
    with pytest.raises(hl.InputError, match="no test rows"):
        hl.analysis.analyze_lm(all_train)
    z = dict(np.load(path))
    z["key_pos"] = z["key_pos"][:, :3]
    bad = tmp_path / "bad.npz"
    np.savez(bad, **z)
    bad.with_suffix(".json").write_text(path.with_suffix(".json").read_text())
    with pytest.raises(hl.HyperlensError, match=r"bad\.npz.*`key_pos`"):
        hl.analysis.analyze_lm(bad)
    with pytest.raises(hl.InputError, match="min_accuracy"):
        hl.analysis.analyze_lm(path, min_accuracy=1.5)
    with pytest.raises(TypeError, match="codes"):
        hl.analysis.analyze_lm(3)


def test_cli_writes_the_same_tables(tmp_path, cli):
    path = write_codes(tmp_path / "codes.npz", seed=6)
    out = tmp_path / "out"
    r = subprocess.run([str(cli), "analyze", "--lm-codes", str(path), "--factor", "operation", "--bootstrap", "300",
                        "--components", "3", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    a = hl.analysis.analyze_lm(path, "operation", n_bootstrap=300)
    pd.testing.assert_frame_equal(a.decoding, pd.read_csv(out / "decoding.csv"))
    pd.testing.assert_frame_equal(a.structure, pd.read_csv(out / "structure.csv"))
    assert json.loads((out / "summary.json").read_text())["decoding"] == a.summary["decoding"]
    r = subprocess.run([str(cli), "analyze", "--lm-codes", str(path), "--factor", "colour", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "colour" in lines[0] and "domain, operation" in lines[0], r.stderr
