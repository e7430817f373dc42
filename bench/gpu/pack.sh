#!/usr/bin/env bash
# Assembles a folder for the device tool's calls (ignored through .git/info/exclude), and checks that
# what travels stays under its 64 MiB limit (tracked + untracked-not-ignored files + the folder):
#   bench/gpu/pack.sh train   .gpu/: the CLI binary and these scripts (training, throughput, reports)
#   bench/gpu/pack.sh test    .gpu-test/: the CPU-vs-CUDA model test binary (it reads the shipped
#                             data/checkpoints/paper-jax-*) and these scripts
#   bench/gpu/pack.sh window  .gpu/: both binaries and these scripts, for window.sh's one call (the CUDA
#                             tests, then the rates); it fits only with reports/ out of the index
#                             (bench/gpu/README.md: `git rm -r -q --cached reports` before the call,
#                             `git reset -q` after it)
# The two binaries (8 + 6 MB compressed) do not fit together beside the tracked tree (57 MB in
# November 2026): they travel in separate calls, each naming its folder in `carry`; both folders can
# be packed ahead of the session. Build first, with the CUDA environment (eval "$(scripts/cuda-build-env.sh)", docs/gpu.md):
#   CARGO_TARGET_DIR=/work/targets/cuda cargo build --release -p hyperlens --features cuda
#   CARGO_TARGET_DIR=/work/targets/cuda cargo test --release -p hyperlens-model --features cuda --test model --no-run
set -euo pipefail
mode=${1:?usage: bench/gpu/pack.sh train|test|window}
target=${CARGO_TARGET_DIR:-/work/targets/cuda}
limit=$((64 * 1024 * 1024))
case "$mode" in
  train) dir=.gpu ;;
  test) dir=.gpu-test ;;
  window) dir=.gpu ;;
  *) echo "unknown mode $mode (train, test or window)" >&2; exit 2 ;;
esac
mkdir -p .git/info && touch .git/info/exclude
for d in /.gpu/ /.gpu-test/; do grep -qx "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
rm -rf "$dir"
mkdir -p "$dir"
cp bench/gpu/*.sh bench/gpu/*.py "$dir/"
pack_cli() {
  strip -o "$dir/hyperlens" "$target/release/hyperlens"
  xz -9e -T1 "$dir/hyperlens"
}
pack_test() {
  bin=$(ls -t "$target"/release/deps/model-* | grep -v '\.d$' | head -1)
  strip -o "$dir/modeltest" "$bin"
  xz -9e -T1 "$dir/modeltest"
}
case "$mode" in
  train) pack_cli ;;
  test) pack_test ;;
  window) pack_cli; pack_test ;;
esac
bytes() { du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0; }
tracked=$(git ls-files -z | bytes)
untracked=$(git ls-files -z --others --exclude-standard | bytes)
carried=$(du -sb "$dir" | cut -f1)
total=$((tracked + ${untracked:-0} + carried))
echo "travels: tracked $tracked + untracked ${untracked:-0} + $dir $carried = $total bytes (limit $limit)"
[ "$total" -le "$limit" ] || { echo "over the device tool's limit: carry less" >&2; exit 1; }
