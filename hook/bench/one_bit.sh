#!/bin/bash
# one_bit.sh ROUNDS BUILD... - the SM limiter's two-tenant pairs over the fake GPU, under NVML's
# two sample models: "exact" (each process its share of every sample period, as make test
# runs them) and "one-bit" (FAKE_NVML_SAMPLE_WINNER=1: a period's whole utilisation goes to one
# process, drawn with the odds of its share, as an H200 read two busy tenants: 0 or 99 %). For
# each build folder given (a libvgpu and its test_contention; give two to compare libraries in
# the same run, alternating), ROUNDS rounds of the pairs 30/60, 50/50, 30/none and 20/20. Prints
# every tenant's share of the GPU and its part, then per model and build the mean and worst miss
# in points and how many tenants missed by more than 5. A measurement, not a test: one bit a
# sample at 1/6 s tells a share of 30 to about +-6 points in 10 s.
#   CONTENTION_SETTLE_S, CONTENTION_MEASURE_S: each pair's windows (default 10 and 10 s)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS BUILD..." >&2; exit 2; }
rounds=$1; shift
tmp=$(mktemp -d /tmp/vgpu-one-bit.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
settle=${CONTENTION_SETTLE_S:-10} measure=${CONTENTION_MEASURE_S:-10}

# pair BUILD DIR A B [ENV...]: one pair, in the background's caller; its log in DIR/out.log.
pair() {
    local build=$1 dir=$2 a=$3 b=$4; shift 4
    mkdir -p "$dir"
    # Each tenant holds a 100 MiB context NVML lists: that is how a process learns its host pid,
    # without which a period another tenant's sample has reads as no sample of its own.
    timeout 300 env LD_LIBRARY_PATH="$build/fake" LD_PRELOAD="$build/libvgpu.so" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/x.cache" FAKE_GPU_SHARED="$dir/gpu.shm" \
        CONTENTION_DIR="$dir" FAKE_CUDA_CONTEXT_MIB=100 LIBCUDA_LOG_LEVEL=1 \
        CONTENTION_SETTLE_S="$settle" CONTENTION_MEASURE_S="$measure" "$@" \
        "$build/tests/test_contention" "$a" "$b" >"$dir/out.log" 2>&1 || true
}

results="$tmp/results.txt"
for round in $(seq 1 "$rounds"); do
    for model in exact one-bit; do
        env=(FAKE_NVML_SAMPLE_WINNER=0)
        [ "$model" = one-bit ] && env=(FAKE_NVML_SAMPLE_WINNER=1)
        for build in "$@"; do
            for p in 30-60 50-50 30-none 20-20; do
                pair "$build" "$tmp/$round-$model-$(basename "$build")-$p" "${p%-*}" "${p#*-}" \
                    "${env[@]}" &
            done
            wait
            for p in 30-60 50-50 30-none 20-20; do
                # "tenant A (limit 30): 29.5% of the GPU, expected 30%"
                sed -n 's/.*tenant \([AB]\) (limit [a-z0-9]*): \([0-9.]*\)% of the GPU, expected \([0-9]*\)%.*/\1 \2 \3/p' \
                    "$tmp/$round-$model-$(basename "$build")-$p/out.log" |
                    while read -r tenant got want; do
                        echo "$model $build $p $tenant $got $want"
                    done | tee -a "$results"
            done
        done
    done
done
echo
echo "model build: tenants, mean miss, worst miss (points), missed by more than 5"
awk '{ k = $1 " " $2; d = $5 - $6; d = d < 0 ? -d : d; n[k]++; s[k] += d
       if (d > w[k]) w[k] = d; if (d > 5) m[k]++ }
     END { for (k in n) printf "%s: %d, %.1f, %.1f, %d\n", k, n[k], s[k] / n[k], w[k], m[k] + 0 }' \
    "$results" | sort
