#!/usr/bin/env bash
# Assembles .gpu/ (ignored through .git/info/exclude) for the device tool's calls, and checks that what
# travels stays under its 64 MiB limit (tracked + untracked-not-ignored files + carried paths).
#   bench/gpu/pack.sh train   the CLI binary and these scripts (training, throughput, reports)
#   bench/gpu/pack.sh test    the CPU-vs-CUDA model test binary (it reads the shipped
#                             data/checkpoints/paper-jax-*) and these scripts
# The two binaries (8 + 6 MB compressed) do not fit together beside the tracked tree (55 MiB in
# November 2026): make them separate calls. Build first, with the CUDA environment (README.md):
#   CARGO_TARGET_DIR=/work/targets/cuda cargo build --release -p hyperlens --features cuda
#   CARGO_TARGET_DIR=/work/targets/cuda cargo test --release -p hyperlens-model --features cuda --test model --no-run
set -euo pipefail
mode=${1:?usage: bench/gpu/pack.sh train|test}
target=${CARGO_TARGET_DIR:-/work/targets/cuda}
limit=$((64 * 1024 * 1024))
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu
mkdir -p .gpu
cp bench/gpu/*.sh .gpu/
case "$mode" in
  train)
    strip -o .gpu/hyperlens "$target/release/hyperlens"
    xz -9e -T1 .gpu/hyperlens ;;
  test)
    bin=$(ls -t "$target"/release/deps/model-* | grep -v '\.d$' | head -1)
    strip -o .gpu/modeltest "$bin"
    xz -9e -T1 .gpu/modeltest ;;
  *) echo "unknown mode $mode (train or test)" >&2; exit 2 ;;
esac
bytes() { du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0; }
tracked=$(git ls-files -z | bytes)
untracked=$(git ls-files -z --others --exclude-standard | bytes)
carried=$(du -sb .gpu | cut -f1)
total=$((tracked + ${untracked:-0} + carried))
echo "travels: tracked $tracked + untracked ${untracked:-0} + .gpu $carried = $total bytes (limit $limit)"
[ "$total" -le "$limit" ] || { echo "over the device tool's limit: carry less" >&2; exit 1; }
