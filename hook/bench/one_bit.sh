#!/bin/bash
# one_bit.sh ROUNDS BUILD... - the SM limiter's two-tenant pairs over the fake GPU, under NVML's
# two sample models: "exact" (each process its share of every sample period, as make test
# runs them) and "one-bit" (FAKE_NVML_SAMPLE_WINNER=1: a period's whole utilisation goes to one
# process, drawn with the odds of its share, as an H200 read two busy tenants: 0 or 99 %). For
# each build folder given (its libvgpu.so; give two to compare libraries in the same run,
# alternating), ROUNDS rounds of the pairs 30/60, 50/50, 30/none and 20/20, every library over
# the first build's fakes and test_contention. Prints every tenant's share of the GPU and its
# part, then per model and library the mean and worst miss in points and how many tenants
# missed by more than 5; a tenant that measured nothing, or a pair that printed nothing, counts
# as missed (its log is printed). A measurement, not a test: one bit a sample at 1/6 s tells a
# share of 30 to about +-6 points in 10 s.
#   CONTENTION_SETTLE_S, CONTENTION_MEASURE_S: each pair's windows (default 10 and 10 s)
#   ONE_BIT_KEEP=DIR: keep every pair's folder (logs, fake GPU, regions) under DIR
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS BUILD..." >&2; exit 2; }
rounds=$1; shift
builds=("$@")
fakes=${builds[0]}
# A fake from before the switch would read exact samples where "one-bit" is printed.
grep -q FAKE_NVML_SAMPLE_WINNER "$fakes/fake/libcuda.so.1" || {
    echo "$fakes/fake/libcuda.so.1 has no FAKE_NVML_SAMPLE_WINNER: make -C hook fakes" >&2; exit 2; }
settle=${CONTENTION_SETTLE_S:-10} measure=${CONTENTION_MEASURE_S:-10}
limit=$(awk -v s="$settle" -v m="$measure" 'BEGIN { printf "%d", 3 * (s + m) + 60 }')
tmp=${ONE_BIT_KEEP:-$(mktemp -d /tmp/vgpu-one-bit.XXXXXX)}
mkdir -p "$tmp"
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${ONE_BIT_KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# pair LIB DIR A B ENV...: one pair; its log in DIR/out.log.
pair() {
    local lib=$1 dir=$2 a=$3 b=$4; shift 4
    rm -rf "$dir" && mkdir -p "$dir" # a kept folder's regions and fake GPU would carry over
    # Each tenant holds a 100 MiB context, as on a GPU; from it a process learns its host pid,
    # without which a period another tenant's sample has reads as no sample of its own.
    # exec: an interrupt's kill reaches timeout, which passes it on to the pair.
    exec timeout "$limit" env LD_LIBRARY_PATH="$fakes/fake" LD_PRELOAD="$lib" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/x.cache" FAKE_GPU_SHARED="$dir/gpu.shm" \
        CONTENTION_DIR="$dir" FAKE_CUDA_CONTEXT_MIB=100 LIBCUDA_LOG_LEVEL=1 \
        CONTENTION_SETTLE_S="$settle" CONTENTION_MEASURE_S="$measure" "$@" \
        "$fakes/tests/test_contention" "$a" "$b" >"$dir/out.log" 2>&1
}

results="$tmp/results.txt"
: >"$results"
pairs=(30-60 50-50 30-none 20-20)
for round in $(seq 1 "$rounds"); do
    for model in exact one-bit; do
        winner=0
        [ "$model" = one-bit ] && winner=1
        for i in "${!builds[@]}"; do
            build=${builds[$i]}
            for p in "${pairs[@]}"; do
                pair "$build/libvgpu.so" "$tmp/$round-$model-$i-$p" "${p%-*}" "${p#*-}" \
                    FAKE_NVML_SAMPLE_WINNER=$winner &
            done
            wait
            for p in "${pairs[@]}"; do
                log="$tmp/$round-$model-$i-$p/out.log"
                # "ok - tenant A (limit 30): 29.5% of the GPU, expected 30%"; a tenant that
                # measured nothing reads -1.0%
                got=$(sed -n 's/.*tenant \([AB]\) (limit [a-z0-9]*): \(-\{0,1\}[0-9.]*\)% of the GPU, expected \([0-9]*\)%.*/\1 \2 \3/p' "$log")
                if [ "$(printf '%s\n' "$got" | grep -c .)" -ne 2 ]; then
                    echo "$model $build $p: no figure for both tenants; its log:" >&2
                    tail -20 "$log" >&2
                    got="A missing 0
B missing 0"
                fi
                printf '%s\n' "$got" | sed "s|^|$model $build $p |" | tee -a "$results"
            done
        done
    done
done
echo
echo "model library: tenants, mean miss, worst miss (points), missed by more than 5 (no figure)"
awk '{ k = $1 " " $2; n[k]++
       if ($5 == "missing" || $5 < 0) { m[k]++; lost[k]++; next }
       d = $5 - $6; d = d < 0 ? -d : d; s[k] += d; c[k]++
       if (d > w[k]) w[k] = d; if (d > 5) m[k]++ }
     END { for (k in n) printf "%s: %d, %.1f, %.1f, %d (%d)\n", k, n[k],
                                (c[k] ? s[k] / c[k] : 0), w[k], m[k], lost[k] }' \
    "$results" | sort
