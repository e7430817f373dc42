"""LanguageModel.latent_codes: the codes of (query, key) pairs equal the full patterns gathered at
the sites; rows of unequal length; the logits and residuals; bad input as clear errors."""

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT

FIXTURES = ROOT / "crates/model/tests/fixtures/lm"


@pytest.fixture(scope="module", params=["data/induction/attn-only-2l", "tiny-llama-hf", "tiny-gpt2-hf"])
def lm(request):
    p = ROOT / request.param if "/" in request.param else FIXTURES / request.param
    return hl.load(p)


def _batch(lm, lengths, seed=0):
    rng = np.random.default_rng(seed)
    t = max(lengths)
    tokens = rng.integers(0, lm.cfg.d_vocab, size=(len(lengths), t))
    query = np.array([[n - 1, n - 2] for n in lengths])
    keys = np.array([[1, n // 2, n - 2] for n in lengths])
    return tokens, np.array(lengths), query, keys


def test_codes_equal_the_patterns_gathered_at_the_sites(lm):
    tokens, lengths, query, keys = _batch(lm, [9, 6, 12])
    codes = lm.latent_codes(tokens, query, keys, lengths=lengths)
    n_l, n_h = lm.cfg.n_layers, lm.cfg.n_heads
    assert codes.shape == (3, n_l, n_h, 2, 3) and codes.dtype == np.float32
    no_sink = lm.latent_codes(tokens, query, keys, form="no-sink", lengths=lengths)
    for i, n in enumerate(lengths):
        _, pats = lm.patterns(tokens[i : i + 1, :n])  # [1, L, H, T, T], the row alone
        want = pats[0][:, :, query[i]][:, :, :, keys[i]]
        np.testing.assert_allclose(codes[i], want, atol=1e-6)
        sink = pats[0][:, :, query[i], 0][..., None]
        # p / (1 - p0) amplifies the roundings of p by 1 / (1 - p0): compare in the scale of p
        np.testing.assert_allclose(no_sink[i] * (1 - sink), want, atol=1e-6)


def test_layers_logits_and_resid(lm):
    tokens, lengths, query, keys = _batch(lm, [7, 10], seed=1)
    full = lm.latent_codes(tokens, query, keys, lengths=lengths)
    codes, logits, resid = lm.latent_codes(
        tokens, query, keys, layers=[1, 0], lengths=lengths, return_logits=True, return_resid=True
    )
    np.testing.assert_array_equal(codes[:, 0], full[:, 1])
    np.testing.assert_array_equal(codes[:, 1], full[:, 0])
    assert logits.shape == (2, lm.cfg.d_vocab) and resid.shape[:3] == (2, 2, 2)
    for i, n in enumerate(lengths):
        want, cache = lm.run_with_cache(tokens[i : i + 1, :n], names_filter=["blocks.*.hook_resid_post"])
        np.testing.assert_allclose(logits[i], want[0, n - 1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(resid[i, 0], cache["blocks.1.hook_resid_post"][0, query[i]], rtol=1e-5, atol=1e-5)
    only_resid = lm.latent_codes(tokens, query, keys, lengths=lengths, return_resid=True)
    assert isinstance(only_resid, tuple) and len(only_resid) == 2


def test_one_sequence_as_a_1d_array(lm):
    tokens, _, query, keys = _batch(lm, [8])
    a = lm.latent_codes(tokens[0], query[0], keys[0], form="scores")
    b = lm.latent_codes(tokens, query, keys, form="scores")
    np.testing.assert_array_equal(a, b)


def test_bad_input_is_a_clear_error(lm):
    tokens, lengths, query, keys = _batch(lm, [6, 8])
    with pytest.raises(hl.InputError, match="sequence 0: key position 5 is after query position 4"):
        lm.latent_codes(tokens, query, np.array([[1, 5], [1, 2]]), lengths=lengths)
    with pytest.raises(hl.InputError, match=r"sequence 0: query position 7 is past its end \(length 6\)"):
        lm.latent_codes(tokens, np.array([[7], [7]]), np.array([[1], [1]]), lengths=lengths)
    with pytest.raises(hl.InputError, match="key position 0 has no code in the no-sink form"):
        lm.latent_codes(tokens, query, np.array([[0], [0]]), form="no-sink", lengths=lengths)
    with pytest.raises(hl.InputError, match="unknown code form"):
        lm.latent_codes(tokens, query, keys, form="probs", lengths=lengths)
    with pytest.raises(hl.InputError, match="layer 9 is out of range"):
        lm.latent_codes(tokens, query, keys, layers=[9], lengths=lengths)
    with pytest.raises(hl.InputError, match="sequence 1 is empty"):
        lm.latent_codes(tokens, query, keys, lengths=[6, 0])
    with pytest.raises(hl.InputError, match="out of range for a vocabulary"):
        lm.latent_codes(tokens + lm.cfg.d_vocab, query, keys, lengths=lengths)
    with pytest.raises(hl.ShapeError):
        lm.latent_codes(tokens, query[:1], keys, lengths=lengths)
    with pytest.raises(hl.ShapeError):
        lm.latent_codes(tokens, query, keys, lengths=[6])


def _own_task():
    """A researcher's own task on the tiny Llama's word-level vocabulary."""
    rows = []
    for i, (x, y) in enumerate([("cat", "dog"), ("sun", "moon"), ("red", "blue"), ("one", "two")]):
        for op in ("same", "swap"):
            rows.append(
                {
                    "segments": [{"text": "Q:", "role": "sep"}, {"text": x, "role": "x"}, {"text": "A:", "role": "sep"}],
                    "labels": {"op": op},
                    "answer": x if op == "same" else y,
                    "split": "test" if (i < 2 and op == "swap") else "train",
                }
            )
    return hl.tasks.prompts(rows)


def test_probe_streams_the_lens_codes_of_a_prompt_set(tmp_path):
    lm = hl.load(FIXTURES / "tiny-llama-hf")
    ps = _own_task()
    seen = []
    r = lm.probe(ps, tmp_path / "codes.npz", "query: last; keys: x, sep#0", batch=3, resid=True, on_progress=lambda d, t: seen.append((d, t)))
    assert r["n_prompts"] == 8 and r["n_answered"] == 8
    assert seen[-1] == (8, 8)
    z = np.load(tmp_path / "codes.npz")
    # <s> Q: x A: -> query 3, keys 2 and 1
    assert (z["query_pos"] == 3).all() and (z["key_pos"] == [2, 1]).all()
    assert list(z["split"]) == [0, 1, 0, 1, 0, 0, 0, 0]
    assert list(z["label"]) == [0, 1] * 4
    tokens = lm.to_tokens([p["segments"][0]["text"] + " " + p["segments"][1]["text"] + " " + p["segments"][2]["text"] for p in ps])
    codes, logits, resid = lm.latent_codes(tokens, z["query_pos"], z["key_pos"], return_logits=True, return_resid=True)
    np.testing.assert_allclose(z["codes"], codes, atol=1e-6)
    np.testing.assert_allclose(z["resid"], resid, atol=1e-4)
    assert (z["prediction"] == logits.argmax(axis=1)).all()
    target = [lm.to_tokens(p["answer"], prepend_bos=False)[0, 0] for p in ps]
    assert list(z["target"]) == target
    assert r["accuracy"] == pytest.approx(float((z["prediction"] == z["target"]).mean()))
    a = hl.analysis.analyze_lm(tmp_path / "codes.npz", factor="op")
    assert len(a.decoding) == lm.cfg.n_layers + 1


def test_probe_refuses_bad_sites_and_models_without_a_tokenizer(tmp_path):
    lm = hl.load(FIXTURES / "tiny-llama-hf")
    ps = _own_task()
    with pytest.raises(hl.InputError, match="sites"):
        lm.probe(ps, tmp_path / "c.npz")  # a built set recommends no sites
    with pytest.raises(hl.InputError, match="prompt 0.*demo_output|demo_output.*prompt 0"):
        lm.probe(ps, tmp_path / "c.npz", "query: last; keys: demo_output")
    with pytest.raises(hl.InputError, match="after"):
        lm.probe(ps, tmp_path / "c.npz", "query: x; keys: last")
    with pytest.raises(hl.InputError, match="tokenizer"):
        hl.load(ROOT / "data/induction/attn-only-2l").probe(ps, tmp_path / "c.npz", "query: last; keys: x")
    assert not (tmp_path / "c.npz").exists()


def test_lm_study_refuses_bad_settings_and_non_models(tmp_path):
    with pytest.raises(hl.InputError, match="n_icl"):
        hl.lm_study(tmp_path / "m.gguf", tmp_path / "out", n_icl=10)
    (tmp_path / "m.txt").write_text("hello")
    with pytest.raises(hl.HyperlensError, match="m.txt"):
        hl.lm_study(tmp_path / "m.txt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_lm_study_stops_on_an_exception_of_its_callback(tmp_path):
    import os

    gguf = os.environ.get("HYPERLENS_SMOLLM2_GGUF")
    if not gguf or not os.path.exists(gguf):
        pytest.skip("set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf")
    seen = []

    def stop(e):
        seen.append(e)
        if e["done"] > 0:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        hl.lm_study(gguf, tmp_path / "out", n_relations=50, n_icl=60, progress=stop)
    assert seen[0]["stage"].startswith("relations") and seen[0]["unit"] == "prompts"
    assert not (tmp_path / "out").exists()
    assert not any(p.name.startswith(".out.") for p in tmp_path.iterdir())
