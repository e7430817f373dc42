# sourced: mps_start runs an MPS control daemon, so that the kernels of several training processes run
# on the GPU at once instead of taking turns (three runs without it: 17-22 steps/s each, one alone
# 45-49); mps_stop ends it. Clients must see the same CUDA_MPS_PIPE_DIRECTORY. It changes no GPU
# setting; stop it before the last call of a session.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mps_start() {
  command -v nvidia-cuda-mps-control > /dev/null || { echo "no nvidia-cuda-mps-control here"; return 1; }
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  pgrep -f "nvidia-cuda-mps-control -d" > /dev/null || nvidia-cuda-mps-control -d
  echo "MPS daemon up"
}
mps_stop() { echo quit | nvidia-cuda-mps-control 2> /dev/null || true; }
