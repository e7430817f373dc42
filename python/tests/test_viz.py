"""hl.viz: the interactive figures in notebooks (issue 36) are the report's: the same SVG element
from the same inputs, the analysis crate's PCA, and files written in the three formats."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl
from conftest import ROOT

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
    with pytest.raises(hl.InputError, match="layer 7"):
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
    with pytest.raises(hl.InputError, match="layer 9"):
        hl.viz.attention(model, ood, layer=9)


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
