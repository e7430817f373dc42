"""notebooks/quickstart.ipynb runs from top to bottom (nbclient) and its results are right."""

import json

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

import hyperlens as hl
from conftest import ROOT


def test_quickstart_notebook_runs_and_its_numbers_hold(model):
    path = ROOT / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    cell = next(c for c in nb.cells if "results" in c.metadata.get("tags", []))
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    r = json.loads(text)
    assert r["n_layers"] == 4
    assert r["codes_shape"] == [1024, 4, 16, 1, 2]
    assert r["pattern_shape"] == [16, 36, 36]
    assert "blocks.3.attn.hook_pattern" in r["cache"] and len(r["cache"]) == 5
    assert r["analyze_layers"] == [0, 1, 2, 3, -1]
    # the notebook's numbers are the package's own, recomputed here
    ood = hl.tasks.sample(split="paper-seed0", set="ood", n=1024, seed=0, unpermuted=True)
    idset = hl.tasks.sample(split="paper-seed0", set="id", n=1024, seed=0, unpermuted=True)
    assert r["accuracy"] == model.evaluate(ood)["accuracy"]
    assert 0.5 < r["accuracy"] < 0.95
    ci, co = model.latent_codes(idset), model.latent_codes(ood)
    d3 = hl.analysis.decode(ci.features(3), ci.label, co.features(3), co.label)
    assert r["decoding"][3] == pytest.approx(d3.accuracy)
    # the rule is decodable from the codes OOD far above the majority baseline in some layer
    assert max(r["decoding"]) > d3.majority_baseline + 0.1
    # the ablated head: the accuracy without it, recomputed through patching's own hook (zero
    # ablation of L3H7 at hook_z) on the same problems
    sub = ood[:256]
    acc = lambda lg: float((lg.argmax(-1) == sub.y).all(-1).mean())
    assert r["ablation"][0] == acc(model.logits(sub))
    zero = lambda z, name: np.where(np.arange(z.shape[2])[None, None, :, None] == 7, 0.0, z).astype(np.float32)
    assert r["ablation"][1] == acc(model.run_with_hooks(sub.x, fwd_hooks=[("blocks.3.attn.hook_z", zero)]))
    # the language model's cached attention and its induction heads (reports/circuits/attn-only-2l)
    assert r["lm_pattern_shape"] == [4, 40, 40]
    assert "L1H2" in r["induction_heads"]
