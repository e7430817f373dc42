"""Reliability of the Python front against hostile input: every array layout read right, sizes
refused by the memory budget before they are allocated (also under `ulimit -v`), integers and
indices checked as numpy checks them, one validation per file format at both ends, and messages
that name the argument in the user's words.

Every error raised in this file is kept (`_seen`) and the last test checks that none of them shows
a Rust `Debug` dump (`Name { field: ... }`) or a Rust path (`a::b`)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl

from conftest import ROOT

_seen: list[str] = []


class raises:
    """``pytest.raises`` that also keeps the message for the message test at the end."""

    def __init__(self, exc, match: str | None = None) -> None:
        self._cm = pytest.raises(exc, match=match)

    def __enter__(self):
        self._info = self._cm.__enter__()
        return self._info

    def __exit__(self, *exc_info):
        out = self._cm.__exit__(*exc_info)
        if exc_info[1] is not None:
            _seen.append(f"{type(exc_info[1]).__name__}: {exc_info[1]}")
        return out


# ---------------------------------------------------------------------------------------------
# Layouts: each the same values as the contiguous array, in another memory layout.


def _packed_field(a: np.ndarray) -> np.ndarray:
    """A field of a packed structured array: byte strides that are no multiple of the element
    size, unaligned data."""
    dt = np.dtype([("pad", "u1"), ("v", a.dtype, a.shape[1:])])
    rec = np.zeros(a.shape[0], dtype=dt)
    rec["v"] = a
    out = rec["v"]
    assert a.itemsize == 1 or (out.strides[0] % a.itemsize != 0 and not out.flags.aligned)
    return out


def _odd_strides(a: np.ndarray) -> np.ndarray:
    """A view over a byte buffer with an odd offset and an odd outer stride."""
    outer = a[0].nbytes + 3
    buf = np.zeros(outer * a.shape[0] + 8, dtype=np.uint8)
    inner = tuple(s for s in np.zeros(a.shape[1:], a.dtype).strides)
    out = np.ndarray(a.shape, dtype=a.dtype, buffer=buf, offset=1, strides=(outer, *inner))
    out[...] = a
    return out


def _fortran(a: np.ndarray) -> np.ndarray:
    return np.asfortranarray(a)


def _reversed(a: np.ndarray) -> np.ndarray:
    """Negative strides on every axis: the values in the original order."""
    r = np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])
    return r[(slice(None, None, -1),) * a.ndim]


def _broadcast(a: np.ndarray) -> np.ndarray:
    """A broadcast (zero-stride) axis: the rows of a repeated along a new middle axis, taken
    back with a stride of zero."""
    b = np.broadcast_to(a[:, None], (a.shape[0], 3, *a.shape[1:]))
    return b[:, 1]


def _read_only(a: np.ndarray) -> np.ndarray:
    r = a.copy()
    r.flags.writeable = False
    return r


def _memmap(a: np.ndarray, tmp: Path) -> np.ndarray:
    p = tmp / f"mm{len(list(tmp.iterdir()))}.npy"
    np.save(p, a)
    return np.load(p, mmap_mode="r")


def _big_endian(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder(">"))


LAYOUTS = {
    "packed structured field": lambda a, tmp: _packed_field(a),
    "odd byte strides": lambda a, tmp: _odd_strides(a),
    "Fortran order": lambda a, tmp: _fortran(a),
    "negative strides": lambda a, tmp: _reversed(a),
    "broadcast": lambda a, tmp: _broadcast(a),
    "read-only": lambda a, tmp: _read_only(a),
    "memory-mapped": _memmap,
    "big-endian": lambda a, tmp: _big_endian(a),
}


def _equal(a, b) -> bool:
    """Bit for bit (NaN-free results), recursively over dicts and tuples."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def layout_inputs(model):
    ps = hl.tasks.sample(split="paper-seed0", set="ood", n=24, seed=5, unpermuted=True)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 12))
    lab = np.arange(60) % 4
    codes = model.latent_codes(ps, layers=[0, 3])
    return ps, X, lab, codes


