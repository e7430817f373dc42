# sourced by every device command: binaries, library path, and /work/main for the path baked into the
# test binary
R=$PWD
mkdir -p /work
[ "$R" = /work/main ] || { rm -rf /work/main; ln -sfn "$R" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
[ -x /tmp/hl ] || { xz -dc .gpu/hyperlens.xz > /tmp/hl && chmod +x /tmp/hl; }
[ -x /tmp/mt ] || [ ! -e .gpu/modeltest.xz ] || { xz -dc .gpu/modeltest.xz > /tmp/mt && chmod +x /tmp/mt; }
