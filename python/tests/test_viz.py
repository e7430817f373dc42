"""hl.viz: the interactive figures in notebooks (issue 36) are the report's: the same SVG element
from the same inputs, the analysis crate's PCA and t-SNE, and files written in the three formats;
the heatmaps of composition scores and head ablation show the CLI's numbers on hover in chromium."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT, run_cli
from test_report_browser import browser, shots  # noqa: F401  (fixtures: one chromium, the screenshot folder)

REPORT = ROOT / "reports" / "default"
NAME = "sraven-hyla"


def _data(svg: str) -> dict:
    a = svg.index('class="hl-data">') + len('class="hl-data">')
    return json.loads(svg[a : svg.index("</script>", a)])


def _decode(a: dict) -> np.ndarray:
    raw = np.frombuffer(base64.b64decode(a["b"]), dtype=np.uint8)
    if a["t"] == "u4":
        return np.stack([raw & 15, raw >> 4], axis=1).reshape(-1)[: a["n"]]
    return np.frombuffer(raw.tobytes(), dtype={"u8": np.uint8, "u16": "<u2", "i32": "<i4", "f32": "<f4"}[a["t"]])


@pytest.fixture(scope="module")
def sets():
    codes = {s.upper(): hl.CodeSet.load(REPORT / "codes" / f"{NAME}_{s}.npz") for s in ("id", "ood")}
    problems = {
        s.upper(): hl.tasks.sample(split="paper-seed0", set=s, n=2048, seed=0, unpermuted=True) for s in ("id", "ood")
    }
    return codes, problems


def test_scatter_is_the_reports_explorer(sets):
    codes, problems = sets
    fig = hl.viz.scatter(
        codes, color="rule", problems=problems, title=f"{NAME}: latent codes (query Q3, keys P6s3 and P7s3)"
    )
    # The notebook's figure and the report's file: the same bytes from the same inputs.
    assert fig.svg == (REPORT / "figures" / f"{NAME}_explorer.svg").read_text()
    assert fig._repr_html_() == fig.html and fig.svg.split("\n", 1)[1].strip() in fig.html


def test_scatter_positions_are_the_analysis_pca(sets):
    codes, _ = sets
    ood = codes["OOD"]
    fig = hl.viz.scatter(ood, layer=2, color="target")
    d = _data(fig.svg)
    assert d["start"] == 2
    assert [c["name"] for c in d["colorings"]] == ["answer value", "rule"]
    s = d["sets"][0]
    assert s["name"] == "OOD" and s["n"] == len(ood)
    assert np.array_equal(_decode(s["colors"][0]), ood.target)
    for layer in range(4):
        want = hl.analysis.pca(ood.features(layer), 2).projection
        a = s["xy"][0][layer]
        for axis, key, r in [(0, "x", "rx"), (1, "y", "ry")]:
            lo, hi = a[r]
            back = lo + _decode(a[key]) * (hi - lo) / 65535
            np.testing.assert_allclose(back, want[:, axis], atol=(hi - lo) / 65535)
    # The codes of each point, 4 bits over their range, point-major then head then key.
    c = s["codes"][1]
    lo, hi = c["r"]
    back = (lo + _decode(c["q"]) * (hi - lo) / 15).reshape(len(ood), 16, 2)
    np.testing.assert_allclose(back, ood.codes[:, 1, :, 0, :], atol=(hi - lo) / 30 + 1e-6)


def test_save_formats_and_determinism(sets, tmp_path):
    codes, problems = sets
    fig = hl.viz.scatter(codes["OOD"], problems=problems["OOD"], projection="pca")
    again = hl.viz.scatter(codes["OOD"], problems=problems["OOD"], projection="pca")
    assert fig.svg == again.svg and fig.png == again.png
    for ext in ("svg", "html", "png"):
        fig.save(tmp_path / f"f.{ext}")
    assert (tmp_path / "f.svg").read_text() == fig.svg
    page = (tmp_path / "f.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and fig.html in page
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.html", "f.png", "f.svg"]
    with pytest.raises(hl.InputError, match="suffix"):
        fig.save(tmp_path / "f.pdf")


def test_bad_input_is_a_clear_error(sets):
    codes, problems = sets
    with pytest.raises(hl.InputError, match="color"):
        hl.viz.scatter(codes["OOD"], color="nope")
    with pytest.raises(hl.InputError, match="`layer` 7"):
        hl.viz.scatter(codes["OOD"], layer=7)
    with pytest.raises(hl.InputError, match="projection"):
        hl.viz.scatter(codes["OOD"], projection="umap")
    with pytest.raises(hl.InputError, match="unknown sets"):
        hl.viz.scatter(codes["OOD"], problems={"ID": problems["ID"]})
    other = hl.CodeSet(codes["ID"].codes[:, :2], codes["ID"].label)
    with pytest.raises(hl.ShapeError):
        hl.viz.scatter({"ID": other, "OOD": codes["OOD"]})


def test_attention_is_the_models_pattern(model, tmp_path):
    ood = hl.tasks.sample(split="paper-seed0", set="ood", n=4, seed=0, unpermuted=True)
    fig = hl.viz.attention(model, ood, layer=1, index=0)
    d = _data(fig.svg)
    assert d["shape"] == [4, 16, 36, 36] and d["start"] == 1
    assert d["rows"][35] == "Q3" and d["cols"][27] == "P6s3"
    lo, hi = d["values"]["r"]
    back = lo + _decode(d["values"]["q"]).reshape(4, 16, 36, 36) * (hi - lo) / 255
    # The report's attention sample is the same problem (the first unpermuted OOD problem, seed 0).
    want = np.load(REPORT / "codes" / f"{NAME}_attention.npz")["pattern"]
    np.testing.assert_allclose(back, want, atol=(hi - lo) / 510 + 1e-5)
    fig.save(tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(hl.InputError, match="`layer` 9"):
        hl.viz.attention(model, ood, layer=9)


def test_attention_of_the_reports_pattern_is_the_reports_figure():
    """The attention builder is the report's: the report's own sample pattern drawn from Python
    with the report's title is ``figures/<name>_attention.svg``, byte for byte."""
    from hyperlens import _core

    pattern = np.load(REPORT / "codes" / f"{NAME}_attention.npz")["pattern"].astype(np.float64)
    mixer = hl.load(ROOT / "data" / "checkpoints" / NAME).cfg.mixer
    d = _core.viz.attention(pattern, 4, 0, title=f"{NAME}: attention on the first OOD problem ({mixer} mixer)")
    assert d["svg"] == (REPORT / "figures" / f"{NAME}_attention.svg").read_text()
    # The default title names the problem and the mixer.
    assert _data(_core.viz.attention(pattern, 4, 2, mixer="hyla")["svg"])["title"] == "attention on problem 2 (hyla mixer)"


