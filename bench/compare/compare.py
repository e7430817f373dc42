#!/usr/bin/env python3
"""hyperlens against scikit-learn and the paper's JAX code, on the same arrays, in one run.

Two parts, each measured round-robin over the tools (R repeats, the tool order rotated every
repeat; medians reported):

1. Extraction of the latent codes (HYLA and softmax checkpoints, the OOD set, N problems, the
   paper's site): `hyperlens probe` against the paper's own flax model run forward by
   jax_extract.py, with XLA's default flags and with the oneDNN matmul rewriter disabled. The codes
   of both are compared (max abs difference) to show that the two compute the same arrays.
2. The latent-code analyses of N ID + N OOD codes (per layer and all layers: PCA, logistic
   decoding ID -> OOD with a shuffled-label control, k-means with ARI/NMI and silhouette, mean-code
   similarity): `hyperlens analyze` against the scikit-learn equivalent in sk_analyze.py, on the
   same code files, with the results' agreement.

The machine (CPU model, a numpy float32 GEMM rate) and the git commit are recorded. Results go to
--out as results.json and results.md; intermediate files to --out/work.

Ratios are always "> 1 = hyperlens faster": another tool's time divided by hyperlens's, or
hyperlens's rate divided by the other tool's. See README.md beside this file.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the repository
from jax_extract import METHOD_OF_MIXER, flax_params_from_checkpoint  # noqa: E402

# The two models compared, as shipped in the repository (data/checkpoints/README.md).
DEFAULT_CHECKPOINTS = {
    "hyla": "data/checkpoints/paper-jax-hyla-seed2",
    "softmax": "data/checkpoints/paper-jax-softmax-seed1",
}
# The two XLA settings of the JAX rows. XLA reads XLA_FLAGS at import, so each runs in its own
# subprocess.
XLA_SETTINGS = {
    "jax (default XLA)": None,
    "jax (no oneDNN rewriter)": "--xla_disable_hlo_passes=onednn-matmul-rewriter",
}
ANALYSIS_STAGES = ("pca", "decoding", "clustering", "similarity")


# ----------------------------------------------------------------------------------------------
# command line


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyperlens", default=str(REPO / "target/release/hyperlens"), help="the hyperlens binary (default: %(default)s)")
    p.add_argument("--n", type=int, default=51200, help="problems per set (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="threads for every tool: RAYON_NUM_THREADS for hyperlens, OMP_NUM_THREADS etc. for Python (default: %(default)s)")
    p.add_argument("--blas-threads", type=int, default=None, help="OPENBLAS/MKL/BLIS threads of the Python side (default: --threads)")
    p.add_argument("--pin", choices=["auto", "on", "off"], default="auto", help="run every tool under `taskset -c 0-(threads-1)`; auto: when the machine has more cores than --threads (default: %(default)s)")
    p.add_argument("--paper-code", help="a checkout of smonsays/hypernetwork-attention; without it the JAX rows are skipped")
    p.add_argument("--jax-params", nargs=2, metavar=("HYLA_NPZ", "SOFTMAX_NPZ"), help="the flax parameter exports the JAX side loads, HYLA first (both, whatever --models says; default: derived from the checkpoints' model.safetensors)")
    p.add_argument("--jax-python", default=sys.executable, help="Python with jax and flax for the JAX rows (default: this one)")
    p.add_argument("--python", default=sys.executable, help="Python with scikit-learn for the analyses (default: this one)")
    p.add_argument("--models", default="hyla,softmax", help="comma-separated subset of hyla,softmax (default: %(default)s)")
    p.add_argument("--hyla-checkpoint", default=DEFAULT_CHECKPOINTS["hyla"])
    p.add_argument("--softmax-checkpoint", default=DEFAULT_CHECKPOINTS["softmax"])
    p.add_argument("--parts", default="extract,analyze", help="comma-separated subset of extract,analyze (default: %(default)s)")
    p.add_argument("--batch", type=int, default=256, help="problems per forward pass, both tools (default: %(default)s, hyperlens's default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the problem sample and of the analyses (default: %(default)s)")
    p.add_argument("--max-iter", type=int, default=1000, help="L-BFGS iterations of the logistic probe, both tools (default: %(default)s)")
    p.add_argument("--silhouette-points", type=int, default=5000, help="silhouette subsample size, both tools (default: %(default)s)")
    p.add_argument("--kmeans-n-init", type=int, default=10, help="k-means restarts of both tools: scikit-learn's n_init and hyperlens's --kmeans-runs (default: %(default)s)")
    p.add_argument("--gemm-size", type=int, default=4096, help="square float32 GEMM for the hardware figure (default: %(default)s)")
    p.add_argument("--out", required=True, help="output directory (results.json, results.md, work/)")
    args = p.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.parts = [x for x in args.parts.split(",") if x]
    for m in args.models:
        if m not in DEFAULT_CHECKPOINTS:
            p.error(f"unknown model {m!r} (hyla, softmax)")
    for x in args.parts:
        if x not in ("extract", "analyze"):
            p.error(f"unknown part {x!r} (extract, analyze)")
    if args.blas_threads is None:
        args.blas_threads = args.threads
    return args


# ----------------------------------------------------------------------------------------------
# running things


class Runner:
    """Runs the tools' commands with their thread settings, optional pinning, and timing."""

    def __init__(self, args):
        self.args = args
        self.binary = Path(args.hyperlens).resolve()
        ncpu = os.cpu_count() or 1
        want_pin = args.pin == "on" or (args.pin == "auto" and ncpu > args.threads)
        self.pin = []
        if want_pin:
            if shutil.which("taskset"):
                self.pin = ["taskset", "-c", f"0-{args.threads - 1}"]
            else:
                print("note: taskset not found; tools are not pinned")
        base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        # hyperlens: rayon's pool (candle's matrix products and elementwise operations, the
        # inference chunks) follows RAYON_NUM_THREADS
        self.env_hyperlens = dict(base, RAYON_NUM_THREADS=str(args.threads))
        # numpy / scipy / scikit-learn: OpenMP (scikit-learn's Cython loops) and the BLAS
        py = {
            "OMP_NUM_THREADS": str(args.threads),
            "OPENBLAS_NUM_THREADS": str(args.blas_threads),
            "MKL_NUM_THREADS": str(args.blas_threads),
            "BLIS_NUM_THREADS": str(args.blas_threads),
            "VECLIB_MAXIMUM_THREADS": str(args.blas_threads),
            "NUMEXPR_NUM_THREADS": str(args.threads),
        }
        self.env_python = dict(base, **py)
        # JAX on the CPU: XLA has no flag for the size of its thread pool, which follows the cores
        # the process may run on; pinning (--pin) is what bounds it. XLA_FLAGS is set per setting.
        self.env_jax = dict(base, **py)
        self.thread_env = {"hyperlens": {"RAYON_NUM_THREADS": str(args.threads)}, "python": py,
                           "jax": dict(py, XLA_FLAGS="per row: unset, or --xla_disable_hlo_passes=onednn-matmul-rewriter"),
                           "pinning": " ".join(self.pin) or "none"}
        self.fingerprint0 = None
        self.warnings = []

    # the hyperlens binary may be rebuilt while this runs: wait for it, and say if it changed
    def _binary_fingerprint(self):
        st = self.binary.stat()
        return (st.st_size, st.st_mtime_ns)

    def wait_for_binary(self, timeout=600):
        t0 = time.time()
        while not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            if time.time() - t0 > timeout:
                raise SystemExit(f"{self.binary}: not there after {timeout} s")
            print(f"  waiting for {self.binary} (being rebuilt?)", flush=True)
            time.sleep(5)
        fp = self._binary_fingerprint()
        if self.fingerprint0 is None:
            self.fingerprint0 = fp
        elif fp != self.fingerprint0:
            msg = f"the hyperlens binary changed during the run (size/mtime {self.fingerprint0} -> {fp}); timings mix builds"
            if msg not in self.warnings:
                self.warnings.append(msg)
                print("WARNING: " + msg, flush=True)
            self.fingerprint0 = fp

    def run(self, cmd, env, what, retries=3):
        """Runs cmd (pinned if asked); returns (wall seconds, stdout). Fails loudly on an error."""
        for attempt in range(retries):
            if cmd[0] == str(self.binary):
                self.wait_for_binary()
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(self.pin + cmd, env=env, cwd=REPO, capture_output=True, text=True)
            except OSError as e:  # e.g. "Text file busy" while the binary is being replaced
                print(f"  {what}: {e}; retrying", flush=True)
                time.sleep(5)
                continue
            wall = time.perf_counter() - t0
            if proc.returncode == 0:
                return wall, proc.stdout
            if cmd[0] == str(self.binary) and not self.binary.exists() and attempt + 1 < retries:
                print(f"  {what}: binary vanished during the run; retrying", flush=True)
                time.sleep(5)
                continue
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}")
        raise SystemExit(f"{what}: gave up after {retries} tries")

    def analyze_has(self, flag):
        """Whether this build's `hyperlens analyze` takes `flag`."""
        if not hasattr(self, "_analyze_help"):
            self._analyze_help = subprocess.run([str(self.binary), "analyze", "--help"], capture_output=True,
                                                text=True, env=self.env_hyperlens).stdout
        return flag in self._analyze_help

    def hyperlens(self, *argv, what):
        return self.run([str(self.binary), *argv], self.env_hyperlens, what)


