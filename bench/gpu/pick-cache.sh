# prints 1 when smoke.sh's HYLA run with the upload cache (HYPERLENS_CUDA_UPLOAD_CACHE=1) finished and
# was at least 3 % faster than `hyla` without it, else 0:
#   export HYPERLENS_CUDA_UPLOAD_CACHE=$(bash .gpu/pick-cache.sh)
rate() { grep -o '"steps_per_s": *[0-9.]*' "$1/train.json" 2>/dev/null | grep -o '[0-9.]*$'; }
a=$(rate /tmp/solo-hyla); b=$(rate /tmp/solo-hyla-cache)
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(b >= 1.03 * a) }'; then echo 1; else echo 0; fi
echo "hyla alone: $a steps/s, with the upload cache: ${b:-failed}" >&2