def test_token_labels_and_default_title_come_from_the_library(sets):
    assert hl.viz.token_labels(36, 4)[27] == "P6s3" and hl.viz.token_labels(36, 4)[35] == "Q3"
    assert hl.viz.token_labels(10, 2) == ["P0s0", "P0s1", "P1s0", "P1s1", "P2s0", "P2s1", "P3s0", "P3s1", "Q0", "Q1"]
    codes, problems = sets
    d = _data(hl.viz.scatter(codes["OOD"], problems=problems["OOD"]).svg)
    assert d["title"] == "latent codes (query Q3, keys P6s3 and P7s3)"
    assert d["keys"] == ["P6s3", "P7s3"]
    # A site of one query given explicitly: its tokens, and the problems' reproduction command.
    c = codes["OOD"]
    other = hl.CodeSet(c.codes, c.label, target=c.target, prediction=c.prediction, site="query:34;keys:26,30")
    d = _data(hl.viz.scatter(other, problems=problems["OOD"]).svg)
    assert d["title"] == "latent codes (query Q2, keys P6s2 and P7s2)"
    assert d["sets"][0]["reproduce"] == (
        "hyperlens tasks sample --split paper-seed0 --set ood --n 2048 --seed 0 --unpermuted --out problems.npz"
    )
    with pytest.raises(hl.InputError, match="one query"):
        hl.viz.scatter(hl.CodeSet(c.codes, c.label, site="all-slots"))


