#!/usr/bin/env bash
# The CPU of a lent GPU machine as a second x86-64 host: runs unit-test binaries there (its Xeon has
# AVX-512, which the 2-core machine's host may lack) and times the default report of two builds,
# interleaved, pinned to 2 physical cores (RAYON_NUM_THREADS=2), as on the 2-core machine.
#
# Here, from the repository root:
#   bench/gpu/cpu-ab.sh pack OLD_BINARY NEW_BINARY [TEST_BINARY:CRATE_DIR ...]
# fills `.cpuab/` (ignored through .git/info/exclude) with the stripped, xz-compressed binaries and a
# copy of `reports/default/tables` and `index.md` to compare with. The device tool carries at most
# 64 MiB: the tracked tree is over that with `reports/` (81 MB in November 2026), so take it out of
# the index for the call and put it back after (the files stay on disk):
#   git rm -r -q --cached reports && echo /reports/ >> .git/info/exclude
#   ... the device call, carry [".cpuab"], command `bash bench/gpu/cpu-ab.sh run` ...
#   git reset -q && sed -i '/^\/reports\/$/d' .git/info/exclude
# There, `run` (ROUNDS, default 3) prints the tests' results, `old`/`new` report times (wall and
# user CPU), whether the new build's tables and index.md are the reference's bytes, and probe times
# of 16,384 OOD problems of a HYLA and a softmax checkpoint; `timings-*.json` come back under $OUT.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
P="$here/.cpuab"
case "${1:-}" in
  pack)
    [ $# -ge 3 ] || { echo "usage: $0 pack OLD_BINARY NEW_BINARY [TEST_BINARY:CRATE_DIR ...]" >&2; exit 2; }
    rm -rf "$P"; mkdir -p "$P/bin" "$P/ref"
    grep -qx '/.cpuab/' "$here/.git/info/exclude" 2>/dev/null || echo '/.cpuab/' >> "$here/.git/info/exclude"
    strip -o "$P/old" "$2" && xz -T2 -c "$P/old" > "$P/bin/old.xz" && rm "$P/old"
    strip -o "$P/new" "$3" && xz -T2 -c "$P/new" > "$P/bin/new.xz" && rm "$P/new"
    shift 3
    for t in "$@"; do
      bin="${t%%:*}" dir="${t#*:}"
      n="test-$(basename "$bin")"
      strip -o "$P/$n" "$bin" && xz -T2 -c "$P/$n" > "$P/bin/$n.xz" && rm "$P/$n"
      echo "$n $dir" >> "$P/tests"
    done
    cp -r "$here/reports/default/tables" "$here/reports/default/index.md" "$P/ref/"
    du -sh "$P"
    ;;
  run)
    lscpu | grep -E 'Model name'
    grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    B=/tmp/cpuab; mkdir -p $B
    for f in "$P"/bin/*.xz; do n=$(basename "$f" .xz); xz -dc "$f" > $B/$n; chmod +x $B/$n; done
    # Test binaries have this checkout's path baked in.
    if [ "$here" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work; ln -s "$here" /work/main; fi
    if [ -f "$P/tests" ]; then
      while read -r n dir; do
        echo "== $n ($dir)"; (cd "$here/$dir" && $B/$n 2>&1 | grep -E '^test result|FAILED|panicked')
      done < "$P/tests"
    fi
    cd "$here"
    cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '!s[$2]++{print $1}' | head -2 | paste -sd,)
    echo "== pinned to CPUs $cpus"
    for i in $(seq "${ROUNDS:-3}"); do for v in old new; do
      RAYON_NUM_THREADS=2 /usr/bin/time -f "$v round $i: wall %e s, user %U s" taskset -c "$cpus" \
        $B/$v report --out /tmp/cpuab-$v-$i > /tmp/cpuab-$v-$i.log 2>&1
      tail -1 /tmp/cpuab-$v-$i.log
      [ -n "${OUT:-}" ] && cp /tmp/cpuab-$v-$i/timings.json "$OUT/timings-$v-$i.json"
    done; done
    for f in $(cd "$P/ref/tables" && find . -name '*.csv' -o -name '*.npz'); do
      cmp -s "$P/ref/tables/$f" "/tmp/cpuab-new-1/tables/$f" || echo "differs: tables/$f"
    done
    cmp -s "$P/ref/index.md" /tmp/cpuab-new-1/index.md && echo "index.md: the same bytes" || echo "index.md differs"
    for c in paper-jax-hyla-seed2 paper-jax-softmax-seed1; do for v in old new; do
      RAYON_NUM_THREADS=2 /usr/bin/time -f "probe $v $c: wall %e s, user %U s" taskset -c "$cpus" \
        $B/$v probe --checkpoint data/checkpoints/$c --n 16384 --unpermuted --set ood --out /tmp/cpuab-$v.npz \
        > /dev/null 2> /tmp/cpuab-probe.log
      tail -1 /tmp/cpuab-probe.log
    done; cmp -s /tmp/cpuab-old.npz /tmp/cpuab-new.npz && echo "probe $c: the same bytes"; done
    ;;
  *)
    echo "usage: $0 pack OLD_BINARY NEW_BINARY [TEST_BINARY:CRATE_DIR ...] | run" >&2; exit 2 ;;
esac