def _fields(r) -> dict:
    """A result object's fields."""
    return dict(vars(r)) if hasattr(r, "__dict__") else {f: getattr(r, f) for f in r.__dataclass_fields__}


def _functions(model):
    """Each function of the table, given a layout transform `t` of its array arguments."""
    lm = hl.load("attn-only-2l")
    tokens = (np.arange(2 * 12).reshape(2, 12) * 7) % lm.cfg.d_vocab

    def logits(t, ps, X, lab, codes):
        return model.logits(t(ps.x))

    def latent_codes(t, ps, X, lab, codes):
        p = hl.ProblemSet(t(ps.x), t(ps.y), t(ps.rules))
        return model.latent_codes(p, layers=[1]).as_dict()

    def problem_set_save(t, ps, X, lab, codes, tmp):
        p = tmp / f"ps{len(list(tmp.iterdir()))}.npz"
        hl.ProblemSet(t(ps.x), t(ps.y), t(ps.rules), t(ps.perms)).save(p)
        return hl.ProblemSet.load(p).as_dict()

    def pca(t, ps, X, lab, codes):
        return _fields(hl.analysis.pca(t(X), n_components=2))

    def decode(t, ps, X, lab, codes):
        return _fields(hl.analysis.decode(t(X[:40]), t(lab[:40]), t(X[40:]), t(lab[40:])))

    def kmeans(t, ps, X, lab, codes):
        return _fields(hl.analysis.kmeans(t(X), k=3, seed=1))

    def code_set_save(t, ps, X, lab, codes, tmp):
        p = tmp / f"cs{len(list(tmp.iterdir()))}.npz"
        hl.CodeSet(t(codes.codes), t(codes.label), rules=t(codes.rules), correct=t(codes.correct)).save(p)
        return hl.CodeSet.load(p).as_dict()

    def lm_logits(t, ps, X, lab, codes):
        return lm.logits(t(tokens))

    return {
        "Model.logits": logits,
        "Model.latent_codes": latent_codes,
        "ProblemSet.save/load": problem_set_save,
        "analysis.pca": pca,
        "analysis.decode": decode,
        "analysis.kmeans": kmeans,
        "CodeSet.save/load": code_set_save,
        "LanguageModel.logits": lm_logits,
    }


def layout_table(model, inputs, tmp: Path) -> dict[tuple[str, str], bool]:
    """(function, layout) -> whether the result equals the contiguous one bit for bit."""
    ps, X, lab, codes = inputs
    table = {}
    for fname, f in _functions(model).items():
        needs_tmp = f.__code__.co_argcount == 6
        call = (lambda t: f(t, ps, X, lab, codes, tmp)) if needs_tmp else (lambda t: f(t, ps, X, lab, codes))
        want = call(np.ascontiguousarray)
        for lname, lay in LAYOUTS.items():
            table[(fname, lname)] = _equal(call(lambda a: lay(np.ascontiguousarray(a), tmp)), want)
    return table


def test_every_layout_reads_the_same_values_as_the_contiguous_array(model, layout_inputs, tmp_path):
    """Before the one reader, a packed field's logits were up to 10.5 away from the contiguous
    array's, without an error."""
    table = layout_table(model, layout_inputs, tmp_path)
    bad = [k for k, ok in table.items() if not ok]
    assert not bad, f"results that differ from the contiguous array's: {bad}"
    assert len(table) == 8 * len(LAYOUTS)


def test_a_readable_view_is_read_in_place_and_an_unreadable_one_is_copied_within_the_budget():
    """Under an 8 MiB budget: 8,000 broadcast problems (9 MiB if copied; zero strides are whole
    elements) are read in place, while the same values as a packed field need a copy that the
    budget refuses, naming it."""
    code = (
        "import numpy as np, hyperlens as hl\n"
        "m = hl.load('sraven-hyla')\n"
        "one = hl.tasks.sample(n=1, seed=0)\n"
        "x = np.broadcast_to(one.x, (8000, 36, 8))\n"
        "lo = m.logits(x, batch=8)\n"
        "print('in place', lo.shape, bool((lo == m.logits(one.x)).all()))\n"
        "rec = np.zeros(8000, dtype=[('pad', 'u1'), ('x', '<f4', (36, 8))])\n"
        "rec['x'] = one.x[0]\n"
        "try:\n"
        "    m.logits(rec['x'], batch=8)\n"
        "except hl.BudgetError as e:\n"
        "    print('refused:', e)\n"
    )
    env = dict(os.environ, HYPERLENS_MEMORY_BUDGET="8M")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "in place (8000, 4, 8) True" in r.stdout, r.stdout
    assert "refused: a C-contiguous copy of an array of shape [8000, 36, 8]" in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------