def test_logic_scatter_names_terms_as_the_report(tmp_path):
    """Logic codes: per-layer PCA of the analysis crate, coloured by the first and second term with
    the report's binary term names, hover text of the terms, keys as the report's explorer."""
    rng = np.random.default_rng(0)
    n, L, H = 40, 2, 3
    ids = rng.integers(0, 4, size=(n, 2))
    c = hl.LogicCodeSet(
        rng.random((n, L, H, 1, 1), dtype=np.float32), np.zeros((n, 2, 2), np.int64), ids,
        target=rng.random(n, dtype=np.float32), prediction=rng.random(n, dtype=np.float32),
    )
    fig = hl.viz.scatter(c, color="term", layer=0)
    d = _data(fig.svg)
    assert [x["name"] for x in d["colorings"]] == ["first term", "second term"]
    assert d["colorings"][0]["classes"] == ["00", "01", "10", "11"]
    assert d["keys"] == ["self"] and d["title"] == "latent codes" and d["start"] == 0
    s = d["sets"][0]
    assert s["name"] == "OOD"
    assert np.array_equal(_decode(s["colors"][0]), ids[:, 0]) and np.array_equal(_decode(s["colors"][1]), ids[:, 1])
    for layer in range(L):
        want = hl.analysis.pca(c.features(layer), 2).projection
        a = s["xy"][0][layer]
        lo, hi = a["rx"]
        np.testing.assert_allclose(lo + _decode(a["x"]) * (hi - lo) / 65535, want[:, 0], atol=(hi - lo) / 65535)
    with pytest.raises(hl.InputError, match="color"):
        hl.viz.scatter(c, color="rule")


def test_notebook_fragment_works_in_a_browser(sets, tmp_path):
    """The fragment of ``_repr_html_`` in an HTML page, in Debian's chromium: hover and click."""
    from test_report_browser import ARGS, CHROMIUM, _playwright, _topmost_point

    sync_playwright = _playwright()
    codes, problems = sets
    fig = hl.viz.scatter(codes, layer=1, problems=problems)
    fig.save(tmp_path / "nb.html")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = b.new_page(viewport={"width": 1100, "height": 700})
        errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((tmp_path / "nb.html").as_uri())
        i = _topmost_point(page, 5)
        page.locator(f'circle.hl-pt[data-i="{i}"]').hover()
        tip = page.locator(".hl-tip").text_content()
        assert f"OOD problem {i}" in tip and "layer 1" in tip, tip
        page.locator(f'circle.hl-pt[data-i="{i}"]').click()
        assert page.locator(".hl-panel").count() == 9
        b.close()
    assert errors == []


# ---- heatmaps (issue 36, item 2) -------------------------------------------------------------

RULE_NAMES = list(hl.tasks.RULES)


def _open(browser, fig, path: Path):
    """``fig`` saved as an HTML page and opened in chromium, with console errors and non-file
    requests recorded: ``(page, context, errors, remote)``."""
    fig.save(path)
    ctx = browser.new_context(viewport={"width": 1100, "height": 800})
    errors: list[str] = []
    remote: list[str] = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            remote.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    page = ctx.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("svg.hl-fig .hl-controls", state="attached")
    return page, ctx, errors, remote


def _hover(page, row: int, col: int) -> str:
    page.locator(f'.hl-cells rect[data-row="{row}"][data-col="{col}"]').hover()
    return page.locator(".hl-tip").text_content()


def test_heatmap_is_the_reports_similarity():
    """hl.viz.heatmap of the similarity table the report writes is the report's interactive
    similarity heatmap, byte for byte."""
    pd = pytest.importorskip("pandas")
    sim = pd.read_csv(REPORT / "tables" / NAME / "similarity.csv")
    sim = sim[~sim["all_layers"]]
    last = int(sim["layer"].max())
    sim = sim[sim["layer"] == last]
    cos = np.zeros((8, 8))
    for r in sim.itertuples():
        cos[r.label_a, r.label_b] = r.cosine
    fig = hl.viz.heatmap(
        cos, RULE_NAMES, RULE_NAMES, title=f"{NAME}: cosine similarity of mean codes, layer {last}",
        value_name="cosine similarity", cmap="blue-white-red", range=(-1, 1),
        row_name="rule (row)", col_name="rule (column)",
    )
    assert fig.svg == (REPORT / "figures" / f"{NAME}_similarity.svg").read_text()
    assert fig._repr_html_() == fig.html and fig.svg.split("\n", 1)[1].strip() in fig.html
    d = _data(fig.svg)
    np.testing.assert_array_equal(_decode(d["panels"][0]["values"]["exact"]), cos.astype(np.float32).ravel())


