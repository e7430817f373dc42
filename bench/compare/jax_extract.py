#!/usr/bin/env python3
"""Latent-code extraction with the paper's own JAX/Flax model code (one timed pass).

Run by compare.py in a fresh subprocess for every repeat and every XLA setting, because XLA reads
XLA_FLAGS once, when jax is imported. It

1. imports the model code of a checkout of smonsays/hypernetwork-attention (--paper-code): the
   `CausalTransformer` of hyla/models/transformer.py, configured by configs/raven.py exactly as the
   paper's run.py does for `raven_3x3_4features;<method>`;
2. loads the flax parameters from a parameter export (.npz, keys = flax paths joined by "/",
   without the leading "params/"), or derives them from a hyperlens checkpoint (--checkpoint) by
   inverting `hyperlens import jax` (crates/model/src/import.rs);
3. runs the model forward in evaluation mode (deterministic=True), jitted, in batches (--batch), on
   the problems of a `hyperlens tasks sample` file, and gathers the attention weights the model
   sows ("intermediates" / "attn_weights", after the mixer's normalisation) at the paper's site:
   query 35 (the answer's slot 3), keys 27 and 31 (slot 3 of panels 6 and 7), all layers and heads;
4. writes the codes [N, L, H, 1, 2] (float32, the layout of `hyperlens probe`) and a JSON record of
   the timings.

Timing: the first batch is run once before the clock starts (compilation and warm-up); the timed
pass then covers every batch: the uint8 -> float32 conversion, the transfer, the jitted forward and
the copy of the codes back to numpy. Import and compile times are recorded separately.

None of the paper's code is contained here: it is imported from --paper-code at run time.
"""
import argparse
import json
import os
import sys
import time

T_START = time.perf_counter()

# The paper's probe site (docs/outputs.md, "SRAVEN token layout"): token t is panel t // 4, slot
# t % 4; the query token of the answer's slot 3 is 35; slot 3 of the two given panels of the
# answer's row (panels 6 and 7) are tokens 27 and 31.
QUERY = 35
KEYS = (27, 31)