# The memory budget.


def test_report_with_a_huge_n_is_a_budget_error_not_an_abort(tmp_path):
    with raises(hl.BudgetError, match="over the memory budget"):
        hl.report(tmp_path / "r", ["data/checkpoints/sraven-hyla"], n=10**10)
    assert not (tmp_path / "r").exists()


def test_the_cli_report_refuses_a_huge_n_as_the_python_front_does(cli, tmp_path):
    r = subprocess.run(
        [str(cli), "report", "--checkpoint", "data/checkpoints/sraven-hyla", "--n", str(10**10), "--out", str(tmp_path / "r")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "over the memory budget" in r.stderr and "panicked" not in r.stderr


def test_validating_a_broadcast_set_of_1e8_problems_is_refused_before_the_copy():
    ps = hl.tasks.sample(n=1, seed=0)
    n = 10**8
    x = np.broadcast_to(ps.x, (n, *ps.x.shape[1:]))
    y = np.broadcast_to(ps.y, (n, ps.y.shape[1]))
    rules = np.broadcast_to(ps.rules, (n, ps.rules.shape[1]))
    with raises(hl.BudgetError, match="`x`"):
        hl.ProblemSet(x, y, rules)
    # A dtype conversion of a broadcast array is checked before numpy copies it too.
    with raises(hl.BudgetError, match="copy of `x`"):
        hl.ProblemSet(np.broadcast_to(ps.x.astype(np.float64), x.shape), y, rules)


def test_a_huge_batch_is_refused_before_its_forward_pass(model):
    ps = hl.tasks.sample(n=1, seed=0)
    x = np.broadcast_to(ps.x, (10**7, *ps.x.shape[1:]))
    with raises(hl.BudgetError, match="forward pass of a batch"):
        model.logits(x, batch=10**7)


def _under_ulimit(code: str, limit_bytes: int) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {k: v for k, v in os.environ.items() if k != "HYPERLENS_MEMORY_BUDGET"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        preexec_fn=limit, env=env,
    )


def test_the_budget_follows_an_address_space_limit():
    """Under `ulimit -v 4G` a set of about 3 GiB (allowed by half of a machine of 6 GiB or more)
    is refused by the budget, naming the limit; a small set still works under the same limit."""
    code = (
        "import hyperlens as hl\n"
        "ps = hl.tasks.sample(n=64)\n"
        "print('small ok', len(ps))\n"
        "try:\n"
        "    hl.tasks.sample(n=2_000_000)\n"
        "except hl.BudgetError as e:\n"
        "    print('refused:', e)\n"
    )
    r = _under_ulimit(code, 4 << 30)
    assert r.returncode == 0, r.stderr
    assert "small ok 64" in r.stdout
    assert "refused:" in r.stdout and "address space" in r.stdout, r.stdout


def test_a_cli_probe_under_ulimit_is_refused_cleanly(cli, tmp_path):
    """A probe batch the machine's budget allows but `ulimit -v` does not: a clear error, exit 1
    (before: an abort, `memory allocation of 5760000000 bytes failed`)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    r = subprocess.run(
        [str(cli), "probe", "--checkpoint", "data/checkpoints/sraven-hyla", "--n", "2000000", "--batch", "2000000",
         "--out", str(tmp_path / "c.npz")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit,
    )
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "over the memory budget" in r.stderr and "address space" in r.stderr
    assert not (tmp_path / "c.npz").exists()


# ---------------------------------------------------------------------------------------------
# Integers, indices and arguments read as numpy reads them.


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda m: hl.tasks.sample(n=-1), "`n`"),
        (lambda m: hl.tasks.sample(n=10**30), "`n`"),
        (lambda m: hl.tasks.sample(seed=-3), "`seed`"),
        (lambda m: hl.tasks.sample(seed=2**64), "`seed`"),
        (lambda m: hl.tasks.sample(n=True), "`n`"),
        (lambda m: hl.tasks.sample(n=2.5), "`n`"),
        (lambda m: m.logits(hl.tasks.sample(n=2).x, batch=-1), "`batch`"),
        (lambda m: m.logits(hl.tasks.sample(n=2).x, batch=2**64), "`batch`"),
        (lambda m: hl.analysis.pca(np.ones((4, 3)), n_components=-2), "`n_components`"),
        (lambda m: hl.analysis.kmeans(np.ones((4, 3)), k=2**70), "`k`"),
        (lambda m: hl.analysis.tsne(np.ones((40, 3)), seed=-1), "`seed`"),
        (lambda m: m.latent_codes(hl.tasks.sample(n=2), layers="12"), "`layers`"),
        (lambda m: m.latent_codes(hl.tasks.sample(n=2), layers=[1.5]), "`layers[0]`"),
        (lambda m: m.latent_codes(hl.tasks.sample(n=2), layers=[-1]), "`layers[0]`"),
        (lambda m: hl.utils.get_act_name("pattern", 1.0), "`layer`"),
        (lambda m: hl.report("unused", n=-5), "`n`"),
        (lambda m: hl.tasks.ProblemSet.load("x.npz", features=-4), "`features`"),
        (lambda m: hl.CodeSet(np.zeros((2, 1, 1, 1, 1)), [0, 1]).features("0"), "`layer`"),
        (lambda m: hl.CodeSet(np.zeros((2, 1, 1, 1, 1)), [0, 1], layers="0"), "`layers`"),
    ],
)
def test_integer_arguments_are_checked_before_conversion(model, call, name):
    with raises(ValueError) as e:
        call(model)
    assert isinstance(e.value, hl.InputError), type(e.value)
    assert name in str(e.value), str(e.value)


def test_circuit_layer_and_head_are_checked():
    lm = hl.load("attn-only-2l")
    with raises(hl.InputError, match="`layer`"):
        hl.circuits.ov_circuit(lm, -1, 0)
    with raises(hl.InputError, match="`head`"):
        hl.circuits.qk_circuit(lm, 0, 2**64)


@pytest.mark.parametrize("make", ["sraven", "logic"])
def test_set_indexing_follows_numpy(make):
    ps = hl.tasks.sample(task=make, n=5, seed=1)
    n = len(ps)
    assert _equal(ps[-1].as_dict(), ps[4].as_dict()) and len(ps[-5]) == 1
    assert _equal(ps[np.array([0, -1])].x, ps.x[[0, 4]])
    assert len(ps[np.zeros(n, bool)]) == 0 and len(ps[2:100]) == 3
    # A prefix is the set sampled with a smaller n; any other subset says it is one.
    assert ps[:3].meta == ps.meta and ps[1:3].meta == {**ps.meta, "subset": True}
    for bad in (5, -6, 10**30, np.int64(7)):
        with raises(IndexError, match="out of range"):
            ps[bad]
    with raises(IndexError, match="out of range"):
        ps[np.array([0, 5])]
    with raises(IndexError, match="boolean mask"):
        ps[np.ones(n + 1, bool)]
    with raises(IndexError, match="one index axis"):
        ps[0, 1]
    with raises(TypeError):
        ps[True]


def test_analyze_refuses_the_labels_that_the_file_form_refuses(model, tmp_path):
    ps = hl.tasks.sample(split="paper-seed0", set="id", n=64, seed=1, unpermuted=True)
    good = model.latent_codes(ps, layers=[3])
    bad_label = good.as_dict()
    bad_label["label"] = bad_label["label"].copy()
    bad_label["label"][3] = 9
    with raises(hl.InputError, match=r"train.*`label`.*entry 3 is 9"):
        hl.analysis.analyze(bad_label, good)
    # The file form refuses the same array (written with numpy, read by the CLI's reader).
    np.savez(tmp_path / "bad.npz", **bad_label)
    with raises(hl.InputError, match=r"`label`.*entry 3 is 9"):
        hl.CodeSet.load(tmp_path / "bad.npz")
    with raises(hl.InputError, match="`label`"):
        hl.analysis.analyze({**good.as_dict(), "label": good.label + 0.5}, good)
    with raises(hl.InputError, match="`correct`"):
        hl.analysis.analyze({**good.as_dict(), "correct": np.full(len(good), 2)}, good)


def test_a_code_set_is_validated_at_both_ends_of_its_file(model, tmp_path):
    ps = hl.tasks.sample(split="paper-seed0", set="id", n=16, seed=1, unpermuted=True)
    good = model.latent_codes(ps, layers=[3])
    p = tmp_path / "c.npz"
    label = good.label.copy()
    label[0] = 8
    with raises(hl.InputError, match="entry 0 is 8"):
        hl.CodeSet(good.codes, label).save(p)
    assert not p.exists()
    codes = good.codes.copy()
    codes[1, 0, 0, 0, 0] = np.nan
    with raises(hl.InputError, match="NaN|non-finite|infinite"):
        hl.CodeSet(codes, good.label).save(p)
    assert not p.exists()
    good.save(p)
    assert _equal(hl.CodeSet.load(p).as_dict(), good.as_dict())
    lp = hl.tasks.sample(task="logic", n=8, seed=2)
    lc = hl.load("logic-hyla").latent_codes(lp)
    terms = lc.terms.copy()
    terms[0, 0, 0] = 3
    with raises(hl.InputError, match="not a bit"):
        hl.LogicCodeSet(lc.codes, terms, lc.term_ids).save(tmp_path / "l.npz")
    assert not (tmp_path / "l.npz").exists()


def test_a_report_split_is_never_silently_ignored(tmp_path):
    with raises(hl.InputError, match="trained on split paper-seed0"):
        hl.report(tmp_path / "r", ["data/checkpoints/sraven-hyla"], n=16, split="paper-seed1", causal_n=0)
    with raises(hl.InputError, match="unknown split"):
        hl.report(tmp_path / "r", ["data/checkpoints/sraven-hyla"], n=16, split="paper-seed9", causal_n=0)
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------------
# Messages.


def test_training_settings_errors_name_the_argument(tmp_path):
    with raises(hl.InputError, match="`lr` must be a finite number"):
        hl.train(tmp_path / "a", lr=float("nan"), steps=1)
    with raises(hl.InputError, match="`steps`"):
        hl.train(tmp_path / "b", steps=-1)
    with raises(hl.InputError, match="`steps` must be an integer"):
        hl.train(tmp_path / "c", steps="100")
    with raises(hl.InputError, match="`heads`"):
        hl.train(tmp_path / "d", steps=1, d_model=16, heads=0, d_head=4, d_mlp=16)
    with raises(hl.InputError, match="`lr\\[1\\]`"):
        hl.train(tmp_path / "e", steps=1, lr=[0.1, float("inf")])


def test_tsne_perplexity_errors_say_what_is_wrong():
    X = np.random.default_rng(0).normal(size=(30, 4))
    with raises(hl.InputError, match="perplexity must be a positive number, got 0"):
        hl.analysis.tsne(X, perplexity=0)
    with raises(hl.InputError, match=r"too large for 30 points: it must be at most \(N - 1\) / 3 = 9.667"):
        hl.analysis.tsne(X, perplexity=10)
    with raises(hl.InputError, match="perplexity must be a positive number, got inf"):
        hl.analysis.tsne(X, perplexity=float("inf"))


def test_no_message_shows_a_rust_debug_dump_or_path():
    """Runs last in this file: every message raised above, none with `{ ` or `::`."""
    assert len(_seen) > 40, len(_seen)
    bad = [m for m in _seen if "{ " in m or "::" in m]
    assert not bad, bad