@pytest.fixture(scope="module")
def circuits_report():
    lm = hl.load(ROOT / "data/induction/attn-only-2l")
    return hl.circuits.analyze(lm, seq_len=20, seed=1, n_seqs=4, baseline_samples=200, top=5)


def test_composition_heatmap_hover_shows_the_cli_scores(circuits_report, browser, shots, tmp_path):
    """hl.viz.heatmap(hl.circuits.analyze(...)): the Q, K and V panels hold `hyperlens circuits`'s
    composition_{q,k,v}.npz scores (weights only, so the committed files), and hovering a cell in
    chromium shows the pair and its score; pairs whose reading head is not in a later layer say so."""
    committed = ROOT / "reports/circuits/induction-2l"
    fig = hl.viz.heatmap(circuits_report, panel="k")
    d = _data(fig.svg)
    assert [p["name"] for p in d["panels"]] == ["q", "k", "v"] and d["start"] == 1
    labels = [f"L{l}H{h}" for l in range(2) for h in range(4)]
    assert d["rows"] == d["cols"] == labels and d["separators"] == 4
    p99 = circuits_report.summary["composition"]["baseline_p99"]
    for p in d["panels"]:
        scores = np.load(committed / f"composition_{p['name']}.npz")["scores"].reshape(8, 8)
        mask = _decode(p["mask"]).reshape(8, 8).astype(bool)
        assert np.array_equal(mask, np.arange(8)[:, None] // 4 >= np.arange(8)[None, :] // 4)
        got = _decode(p["values"]["exact"]).reshape(8, 8)
        np.testing.assert_array_equal(got[~mask], scores[~mask].astype(np.float32))
        assert p["title"] == f"{p['name'].upper()}-composition scores (random baseline p99 = {p99[p['name']]:.3f})"
    assert fig.svg == hl.viz.heatmap(circuits_report, panel="k").svg  # deterministic

    page, ctx, errors, remote = _open(browser, fig, tmp_path / "composition.html")
    k = np.load(committed / "composition_k.npz")["scores"]
    for (l1, h1, l2, h2) in [(0, 1, 1, 2), (0, 0, 1, 3)]:
        tip = _hover(page, l1 * 4 + h1, l2 * 4 + h2)
        assert tip.startswith("k") and f"earlier head (writes): L{l1}H{h1}" in tip and f"later head (reads): L{l2}H{h2}" in tip, tip
        shown = float(tip.split("composition score: ")[1])
        assert abs(shown - k[l1, h1, l2, h2]) <= 5e-4 * abs(k[l1, h1, l2, h2]), (tip, k[l1, h1, l2, h2])
    assert "not computed" in _hover(page, 5, 2)  # L1H1 -> L0H2: not a later layer
    page.locator(".hl-btn", has_text="v").click()
    v = np.load(committed / "composition_v.npz")["scores"]
    tip = _hover(page, 2, 7)
    assert tip.startswith("v") and abs(float(tip.split("composition score: ")[1]) - v[0, 2, 1, 3]) <= 5e-4 * v[0, 2, 1, 3], tip
    page.locator("svg.hl-fig").screenshot(path=str(shots / "composition_heatmap.png"))
    ctx.close()
    assert errors == [] and remote == [], (errors, remote)


def test_head_ablation_heatmap_hover_shows_the_cli_table(cli, browser, shots, tmp_path):
    """hl.viz.heatmap(hl.patching.head_ablation(...)) on a tiny SRAVEN model the CLI trains:
    hovering head (l, h) shows its accuracy and loss changes from `hyperlens patch heads`'s
    head_ablation.csv."""
    pd = pytest.importorskip("pandas")
    ckpt = tmp_path / "sraven-tiny"
    run_cli(
        cli, "train", "--task", "sraven", "--mixer", "hyla", "--split", "paper-seed0", "--steps", "60",
        "--batch", "32", "--layers", "2", "--d-model", "16", "--heads", "3", "--d-head", "8",
        "--d-mlp", "16", "--lr", "0.01", "--warmup", "10", "--eval-n", "64", "--out", str(ckpt), "--quiet",
    )
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=48, seed=3, unpermuted=True)
    ps.save(tmp_path / "p.npz")
    run_cli(cli, "patch", "heads", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"),
            "--problems", str(tmp_path / "p.npz"), "--ablation", "mean", "--batch", "16")
    table = pd.read_csv(tmp_path / "o" / "head_ablation.csv")
    fig = hl.viz.heatmap(hl.patching.head_ablation(hl.load(ckpt), ps, ablation="mean", batch=16))
    d = _data(fig.svg)
    assert [p["name"] for p in d["panels"]] == ["accuracy change", "loss change"]
    assert d["rows"] == ["L0", "L1"] and d["cols"] == ["H0", "H1", "H2"]
    assert d["panels"][0]["title"] == "change in accuracy with each head mean-ablated"
    lo, hi = d["panels"][0]["range"]
    assert lo == -hi and hi >= max(0.01, table["delta_accuracy"].abs().max())

    page, ctx, errors, remote = _open(browser, fig, tmp_path / "ablation.html")
    for panel, column in [("accuracy change", "delta_accuracy"), ("loss change", "delta_loss")]:
        page.locator(".hl-btn", has_text=panel).click()
        for r in table.itertuples():
            tip = _hover(page, r.layer, r.head)
            assert f"layer: L{r.layer}" in tip and f"head: H{r.head}" in tip, tip
            shown = float(tip.split(f"{panel}: ")[1])
            want = getattr(r, column)
            assert abs(shown - want) <= 5e-4 * abs(want) + 1e-6, (panel, tip, want)
    page.locator("svg.hl-fig").screenshot(path=str(shots / "head_ablation_heatmap.png"))
    # `patch heads`' own head_ablation.svg (the PNG's heatmap, opened from file://): the same values
    page.goto((tmp_path / "o" / "head_ablation.svg").as_uri())
    page.wait_for_selector("svg.hl-fig .hl-controls", state="attached")
    for r in table.itertuples():
        tip = _hover(page, r.layer, r.head)
        assert f"layer: L{r.layer}" in tip and f"head: H{r.head}" in tip, tip
        shown = float(tip.split("accuracy change: ")[1])
        assert abs(shown - r.delta_accuracy) <= 5e-4 * abs(r.delta_accuracy) + 1e-6, (tip, r.delta_accuracy)
    ctx.close()
    assert errors == [] and remote == [], (errors, remote)


