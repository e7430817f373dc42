#!/usr/bin/env python3
"""Round-trip test of scripts/export_jax_checkpoint.py (plain python3 + numpy):

    python3 scripts/test_export_jax_checkpoint.py

Builds pickled states from the paper-jax test fixture (crates/model/tests/fixtures/paper-jax/
hyla_params.npz, 74 arrays) in the shapes the authors' code and its libraries produce, runs the export
script on each in a fresh interpreter, and checks that the written .npz has exactly the fixture's keys
and bit-identical float32 arrays, uncompressed (what `hyperlens import jax` reads). Also checks that
incomplete or inconsistent states fail with a one-line `error:` message.

The states:
1. the bare variable dict `{"params": tree}`, nested plain dicts of numpy arrays;
2. an object of a class `hyla.experiment.ExperimentState` (as the authors' `Experiment.save` writes
   it) whose `.params` is `{"params": FrozenDict(tree)}` and whose arrays are jax arrays, with an
   optimizer state of named tuples. The classes are registered under the real module names only in
   this process, so the export script, which cannot import them, must use its stand-ins (unless flax
   or jax are installed, in which case their real classes are used on both sides);
3. the tree alone, without a `params` key.
"""
import collections
import os
import pickle
import subprocess
import sys
import tempfile
import types
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "export_jax_checkpoint.py")
FIXTURE = os.path.join(ROOT, "crates", "model", "tests", "fixtures", "paper-jax", "hyla_params.npz")


def nested(flat):
    """`{'a/b': x}` -> `{'a': {'b': x}}`."""
    tree = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def fake_module(name, **attrs):
    """Registers a module `name` (and its parents) in this process only, holding `attrs`."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    mod = sys.modules[name]
    for k, v in attrs.items():
        v.__module__, v.__qualname__ = name, k  # so that pickle finds it as name.k
        setattr(mod, k, v)
    return mod


def frozen_dict_type():
    try:
        from flax.core.frozen_dict import FrozenDict  # noqa: F401

        return FrozenDict, lambda d: FrozenDict(d)
    except ImportError:
        pass

    class FrozenDict(collections.abc.Mapping):
        """Pickles like flax's: `FrozenDict(plain dict)`."""

        def __init__(self, d):
            self._dict = dict(d)

        def __getitem__(self, k):
            return self._dict[k]

        def __iter__(self):
            return iter(self._dict)

        def __len__(self):
            return len(self._dict)

        def __reduce__(self):
            return FrozenDict, (self._dict,)

    fake_module("flax.core.frozen_dict", FrozenDict=FrozenDict)

    def freeze(d):
        return FrozenDict({k: freeze(v) if isinstance(v, dict) else v for k, v in d.items()})

    return FrozenDict, freeze


def jax_array_type():
    try:
        import jax.numpy as jnp

        return jnp.asarray
    except ImportError:
        pass

    def _reconstruct_array(fun, args, arr_state, aval_state):  # jax's signature
        raise AssertionError("only called when unpickling with jax installed")

    class ArrayImpl:
        """Pickles like a jax array: through `jax._src.array._reconstruct_array`."""

        def __init__(self, value):
            self.value = np.asarray(value)  # jax keeps an ndarray, 0-d for scalars

        def __reduce__(self):
            fun, args, state = self.value.__reduce__()
            return _reconstruct_array, (fun, args, state, {"weak_type": False})

    fake_module("jax._src.array", _reconstruct_array=_reconstruct_array, ArrayImpl=ArrayImpl)
    return ArrayImpl


def train_state(flat):
    FrozenDict, freeze = frozen_dict_type()
    to_jax = jax_array_type()
    AdamState = collections.namedtuple("ScaleByAdamState", ["count", "mu", "nu"])

    class ExperimentState:
        def __init__(self, optim, params, rng, step):
            self.optim, self.params, self.rng, self.step = optim, params, rng, step

    fake_module("hyla.experiment", ExperimentState=ExperimentState)
    fake_module("optax._src.transform", ScaleByAdamState=AdamState)
    tree = nested({k: to_jax(v) for k, v in flat.items()})
    zeros = nested({k: to_jax(np.zeros_like(v)) for k, v in flat.items()})
    optim = (AdamState(to_jax(np.int32(7)), zeros, zeros),)
    rng = to_jax(np.array([0, 42], np.uint32))
    return ExperimentState(optim=optim, params={"params": freeze(tree)}, rng=rng, step=156250)


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check_round_trip(name, state, flat, tmp):
    pkl = os.path.join(tmp, f"{name}.pkl")
    out = os.path.join(tmp, f"{name}.npz")
    with open(pkl, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    rc, stdout, stderr = run(pkl, out)
    assert rc == 0, f"{name}: exit {rc}: {stderr}"
    assert "wrote" in stdout and "74 float32 arrays" in stdout and "402,824" in stdout, stdout
    with zipfile.ZipFile(out) as z:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist()), "compressed members"
    with np.load(out) as got:
        assert sorted(got.files) == sorted(flat), f"{name}: keys differ"
        for k, want in flat.items():
            a = got[k]
            assert a.dtype == np.float32 and a.shape == want.shape, (name, k, a.dtype, a.shape)
            assert np.array_equal(a, want), (name, k)
    print(f"ok   {name}: {len(flat)} arrays identical after the round trip")


def check_error(name, state, tmp, *extra, expect):
    pkl = os.path.join(tmp, f"{name}.pkl")
    with open(pkl, "wb") as f:
        pickle.dump(state, f)
    rc, stdout, stderr = run(pkl, os.path.join(tmp, f"{name}.npz"), *extra)
    lines = stderr.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: "), (name, rc, stderr)
    assert expect in lines[0], (name, lines[0])
    assert not os.path.exists(os.path.join(tmp, f"{name}.npz")), f"{name}: wrote a file"
    print(f"ok   {name}: {lines[0]}")


def main():
    with np.load(FIXTURE) as f:
        flat = {k: f[k] for k in f.files}
    assert len(flat) == 74, len(flat)
    with tempfile.TemporaryDirectory() as tmp:
        check_round_trip("variables-dict", {"params": nested(flat)}, flat, tmp)
        check_round_trip("experiment-state", train_state(flat), flat, tmp)
        check_round_trip("bare-tree", nested(flat), flat, tmp)

        missing = dict(flat)
        del missing["transformer_block_2/sequence_mixer/value/bias"]
        check_error("missing-key", {"params": nested(missing)}, tmp,
                    expect="`transformer_block_2/sequence_mixer/value/bias`")
        check_error("wrong-layers", {"params": nested(flat)}, tmp, "--layers", "8",
                    expect="the tree has 4 transformer blocks")
        extra = dict(flat)
        extra["transformer_block_0/sequence_mixer/extra/kernel"] = np.zeros(3, np.float32)
        check_error("extra-key", {"params": nested(extra)}, tmp, expect="1 unexpected")
        bad = dict(flat)
        bad["transformer_block_1/state_mixer/Dense_1/kernel"] = np.zeros((256, 64), np.float32)
        check_error("bad-shape", {"params": nested(bad)}, tmp, expect="expected (256, 128)")
        ints = dict(flat)
        ints["logitdense/bias"] = np.arange(8)
        check_error("int-array", {"params": nested(ints)}, tmp, expect="expected floating point")
        check_error("no-tree", [1, 2, 3], tmp, expect="no parameter tree found")
    print("all export checks passed")


if __name__ == "__main__":
    main()
