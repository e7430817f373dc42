#!/usr/bin/env python3
"""Export the parameters of a SRAVEN model trained with the paper authors' JAX/Flax code
(GitHub smonsays/hypernetwork-attention) to the `.npz` that hyperlens imports:

    python3 scripts/export_jax_checkpoint.py RUN/state.pkl params.npz [--layers 4]
    hyperlens import jax --params params.npz --mixer hyla --out data/checkpoints/NAME

Input: the `state.pkl` that the authors' `Experiment.save` writes into the run's log directory (a
pickled `ExperimentState` whose `.params` is the flax variable dict `{"params": {...}}`), or any pickle
of the parameters: a train-state object with a `.params` attribute, a dict or flax `FrozenDict` with
the tree under a `params` key, or the bare tree of nested dicts of arrays. A directory is read as
DIR/state.pkl.

Output: an uncompressed `np.savez` archive of float32 arrays, one per parameter, keyed by the flax
path joined with `/` and without the leading `params/` (`embedding/kernel`,
`transformer_block_0/sequence_mixer/query/kernel`, ..., `logitdense/bias`): 6 + 17 * layers keys,
74 for the paper's 4-layer model (docs/spec/models.md, "Parameter names in the paper code").

Needs numpy only. jax, flax, optax and the authors' `hyla` package are used when they are installed;
otherwise the objects of those libraries in the pickle are replaced by inert stand-ins while loading,
and jax arrays are rebuilt as numpy arrays. Unpickling can run code that the file names: export only
files you trust.
"""
import argparse
import os
import pickle
import sys
from collections.abc import Mapping

import numpy as np

PAPER_LAYERS = 4


class ExportError(Exception):
    """A problem with the input, reported as a one-line `error:` message."""


# ---------------------------------------------------------------------------------------------
# Loading a pickle whose classes may not be importable here


class _StandIn:
    """Replaces an object whose class cannot be imported: remembers its constructor arguments and
    its pickled state, so that the parameter tree inside it can still be found."""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__["_standin_args"] = args
        obj.__dict__["_standin_kwargs"] = kwargs
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        # Plain objects pickle their __dict__; objects with __slots__ pickle (dict or None, slots).
        if isinstance(state, tuple) and len(state) == 2 and all(
            s is None or isinstance(s, dict) for s in state
        ):
            for part in state:
                self.__dict__.update(part or {})
        elif isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_standin_state"] = state

    def __repr__(self):
        return f"<stand-in for {type(self).__module__}.{type(self).__qualname__}>"


def _jax_array_as_numpy(rebuild, args, array_state, *_aval_state):
    """What jax's `_reconstruct_array` does, minus moving the result onto a device."""
    value = rebuild(*args)
    value.__setstate__(array_state)
    return value


class _TolerantUnpickler(pickle.Unpickler):
    def __init__(self, file):
        super().__init__(file)
        self._stand_ins = {}

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception:  # not installed here (or failing to import): use a stand-in
            pass
        if module.startswith("jax") and name == "_reconstruct_array":
            return _jax_array_as_numpy
        key = (module, name)
        if key not in self._stand_ins:
            cls = type(name.rsplit(".", 1)[-1], (_StandIn,), {})
            cls.__module__, cls.__qualname__ = module, name
            self._stand_ins[key] = cls
        return self._stand_ins[key]


