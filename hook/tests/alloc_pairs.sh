#!/bin/sh
# alloc_pairs.sh BUILD - alloc-pairs (gpu-check.sh section 4's timing of alloc+free pairs through
# the real driver) over the fake: bare and under libvgpu it prints a figure for every process,
# and a pair the cap refuses is a failure (exit 1), never a figure.
# Runs under tests/run.sh's preload (libvgpu.so, and the sanitizer's first when sanitized).
set -u
build=$1
lib_preload=$LD_PRELOAD
region=$CUDA_DEVICE_MEMORY_SHARED_CACHE # each case its own region: the first process sets the cap
failed=0
say() { if [ "$1" = 0 ]; then echo "ok - $2"; else echo "not ok - $2"; failed=1; fi; }
line='^3 processes, 4096 bytes: [0-9]+ ns per pair \(median\), [0-9]+ \(max\)$'

out=$(env -u LD_PRELOAD "$build/alloc-pairs" 3 2000 4096)
echo "$out" | grep -Eq "$line"
say $? "bare: $out"
out=$(LD_PRELOAD=$lib_preload CUDA_DEVICE_MEMORY_SHARED_CACHE="$region.1g" CUDA_DEVICE_MEMORY_LIMIT=1g \
    "$build/alloc-pairs" 3 2000 4096)
echo "$out" | grep -Eq "$line"
say $? "under libvgpu, a 1 GiB cap: $out"
out=$(LD_PRELOAD=$lib_preload CUDA_DEVICE_MEMORY_SHARED_CACHE="$region.1m" CUDA_DEVICE_MEMORY_LIMIT=1m \
    LIBCUDA_LOG_LEVEL=0 "$build/alloc-pairs" 3 20 2097152 2>&1)
rc=$?
[ "$rc" = 1 ] && echo "$out" | grep -q "a warm-up pair failed" &&
    echo "$out" | grep -q "a process failed" && ! echo "$out" | grep -q "ns per pair"
say $? "2 MiB pairs under a 1 MiB cap: refused, exit $rc, no figure"
out=$("$build/alloc-pairs" 0 1 1 2>&1)
rc=$?
[ "$rc" = 2 ] && echo "$out" | grep -q "usage"
say $? "no processes: usage, exit $rc"
exit $failed