def test_heatmap_of_a_matrix_and_its_errors(tmp_path):
    v = np.arange(6, dtype=np.float64).reshape(2, 3) - 2.0
    fig = hl.viz.heatmap({"a": v, "b": -v}, ["x", "y"], ["p", "q", "r"], title="t", value_name="w", panel="b")
    d = _data(fig.svg)
    assert d["start"] == 1 and d["rowName"] == "row" and d["colName"] == "column"
    # A negative value: the diverging map, symmetric about 0.
    assert d["panels"][1]["range"] == [-3.0, 3.0] and d["panels"][1]["valueName"] == "w"
    np.testing.assert_array_equal(_decode(d["panels"][1]["values"]["exact"]), (-v).ravel())
    fig.save(tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    masked = hl.viz.heatmap(np.array([[np.nan, 1.0], [2.0, 3.0]]), mask=np.array([[True, False], [False, False]]))
    assert _decode(_data(masked.svg)["panels"][0]["mask"])[:4].tolist() == [1, 0, 0, 0]
    with pytest.raises(hl.InputError, match="2-D"):
        hl.viz.heatmap(np.zeros(3))
    with pytest.raises(hl.InputError, match="cmap"):
        hl.viz.heatmap(v, cmap="jet")
    with pytest.raises(hl.InputError, match="panel"):
        hl.viz.heatmap(v, panel="c")
    with pytest.raises(hl.InputError):
        hl.viz.heatmap(np.array([[np.nan, 1.0]]))
    with pytest.raises(hl.ShapeError):
        hl.viz.heatmap(v, ["only one"], ["p", "q", "r"])


def test_scatter_tsne_is_the_analysis_tsne(sets):
    """method="tsne": each set's positions per layer are hl.analysis.tsne's exact t-SNE (theta=0)
    of its features, the same on every run."""
    codes, _ = sets
    full = codes["OOD"]
    sub = hl.CodeSet(full.codes[:150], full.label[:150], target=full.target[:150], site=full.site, layers=full.layers)
    fig = hl.viz.scatter(sub, layer=3, color="rule", method="tsne")
    d = _data(fig.svg)
    assert d["projections"] == [{"name": "t-SNE", "axes": ["t-SNE 1", "t-SNE 2"]}] and d["start"] == 3
    for layer in (0, 3):
        want = hl.analysis.tsne(sub.features(layer), perplexity=min(30, (150 - 1) // 3), theta=0, seed=0)
        a = d["sets"][0]["xy"][0][layer]
        for axis, key, r in [(0, "x", "rx"), (1, "y", "ry")]:
            lo, hi = a[r]
            back = lo + _decode(a[key]) * (hi - lo) / 65535
            np.testing.assert_allclose(back, want[:, axis], atol=(hi - lo) / 65535)
    assert hl.viz.scatter(sub, layer=3, method="tsne").svg == fig.svg


# ---- the binary array format (issue 46, item 6) ----------------------------------------------


def test_binary_arrays_round_trip_from_the_rust_encoder_to_the_browser(browser, tmp_path):  # noqa: F811
    """Arrays encoded by the Rust encoder (``encode.rs``, its output kept in the fixture that
    ``the_round_trip_fixture_is_the_encoders_output`` holds to the encoder) decode in chromium, with
    the figures' own script, to the same values: every type, odd and empty lengths, negative values,
    the extremes, NaN, the infinities, -0 and a subnormal. A bad type or length is an error."""
    fixture = json.loads((ROOT / "crates" / "viz" / "tests" / "data" / "binary_arrays.json").read_text())
    script = (ROOT / "crates" / "viz" / "src" / "interactive" / "interactive.js").read_text()
    page_path = tmp_path / "arrays.html"
    page_path.write_text(f"<!doctype html><html><body><script>{script}</script></body></html>")
    ctx = browser.new_context()
    errors: list[str] = []
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    decoded = page.evaluate(
        """cases => cases.map(c => Array.from(window.hlViz.decodeArray(c.encoded), v =>
            Number.isNaN(v) ? 'NaN' : v === Infinity ? 'Infinity' : v === -Infinity ? '-Infinity'
            : Object.is(v, -0) ? '-0' : v))""",
        fixture["cases"],
    )
    refused = page.evaluate(
        """() => [{t: 'f64', n: 1, b: 'AAAAAAAAAAA='}, {t: 'f32', n: 2, b: 'AACAPw=='}, {t: 'u4', n: 3, b: 'AA=='}]
            .map(a => { try { window.hlViz.decodeArray(a); return null; } catch (e) { return e.message; } })"""
    )
    ctx.close()
    assert not errors, errors
    assert len(fixture["cases"]) >= 10
    for case, got in zip(fixture["cases"], decoded):
        assert got == case["values"], case["name"]
        assert len(got) == case["encoded"]["n"], case["name"]
    assert "unknown array type f64" in refused[0]
    assert "has 4 bytes, not 8" in refused[1]
    assert "has 1 bytes, not 2" in refused[2]


# ---- the explorer of a language model's code file (issue 47, item 6) -----------------------

TINY_LLAMA = ROOT / "crates" / "model" / "tests" / "fixtures" / "lm" / "tiny-llama-hf"
# (x, y, x2, op, split) of `Q: x A: y Q: x2 A:`; the held-out prompts' texts with the sites
# (keys: the x segments' last token and y's first; query: the last token) marked, by hand.
LM_ROWS = [
    ("cat", "dog", "sun big", "copy", "train"),
    ("one", "two", "three", "next", "train"),
    ("red", "blue", "the small tree", "copy", "test"),
    ("up", "down", "left", "next", "test"),
    ("big", "small", "cat dog", "next", "test"),
]
LM_MARKED = {
    2: "<s> Q: [[red]] A: [[blue]] Q: the small [[tree]] <<A:>>",
    3: "<s> Q: [[up]] A: [[down]] Q: [[left]] <<A:>>",
    4: "<s> Q: [[big]] A: [[small]] Q: cat [[dog]] <<A:>>",
}


@pytest.fixture(scope="module")
def lm_explorer_files(cli, tmp_path_factory):
    """``hyperlens probe --prompts`` on the tiny Llama, then ``analyze --lm-codes``: the folder."""
    d = tmp_path_factory.mktemp("lm_explorer")
    lines = []
    for x, y, x2, op, split in LM_ROWS:
        segs = [("Q:", "sep"), (x, "x"), ("A:", "sep"), (y, "y"), ("Q:", "sep"), (x2, "x"), ("A:", "sep")]
        lines.append(json.dumps({
            "segments": [{"text": t, "role": r} for t, r in segs],
            "labels": {"op": op}, "answer": "sky", "split": split,
        }))
    (d / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    run_cli(cli, "probe", "--checkpoint", str(TINY_LLAMA), "--prompts", str(d / "prompts.jsonl"),
            "--sites", "query: last; keys: x, y#0", "--out", str(d / "codes.npz"))
    run_cli(cli, "analyze", "--lm-codes", str(d / "codes.npz"), "--bootstrap", "20", "--out", str(d / "an"), "--quiet")
    return d


def test_lm_explorer_is_the_clis_with_the_marked_prompts(lm_explorer_files, tmp_path):
    d = lm_explorer_files
    a = hl.analysis.analyze_lm(d / "codes.npz", n_bootstrap=20, n_components=2)
    fig = hl.viz.lm_explorer(a)
    fig.save(tmp_path / "x.html")
    # The notebook's figure is the CLI's page, byte for byte.
    assert (tmp_path / "x.html").read_bytes() == (d / "an" / "explorer.html").read_bytes()
    assert fig.png[:4] == b"\x89PNG"
    data = _data(fig.svg)
    s = data["sets"][0]
    assert s["name"] == "held out" and s["n"] == 3
    index = _decode(s["index"]).astype(int).tolist()
    assert index == a.structure_prompt.tolist() == [2, 3, 4]
    text = next(f for f in s["fields"] if f["name"] == "text")
    assert text["v"] == [LM_MARKED[p] for p in index]
    assert [c["name"] for c in data["colorings"]] == ["op", "correct"]
    assert _decode(s["colors"][0]).astype(int)[:3].tolist() == a.structure_label.tolist()
    # A path is analysed first: the same figure.
    assert hl.viz.lm_explorer(d / "codes.npz", n_bootstrap=20, n_components=2).svg == fig.svg
    with pytest.raises(hl.InputError, match="with a path"):
        hl.viz.lm_explorer(a, factor="op")


def test_lm_explorer_hover_shows_the_marked_prompt_in_a_browser(lm_explorer_files, browser):  # noqa: F811
    """The CLI's explorer.html in chromium: hovering a point shows its prompt's text with the
    query and keys marked."""
    from test_report_browser import _topmost_point

    page = browser.new_page(viewport={"width": 1100, "height": 700})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((lm_explorer_files / "an" / "explorer.html").as_uri())
    page.wait_for_selector("svg.hl-fig circle.hl-pt", state="attached")
    seen = set()
    for start in range(3):
        i = _topmost_point(page, start)
        if i is None or i < 0:
            continue
        page.locator(f'circle.hl-pt[data-i="{i}"]').hover()
        lines = page.locator(".hl-tip text").all_text_contents()
        head = lines[0]
        assert head.startswith("held out problem "), lines
        p = int(head.split()[-1])
        assert f"text: {LM_MARKED[p]}" in lines, lines
        seen.add(p)
    assert seen, "no point could be hovered"
    page.close()
    assert errors == []


def test_lm_explorer_without_or_with_a_changed_prompt_file(lm_explorer_files, tmp_path):
    """A code file whose prompt file is not there: the figure without the text, saying why; a
    prompt file that changed since the probe: InputError naming the prompt."""
    import shutil

    for f in ("codes.npz", "codes.json"):
        shutil.copy(lm_explorer_files / f, tmp_path / f)
    side = json.loads((tmp_path / "codes.json").read_text())
    side["prompts"] = str(tmp_path / "gone.jsonl")
    (tmp_path / "codes.json").write_text(json.dumps(side))
    fig = hl.viz.lm_explorer(tmp_path / "codes.npz", n_bootstrap=20)
    s = _data(fig.svg)["sets"][0]
    assert "text" not in [f["name"] for f in s["fields"]]
    assert "no prompt text" in s["reproduce"] and "gone.jsonl" in s["reproduce"]
    lines = (lm_explorer_files / "prompts.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"left"', '"the small tree"')
    (tmp_path / "gone.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(hl.InputError, match="prompt 3: .*changed since the probe"):
        hl.viz.lm_explorer(tmp_path / "codes.npz", n_bootstrap=20)
    with pytest.raises(TypeError, match="LmAnalysis or a path"):
        hl.viz.lm_explorer(3)