def load_pickle(path):
    if os.path.isdir(path):
        path = os.path.join(path, "state.pkl")
    try:
        with open(path, "rb") as f:
            return _TolerantUnpickler(f).load()
    except OSError as e:
        raise ExportError(f"cannot read {path}: {e.strerror or e}") from e
    except Exception as e:  # a corrupt or foreign pickle: any unpickling error
        raise ExportError(f"cannot unpickle {path}: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Finding and flattening the parameter tree


def _as_mapping(obj):
    """A dict view of `obj` if it is a mapping, or a stand-in for one (a flax FrozenDict pickles as
    `FrozenDict(dict)`, older versions as an object holding `_dict`); else None."""
    if isinstance(obj, Mapping):
        return obj
    if isinstance(obj, _StandIn):
        args = obj.__dict__.get("_standin_args", ())
        if len(args) == 1 and isinstance(args[0], Mapping):
            return args[0]
        inner = obj.__dict__.get("_dict")
        if isinstance(inner, Mapping):
            return inner
    return None


def _params_attribute(obj):
    if isinstance(obj, _StandIn):
        return obj.__dict__.get("params")
    return getattr(obj, "params", None)


def find_param_tree(obj):
    """Follows `.params` attributes and `params` keys down to the tree of modules."""
    for _ in range(8):
        mapping = _as_mapping(obj)
        if mapping is not None:
            if "params" in mapping:
                obj = mapping["params"]
                continue
            return mapping
        inner = _params_attribute(obj)
        if inner is None:
            raise ExportError(
                f"no parameter tree found: {type(obj).__name__} is neither a mapping nor has `.params`"
            )
        obj = inner
    raise ExportError("no parameter tree found: `params` nested more than 8 levels deep")


def _leaf_array(key, leaf):
    try:
        a = np.asarray(leaf)
    except Exception as e:
        raise ExportError(f"`{key}` is not an array ({type(leaf).__name__}): {e}") from e
    if a.dtype.kind in "biuOUSM" or a.dtype == np.dtype(object):
        raise ExportError(f"`{key}` has dtype {a.dtype}, expected floating point")
    try:
        return np.ascontiguousarray(a.astype(np.float32))
    except (TypeError, ValueError) as e:
        raise ExportError(f"`{key}` (dtype {a.dtype}) cannot be converted to float32: {e}") from e


def flatten(tree, prefix=""):
    """`{'a': {'b': x}}` -> `{'a/b': x}`, as float32 numpy arrays."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        sub = _as_mapping(v)
        if sub is not None:
            out.update(flatten(sub, key + "/"))
        else:
            out[key] = _leaf_array(key, v)
    return out


# ---------------------------------------------------------------------------------------------
# The keys and shapes that `hyperlens import jax` reads


def expected_keys(n_layers):
    keys = ["embedding/kernel", "embedding/bias"]
    for l in range(n_layers):
        b = f"transformer_block_{l}"
        keys.append(f"{b}/relative_embedding/rel_embedding")
        keys += [f"{b}/{norm}/{p}" for norm in ("norm1", "norm2") for p in ("scale", "bias")]
        keys += [
            f"{b}/sequence_mixer/{proj}/{p}"
            for proj in ("query", "key", "value", "out")
            for p in ("kernel", "bias")
        ]
        keys += [f"{b}/state_mixer/{dense}/{p}" for dense in ("Dense_0", "Dense_1") for p in ("kernel", "bias")]
    keys += ["decoder_norm/scale", "decoder_norm/bias", "logitdense/kernel", "logitdense/bias"]
    return keys


def expected_shapes(arrays, n_layers):
    """Sizes read off a few arrays (as the importer does), then the shape every key must have."""

    def dims(key, rank):
        shape = arrays[key].shape
        if len(shape) != rank:
            raise ExportError(f"`{key}` has shape {shape}, expected {rank} dimensions")
        return shape

    d_in, d_model = dims("embedding/kernel", 2)
    _, heads, d_head = dims("transformer_block_0/sequence_mixer/query/kernel", 3)
    _, n_buckets = dims("transformer_block_0/relative_embedding/rel_embedding", 2)
    _, d_mlp = dims("transformer_block_0/state_mixer/Dense_0/kernel", 2)
    _, d_out = dims("logitdense/kernel", 2)
    shapes = {
        "embedding/kernel": (d_in, d_model),
        "embedding/bias": (d_model,),
        "decoder_norm/scale": (d_model,),
        "decoder_norm/bias": (d_model,),
        "logitdense/kernel": (d_model, d_out),
        "logitdense/bias": (d_out,),
    }
    for l in range(n_layers):
        b = f"transformer_block_{l}"
        shapes[f"{b}/relative_embedding/rel_embedding"] = (heads, n_buckets)
        for norm in ("norm1", "norm2"):
            shapes[f"{b}/{norm}/scale"] = shapes[f"{b}/{norm}/bias"] = (d_model,)
        for proj in ("query", "key", "value"):
            shapes[f"{b}/sequence_mixer/{proj}/kernel"] = (d_model, heads, d_head)
            shapes[f"{b}/sequence_mixer/{proj}/bias"] = (heads, d_head)
        shapes[f"{b}/sequence_mixer/out/kernel"] = (heads, d_head, d_model)
        shapes[f"{b}/sequence_mixer/out/bias"] = (d_model,)
        shapes[f"{b}/state_mixer/Dense_0/kernel"] = (d_model, d_mlp)
        shapes[f"{b}/state_mixer/Dense_0/bias"] = (d_mlp,)
        shapes[f"{b}/state_mixer/Dense_1/kernel"] = (d_mlp, d_model)
        shapes[f"{b}/state_mixer/Dense_1/bias"] = (d_model,)
    sizes = dict(D=d_model, H=heads, d=d_head, mlp=d_mlp, buckets=n_buckets, d_in=d_in, d_out=d_out)
    return shapes, sizes


def _listing(keys, limit=3):
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(f"`{k}`" for k in keys[:limit]) + more


def check(arrays, n_layers):
    want = expected_keys(n_layers)
    missing = [k for k in want if k not in arrays]
    extra = [k for k in arrays if k not in set(want)]
    if missing or extra:
        found = len({k.split("/")[0] for k in arrays if k.startswith("transformer_block_")})
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} of the {len(want)} keys of the {n_layers}-layer model ({_listing(missing)})")
        if extra:
            parts.append(f"{len(extra)} unexpected key(s) ({_listing(extra)})")
        hint = f"; the tree has {found} transformer blocks (--layers)" if found != n_layers else ""
        raise ExportError("; ".join(parts) + hint)
    shapes, sizes = expected_shapes(arrays, n_layers)
    for k in want:
        if arrays[k].shape != shapes[k]:
            raise ExportError(f"`{k}` has shape {arrays[k].shape}, expected {shapes[k]}")
        if not np.all(np.isfinite(arrays[k])):
            raise ExportError(f"`{k}` has non-finite values")
    return want, sizes


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Export a checkpoint of the paper authors' JAX code (state.pkl) to the .npz "
        "that `hyperlens import jax` reads."
    )
    ap.add_argument("state", help="the pickled state (state.pkl), or the run directory holding it")
    ap.add_argument("out", help="the .npz to write")
    ap.add_argument(
        "--layers", type=int, default=PAPER_LAYERS, help=f"number of transformer blocks (default {PAPER_LAYERS})"
    )
    args = ap.parse_args(argv)
    try:
        if args.layers < 1:
            raise ExportError("--layers must be at least 1")
        tree = find_param_tree(load_pickle(args.state))
        arrays = flatten(tree)
        arrays = {k[len("params/"):] if k.startswith("params/") else k: v for k, v in arrays.items()}
        keys, sizes = check(arrays, args.layers)
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise ExportError(f"output directory {out_dir} does not exist")
        with open(args.out, "wb") as f:  # a file object: np.savez keeps the name as given
            np.savez(f, **{k: arrays[k] for k in keys})
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    numbers = sum(arrays[k].size for k in keys)
    print(
        f"wrote {args.out}: {len(keys)} float32 arrays, {numbers:,} numbers "
        f"({args.layers} layers, D {sizes['D']}, {sizes['H']} heads of {sizes['d']}, MLP {sizes['mlp']}, "
        f"{sizes['buckets']} position buckets, input {sizes['d_in']}, output {sizes['d_out']})"
    )
    print(f"next: hyperlens import jax --params {args.out} --mixer MIXER --out DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
