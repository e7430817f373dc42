#!/usr/bin/env bash
# Prepare a CUDA 13.0 tool chain for `cargo build --features cuda` on a machine that has no GPU and no
# system CUDA, and print the environment to use it. Everything comes from NVIDIA's PyPI wheels and is
# kept in a cache directory, so nothing is installed system-wide.
#
# Usage (from the repository root):
#   eval "$(scripts/cuda-build-env.sh)"        # once per shell; the first call downloads ~1.2 GB
#   cargo build --release -p hyperlens --features cuda
#
# Only `export ...` lines go to stdout; progress and errors go to stderr. See docs/gpu.md.
#
# Environment:
#   HYPERLENS_CUDA_ROOT  cache directory (default: ~/.cache/hyperlens-cuda); delete it to start over
#   CARGO_HOME           where cargo keeps its registry (default: ~/.cargo)
#
# Why it looks like this:
# - 13.0 is the CUDA release of the GPU machines this project uses (H100/H200, driver 580). A newer nvcc
#   would emit PTX that this driver refuses to load.
# - The wheels ship only versioned shared libraries (libcublas.so.13, ...), but the linker looks for
#   unversioned names (libcublas.so), so we add those links.
# - The driver library libcuda.so is part of the NVIDIA driver, not of the toolkit wheels. For linking we
#   build a stub with the same soname (libcuda.so.1) whose functions all fail; at run time the real
#   driver's libcuda.so.1 is found instead.
# - candle's kernel build normally asks nvidia-smi for the compute capability; without a GPU we set
#   CUDA_COMPUTE_CAP=90 (Hopper: H100/H200), so the kernels are built for sm_90.
set -euo pipefail

# Pinned wheel versions of the CUDA 13.0 toolkit pieces that candle's build needs.
WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-nvrtc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
  nvidia-cuda-cccl==13.0.85
)
# Libraries that get an unversioned link name.
LINK_LIBS=(cublas cublasLt cudart nvrtc curand)
COMPUTE_CAP=90

cache=${HYPERLENS_CUDA_ROOT:-$HOME/.cache/hyperlens-cuda}
cargo_home=${CARGO_HOME:-$HOME/.cargo}

log() { echo "cuda-build-env: $*" >&2; }
die() { log "error: $*"; exit 1; }

# 1. A private virtual environment for the wheels.
py="$cache/venv/bin/python"
if [ ! -x "$py" ]; then
  log "creating $cache/venv"
  mkdir -p "$cache"
  python3 -m venv "$cache/venv" >&2 || die "python3 -m venv failed (install python3-venv)"
fi

# The wheels unpack into <site-packages>/nvidia/cu13/{bin,lib,include}.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda="$site/nvidia/cu13"

# 2. The toolkit wheels, unless nvcc is already there.
if [ ! -x "$cuda/bin/nvcc" ]; then
  log "installing CUDA 13.0 wheels into $site (about 1.2 GB, a minute or so)"
  "$py" -m pip install --quiet --no-deps "${WHEELS[@]}" >&2
  [ -x "$cuda/bin/nvcc" ] || die "nvcc not found in $cuda/bin after installing the wheels"
fi

# 3. Unversioned link names for the linker.
for name in "${LINK_LIBS[@]}"; do
  plain="$cuda/lib/lib$name.so"
  [ -e "$plain" ] && continue
  versioned=""
  for candidate in "$cuda/lib/lib$name.so."*; do
    [ -e "$candidate" ] && { versioned=$candidate; break; }
  done
  [ -n "$versioned" ] || die "no $cuda/lib/lib$name.so.* to link to"
  ln -s "$(basename "$versioned")" "$plain"
done

# 4. A link-time stand-in for the driver library. Its symbols are the driver entry points that cudarc
#    declares; cudarc's sources are in the cargo registry once `cargo fetch` has run in the workspace.
stub="$cuda/lib/libcuda.so"
if [ ! -e "$stub" ]; then
  decls=""
  for candidate in "$cargo_home"/registry/src/*/cudarc-*/src/driver/sys/mod.rs; do
    [ -e "$candidate" ] && decls=$candidate   # the last match: the newest cudarc by name
  done
  [ -n "$decls" ] || die "cudarc sources not found under $cargo_home/registry: run 'cargo fetch' in the workspace first"
  command -v gcc >/dev/null || die "gcc is needed to build the libcuda link stub"
  log "building the libcuda link stub from $decls"
  grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+\(' "$decls" \
    | sed -E 's/^pub unsafe fn (cu[A-Za-z0-9_]+)\($/\1/' \
    | sort -u \
    | while read -r fn; do printf 'int %s(void) { return 999; }\n' "$fn"; done \
    > "$cache/libcuda_stub.c"
  [ -s "$cache/libcuda_stub.c" ] || die "no driver functions found in $decls"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$cache/libcuda_stub.c"
fi

# 5. The environment for cargo, nvcc and the linker (evaluated by the caller).
cat <<EOF
export PATH="$cuda/bin:\$PATH"
export CUDA_HOME="$cuda" CUDA_ROOT="$cuda" CUDA_PATH="$cuda"
export CUDA_COMPUTE_CAP=$COMPUTE_CAP
export LIBRARY_PATH="$cuda/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
EOF
