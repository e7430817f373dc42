"""The report's interactive figures in a real browser (issue 36).

Debian's chromium (/usr/bin/chromium), driven headless by Playwright with that executable: nothing
downloads a browser. The page is the committed reports/default/index.html, opened from file://.
Every request that is not a file:// URL is aborted and counted. Screenshots of the explorer go to
$HYPERLENS_TEST_SHOTS (a folder; pytest's temporary folder otherwise), and the test prints where.

Skipped, with a message, only where chromium or the playwright package is missing (.ci/run
installs chromium when it can; scripts/test.sh installs playwright into the test venv).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli

CHROMIUM = os.environ.get("HYPERLENS_CHROMIUM", "/usr/bin/chromium")
REPORT = ROOT / "reports" / "default"
CHECKPOINT = "sraven-hyla"
# The rule names of README's table "SRAVEN rule indices", in label order.
RULES = [
    "constant",
    "progression +1",
    "progression +2",
    "progression -1",
    "progression -2",
    "addition",
    "subtraction",
    "distribute-three",
]
# Chromium as root in a container, and no call home at start-up (shared/TOOLCHAIN.md).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _playwright():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"browser tests skipped: {CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests skipped: the `playwright` package is not installed (pip install playwright)")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _playwright()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = os.environ.get("HYPERLENS_TEST_SHOTS")
    out = Path(d) if d else tmp_path_factory.mktemp("shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


class Page:
    """A page of the report with its console errors and non-file requests recorded."""

    def __init__(self, browser):
        self.ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
        self.errors: list[str] = []
        self.remote: list[str] = []

        def route(r):
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                self.remote.append(r.request.url)
                r.abort()

        self.ctx.route("**/*", route)
        self.page = self.ctx.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "request", lambda r: None if r.url.startswith("file://") else self.remote.append(r.url)
        )
        self.page.goto((REPORT / "index.html").as_uri())

    def frame(self, name: str):
        obj = self.page.locator(f'object[data="figures/{name}"]')
        obj.scroll_into_view_if_needed()
        frame = None
        for _ in range(100):  # the object's document attaches after it is scrolled to (10 s at most)
            frame = next((f for f in self.page.frames if f.url.endswith("/" + name)), None)
            if frame is not None:
                break
            self.page.wait_for_timeout(100)
        assert frame is not None, f"{name} did not load"
        frame.wait_for_selector("svg.hl-fig .hl-controls", state="attached")  # booted
        return obj, frame


@pytest.fixture()
def page(browser):
    p = Page(browser)
    yield p
    p.ctx.close()


def _topmost_point(frame, start: int) -> int:
    """The first point index from `start` whose circle is the element under its own centre (so
    that the pointer reaches it, as a person's would)."""
    return frame.evaluate(
        """start => {
            const cs = Array.from(document.querySelectorAll('circle.hl-pt'));
            for (let i = start; i < cs.length; i++) {
                const r = cs[i].getBoundingClientRect();
                if (document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === cs[i]) return i;
            }
            return -1;
        }""",
        start,
    )


def test_explorer_hover_click_legend(page, shots, cli):
    codes = np.load(REPORT / "codes" / f"{CHECKPOINT}_ood.npz")
    obj, frame = page.frame(f"{CHECKPOINT}_explorer.svg")
    n = frame.locator("circle.hl-pt").count()
    assert n == len(codes["label"]) == 2048
    obj.screenshot(path=str(shots / "explorer_before_click.png"))

    # Hover: the problem index and its rule (from the codes file), and the layer shown (the last).
    i = _topmost_point(frame, 17)
    assert i >= 0
    frame.locator(f'circle.hl-pt[data-i="{i}"]').hover()
    tip = frame.locator(".hl-tip").text_content()
    assert f"OOD problem {int(codes['problem'][i])}" in tip, tip
    assert f"rule: {RULES[int(codes['label'][i])]}" in tip, tip
    assert f"target: {int(codes['target'][i])}" in tip and "layer 3" in tip, tip
    assert f"correct: {'yes' if codes['correct'][i] else 'no'}" in tip, tip

    # Click: the problem's panels, from the problem file that the shown command writes.
    frame.locator(f'circle.hl-pt[data-i="{i}"]').click()
    title = frame.locator(".hl-detail-title").text_content()
    assert title == f"OOD problem {i}, layer 3", title
    repro = " ".join(frame.locator(".hl-repro").all_text_contents())
    cmd = repro.split(" (problem")[0].split()
    assert cmd[:3] == ["hyperlens", "tasks", "sample"], repro
    out = shots / "explorer_problems.npz"
    run_cli(cli, *cmd[1:-1], str(out))
    prob = np.load(out)
    x, y = prob["x"][i], prob["y"][i]
    want = [list(x[4 * p : 4 * p + 4].argmax(axis=1)) for p in range(8)] + [list(y)]
    shown = frame.evaluate(
        """() => Array.from(document.querySelectorAll('.hl-panel')).map(g =>
            Array.from(g.querySelectorAll('.hl-feat')).map(f => +f.getAttribute('data-value')))"""
    )
    assert shown == want
    answer = frame.locator(".hl-answer").text_content()
    assert answer.startswith(f"slot 3: true {int(y[3])}, model {int(codes['prediction'][i])}"), answer
    # The site's query and keys (tokens 35, 27, 31) are marked: panel 8, 6, 7 at slot 3.
    marked = frame.evaluate(
        """() => Array.from(document.querySelectorAll('.hl-mark')).map(m =>
            [+m.parentNode.parentNode.getAttribute('data-panel'), +m.parentNode.getAttribute('data-feature')])"""
    )
    assert sorted(marked) == [[6, 3], [7, 3], [8, 3]]
    # The point's code: 16 heads x 2 keys.
    assert frame.locator("rect.hl-code").count() == 32
    obj.screenshot(path=str(shots / "explorer_after_click.png"))

    # Legend: hiding a rule hides exactly its points; showing it again brings them back.
    k = int(codes["label"][i])
    frame.locator(f'.hl-leg[data-class="{k}"]').click()
    hidden = frame.evaluate(
        """() => Array.from(document.querySelectorAll('circle.hl-pt')).sort((a, b) => a.getAttribute('data-i') - b.getAttribute('data-i')).map(c => c.getAttribute('display') === 'none')"""
    )
    assert np.array_equal(np.array(hidden), codes["label"] == k)
    frame.locator(f'.hl-leg[data-class="{k}"]').click()
    assert frame.locator('circle.hl-pt[display="none"]').count() == 0

    # Switches: the ID set, another layer, colour by answer value.
    frame.locator(".hl-btn", has_text="ID").first.click()
    frame.locator(".hl-btn", has_text="answer value").click()
    ids = np.load(REPORT / "codes" / f"{CHECKPOINT}_id.npz")
    classes = frame.evaluate(
        """() => Array.from(document.querySelectorAll('circle.hl-pt')).sort((a, b) => a.getAttribute('data-i') - b.getAttribute('data-i')).map(c => +c.getAttribute('data-class'))"""
    )
    assert np.array_equal(np.array(classes), ids["target"])

    # Zoom: the wheel over the plot narrows the axes (fewer points inside the frame).
    box = frame.locator("rect.hl-plot").bounding_box()
    page.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(5):
        page.page.mouse.wheel(0, -100)
    inside = frame.evaluate(
        """() => Array.from(document.querySelectorAll('circle.hl-pt')).filter(c =>
            +c.getAttribute('cx') >= 64 && +c.getAttribute('cx') <= 504 && +c.getAttribute('cy') >= 76 && +c.getAttribute('cy') <= 516).length"""
    )
    assert 0 < inside < 2048

    assert page.errors == [], page.errors
    assert page.remote == [], page.remote
    print(f"\nexplorer screenshots: {shots}/explorer_before_click.png, {shots}/explorer_after_click.png")


def test_attention_hover_values_and_head_selector(page, shots):
    att = np.load(REPORT / "codes" / f"{CHECKPOINT}_attention.npz")["pattern"]
    obj, frame = page.frame(f"{CHECKPOINT}_attention.svg")
    L, H, T, _ = att.shape
    frame.locator(".hl-btn", has_text="H5").click()
    q, k = 35, 27
    frame.locator(f'.hl-cells rect[data-row="{q}"][data-col="{k}"]').hover()
    tip = frame.locator(".hl-tip").text_content()
    assert "H5" in tip and "layer 3" in tip and "query Q3 -> key P6s3" in tip, tip
    shown = float(tip.split("\u2248")[1])
    # 8 bits over [0, max] (or [-max|v|, max|v|]): within half a step (plus the 4 digits shown).
    step = 2 * np.abs(att).max() / 255
    assert abs(shown - att[L - 1, 5, q, k]) <= step / 2 + 1e-3 * abs(shown) + 1e-6, (shown, att[L - 1, 5, q, k])
    obj.screenshot(path=str(shots / "attention.png"))
    assert page.errors == [], page.errors
    assert page.remote == [], page.remote


def _tip(frame, row: int, col: int) -> str:
    frame.locator(f'.hl-cells rect[data-row="{row}"][data-col="{col}"]').hover()
    return frame.locator(".hl-tip").text_content()


def test_similarity_and_confusion_heatmaps_hover_values(page, shots):
    """The rule-similarity and confusion heatmaps: hovering a cell shows its rules and the value
    of tables/<name>/similarity.csv (cosine) and confusion.csv (count over the true rule's row)."""
    import pandas as pd

    tables = REPORT / "tables" / CHECKPOINT
    sim = pd.read_csv(tables / "similarity.csv")
    last = int(sim.loc[~sim["all_layers"], "layer"].max())
    sim = sim[(sim["layer"] == last) & ~sim["all_layers"]]
    obj, frame = page.frame(f"{CHECKPOINT}_similarity.svg")
    assert frame.locator(".hl-cells rect").count() == 64  # every rule has OOD codes here
    assert frame.locator(".hl-title").text_content() == f"{CHECKPOINT}: cosine similarity of mean codes, layer {last}"
    for a, b in [(0, 0), (2, 5), (7, 1)]:
        tip = _tip(frame, a, b)
        want = float(sim[(sim["label_a"] == a) & (sim["label_b"] == b)]["cosine"].iloc[0])
        assert f"rule (row): {RULES[a]}" in tip and f"rule (column): {RULES[b]}" in tip, tip
        shown = float(tip.split("cosine similarity: ")[1])
        assert abs(shown - want) <= 5e-4 * abs(want) + 1e-9, (tip, want)
    obj.screenshot(path=str(shots / "similarity_heatmap.png"))

    summary = json.loads((REPORT / "summary.json").read_text())
    best = next(c for c in summary["checkpoints"] if c["name"] == CHECKPOINT)["best_decoding_layer"]
    conf = pd.read_csv(tables / "confusion.csv")
    conf = conf[(conf["layer"] == best) & ~conf["all_layers"]]
    counts = np.zeros((8, 8))
    for r in conf.itertuples():
        counts[r.true_label, r.predicted_label] = r.count
    obj, frame = page.frame(f"{CHECKPOINT}_confusion.svg")
    assert f"layer {best}" in frame.locator(".hl-title").text_content()
    # Every rule is in the OOD set and predicted somewhere: rows and columns are the 8 rules.
    assert frame.locator(".hl-cells rect").count() == 64
    off = np.unravel_index(np.argmax(counts - np.diag(np.diag(counts))), counts.shape)
    for t, p in [(3, 3), (int(off[0]), int(off[1]))]:
        tip = _tip(frame, t, p)
        assert f"true rule: {RULES[t]}" in tip and f"predicted rule: {RULES[p]}" in tip, tip
        want = counts[t, p] / counts[t].sum()
        shown = float(tip.rsplit(": ", 1)[1])
        assert abs(shown - want) <= 5e-4 * abs(want) + 1e-9, (tip, want)
    obj.screenshot(path=str(shots / "confusion_heatmap.png"))
    assert page.errors == [], page.errors
    assert page.remote == [], page.remote
    print(f"\nheatmap screenshots: {shots}/similarity_heatmap.png, {shots}/confusion_heatmap.png")


def test_logic_explorer_hover_legend_and_tsne(page, shots):
    """The fuzzy-logic explorer: hovering a point shows its problem, terms and target from the codes
    file; the legend hides exactly the points of a first term; the t-SNE switch places the points
    at tables/<name>/projections.npz's tsne_all."""
    name = "logic-hyla"
    codes = np.load(REPORT / "codes" / f"{name}_ood.npz")
    proj = np.load(REPORT / "tables" / name / "projections.npz")
    n = len(proj["tsne_all"])
    obj, frame = page.frame(f"{name}_explorer.svg")
    assert frame.locator("circle.hl-pt").count() == n
    bits = max(1, int(np.ceil(np.log2(max(2, int(codes["term_ids"].max()) + 1)))))
    i = _topmost_point(frame, 11)
    assert i >= 0
    frame.locator(f'circle.hl-pt[data-i="{i}"]').hover()
    tip = frame.locator(".hl-tip").text_content()
    terms = ", ".join(format(int(t), f"0{bits}b") for t in codes["term_ids"][i])
    assert f"OOD problem {int(codes['problem'][i])}" in tip and f"terms: {terms}" in tip, tip
    target = float(tip.split("target: ")[1].split("prediction")[0])
    assert abs(target - codes["target"][i]) <= 5e-4 * abs(codes["target"][i]) + 1e-6, (tip, codes["target"][i])
    frame.locator(f'circle.hl-pt[data-i="{i}"]').click()
    assert frame.locator("rect.hl-code").count() == codes["codes"].shape[1] * codes["codes"].shape[2]
    obj.screenshot(path=str(shots / "logic_explorer.png"))
    k = int(codes["term_ids"][i, 0])
    frame.locator(f'.hl-leg[data-class="{k}"]').click()
    hidden = frame.evaluate(
        """() => Array.from(document.querySelectorAll('circle.hl-pt')).sort((a, b) => a.getAttribute('data-i') - b.getAttribute('data-i')).map(c => c.getAttribute('display') === 'none')"""
    )
    assert np.array_equal(np.array(hidden), codes["term_ids"][:n, 0] == k)
    frame.locator(f'.hl-leg[data-class="{k}"]').click()
    frame.locator(".hl-btn", has_text="t-SNE").click()
    xy = np.array(frame.evaluate(
        """() => Array.from(document.querySelectorAll('circle.hl-pt')).sort((a, b) => a.getAttribute('data-i') - b.getAttribute('data-i')).map(c => [+c.getAttribute('cx'), +c.getAttribute('cy')])"""
    ))
    # Screen x grows with t-SNE 1 and screen y falls with t-SNE 2, linearly (to 0.1 px rounding).
    assert np.corrcoef(xy[:, 0], proj["tsne_all"][:, 0])[0, 1] > 0.9999
    assert np.corrcoef(xy[:, 1], proj["tsne_all"][:, 1])[0, 1] < -0.9999
    obj.screenshot(path=str(shots / "logic_explorer_tsne.png"))
    assert page.errors == [], page.errors
    assert page.remote == [], page.remote
    print(f"\nlogic explorer screenshots: {shots}/logic_explorer.png, {shots}/logic_explorer_tsne.png")


def test_page_loads_every_figure_without_errors(page, shots):
    page.page.wait_for_load_state("load")
    names = page.page.eval_on_selector_all("object.hl-live", "os => os.map(o => o.getAttribute('data'))")
    # Per SRAVEN checkpoint: the explorer, the attention, the confusion and similarity heatmaps;
    # per logic checkpoint: the explorer.
    assert len(names) == 6 * 4 + 3
    for name in names:
        _, frame = page.frame(name.removeprefix("figures/"))  # waits until the figure has booted
        assert frame.locator("svg.hl-fig .hl-noscript").count() == 0
    # Every image of the page loaded (PNG figures and fallbacks are files beside the page).
    broken = page.page.evaluate(
        "() => Array.from(document.images).filter(i => !i.closest('object') && (!i.complete || !i.naturalWidth)).map(i => i.src)"
    )
    assert broken == [], broken
    assert page.errors == [], page.errors
    assert page.remote == [], page.remote

