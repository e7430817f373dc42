# the CPU-vs-CUDA test (a `pack.sh test` folder): logits and latent codes of the shipped paper-jax-*
# checkpoints and the loss and gradients of every mixer, on the GPU against the CPU. It may run while
# train.sh's runs go on: it joins their MPS daemon when there is one.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
source "$G/mps.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
[ -x /tmp/mt ] || { echo "no test binary: pack with bench/gpu/pack.sh test"; exit 1; }
(cd /work/main/crates/model && CARGO_MANIFEST_DIR=$PWD /tmp/mt cuda_forward --nocapture --test-threads 1) 2>&1 | tee "$OUT/cuda-test.log"
