#!/bin/sh
# run.sh BUILD - libvgpu's per-call overhead figures over the fake driver (make bench).
# FAKE_CUDA_NS_PER_BLOCK=0: launches cost no fake GPU time, so the SM limiter is armed but never
# has to wait; what is measured is the bookkeeping on every launch.
set -eu
build=$1
tmp=$(mktemp -d /tmp/vgpu-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# FAKE_CUDA_CONTEXT_MIB: each process's context holds memory, as on a GPU, so the measured
# path includes the check of the context memory counted (re-measured once a second).
export LD_LIBRARY_PATH="$build/fake" FAKE_CUDA_NS_PER_BLOCK=0 LIBCUDA_LOG_LEVEL=0 FAKE_CUDA_CONTEXT_MIB=300
export LD_PRELOAD="$(pwd)/$build/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=15g
echo "per-call overhead, libvgpu interposed vs the fake driver called directly (CPU time):"
CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/a.cache" "$build/vgpu-bench" calls
CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/b.cache" CUDA_DEVICE_SM_LIMIT=50 "$build/vgpu-bench" calls
# One GPU, as most vGPU containers have: the gate need not ask the driver for the device.
CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/c.cache" CUDA_DEVICE_SM_LIMIT=50 FAKE_CUDA_DEVICES=1 \
    "$build/vgpu-bench" calls
CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/d.cache" FAKE_CUDA_DEVICES=1 "$build/vgpu-bench" contexts
for n in 1 8 32; do
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/scale$n.cache" "$build/vgpu-bench" scale "$n" 100000
done
