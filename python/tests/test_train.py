"""hl.train and hl.report against `hyperlens train` / `hyperlens report` on tiny sizes."""

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import run_cli

TINY = {
    "task": "sraven", "mixer": "hyla", "split": "paper-seed0", "steps": 40, "batch": 32, "layers": 2,
    "d_model": 16, "heads": 2, "d_head": 8, "d_mlp": 16, "eval_n": 64, "eval_every": 20, "lr": 0.01,
    "warmup": 10, "checkpoint_every": 10,
}


def _flags(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


@pytest.fixture(scope="module")
def cli_run(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "cli"
    run_cli(cli, "train", *_flags(TINY), "--out", str(out), "--quiet")
    return out


def test_train_equals_cli(cli_run, tmp_path):
    events = []
    r = hl.train(tmp_path / "py", progress=events.append, **TINY)
    assert isinstance(r, hl.TrainResult) and r.completed and r.step == 40
    # the same settings train the same weights, bit for bit, and log the same metrics
    assert (tmp_path / "py/model.safetensors").read_bytes() == (cli_run / "model.safetensors").read_bytes()
    ref = json.loads((cli_run / "train.json").read_text())
    assert r.record["final_eval"] == ref["final_eval"]
    assert json.loads((tmp_path / "py/train_state.json").read_text())["settings"] == json.loads((cli_run / "train_state.json").read_text())["settings"]
    kinds = [e["event"] for e in events]
    assert "checkpoint_write" not in kinds
    assert kinds[0] == "start" and kinds.count("step") == 40 and "evaluated" in kinds and "checkpoint" in kinds
    assert events[0]["total"] == 40 and events[0]["line"].startswith("training hyla")
    m = r.load()
    assert m.cfg.d_model == 16 and m.cfg.n_heads == 2


def test_train_stops_and_resumes_exactly(cli_run, tmp_path):
    out = tmp_path / "run"
    r = hl.train(out, progress=lambda e: e["event"] == "step" and e["step"] + 1 >= 15, **TINY)
    assert not r.completed and r.step == 15 and r.record is None
    r2 = hl.train(out, resume=True, progress=False)
    assert r2.completed and r2.step == 40
    assert (out / "model.safetensors").read_bytes() == (cli_run / "model.safetensors").read_bytes()


def test_keyboard_interrupt_leaves_a_resumable_run(tmp_path):
    out = tmp_path / "run"

    def stop(e):
        if e["event"] == "step" and e["step"] == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hl.train(out, progress=stop, **TINY)
    state = json.loads((out / "train_state.json").read_text())
    assert state["step"] == 13
    assert hl.train(out, resume=True, progress=False).completed


def test_train_group_of_seeds(cli, tmp_path):
    opts = dict(TINY, steps=20, checkpoint_every=20)
    res = hl.train(tmp_path / "group", seeds=[0, 1], progress=False, **opts)
    assert [r.completed for r in res] == [True, True] and len(res) == 2
    assert json.loads((tmp_path / "group/group.json").read_text())["runs"] == [r.out.name for r in res]
    # the CLI's group of the same lists trains the same two models
    run_cli(cli, "train", *_flags({k: v for k, v in opts.items() if k != "task"}), "--seeds", "0,1", "--out", str(tmp_path / "cli"), "--quiet")
    for r in res:
        assert (r.out / "model.safetensors").read_bytes() == (tmp_path / "cli" / r.out.name / "model.safetensors").read_bytes()
    # resuming a finished group has nothing to do
    assert hl.train(tmp_path / "group", resume=True, progress=False) == []


def test_train_errors(tmp_path):
    with pytest.raises(hl.InputError, match="unknown setting"):
        hl.train(tmp_path / "a", stepz=3)
    with pytest.raises(hl.InputError, match="together"):
        hl.train(tmp_path / "b", d_model=16)
    with pytest.raises(hl.InputError):
        hl.train(tmp_path / "c", steps=10, batch=0)
    with pytest.raises(hl.HyperlensError):
        hl.train(tmp_path / "missing", resume=True)


def test_report_equals_cli(cli, cli_run, tmp_path):
    run_cli(cli, "report", "--checkpoint", str(cli_run), "--out", str(tmp_path / "cli"), "--n", "16", "--causal-n", "0")
    stages = []
    index = hl.report(tmp_path / "py", [cli_run], n=16, causal_n=0, progress=stages.append)
    assert index == tmp_path / "py/index.html" and index.is_file()
    assert {s["stage"] for s in stages} >= {"checkpoint", "codes", "analysis", "figures"}
    for rel in ("aggregate.csv", "tables/cli/decoding.csv", "tables/cli/pca.csv", "tables/cli/summary.json"):
        # the files name their own paths (the output directory) and nothing else differs
        py_text = (tmp_path / "py" / rel).read_text().replace(str(tmp_path / "py"), "OUT")
        assert py_text == (tmp_path / "cli" / rel).read_text().replace(str(tmp_path / "cli"), "OUT"), rel
    z1, z2 = np.load(tmp_path / "py/codes/cli_ood.npz"), np.load(tmp_path / "cli/codes/cli_ood.npz")
    for k in z1.keys():
        np.testing.assert_array_equal(z1[k], z2[k], err_msg=k)
    with pytest.raises(hl.InputError, match="16"):
        hl.report(tmp_path / "x", [cli_run], n=8)
