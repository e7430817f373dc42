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