# ----------------------------------------------------------------------------------------------
# machine and versions


def machine_info(args, runner):
    info = {"cpus": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        info["cpu_model"] = fields.get("Model name", "?").strip()
        flags = fields.get("Flags", "").split()
        info["simd"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    except OSError:
        info["cpu_model"] = "? (no lscpu)"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gib"] = round(kb / 2**20, 1)
    except OSError:
        pass
    # the hardware bound: numpy float32 GEMM with the Python side's thread settings
    code = (
        "import numpy as np, time, json\n"
        f"n = {args.gemm_size}\n"
        "r = np.random.default_rng(0)\n"
        "a = r.standard_normal((n, n), dtype=np.float32); b = r.standard_normal((n, n), dtype=np.float32)\n"
        "a @ b\n"
        "best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))\n"
        "print(json.dumps({'seconds': best, 'gflops': 2 * n**3 / best / 1e9}))\n"
    )
    _, out = runner.run([args.python, "-c", code], runner.env_python, "GEMM")
    info["gemm_f32"] = dict(json.loads(out), n=args.gemm_size, threads=args.blas_threads)
    return info


def software_info(args, runner):
    info = {"python": sys.version.split()[0]}
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        info["git_commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        info["git_commit"] = "?"
    runner.wait_for_binary()
    _, v = runner.hyperlens("--version", what="hyperlens --version")
    info["hyperlens"] = v.strip()
    info["hyperlens_binary"] = str(runner.binary)
    info["hyperlens_sha256"] = hashlib.sha256(runner.binary.read_bytes()).hexdigest()
    _, v = runner.run([args.python, "-c", "import sklearn, numpy, scipy; print(sklearn.__version__, numpy.__version__, scipy.__version__)"],
                      runner.env_python, "scikit-learn version")
    info["scikit_learn"], info["numpy"], info["scipy"] = v.split()
    return info


def jax_available(args, runner):
    """None if the JAX rows can run, else the reason they cannot."""
    if not args.paper_code:
        return "no --paper-code given"
    pc = Path(args.paper_code)
    for f in ("hyla/models/transformer.py", "configs/raven.py"):
        if not (pc / f).is_file():
            return f"--paper-code {pc} has no {f}"
    probe = subprocess.run([args.jax_python, "-c", "import jax, flax, ml_collections, chex; print(jax.__version__, flax.__version__)"],
                           env=runner.env_jax, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{args.jax_python} cannot import jax/flax/ml_collections/chex: {probe.stderr.strip().splitlines()[-1:]}"
    return None


# ----------------------------------------------------------------------------------------------
# helpers


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=3):
    if x is None:
        return "n/a"
    if isinstance(x, float) and np.isnan(x):
        return "NaN"
    if isinstance(x, (int, np.integer)):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def rotated(items, r):
    k = r % len(items)
    return items[k:] + items[:k]


def read_csv(path):
    with open(path) as f:
        header = f.readline().strip().split(",")
        return [dict(zip(header, line.strip().split(","))) for line in f if line.strip()]


def as_float(s):
    return float("nan") if s in ("", "NaN", "null") else float(s)


# ----------------------------------------------------------------------------------------------
# preparation (untimed): problem files, the ID / OOD code files of the analyses, the JAX parameters


def prepare(args, runner, work, probe_quiet):
    models = {}
    for m in args.models:
        ckpt = getattr(args, f"{m}_checkpoint")
        ckpt_dir = (REPO / ckpt) if not Path(ckpt).is_absolute() else Path(ckpt)
        with open(ckpt_dir / "config.json") as f:
            mixer = json.load(f)["mixer"]
        with open(ckpt_dir / "train.json") as f:
            split = json.load(f)["split"]
        d = {"checkpoint": str(ckpt), "checkpoint_dir": ckpt_dir, "mixer": mixer, "split": split,
             "method": METHOD_OF_MIXER[mixer]}
        print(f"[prepare] {m}: {ckpt} (mixer {mixer}, split {split}, paper method {d['method']})", flush=True)
        # the OOD problems as a file, for the JAX side and for hyperlens's from-file row
        d["problems"] = work / f"{m}_ood_problems.npz"
        runner.hyperlens("tasks", "sample", "--split", split, "--set", "ood", "--n", str(args.n), "--seed", str(args.seed),
                         "--unpermuted", "--out", str(d["problems"]), what="tasks sample")
        # the analyses' inputs: ID and OOD codes, written once
        for s in ("id", "ood"):
            d[f"codes_{s}"] = work / f"{m}_{s}_codes.npz"
            runner.hyperlens("probe", "--checkpoint", str(ckpt), "--n", str(args.n), "--unpermuted", "--set", s,
                             "--seed", str(args.seed), "--batch", str(args.batch), "--out", str(d[f"codes_{s}"]),
                             *probe_quiet, what=f"probe --set {s}")
        # are the problems the probe generates those of the problem file? (same split, set, seed)
        with np.load(d["problems"]) as p, np.load(d["codes_ood"]) as c:
            d["generated_equals_file"] = bool(np.array_equal(p["rules"], c["rules"]) and
                                              np.array_equal(np.argmax(p["x"][:, [27, 31]], -1), c["inputs"]))
        if not d["generated_equals_file"]:
            runner.warnings.append(f"{m}: the problems `probe --set ood` generates differ from `tasks sample`'s file")
        models[m] = d
    return models


def jax_params_for(args, models, work):
    """The parameter file each model's JAX row loads, and how it compares with the checkpoint."""
    out = {}
    for i, m in enumerate(["hyla", "softmax"]):
        if m not in models:
            continue
        derived = flax_params_from_checkpoint(models[m]["checkpoint_dir"])
        if args.jax_params:
            path = Path(args.jax_params[i]).resolve()
            with np.load(path) as z:
                given = {k: z[k] for k in z.files}
            if set(given) != set(derived):
                raise SystemExit(f"{path}: keys differ from the checkpoint's parameters: "
                                 f"{sorted(set(given) ^ set(derived))[:5]}")
            diff = max(float(np.max(np.abs(given[k] - derived[k]))) for k in derived)
            out[m] = {"path": str(path), "source": "--jax-params", "max_abs_diff_vs_checkpoint": diff}
        else:
            path = work / f"{m}_flax_params.npz"
            np.savez(path, **derived)
            out[m] = {"path": str(path), "source": f"derived from {models[m]['checkpoint']}/model.safetensors",
                      "max_abs_diff_vs_checkpoint": 0.0}
    return out


# ----------------------------------------------------------------------------------------------
# the timed runs


def extraction_tools(runner, args, models, m, work, jax_params, jax_reason, probe_quiet):
    """The tools of the extraction part for model m: name -> function(repeat) -> record."""
    d = models[m]
    tools = {}

    def hyperlens_generating(r):
        # the command of the brief: problems generated on the fly, codes written to .npz
        out = work / f"{m}_extract_hyperlens.npz"
        wall, _ = runner.hyperlens("probe", "--checkpoint", d["checkpoint"], "--n", str(args.n), "--unpermuted",
                                   "--set", "ood", "--seed", str(args.seed), "--batch", str(args.batch),
                                   "--out", str(out), *probe_quiet, what=f"{m}: hyperlens probe")
        return {"wall_s": wall, "codes": str(out)}

    def hyperlens_from_file(r):
        # the same problems read from the file the JAX side reads
        out = work / f"{m}_extract_hyperlens_file.npz"
        wall, _ = runner.hyperlens("probe", "--checkpoint", d["checkpoint"], "--problems", str(d["problems"]),
                                   "--batch", str(args.batch), "--out", str(out), *probe_quiet,
                                   what=f"{m}: hyperlens probe --problems")
        return {"wall_s": wall, "codes": str(out)}

    tools["hyperlens"] = hyperlens_generating
    tools["hyperlens (problem file)"] = hyperlens_from_file

    if jax_reason is None:
        for name, flags in XLA_SETTINGS.items():
            def jax_run(r, name=name, flags=flags):
                tag = "jax_default" if flags is None else "jax_noonednn"
                out = work / f"{m}_extract_{tag}.npz"
                timing = work / f"{m}_extract_{tag}.json"
                env = dict(runner.env_jax)
                if flags:
                    env["XLA_FLAGS"] = flags
                wall, _ = runner.run([args.jax_python, str(HERE / "jax_extract.py"), "--paper-code", args.paper_code,
                                      "--method", d["method"], "--params", jax_params[m]["path"],
                                      "--problems", str(d["problems"]), "--batch", str(args.batch),
                                      "--out", str(out), "--timing", str(timing)], env, f"{m}: {name}")
                with open(timing) as f:
                    rec = json.load(f)
                rec.update(wall_s=wall, codes=str(out))
                return rec
            tools[name] = jax_run
    return tools


def analysis_tools(runner, args, models, m, work):
    d = models[m]
    tools = {}

    def hyperlens_analyze(r):
        out = work / f"{m}_analyze_hyperlens"
        # builds since the greedy k-means++ seeding take scikit-learn's n_init as --kmeans-runs
        restarts = ["--kmeans-runs", str(args.kmeans_n_init)] if runner.analyze_has("--kmeans-runs") else []
        wall, stdout = runner.hyperlens(
            "analyze", "--train", str(d["codes_id"]), "--test", str(d["codes_ood"]), "--out", str(out),
            "--seed", str(args.seed), "--c", "1", "--max-iter", str(args.max_iter),
            "--silhouette-points", str(args.silhouette_points), *restarts, "--quiet",
            what=f"{m}: hyperlens analyze")
        rec = {"wall_s": wall, "dir": str(out)}
        # the analysis's own clock: printed as "wrote 7 files to DIR in X s" (one decimal)
        mt = re.search(r"in ([0-9.]+) s\s*$", stdout.strip())
        rec["analysis_s"] = float(mt.group(1)) if mt else None
        # stage timings, where this build writes them: timings.json (the shape of
        # LatentReport::timings) or per-layer `seconds` in summary.json (docs/outputs.md)
        stages = None
        tpath = out / "timings.json"
        if tpath.is_file():
            with open(tpath) as f:
                t = json.load(f)
            rec["analysis_s"] = t.get("elapsed_s", rec["analysis_s"])
            stages = {s: sum(l[s] for l in t["layers"]) for s in ANALYSIS_STAGES}
        else:
            with open(out / "summary.json") as f:
                s = json.load(f)
            if all("seconds" in l for l in s.get("layers", [])) and s.get("layers"):
                stages = {st: sum(l["seconds"][st] for l in s["layers"]) for st in ANALYSIS_STAGES}
            if s.get("elapsed_s") is not None:
                rec["analysis_s"] = s["elapsed_s"]
        rec["stages_s"] = stages
        return rec

    def sklearn_analyze(r):
        out = work / f"{m}_analyze_sklearn.json"
        wall, _ = runner.run([args.python, str(HERE / "sk_analyze.py"), "--train", str(d["codes_id"]),
                              "--test", str(d["codes_ood"]), "--out", str(out), "--seed", str(args.seed),
                              "--c", "1", "--max-iter", str(args.max_iter), "--kmeans-n-init", str(args.kmeans_n_init),
                              "--silhouette-points", str(args.silhouette_points)], runner.env_python,
                             f"{m}: scikit-learn analysis")
        with open(out) as f:
            res = json.load(f)
        stages = {s: sum(l["seconds"][s] for l in res["layers"]) for s in ANALYSIS_STAGES}
        return {"wall_s": wall, "analysis_s": res["analysis_s"], "stages_s": stages, "file": str(out),
                "import_s": res["import_s"], "load_s": res["load_s"]}

    tools["hyperlens"] = hyperlens_analyze
    tools["scikit-learn"] = sklearn_analyze
    return tools


# ----------------------------------------------------------------------------------------------
# agreement


def codes_agreement(models, extraction_runs):
    rows = []
    for m, tools in extraction_runs.items():
        def codes(tool):
            recs = tools.get(tool)
            if not recs:
                return None
            with np.load(recs[-1]["codes"]) as z:
                return z["codes"]
        ref = codes("hyperlens (problem file)")
        gen = codes("hyperlens")
        if ref is not None and gen is not None and ref.shape == gen.shape:
            rows.append({"model": m, "a": "hyperlens (problem file)", "b": "hyperlens",
                         "max_abs_diff": float(np.max(np.abs(ref - gen))), "max_abs_code": float(np.max(np.abs(ref)))})
        for tool in XLA_SETTINGS:
            other = codes(tool)
            if other is None or ref is None:
                continue
            if other.shape != ref.shape:
                rows.append({"model": m, "a": "hyperlens (problem file)", "b": tool, "max_abs_diff": None,
                             "note": f"shapes differ: {ref.shape} vs {other.shape}"})
                continue
            diff = np.abs(ref - other)
            rows.append({"model": m, "a": "hyperlens (problem file)", "b": tool, "max_abs_diff": float(diff.max()),
                         "mean_abs_diff": float(diff.mean()), "max_abs_code": float(np.max(np.abs(ref)))})
    return rows


def analysis_agreement(hl_dir, sk_file):
    """Per selection: hyperlens's tables against the scikit-learn results."""
    hl_dir = Path(hl_dir)
    with open(sk_file) as f:
        sk = {(l["layer"], l["all_layers"]): l for l in json.load(f)["layers"]}
    dec = {(int(r["layer"]), r["all_layers"] == "true"): r for r in read_csv(hl_dir / "decoding.csv")}
    clu = {(int(r["layer"]), r["all_layers"] == "true"): r for r in read_csv(hl_dir / "clusters.csv")}
    pca = {}
    for r in read_csv(hl_dir / "pca.csv"):
        pca.setdefault((int(r["layer"]), r["all_layers"] == "true"), []).append(as_float(r["explained_variance_ratio"]))
    sim = {}
    for r in read_csv(hl_dir / "similarity.csv"):
        sim[(int(r["layer"]), r["all_layers"] == "true", int(r["label_a"]), int(r["label_b"]))] = as_float(r["cosine"])
    rows = []
    for key, s in sk.items():
        h, c = dec[key], clu.get(key)
        sd, sc = s["decoding"], s["clusters"]
        row = {
            "layer": "all" if key[1] else str(key[0]),
            "accuracy": (as_float(h["accuracy"]), sd["accuracy"]),
            "shuffled_control": (as_float(h["shuffled_control"]), sd["shuffled_control"]),
            "balanced_accuracy": (as_float(h["balanced_accuracy"]), sd["balanced_accuracy"]),
            "train_accuracy": (as_float(h["train_accuracy"]), sd["train_accuracy"]),
            "majority_baseline": (as_float(h["majority_baseline"]), sd["majority_baseline"]),
            "sklearn_lbfgs_iterations": sd["n_iter"],
            "sklearn_converged": sd["converged"] and sd["shuffled_converged"],
        }
        if c is not None and sc is not None:
            row.update({
                "ari": (as_float(c["ari"]), sc["ari"]),
                "nmi": (as_float(c["nmi"]), sc["nmi"]),
                "silhouette": (as_float(c["silhouette"]), sc["silhouette"]),
                "silhouette_kmeans": (as_float(c["silhouette_kmeans"]), sc["silhouette_kmeans"]),
                "silhouette_points": (int(c["silhouette_points"]), sc["silhouette_points"]),
                # hyperlens's inertia is the mean squared distance (linfa); scikit-learn's the sum
                "inertia_per_point": (as_float(c["inertia"]), sc["inertia_mean"]),
            })
        evr_h = pca[key]
        evr_s = s["pca"]["explained_variance_ratio"]
        row["pca_evr_0"] = (evr_h[0], evr_s[0])
        row["pca_evr_max_abs_diff"] = float(np.max(np.abs(np.array(evr_h) - np.array(evr_s[: len(evr_h)]))))
        labels = s["similarity"]["labels"]
        diffs = []
        for i, a in enumerate(labels):
            for j, b in enumerate(labels):
                hv, sv = sim.get((key[0], key[1], a, b)), s["similarity"]["cosine"][i][j]
                if hv is not None and sv is not None and not np.isnan(hv):
                    diffs.append(abs(hv - sv))
        row["similarity_max_abs_diff"] = max(diffs) if diffs else None
        rows.append(row)
    rows.sort(key=lambda r: (r["layer"] == "all", r["layer"]))
    return rows


def settings_comparison(args, hl_summary):
    """What was matched between hyperlens analyze and scikit-learn, and what could not be."""
    p = hl_summary.get("params", {})
    lg = p.get("logistic", {})
    matched = [
        f"logistic probe: StandardScaler + multinomial L2 logistic regression, C = {lg.get('c')} (both), "
        f"tol = {lg.get('tol')} (both), max_iter = {lg.get('max_iterations')} (hyperlens --max-iter) / {args.max_iter} (scikit-learn)",
        f"silhouette subsample size: {p.get('silhouette_max_points')} (hyperlens --silhouette-points) / {args.silhouette_points} (scikit-learn)",
        f"k-means: k = number of labels of the unsupervised set, max_iter = {p.get('kmeans_max_iterations')} / 300, tol 1e-4 in scikit-learn's definition (both)",
        f"seed {p.get('seed')} for the shuffled control, k-means and the silhouette subsample (each tool's own generator)",
        f"unsupervised set: {p.get('unsupervised_on')} (OOD) for PCA, clustering and similarity (both)",
        "PCA: every component, explained variance with n - 1 (both)",
        "features as float64 (both)",
    ]
    restarts = p.get("kmeans_runs")
    if restarts == args.kmeans_n_init:
        matched.append(f"k-means restarts: {restarts} (hyperlens --kmeans-runs, scikit-learn n_init), both seeded by "
                       "greedy k-means++ with 2 + ln(k) local trials")
    unmatched = [
        "k-means seeds: each tool's own generator, so the restarts can end in different local optima: "
        "ARI/NMI/inertia then differ (compare the inertia: the lower one is the better clustering)",
        "silhouette subsample: the same size, not the same points (hyperlens draws them with ChaCha8); "
        "silhouette_check.py compares both on the same points",
        "shuffled-label control: a different random permutation of the training labels (different generators)",
        "L-BFGS: argmin's L-BFGS (history 10, More-Thuente line search) with scipy's stopping rules (max-norm "
        "of the mean-loss gradient <= tol, or relative decrease <= 64 eps) vs scipy's L-BFGS-B; the line "
        "searches differ, so the iteration counts differ a little",
        "threads: hyperlens analyze runs the selections, shuffled controls, k-means restarts and silhouette "
        "rows on rayon's pool (RAYON_NUM_THREADS); scikit-learn runs the stages one after the other on "
        "OMP/BLAS threads",
        "inertia: hyperlens reports the mean squared distance, scikit-learn the sum (compared per point here)",
    ]
    if restarts is not None and restarts != args.kmeans_n_init:
        unmatched.insert(0, f"k-means restarts: hyperlens runs {restarts}, scikit-learn n_init = {args.kmeans_n_init}")
    return matched, unmatched


# ----------------------------------------------------------------------------------------------
# main


def main():
    args = parse_args()
    out_dir = Path(args.out).resolve()
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(args)

    print("== machine and software", flush=True)
    software = software_info(args, runner)
    machine = machine_info(args, runner)
    for k, v in {**machine, **software}.items():
        print(f"  {k}: {v}")
    print(f"  thread settings: {json.dumps(runner.thread_env)}", flush=True)

    _, probe_help = runner.hyperlens("probe", "--help", what="probe --help")
    probe_quiet = ["--quiet"] if "--quiet" in probe_help else []

    jax_reason = jax_available(args, runner) if "extract" in args.parts else "extraction part not run"
    if jax_reason:
        print(f"note: the JAX rows are skipped: {jax_reason}", flush=True)

    print("== preparation (untimed)", flush=True)
    models = prepare(args, runner, work, probe_quiet)
    jax_params = jax_params_for(args, models, work) if jax_reason is None else {}
    for m, jp in jax_params.items():
        print(f"  {m}: JAX parameters {jp['path']} ({jp['source']}), max |export - checkpoint| = {jp['max_abs_diff_vs_checkpoint']}")

    # the jobs: (part, model) -> {tool name: function(repeat) -> record}
    jobs = {}
    for m in args.models:
        if "extract" in args.parts:
            jobs[("extract", m)] = extraction_tools(runner, args, models, m, work, jax_params, jax_reason, probe_quiet)
        if "analyze" in args.parts:
            jobs[("analyze", m)] = analysis_tools(runner, args, models, m, work)
    runs = {job: {tool: [] for tool in tools} for job, tools in jobs.items()}

    # other work on the machine distorts multi-threaded timings badly (spinning BLAS/OpenMP pools
    # on oversubscribed cores): record the load average around the timed runs
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        runner.warnings.append(f"load average {load_before[0]:.2f} at the start of the timed runs on "
                               f"{os.cpu_count()} CPUs: other work is running, timings are unreliable")
        print("WARNING: " + runner.warnings[-1], flush=True)
    print(f"== timed runs: {args.repeats} repeat(s), round-robin over the tools", flush=True)
    for r in range(args.repeats):
        for job, tools in jobs.items():
            for tool in rotated(list(tools), r):
                rec = tools[tool](r)
                runs[job][tool].append(rec)
                extra = ""
                if "forward_s" in rec:
                    extra = f" (forward {rec['forward_s']:.2f} s, {rec['forward_rate']:.0f} problems/s; compile {rec['compile_s']:.2f} s)"
                elif rec.get("analysis_s") is not None:
                    extra = f" (analysis {rec['analysis_s']:.2f} s)"
                print(f"  repeat {r + 1}/{args.repeats} {job[0]:7s} {job[1]:7s} {tool:26s} {rec['wall_s']:8.2f} s{extra}", flush=True)

    machine["load_average_before"] = [round(x, 2) for x in load_before]
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results = summarize(args, machine, software, runner, models, jax_params, jax_reason, runs)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    md = render_markdown(results)
    (out_dir / "results.md").write_text(md)
    print()
    print(md)
    print(f"\nwrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")


def summarize(args, machine, software, runner, models, jax_params, jax_reason, runs):
    n = args.n
    res = {
        "config": {k: v for k, v in vars(args).items()},
        "machine": machine,
        "software": software,
        "thread_settings": runner.thread_env,
        "warnings": runner.warnings,
        "jax": {"skipped": jax_reason, "params": jax_params},
        "problems": {m: {"split": d["split"], "generated_equals_file": d["generated_equals_file"]} for m, d in models.items()},
        "raw": {f"{k[0]}/{k[1]}": v for k, v in runs.items()},
        "extraction": [],
        "analysis_timings": [],
        "analysis_agreement": {},
    }
    # extraction: rates and ratios (hyperlens's problems/s over the other tool's)
    extraction_runs = {}
    for (part, m), tools in runs.items():
        if part != "extract":
            continue
        extraction_runs[m] = tools
        hl_rate = n / median([x["wall_s"] for x in tools["hyperlens"]])
        for tool, recs in tools.items():
            wall = median([x["wall_s"] for x in recs])
            row = {"model": m, "tool": tool, "wall_s": wall, "rate": n / wall,
                   "ratio": hl_rate / (n / wall)}
            if recs and "forward_s" in recs[0]:
                fwd = median([x["forward_s"] for x in recs])
                row.update(forward_s=fwd, forward_rate=n / fwd, compile_s=median([x["compile_s"] for x in recs]),
                           import_s=median([x["import_s"] for x in recs]), ratio_forward=hl_rate / (n / fwd),
                           xla_flags=recs[0]["xla_flags"], jax=recs[0]["jax"], flax=recs[0]["flax"])
            res["extraction"].append(row)
    res["codes_agreement"] = codes_agreement(models, extraction_runs)

    hl_summary = {}
    for (part, m), tools in runs.items():
        if part != "analyze":
            continue
        hl, sk = tools["hyperlens"], tools["scikit-learn"]
        with open(Path(hl[-1]["dir"]) / "summary.json") as f:
            hl_summary = json.load(f)
        for stage in ANALYSIS_STAGES:
            h = median([x["stages_s"][stage] for x in hl if x["stages_s"]])
            s = median([x["stages_s"][stage] for x in sk])
            res["analysis_timings"].append({"model": m, "stage": stage, "hyperlens_s": h, "sklearn_s": s,
                                            "ratio": (s / h) if h else None})
        for label, key in (("analysis (in-process)", "analysis_s"), ("process wall", "wall_s")):
            h = median([x[key] for x in hl])
            s = median([x[key] for x in sk])
            res["analysis_timings"].append({"model": m, "stage": label, "hyperlens_s": h, "sklearn_s": s,
                                            "ratio": (s / h) if h else None})
        res["analysis_agreement"][m] = analysis_agreement(hl[-1]["dir"], sk[-1]["file"])
        res["hyperlens_stage_timings_available"] = any(x["stages_s"] for x in hl)
    if hl_summary:
        res["settings_matched"], res["settings_unmatched"] = settings_comparison(args, hl_summary)
    return res


def render_markdown(res):
    cfg, mach, sw = res["config"], res["machine"], res["software"]
    out = [f"# hyperlens vs scikit-learn vs the paper's JAX code (N = {cfg['n']:,} problems per set, "
           f"{cfg['repeats']} interleaved repeat(s), medians)", ""]
    gemm = mach.get("gemm_f32", {})
    out += ["## Machine", "",
            f"- CPU: {mach.get('cpu_model')} ({mach.get('cpus')} logical CPUs, {mach.get('memory_gib')} GiB; SIMD: {', '.join(mach.get('simd', []))})",
            f"- numpy float32 GEMM {gemm.get('n')}x{gemm.get('n')}, best of 5, {gemm.get('threads')} BLAS thread(s): "
            f"{fmt(gemm.get('gflops'), 1)} GFLOP/s",
            f"- git commit: {sw.get('git_commit')}; {sw.get('hyperlens')} (sha256 {sw.get('hyperlens_sha256', '')[:12]})",
            f"- Python {sw.get('python')}, numpy {sw.get('numpy')}, scipy {sw.get('scipy')}, scikit-learn {sw.get('scikit_learn')}",
            f"- threads: {cfg['threads']} (hyperlens RAYON_NUM_THREADS; Python OMP_NUM_THREADS, BLAS threads {cfg['blas_threads']}); pinning: {res['thread_settings']['pinning']}",
            f"- load average (1, 5, 15 min) before / after the timed runs: {mach.get('load_average_before')} / {mach.get('load_average_after')}",
            ""]
    for w in res["warnings"]:
        out.append(f"**Warning:** {w}")
    if res["warnings"]:
        out.append("")

    if res["extraction"]:
        jax_rows = [r for r in res["extraction"] if "forward_s" in r]
        versions = f" (jax {jax_rows[0]['jax']}, flax {jax_rows[0]['flax']})" if jax_rows else ""
        out += ["## Extraction of the latent codes (OOD set, paper site, batch "
                f"{cfg['batch']}){versions}", "",
                "hyperlens: the whole `hyperlens probe` process (start-up, model load, problems, forward passes, "
                ".npz written). JAX: the whole subprocess (\"e2e\": import, parameters, compile, forward, codes written) "
                "and its forward pass alone after a warm-up batch (\"forward\"). Ratio = hyperlens's problems/s over "
                "the tool's (> 1 = hyperlens faster).", ""]
        rows = []
        for r in res["extraction"]:
            rows.append([r["model"], r["tool"], fmt(r["wall_s"], 2), fmt(r["rate"], 0),
                         fmt(r.get("forward_rate"), 0), fmt(r.get("compile_s"), 2),
                         fmt(r["ratio"], 2), fmt(r.get("ratio_forward"), 2)])
        out += [markdown_table(["model", "tool", "wall s", "problems/s (e2e)", "problems/s (forward)", "compile s",
                                "ratio (e2e)", "ratio (vs forward)"], rows), ""]
    if res["jax"]["skipped"]:
        out += [f"JAX rows skipped: {res['jax']['skipped']}.", ""]
    if res.get("codes_agreement"):
        rows = [[r["model"], r["a"], r["b"], fmt(r.get("max_abs_diff"), 2), fmt(r.get("mean_abs_diff"), 2),
                 fmt(r.get("max_abs_code"), 3)] for r in res["codes_agreement"]]
        out += ["## Same arrays: codes of hyperlens and the paper's code", "",
                markdown_table(["model", "a", "b", "max abs diff", "mean abs diff", "max abs code"], rows), ""]

    if res["analysis_timings"]:
        out += ["## Analyses (N ID codes to train the decoder, N OOD codes to test it and for PCA / clustering / similarity)", "",
                "Stage seconds are summed over the selections (each layer and all layers). Ratio = scikit-learn's "
                "seconds over hyperlens's (> 1 = hyperlens faster)."]
        if not res.get("hyperlens_stage_timings_available"):
            out += ["This hyperlens build writes no stage timings for `analyze` (no timings.json, no per-layer "
                    "`seconds` in summary.json), so only its total is compared; its in-process time is the "
                    "\"in X s\" it prints (one decimal)."]
        out.append("")
        rows = [[r["model"], r["stage"], fmt(r["hyperlens_s"], 2), fmt(r["sklearn_s"], 2), fmt(r["ratio"], 2)]
                for r in res["analysis_timings"]]
        out += [markdown_table(["model", "stage", "hyperlens s", "scikit-learn s", "ratio"], rows), ""]
    for m, rows in res["analysis_agreement"].items():
        out += [f"### Agreement of the results: {m} (hyperlens / scikit-learn)", ""]
        t = []
        for r in rows:
            acc_h, acc_s = r["accuracy"]

            def pair(key, d=3):
                v = r.get(key)
                return "n/a" if v is None else f"{fmt(v[0], d)} / {fmt(v[1], d)}"
            t.append([r["layer"], pair("accuracy"), f"{100 * (acc_h - acc_s):+.2f}", pair("balanced_accuracy"),
                      pair("shuffled_control"), pair("ari"), pair("nmi"), pair("silhouette"), pair("silhouette_kmeans"),
                      pair("inertia_per_point"), pair("pca_evr_0"), fmt(r["similarity_max_abs_diff"], 2),
                      f"{r['sklearn_lbfgs_iterations']}{'' if r['sklearn_converged'] else ' (not converged)'}"])
        out += [markdown_table(["layer", "decoding acc", "Δ points", "balanced acc", "shuffled ctrl", "ARI", "NMI",
                                "silhouette (labels)", "silhouette (k-means)", "inertia / point", "PCA EVR[0]",
                                "cosine max abs diff", "sklearn L-BFGS iters"], t), ""]
    if res.get("settings_unmatched"):
        out += ["## Settings", "", "Matched:"] + [f"- {s}" for s in res["settings_matched"]]
        out += ["", "Could not be matched:"] + [f"- {s}" for s in res["settings_unmatched"]] + [""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
