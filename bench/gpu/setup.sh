# sourced by every device command: unpacks the binaries of this pack folder ($G: .gpu or .gpu-test),
# sets the library path, and links /work/main to the carried tree for the path baked into the test
# binary (never over a real checkout: only a missing path or an earlier link is replaced)
G=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
R=$PWD
mkdir -p /work
if [ "$R" != /work/main ] && { [ -L /work/main ] || [ ! -e /work/main ]; }; then ln -sfn "$R" /work/main; fi
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
[ -x /tmp/hl ] || [ ! -e "$G/hyperlens.xz" ] || { xz -dc "$G/hyperlens.xz" > /tmp/hl && chmod +x /tmp/hl; }
[ -x /tmp/mt ] || [ ! -e "$G/modeltest.xz" ] || { xz -dc "$G/modeltest.xz" > /tmp/mt && chmod +x /tmp/mt; }