# The mixers of hyperlens checkpoints and the paper's method strings (configs/raven.py).
METHOD_OF_MIXER = {
    "softmax": "transformer",
    "linear": "linear_transformer",
    "hyla": "linear_hypatt",
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper-code", required=True, help="checkout of smonsays/hypernetwork-attention")
    p.add_argument("--method", required=True, help="paper method string, e.g. linear_hypatt or transformer")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", help="flax parameter export (.npz, keys joined with '/')")
    src.add_argument("--checkpoint", help="hyperlens checkpoint directory (model.safetensors) to derive the parameters from")
    p.add_argument("--problems", required=True, help="problem set written by `hyperlens tasks sample`")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", help="write the codes here (.npz, array `codes`)")
    p.add_argument("--timing", required=True, help="write the timing record here (.json)")
    return p.parse_args()


def read_safetensors(path):
    """A minimal safetensors reader (float32 only): an 8-byte header length, a JSON header, data."""
    import numpy as np

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {meta['dtype']}, expected F32")
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(meta["shape"]).copy()
    return out


def flax_params_from_checkpoint(ckpt_dir):
    """Inverts the name mapping of `hyperlens import jax` (crates/model/src/import.rs).

    hyperlens stores the q/k/v kernels heads-first ([H, D, d]); flax has them as [D, H, d]. Every
    other tensor is only renamed.
    """
    t = read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    flat = {
        "embedding/kernel": t["embed.W_E"],
        "embedding/bias": t["embed.b_E"],
        "decoder_norm/scale": t["ln_final.w"],
        "decoder_norm/bias": t["ln_final.b"],
        "logitdense/kernel": t["unembed.W_U"],
        "logitdense/bias": t["unembed.b_U"],
    }
    layers = sorted({int(k.split(".")[1]) for k in t if k.startswith("blocks.")})
    for l in layers:
        b, sm, st = f"transformer_block_{l}", f"transformer_block_{l}/sequence_mixer", f"transformer_block_{l}/state_mixer"
        g = lambda name: t[f"blocks.{l}.{name}"]
        flat.update({
            f"{b}/norm1/scale": g("ln1.w"), f"{b}/norm1/bias": g("ln1.b"),
            f"{b}/norm2/scale": g("ln2.w"), f"{b}/norm2/bias": g("ln2.b"),
            f"{sm}/query/kernel": g("attn.W_Q").transpose(1, 0, 2),
            f"{sm}/key/kernel": g("attn.W_K").transpose(1, 0, 2),
            f"{sm}/value/kernel": g("attn.W_V").transpose(1, 0, 2),
            f"{sm}/query/bias": g("attn.b_Q"), f"{sm}/key/bias": g("attn.b_K"), f"{sm}/value/bias": g("attn.b_V"),
            f"{sm}/out/kernel": g("attn.W_O"), f"{sm}/out/bias": g("attn.b_O"),
            f"{b}/relative_embedding/rel_embedding": g("attn.rel_pos"),
            f"{st}/Dense_0/kernel": g("mlp.W_in"), f"{st}/Dense_0/bias": g("mlp.b_in"),
            f"{st}/Dense_1/kernel": g("mlp.W_out"), f"{st}/Dense_1/bias": g("mlp.b_out"),
        })
    return flat


def main():
    args = parse_args()
    sys.path.insert(0, os.path.abspath(args.paper_code))

    import numpy as np
    import jax
    import jax.numpy as jnp
    from flax.traverse_util import unflatten_dict

    # the paper's own modules
    from configs.raven import get_config
    from hyla.models.transformer import CausalTransformer, TransformerConfig

    t_imported = time.perf_counter()

    # The model, configured as run.py's setup() does for SRAVEN.
    config = get_config(f"raven_3x3_4features;{args.method}")
    config.model.relative_position_max_dist = config.data.seq_len
    config.model.output_dim = config.data.feature_maxval
    model = CausalTransformer(TransformerConfig(**config.model))

    if args.params:
        with np.load(args.params) as z:
            flat = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
    else:
        flat = flax_params_from_checkpoint(args.checkpoint)
    params = {"params": unflatten_dict(flat, sep="/")}
    n_layers = config.model.num_layers

    with np.load(args.problems) as z:
        x_all = np.asarray(z["x"])  # [N, 36, 8], one-hot (uint8 as hyperlens writes it)
    n = x_all.shape[0]
    if x_all.shape[1:] != (config.data.seq_len, config.data.feature_maxval):
        raise SystemExit(f"{args.problems}: x has shape {x_all.shape}, expected [N, 36, 8]")

    keys = np.asarray(KEYS)

    @jax.jit
    def codes_of(x):
        _, variables = model.apply(params, x, deterministic=True, mutable="intermediates")
        inter = variables["intermediates"]
        per_layer = []
        for l in range(n_layers):
            (a,) = inter[f"transformer_block_{l}"]["sequence_mixer"]["attn_weights"]  # [B, H, Q, K]
            per_layer.append(a[:, :, QUERY, keys])  # [B, H, 2]
        return jnp.stack(per_layer, axis=1)[:, :, :, None, :]  # [B, L, H, 1, 2]

    def batch_at(start):
        xb = x_all[start:start + args.batch].astype(np.float32)
        if xb.shape[0] < args.batch:  # pad the last batch so that one compiled shape serves all
            xb = np.concatenate([xb, np.zeros((args.batch - xb.shape[0],) + xb.shape[1:], np.float32)])
        return xb

    # warm-up: compile and run the first batch once, outside the timed pass
    t0 = time.perf_counter()
    np.asarray(codes_of(batch_at(0)))
    t_compile = time.perf_counter() - t0

    out = np.empty((n, n_layers, config.model.num_heads, 1, len(KEYS)), np.float32)
    t0 = time.perf_counter()
    for start in range(0, n, args.batch):
        stop = min(n, start + args.batch)
        out[start:stop] = np.asarray(codes_of(batch_at(start)))[: stop - start]
    t_forward = time.perf_counter() - t0

    if args.out:
        np.savez(args.out, codes=out)
    record = {
        "n": n,
        "batch": args.batch,
        "method": args.method,
        "params": args.params or f"derived from {args.checkpoint}",
        "import_s": t_imported - T_START,
        "compile_s": t_compile,
        "forward_s": t_forward,
        "forward_rate": n / t_forward,
        "script_s": time.perf_counter() - T_START,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or __import__("jaxlib").__version__,
        "flax": __import__("flax").__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }
    with open(args.timing, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
