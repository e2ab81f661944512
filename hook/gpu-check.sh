#!/usr/bin/env bash
# gpu-check.sh - libvgpu.so on a real GPU: the acceptance suite of issue 11 (hook/README.md).
# Needs: an NVIDIA GPU with at least 4 GiB, nvidia-smi, python3 with torch (CUDA build) and
# pynvml, cc/make. Context memory is counted against the cap (about 0.5 GiB a process on an
# H100), so the sizes below leave room for one per process. Checks: (1) a 2 GiB cap under
# PyTorch: the context counted before any tensor, what mem_get_info leaves works, 3 GiB fails
# cleanly with an OOM the program can catch, torch.cuda.mem_get_info and nvidia-smi show 2048 MiB;
# (2) two processes sharing one cap; (3) an SM limit of 30 % on a compute-bound kernel;
# (4) overhead figures; (5) what NVML shows a capped process holding (context included) stays
# within the cap; (6) SM shares of two containers at once (30/60, 50/50, 30/none, 20/20), each
# limit's part of what two processes without libvgpu do together, and what NVML's per-process
# samples said of each;
# (7) CUDA graph replay under a 25 % limit; (8) CUDA graphs made or changed through each driver
# export the library costs (tests/test_contention.c, the cases make test runs over the fake);
# (9) memory freed with a context (cudaDeviceReset, cuCtxDestroy) given back to the cap, and a
# cudaMallocAsync pool's cache not counted twice; (10) a VMM mapping, created contexts, a
# pool's cache, a graph's allocation nodes, a raised stack limit and green contexts held within
# the cap;
# (11) CUDA's GPU UUIDs, as libvgpu writes them, are NVML's (the settings file's GPUs);
# (12) under an SM limit of 50 %, a light load, then large kernels: the first is not held back
# for its debt in blocks, and back to back they get the limit (the GPU-time account); (13)
# short-lived processes of one container one after another under 20 % (prepayment); (14)
# which waits of PyTorch, CuPy and JAX drain under an SM limit (prepay nothing after them);
# (15) memsets alone under an SM limit of 25 % (CuPy's cudaMemsetAsync); (16) matmuls under
# 25 % beside a thread making calls the driver refuses in a loop (they take no tokens).
# Usage: gpu-check.sh [SECTION...] (default: all sixteen; sections 1-15 about 11 minutes on an H200, section
# 14 some 25 s of it; sections
# can be run separately: gpu-session.sh runs each under its own time limit on a lent machine).
# Exit 77 (skip) without a GPU, 1 on any failed check.
set -uo pipefail
export PYTHONUNBUFFERED=1 # a section killed by a time limit keeps what it printed
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here; skipping"; exit 77
fi
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "gpu-check: python3 with a CUDA build of torch is needed"; exit 77; }
python3 -c 'import pynvml' || {
    echo "gpu-check: python3 with pynvml is needed (nvidia-ml-py, one pure-Python file)"; exit 77; }
make -C "$here" gpu-check-build >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv,noheader
lib="$here/build/libvgpu.so"
work=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-gpu-check.XXXXXX")
# Kept after a failure: its region files say what the library counted.
trap 'if [ "$failed" = 0 ]; then rm -rf "$work"; else echo "gpu-check: kept $work"; fi' EXIT
failed=0
result() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=1; return 1; fi; }
under_cap() { # under_cap REGION CAP COMMAND...: run with libvgpu preloaded and a cap
    local region=$1 cap=$2; shift 2
    local run=(env LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$region"
               CUDA_DEVICE_MEMORY_LIMIT="$cap" "$@")
    # In a subshell (`under_cap ... &`, a pipeline, `$(...)`) become the program, so that $! is
    # its pid: `kill -9 $!` must hit the process holding GPU memory, not a wrapper shell.
    if [ "$BASH_SUBSHELL" -gt 0 ]; then exec "${run[@]}"; fi
    "${run[@]}"
}

share_of() { sed -n 's/.*, \([0-9.]*\) %$/\1/p' "$work/$1.txt"; } # what share.py printed
within() { awk -v got="$1" -v want="$2" 'BEGIN { exit !(got >= want - 5 && got <= want + 5) }'; }
# share.py NAME SECONDS [BASELINE], for sections 6 and 7.
cat > "$work/share.py" <<'PY'
# share.py NAME SECONDS [BASELINE]: a compute-bound kernel back to back; prints its throughput
# over the second half as a % of BASELINE (kernels/s of the same kernel alone, bare).
import os, sys, time, torch
name, seconds = sys.argv[1], float(sys.argv[2])
baseline = float(sys.argv[3]) if len(sys.argv) > 3 else 0
if os.environ.get("SHARE_PID_DIR"): # for nvml_samples.py: which NVML pid is this tenant
    with open(f"{os.environ['SHARE_PID_DIR']}/{name}.pid", "w") as f: f.write(str(os.getpid()))
a = torch.randn(8192, 8192, device="cuda")
graph = name.startswith("graph")
if graph:
    static = a.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): static = (static @ static).clamp_(-1, 1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(10): static = (static @ static).clamp_(-1, 1)
# SHARE_T0: tenants started together measure the same window (the second half from T0).
start = float(os.environ.get("SHARE_T0") or time.time()); n = 0; n_half = None
while time.time() - start < seconds:
    if graph: g.replay(); n += 10
    else: a = (a @ a).clamp_(-1, 1); n += 1
    if n % 8 == 0 or graph: torch.cuda.synchronize()
    if n_half is None and time.time() - start >= seconds / 2:
        torch.cuda.synchronize(); n_half, t_half = n, time.time()
torch.cuda.synchronize()
rate = (n - n_half) / (time.time() - t_half)
print(f"{name}: {rate:.1f} kernels/s" + (f", {100 * rate / baseline:.1f} %" if baseline else ""))
PY

section_1() {
echo "== 1. PyTorch under a 2 GiB cap"
under_cap one.cache 2g python3 - <<'PY'
import sys
import torch
MiB, GiB = 1 << 20, 1 << 30
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: free {free / GiB:.2f} GiB, total {total / GiB:.2f} GiB")
ok = total == 2 * GiB
# Nothing allocated yet: what is used is the CUDA context, counted against the cap.
context = total - free
print(f"counted before any tensor (the CUDA context): {context // MiB} MiB")
ok &= 0 < context < total // 2
props = torch.cuda.get_device_properties(0).total_memory
print(f"get_device_properties.total_memory {props / GiB:.2f} GiB")
ok &= props == 2 * GiB
size = (free - 256 * MiB) // MiB * MiB
x = torch.empty(size, dtype=torch.uint8, device="cuda")
print(f"{size // MiB} MiB tensor (what mem_get_info left, less 256 MiB): allocated")
del x
torch.cuda.empty_cache()
try:
    y = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
    print("3 GiB tensor: allocated (the cap did not hold)")
    ok = False
except torch.cuda.OutOfMemoryError:
    print("3 GiB tensor: torch.cuda.OutOfMemoryError, as expected")
z = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")  # still usable after the OOM
# all(), not sum(): a uint8 sum is computed in int64, a 2 GiB temporary under a 2 GiB cap.
ok &= bool(z.all().item()) and z.numel() == 256 << 20
sys.exit(0 if ok else 1)
PY
result $? "PyTorch: cap reported, context counted, the rest works, 3 GiB is a clean OOM"
shown=$(under_cap one.cache 2g nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
echo "nvidia-smi under the hook: memory.total = ${shown} MiB"
[ "${shown// /}" = 2048 ]; result $? "nvidia-smi shows the 2048 MiB cap"
}

section_2() {
echo "== 2. two processes sharing one 4 GiB cap (a context each)"
under_cap two.cache 4g python3 -c '
import time, torch
x = torch.empty(1200 << 20, dtype=torch.uint8, device="cuda")
open("'"$work"'/holding", "w").close()
time.sleep(600)' &
holder=$!
for _ in $(seq 300); do [ -e "$work/holding" ] && break; sleep 0.2; done
kill -0 $holder 2>/dev/null && [ -e "$work/holding" ]
result $? "the first process holds 1200 MiB"
under_cap two.cache 4g python3 - <<'PY'
import sys
import torch
try:
    # Alone, 3000 MiB and a context fit under 4 GiB; beside the holder's 1200 MiB and context,
    # they must not.
    torch.empty(3000 << 20, dtype=torch.uint8, device="cuda")
    sys.exit(1)
except torch.cuda.OutOfMemoryError:
    pass
torch.cuda.empty_cache()
torch.empty(500 << 20, dtype=torch.uint8, device="cuda")
free, total = torch.cuda.mem_get_info()
print(f"second process: free {free >> 20} MiB of {total >> 20} MiB")
PY
result $? "second process: 3000 MiB refused, 500 MiB fits while the first holds 1200 MiB"
kill -9 $holder 2>/dev/null; wait $holder 2>/dev/null
under_cap two.cache 4g python3 -c '
import torch; torch.empty(3000 << 20, dtype=torch.uint8, device="cuda")'
result $? "after kill -9 of the holder, 3000 MiB fits again"
}

section_3() {
echo "== 3. SM limit 30 % on a compute-bound kernel"
cat > "$work/burn.py" <<'PY'
import threading, time, sys
import pynvml, torch
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
a = torch.randn(4096, 4096, device="cuda")
samples, stop = [], False
def sample():
    while not stop:
        samples.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        time.sleep(0.2)
t = threading.Thread(target=sample); t.start()
end, n = time.time() + 12, 0
while time.time() < end:
    a = (a @ a).clamp_(-1, 1); n += 1
    if n % 8 == 0: torch.cuda.synchronize()
torch.cuda.synchronize(); stop = True; t.join()
tail = samples[len(samples) // 3:]
print(f"{sys.argv[1]}: {n / 12:.1f} matmuls/s, utilisation {sum(tail) / len(tail):.1f} %")
PY
python3 "$work/burn.py" unlimited | tee "$work/unlimited.txt"
CUDA_DEVICE_SM_LIMIT=30 under_cap three.cache 0 python3 "$work/burn.py" limit-30 | tee "$work/limited.txt"
util=$(sed -n 's/.*utilisation \([0-9.]*\) %/\1/p' "$work/limited.txt")
awk -v u="$util" 'BEGIN { exit !(u >= 25 && u <= 35) }'
result $? "SM limit 30 %: measured ${util} %"
}

section_4() {
echo "== 4. overhead"
# A tiny kernel through PyTorch, bare and with the library, in 3 rounds alternating the three
# (one process each: the library cannot be taken out of a process); each process prints the
# median of 3 timed blocks, and the medians over the rounds are compared (timings on a shared
# machine drift: a single run of each, in a row, cannot tell 5 % from noise).
cat > "$work/launch.py" <<'PY'
import statistics, time, torch
x = torch.zeros(1, device="cuda")
for _ in range(1000): x.add_(1)
torch.cuda.synchronize()
blocks = []
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(50000): x.add_(1)
    torch.cuda.synchronize()
    blocks.append((time.perf_counter() - t0) * 1e6 / 50000)
print(f"{statistics.median(blocks):.3f}")
PY
local round bare=() hooked=() limited=()
for round in 1 2 3; do
    bare+=("$(python3 "$work/launch.py")")
    hooked+=("$(under_cap four.cache 0 python3 "$work/launch.py")")
    limited+=("$(CUDA_DEVICE_SM_LIMIT=90 under_cap five.cache 0 python3 "$work/launch.py")")
    echo "round $round, us per tiny kernel: without the hook ${bare[-1]}, with it ${hooked[-1]}, under a limit of 90 ${limited[-1]}"
done
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
local mb mh ml
mb=$(median3 "${bare[@]}"); mh=$(median3 "${hooked[@]}"); ml=$(median3 "${limited[@]}")
awk -v b="$mb" -v h="$mh" -v l="$ml" 'BEGIN {
    printf "medians: %.3f us bare; the hook adds %.3f us (%.1f %%), under a limit of 90 %.3f us (%.1f %%)\n",
        b, h - b, 100 * (h - b) / b, l - b, 100 * (l - b) / b }'
make -C "$here" -s bench
# cuMemAlloc_v2 + cuMemFree_v2 pairs of 2 MiB (a CUDA allocator's smallest segment) through the
# real driver, 1, 8 and 32 processes at once, 3 rounds alternating bare and under libvgpu: what
# the library's ledger costs beside the driver's own work (make bench's scale figures,
# above, are over the fake, whose allocations cost next to nothing). 4000 / N pairs a process:
# on the H200 a pair took 60-90 us alone and 0.85-0.9 ms with 8 processes at once (2000 pairs
# each at 32 ran past the section's 130 s). Each run under 40 s, timed.
local n ok=0 pb ph t
pairs_run() { # pairs_run N [VAR=VALUE...]: one run in that environment; prints its median
    local n=$1; shift     # figure, nothing if it failed or ran past its time
    timeout -k 5 40 env "$@" "$here/build/alloc-pairs" "$n" $((4000 / n)) 2097152 |
        sed -n 's/.*: \([0-9]*\) ns per pair (median).*/\1/p'
}
for n in 1 8 32; do
    pb=() ph=() t=$(date +%s)
    for round in 1 2 3; do
        pb+=("$(pairs_run "$n")")
        ph+=("$(pairs_run "$n" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_LIMIT=100g \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/pairs-$n-$round.cache")")
        [ -n "${pb[-1]}" ] && [ -n "${ph[-1]}" ] || ok=1 # a run that gave no figure failed
    done
    echo "alloc+free pairs of 2 MiB, $n processes at once, ns per pair (each round's median" \
        "process): bare ${pb[*]}, under libvgpu ${ph[*]} ($(( $(date +%s) - t )) s)"
    awk -v b="$(median3 "${pb[@]}")" -v h="$(median3 "${ph[@]}")" 'BEGIN {
        printf "  medians: %d ns bare, %d under libvgpu: the library adds %d ns (%.1f %%)\n",
            b, h, h - b, (b > 0 ? 100 * (h - b) / b : 0) }'
done
result $ok "alloc-pairs ran bare and under libvgpu with 1, 8 and 32 processes, each a figure"
}

section_5() {
echo "== 5. what NVML shows a process holding under a 2 GiB cap (its context included)"
under_cap six.cache 2g python3 - <<'PY'
import os, sys
import pynvml, torch
MiB = 1 << 20
held = []
try:
    while True:
        held.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    pass
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
# Our pid, or the only process listed (in a pid namespace NVML names us by the host's pid).
mine = [p.usedGpuMemory for p in procs if p.pid == os.getpid()] or \
       [p.usedGpuMemory for p in procs if len(procs) == 1]
print(f"tensors {len(held) * 64} MiB; NVML lists {[(p.pid, p.usedGpuMemory) for p in procs]}")
# 4 MiB of slack: NVML counts 2 MiB pages and the library re-measures context growth above 2 MiB.
sys.exit(0 if mine and mine[0] is not None and mine[0] <= 2048 * MiB + 4 * MiB else 1)
PY
result $? "NVML: the process holds <= 2048 MiB (+ 4 MiB of pages) under a 2 GiB cap (context counted)"
}

section_6() {
echo "== 6. SM shares of two containers at once"
base=$(python3 "$work/share.py" bare 8 | sed -n 's/.*: \([0-9.]*\) kernels.*/\1/p')
echo "bare: $base kernels/s"
[ -n "$base" ] || { result 1 "the bare run measured nothing"; return; }
# Both tenants start at the same moment, as pods do (when their contexts appear together each
# learns its host pid from an allocation instead; the log lines say which), and measure the
# same window. Each tenant's debug log (NVML's samples, the rate, holds) goes to $work/NAME.log,
# kept when a check fails (set TMPDIR to a folder that outlives the machine); its info, warning
# and error lines are shown, and the end of both logs when a check of the pair fails.
# Each pair runs SECTION6_SECONDS (24), measured over the second half: NVML gives each sample
# period to one process on the H200, which tells a share of 30 to about 6 points in 10 s
# (README, "One bit a sample, over the fake"); longer pairs tell it closer.
local seconds=${SECTION6_SECONDS:-24}
tenant() { # tenant NAME LIMIT: one container (its own region) with SM limit LIMIT ("none"),
           # or a process without libvgpu (LIMIT "bare")
    local limit=$2
    if [ "$limit" = bare ]; then
        python3 "$work/share.py" "$1" "$seconds" "$base" 2>"$work/$1.log"; return
    fi
    [ "$limit" = none ] && limit=0
    LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_SM_LIMIT=$limit under_cap "$1.cache" 0 \
        python3 "$work/share.py" "$1" "$seconds" "$base" 2>"$work/$1.log"
}
pair() { # pair A B: both tenants at once; sets sa and sb, their shares of the bare rate
    export SHARE_T0 SHARE_PID_DIR=$work; SHARE_T0=$(date +%s.%N)
    tenant "a-$1-$2" "$1" >"$work/a.txt" & local pa=$!
    tenant "b-$1-$2" "$2" >"$work/b.txt" & local pb=$!
    python3 "$work/nvml_samples.py" "$SHARE_T0" "$seconds" "$work" "a-$1-$2" "b-$1-$2" \
        >"$work/samples.txt" 2>&1 & local ps=$!
    wait $pa $pb; wait $ps
    unset SHARE_T0 SHARE_PID_DIR
    grep -hE ' (INFO|WARN|ERROR) ' "$work/a-$1-$2.log" "$work/b-$1-$2.log"
    cat "$work/a.txt" "$work/b.txt" "$work/samples.txt"
    sa=$(share_of a); sb=$(share_of b)
    na=$(nvml_share "a-$1-$2"); nb=$(nvml_share "b-$1-$2")
}
# What NVML said a tenant used over the measured half, asked once (nvml_samples.py); empty when
# it was not read.
nvml_share() {
    sed -n "s/^NVML's average over the measured half, $1 (pid [0-9]*): \([0-9.]*\) %$/\1/p" \
        "$work/samples.txt"
}
# What NVML's per-process samples said of each tenant over the measured half: the library's
# SM limiter reads them (one period at a time: 0 % or about the whole GPU's use on the H200).
# Printed beside the throughput shares, and NVML's own average over the half checked against
# the tenant's part: the limiter holding its input there while the kernels miss theirs is NVML's
# attribution, not the limiter. The raw samples go to $work/samples-A-B.txt (pid, stamp in us,
# smUtil).
cat > "$work/nvml_samples.py" <<'PY'
import os, sys, time, pynvml
t0, seconds, work, names = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
seen, last, average = {}, 0, None
half = (t0 + seconds / 2) * 1e6
while time.time() < t0 + seconds + 0.5:
    try:
        # From a second before the newest stamp seen: a process's sample stamped before
        # another's newest, and read after it, still comes in (kept once, by pid and stamp).
        for x in pynvml.nvmlDeviceGetProcessUtilization(h, max(0, last - 1000000)):
            seen[(x.pid, x.timeStamp)] = x.smUtil
            last = max(last, x.timeStamp)
    except pynvml.NVMLError:
        pass  # no sample newer than last
    # Asked since a time, NVML reads "utilization since" then (nvml.h): once, just before the
    # tenants end (a process gone may have no sample left), NVML's own average over the half.
    # (It assumes the driver keeps the half's samples; should it return several for a process,
    # the latest stamp's is taken, as libvgpu does.)
    if average is None and time.time() >= t0 + seconds - 0.4:
        try:
            latest = {}
            for x in pynvml.nvmlDeviceGetProcessUtilization(h, int(half)):
                if x.pid not in latest or x.timeStamp > latest[x.pid][0]:
                    latest[x.pid] = (x.timeStamp, x.smUtil)
            average = {pid: util for pid, (_, util) in latest.items()}
        except pynvml.NVMLError as e:
            average = False
            print(f"NVML's average over the measured half: not read ({e})")
    time.sleep(0.05)
with open(f"{work}/samples-{names[0][2:]}.txt", "w") as f:
    for (pid, stamp), util in sorted(seen.items(), key=lambda kv: kv[0][1]):
        f.write(f"{pid} {stamp} {util}\n")
periods = sorted({stamp for (_, stamp) in seen if stamp >= half})  # a stamp: a period's end
# Whether every process's sample of a period carries one stamp (as the fake's do): if not, the
# stamps come closer than a period and "periods" below counts each process's apart.
gaps = sorted(b - a for a, b in zip(periods, periods[1:]))
if gaps:
    print(f"NVML sample stamps in the measured half: {len(periods)} distinct, the closest "
          f"{gaps[0] / 1000:.1f} ms apart, the median gap {gaps[len(gaps) // 2] / 1000:.1f} ms")
for name in names:
    try:
        pid = int(open(f"{work}/{name}.pid").read())
    except (OSError, ValueError):
        print(f"NVML samples of {name}: its pid unknown"); continue
    if average:  # a process without a sample had no utilisation in the half
        print(f"NVML's average over the measured half, {name} (pid {pid}): {average.get(pid, 0)} %")
    v = [u for (p, stamp), u in seen.items() if p == pid and stamp >= half]
    if not v:
        print(f"NVML samples of {name} (pid {pid}): none in the measured half"); continue
    # Each reading is NVML's average over the second before it: the count says in how many
    # periods NVML had a sample of this process (one process a period on the H200).
    print(f"NVML samples of {name} (pid {pid}) in the measured half: {len(v)} of "
          f"{len(periods)} periods, smUtil mean {sum(v) / len(v):.1f} % ({sum(v) / len(periods):.1f}"
          f" over all periods), 0 in {100 * sum(u == 0 for u in v) / len(v):.0f} %, "
          f">= 90 in {100 * sum(u >= 90 for u in v) / len(v):.0f} %")
PY
# Each limited tenant's host pid as libvgpu learnt it (NVML's name for it, read beside the
# other's start) must be its own: gpu-check.sh runs on the machine itself, in no pid namespace
# (the H200 runs' logs name each tenant's own). Over the fake, a tenant that took the other's
# pid was charged the other's GPU time and held back for good (tests/run.sh,
# contention-30-60-slow-context). A tenant without a limit has no pid to learn.
own_pids() { # own_pids A B
    local t pid host wrong=
    for t in "a-$1-$2" "b-$1-$2"; do
        pid=$(sed -n 's/^\[vgpu INFO pid \([0-9]*\)\] SM limit active.*/\1/p' "$work/$t.log" |
            head -n 1)
        [ -n "$pid" ] || continue
        host=$(sed -n "s/^\[vgpu INFO pid $pid\] host pid \([0-9]*\) .*/\1/p" "$work/$t.log" |
            head -n 1)
        [ "$host" = "$pid" ] || wrong+=" $t (pid $pid) learnt ${host:-none}"
    done
    [ -z "$wrong" ]
    result $? "limits $1 / $2: each limited tenant learnt its own pid as NVML's name for \
it${wrong:+:$wrong}"
}
logs_of() { # logs_of A B: the end of both tenants' logs, after a failed check
    local t; for t in "a-$1-$2" "b-$1-$2"; do echo "-- $work/$t.log, last lines:"; tail -n 8 "$work/$t.log"; done
}
sum_of() { awk -v a="$1" -v b="$2" 'BEGIN { print a + b }'; }
part_of() { awk -v l="$1" -v t="$2" 'BEGIN { printf "%.1f", l * t / 100 }'; } # part_of L T: L % of T
# Two processes of different containers are time-sliced on the GPU, and switching costs: on the
# H200 (hook/results/gpu-check-h200-2026-11-28-b.txt) two processes without libvgpu did 89.7 %
# of one process's rate together, where the issue asks 95 of two tenants under it. So that pair
# runs first: where two tenants' limits fill the GPU, a limited tenant is expected to get its
# limit's part of what that pair did together, and an unlimited one at least what the other
# leaves of it (the issue's figures are printed beside). Where their limits leave some of the
# GPU idle, each is expected to get its limit.
pair bare bare
[ -n "$sa" ] && [ -n "$sb" ]
result $? "two processes without libvgpu each measured (${sa:-none} / ${sb:-none} %)" || {
    logs_of bare bare; return; }
local together; together=$(sum_of "$sa" "$sb")
awk -v t="$together" 'BEGIN { exit !(t >= 75 && t <= 105) }'
result $? "two processes without libvgpu: $together % together (one alone: 100; 75-105 expected)" ||
    return
for limits in "30 60" "50 50" "30 none" "20 20"; do
    set -- $limits
    pair "$1" "$2"
    local want_b=$2; [ "$2" = none ] && want_b=$((100 - $1))
    own_pids "$1" "$2" || { logs_of "$1" "$2"; continue; }
    if [ -z "$sa" ] || [ -z "$sb" ]; then
        result 1 "limits $1 / $2: a tenant measured nothing (${sa:-none} / ${sb:-none} %)"
        logs_of "$1" "$2"; continue
    fi
    local bad=0 filled=0 scale=100 why="their limits"
    if [ $(($1 + want_b)) -ge 100 ]; then
        filled=1 scale=$together why="$1 / $want_b % of the $together % two processes do"
        [ "$2" = none ] && why="$1 % of the $together % two processes do"
    fi
    local ea eb
    ea=$(part_of "$1" "$scale")
    if [ "$2" = none ]; then
        # No limit is no part to keep to: taking more than the other leaves is the GPU kept busy.
        eb=$(awk -v t="$together" -v a="$ea" 'BEGIN { printf "%.1f", t - a - 5 }')
        within "$sa" "$ea" && awk -v s="$sb" -v e="$eb" 'BEGIN { exit !(s >= e) }'
        result $? "limits $1 / $2: shares $sa / $sb %, expected $ea / >= $eb ($why; \
the unlimited one what the other leaves, less 5)" || bad=1
    else
        eb=$(part_of "$want_b" "$scale")
        within "$sa" "$ea" && within "$sb" "$eb"
        result $? "limits $1 / $2: shares $sa / $sb %, expected $ea / $eb ($why)" || bad=1
    fi
    if [ "$filled" = 1 ]; then
        local sum; sum=$(sum_of "$sa" "$sb")
        awk -v s="$sum" -v t="$together" 'BEGIN { exit !(s >= t - 5) }'
        result $? "limits $1 / $2: the GPU busy $sum % together (>= $together - 5)" || bad=1
        if [ "$2" = none ]; then
            echo "   the issue's figures, printed only: 30 + unlimited -> 30 / >= 65, here $sa / $sb"
        else
            echo "   the issue's figures, printed only: 50/50 with >= 95 together, here $sum"
        fi
    fi
    # The limiter's input: NVML's own average over the half, in NVML's terms: the account holds
    # a tenant's NVML share at its limit (beside an unlimited tenant too), and where two limits
    # fill the GPU each gets its limit's part of what NVML saw the two use together. On the
    # H200 NVML gave each 200 ms period to one process, so over a measured half of 12 s its
    # figure for a tenant is a count of some 60 coin tosses: the kernels a tenant ran may differ
    # from it by several points while the limiter holds it (hook/README.md, "Fourth run").
    if [ -n "$na" ] && [ -n "$nb" ]; then
        local seen pa pb="$want_b"
        seen=$(sum_of "$na" "$nb")
        pa=$1
        [ "$filled" = 1 ] && [ "$2" != none ] &&
            { pa=$(part_of "$1" "$seen"); pb=$(part_of "$want_b" "$seen"); }
        [ "$2" = none ] && pb="(no limit)"
        within "$na" "$pa" && { [ "$2" = none ] || within "$nb" "$pb"; }
        result $? "limits $1 / $2: NVML's average over the half $na / $nb %, expected $pa / $pb \
($seen together): the limiter held what it reads" || bad=1
        echo "   kernels run less NVML's figure: $(sum_of "$sa" "-$na") / $(sum_of "$sb" "-$nb") points"
    else
        echo "   NVML's average over the half not read: the limiter's input not checked"
    fi
    [ "$bad" = 0 ] || logs_of "$1" "$2"
done
}

section_7() {
echo "== 7. CUDA graph replay under a 25 % limit"
gbase=$(python3 "$work/share.py" graph-bare 8 | sed -n 's/.*: \([0-9.]*\) kernels.*/\1/p')
CUDA_DEVICE_SM_LIMIT=25 under_cap graph.cache 0 python3 "$work/share.py" graph-25 20 "$gbase" | tee "$work/g.txt"
gs=$(share_of g)
within "$gs" 25
result $? "graph replay at limit 25: $gs %"
}

section_8() {
echo "== 8. CUDA graphs made or changed through the driver API, under a 25 % limit"
# Each case: an unlimited tenant, then one at 25 %, replaying ten 2000-block kernels of real PTX
# (each graph first shown, by a counter its kernels add to, to run all 20000 blocks); the
# second's kernels/s must be 20-30 % of the first's. destroy-refused needs the fake.
for abi in flags v1 v2-update update-refused update-set update-enable set-params set-params-v1 \
        node-set child-set enable-half crowded; do
    mkdir -p "$work/graph-$abi"
    CONTENTION_DIR="$work/graph-$abi" CONTENTION_SETTLE_S=5 CONTENTION_MEASURE_S=5 \
        LD_PRELOAD="$lib" "$here/build/tests/test_contention" graph 25 "$abi" \
        >"$work/graph-$abi.txt" 2>&1
    rc=$?
    grep -v '^ok - usage' "$work/graph-$abi.txt"
    result $rc "graph made by $abi at limit 25"
done
}

section_9() {
echo "== 9. memory the driver frees or keeps without a free call, under a 2 GiB cap"
# Driver API through ctypes (its dlsym resolves to libvgpu's). What mem_get_info leaves less
# 256 MiB must fit before cudaDeviceReset (cuDevicePrimaryCtxReset) and after it; then, with
# 256 MiB plain and 256 MiB stream-ordered held in the primary context, a created context's
# allocation and the context itself must come back after cuCtxDestroy, and the held ones stay
# counted (stream-ordered memory is no context's: cuda.h).
cat > "$work/teardown.py" <<'PY'
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
MiB = 1 << 20
def call(what, *args):
    rc = getattr(cuda, what)(*args)
    if rc != 0:
        print(f"{what}: CUresult {rc}"); sys.exit(1)
def free_now():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value
def alloc(size, api="cuMemAlloc_v2"):
    ptr = ctypes.c_uint64()
    args = (ctypes.c_void_p(None),) if api == "cuMemAllocAsync" else ()
    call(api, ctypes.byref(ptr), ctypes.c_size_t(size), *args)
    return ptr
def fill(label):
    free, total = free_now()
    print(f"{label}: {free // MiB} MiB free of a {total // MiB} MiB cap")
    if free <= 256 * MiB:
        print("  not even 256 MiB free: what was freed is still counted"); sys.exit(1)
    alloc(free - 256 * MiB)
    print(f"  {(free - 256 * MiB) // MiB} MiB allocated")
    return free - 256 * MiB
dev, ctx, made = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
def primary():
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev); call("cuCtxSetCurrent", ctx)
call("cuInit", 0); call("cuDeviceGet", ctypes.byref(dev), 0)
primary()
first = fill("primary context")
call("cuDevicePrimaryCtxReset_v2", dev); primary()
again = fill("after cudaDeviceReset")
call("cuDevicePrimaryCtxReset_v2", dev); primary()
alloc(256 * MiB); alloc(256 * MiB, "cuMemAllocAsync"); call("cuCtxSynchronize")
before, _ = free_now()
call("cuCtxCreate_v2", ctypes.byref(made), 0, dev)
inside = alloc(before // 4)
call("cuCtxDestroy_v2", made); call("cuCtxSetCurrent", ctx)
after, _ = free_now()
print(f"free {before // MiB} MiB before a created context took {before // 4 // MiB} MiB, "
      f"{after // MiB} MiB after cuCtxDestroy")
ok = again >= first - 64 * MiB and abs(after - before) <= 64 * MiB
sys.exit(0 if ok else 1)
PY
LIBCUDA_LOG_LEVEL=3 under_cap nine.cache 2g python3 "$work/teardown.py"
result $? "cudaDeviceReset and cuCtxDestroy give back what they free, and only that"
# PyTorch's cudaMallocAsync backend keeps freed memory in the pool (release threshold the
# maximum): 1 GiB freed, then 1 GiB again must fit beside the context under 2 GiB.
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync under_cap ten.cache 2g python3 - <<'PY'
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); del x
torch.cuda.synchronize(); time.sleep(1.5)  # the next allocation measures the pool's cache
y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print(f"1 GiB again: allocated; mem_get_info {[v >> 20 for v in torch.cuda.mem_get_info()]} MiB")
PY
result $? "cudaMallocAsync backend: the pool's cache is not counted twice"
}

section_10() {
echo "== 10. memory held without an allocation to show for it, under a 2 GiB cap"
# Driver API through ctypes; NVML says what the process really holds. (a) 512 MiB created,
# mapped and released stay counted until unmapped (cuda.h: freed when unmapped and released);
# (b) cuCtxCreate until refused: NVML's figure for the process stays within the cap;
# (c) 512 MiB freed with cuMemFreeAsync into a pool that keeps it stay counted: a plain
# allocation of what the cap has left beside them fits, 64 MiB more does not; (d) a graph
# allocating 1 GiB is counted when it runs, and a trim after it is destroyed gives it back;
# (e) a 4 KiB stack a thread is counted at once, an 8 KiB one refused; (f) green contexts until
# refused: NVML's figure within the cap, and what one holds on this GPU.
LIBCUDA_LOG_LEVEL=3 under_cap eleven.cache 2g python3 "$here/tests/gpu_held.py"
result $? "VMM mappings, created contexts, a pool's cache, graph memory, a raised stack and green contexts held within the cap"
}

section_11() {
echo "== 11. the GPU's UUID as CUDA gives it is NVML's (src/devices.c matches limits to GPUs by it)"
# With the plugin's settings file a GPU whose CUDA UUID is not in its NVIDIA_VISIBLE_DEVICES
# (NVML's UUIDs) gets no context: the two must be written alike for every GPU.
under_cap twelve.cache 2g python3 -c 'import torch; torch.ones(1, device="cuda"); torch.cuda.synchronize()'
local recorded listed
recorded=$("$here/build/vgpu-region" "$work/twelve.cache" |
    python3 -c 'import json, sys; print(" ".join(d["uuid"] for d in json.load(sys.stdin)["devices"] if d["uuid"]))')
listed=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr 'A-Z' 'a-z' | tr -d ' ')
echo "CUDA's UUIDs as recorded: ${recorded:-none}; NVML's: $(echo $listed)"
local ok=1 uuid
for uuid in $recorded; do
    grep -qx "$(echo "$uuid" | tr 'A-Z' 'a-z')" <<<"$listed" || ok=0
done
[ -n "$recorded" ] && [ "$ok" = 1 ]; result $? "every GPU's UUID, as libvgpu writes CUDA's, is one NVML lists"
}

section_12() {
echo "== 12. SM limit 50 %: a light load, then large kernels"
# Small matmuls every 100 ms keep the limiter's rate low (it follows demand); a large kernel's
# blocks then made a debt that held the next launch back for minutes on an idle GPU (over the
# fake: more than 60 s). The GPU-time account forgives a debt the measured share does not back.
cat > "$work/burst.py" <<'PY'
import sys, time, torch
small = torch.randn(64, 64, device="cuda")
big = torch.randn(8192, 8192, device="cuda")
def large():
    global big
    big = (big @ big).clamp_(-1, 1)
    torch.cuda.synchronize()
large()  # cuBLAS's set-up, in the period that runs free
if sys.argv[1] == "limited":
    end = time.time() + 3
    while time.time() < end:
        small = (small @ small).clamp_(-1, 1); torch.cuda.synchronize(); time.sleep(0.1)
    large()
    t0 = time.time(); small = (small @ small).clamp_(-1, 1); torch.cuda.synchronize()
    print(f"after a light load, a large kernel held the next back {time.time() - t0:.3f} s")
start, n, n3 = time.time(), 0, None
while time.time() - start < 8:
    large(); n += 1
    if n3 is None and time.time() - start >= 3: n3, t3 = n, time.time()
print(f"large kernels from 3 s on: {(n - n3) / (time.time() - t3):.2f}/s")
PY
python3 "$work/burst.py" bare | tee "$work/burst-bare.txt"
CUDA_DEVICE_SM_LIMIT=50 under_cap burst.cache 0 python3 "$work/burst.py" limited |
    tee "$work/burst-limited.txt"
local held bare limited share
held=$(sed -n 's/.*held the next back \([0-9.]*\) s/\1/p' "$work/burst-limited.txt")
bare=$(sed -n 's/.*on: \([0-9.]*\)\/s/\1/p' "$work/burst-bare.txt")
limited=$(sed -n 's/.*on: \([0-9.]*\)\/s/\1/p' "$work/burst-limited.txt")
awk -v h="${held:-99}" 'BEGIN { exit !(h < 1.0) }'
result $? "after a light load, a large kernel holds the next one back ${held:-?} s (< 1 s)"
share=$(awk -v l="${limited:-0}" -v b="${bare:-0}" 'BEGIN { printf "%.1f", (b > 0 ? 100 * l / b : 0) }')
within "$share" 50; result $? "back-to-back large kernels then get ${share} % of the bare rate (50 ± 5)"
}

section_13() {
echo "== 13. SM limit 20 %: short-lived processes of one container, one after another"
# Each ran free until NVML first measured it and exited before its samples were read: over the
# fake, 94 % of an unlimited tenant's rate (tests/test_contention.c, chain). Each link's context
# and module load count in its time, so links run 0.5 s of kernels here (the same chain
# unlimited must read above the limit for the check to mean anything; the test checks it).
mkdir -p "$work/chain"
CONTENTION_DIR="$work/chain" CONTENTION_SETTLE_S=3 CONTENTION_MEASURE_S=3 CONTENTION_LINK_S=0.5 \
    LD_PRELOAD="$lib" "$here/build/tests/test_contention" chain 20 >"$work/chain.txt" 2>&1
rc=$?
cat "$work/chain.txt"
result $rc "short-lived processes one after another at limit 20"
}

section_14() {
echo "== 14. SM limit 20 %: which waits of PyTorch, CuPy and JAX drain (prepay nothing after)"
# A process that waits on all its work prepays nothing until its next launch (hook/README.md,
# SM limit); over the fake each driver export's wait is a drain case of make test, but which
# exports a framework's waits reach is known only here. Each way launches kernels, then waits;
# libvgpu's debug line "drained by a wait" between its markers says whether the wait drained.
# "drains": it must; "none": it must not (a kernel on a second stream); "report": printed only
# (JAX waits from another thread than XLA's launches; PyTorch's backward launches from the
# autograd thread, after which, by design, nothing of the process drains again).
cat > "$work/drains.py" <<'PY'
# drains.py FRAMEWORK [smoke]: each way "NAME EXPECT" launches kernels, then waits; markers on
# fd 2 ("smoke": the set-up alone, one kernel and its wait, then exit).
import os, sys
def mark(text): os.write(2, (text + "\n").encode())
def run(ways):
    for name, expect, body in ways:
        mark(f"way {name} {expect}: begin")
        try: body()
        except Exception as e: mark(f"way {name}: error {type(e).__name__}: {e}")
        mark(f"way {name}: end")
framework, smoke = sys.argv[1], sys.argv[2:] == ["smoke"]
if framework == "torch":
    import torch
    mark(f"note: torch {torch.__version__}, CUDA {torch.version.cuda}")
    x = torch.randn(1024, 1024, device="cuda"); torch.cuda.synchronize()
    if smoke: sys.exit(0)
    def k():
        global x
        x = (x @ x).clamp_(-1, 1)
    def event(wait):
        k(); e = torch.cuda.Event(); e.record(); wait(e)
    def query(e):
        while not e.query(): pass
    def side_stream():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s): (x @ x).clamp_(-1, 1)
        k(); torch.cuda.current_stream().synchronize(); s.synchronize()
    def backward():
        w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        (x @ w).sum().backward(); torch.cuda.synchronize()
    run([("torch.cuda.synchronize", "drains", lambda: (k(), torch.cuda.synchronize())),
         ("torch-stream.synchronize", "drains",
          lambda: (k(), torch.cuda.current_stream().synchronize())),
         ("torch-event.synchronize", "drains", lambda: event(lambda e: e.synchronize())),
         ("torch-event.query", "drains", lambda: event(query)),
         ("torch-item", "drains", lambda: (k(), x.sum().item())),
         ("torch-cpu", "drains", lambda: (k(), x.cpu())),
         ("torch-side-stream", "none", side_stream),
         ("torch-backward", "report", backward)])  # last: the autograd thread launched
elif framework == "cupy":
    import cupy
    mark(f"note: cupy {cupy.__version__}")  # asnumpy's copy differs between versions
    x = cupy.random.rand(1024, 1024, dtype=cupy.float32); cupy.cuda.Device().synchronize()
    if smoke: sys.exit(0)
    def k():
        global x
        x = cupy.clip(x @ x, -1, 1)
    run([("cupy-device.synchronize", "drains", lambda: (k(), cupy.cuda.Device().synchronize())),
         ("cupy-stream.synchronize", "drains",
          lambda: (k(), cupy.cuda.get_current_stream().synchronize())),
         ("cupy-asnumpy", "drains", lambda: (k(), cupy.asnumpy(x)))])
else:
    import jax, jax.numpy as jnp, numpy
    mark(f"note: JAX runs on {jax.devices()}")  # a CPU fallback would drain nothing
    x = jnp.ones((1024, 1024)); f = jax.jit(lambda a: jnp.clip(a @ a, -1, 1))
    f(x).block_until_ready()
    if smoke: sys.exit(0)
    run([("jax-block_until_ready", "report", lambda: f(x).block_until_ready()),
         ("jax-asarray", "report", lambda: numpy.asarray(f(x)))])
PY
local framework rc name expect n err
for framework in torch cupy jax; do
    # A framework not installed, or that cannot run a kernel without libvgpu, is this machine's
    # matter, not the library's: skipped, said so.
    if ! python3 "$work/drains.py" "$framework" smoke >"$work/smoke-$framework.txt" 2>&1; then
        echo "$framework: not installed, or no kernel ran without libvgpu; its ways not run"
        tail -n 3 "$work/smoke-$framework.txt"; continue
    fi
    XLA_PYTHON_CLIENT_PREALLOCATE=false CUDA_DEVICE_SM_LIMIT=20 LIBCUDA_LOG_LEVEL=4 \
        under_cap "drains-$framework.cache" 0 python3 "$work/drains.py" "$framework" \
        >"$work/drains-$framework.txt" 2>&1
    rc=$?
    # NAME EXPECT DRAINS [ERROR] a way, from its markers and the lines between them
    awk '/^way .*: begin$/ { name = $2; expect = $3; sub(/:$/, "", expect); n = 0; err = "" }
         /drained by a wait/ { n++ }
         /^way .*: error / { err = $0; sub(/^way [^ ]*: /, "", err) }
         /^way .*: end$/ { print name, expect, n, err }' "$work/drains-$framework.txt" \
        >"$work/drains-$framework.ways"
    sed -n 's/^note: //p' "$work/drains-$framework.txt"
    [ "$rc" = 0 ] && [ -s "$work/drains-$framework.ways" ]
    result $? "$framework: its ways ran (exit $rc)" ||
        tail -n 20 "$work/drains-$framework.txt"
    while read -r name expect n err; do
        case "$expect" in
        drains) [ -z "$err" ] && [ "$n" -gt 0 ]
                result $? "$name: the wait drained ($n drain lines${err:+; $err})" ;;
        none) [ -z "$err" ] && [ "$n" = 0 ]
              result $? "$name: the wait did not drain ($n drain lines${err:+; $err})" ;;
        *) echo "$name: $n drain lines${err:+ ($err)}, printed only" ;;
        esac
    done <"$work/drains-$framework.ways"
done
}

section_15() {
echo "== 15. SM limit 25 %: a process that only sets memory (cudaMemsetAsync through CuPy)"
# A memset is a kernel the driver writes (src/cuda_memset.c): it passes the limiter's gate as a
# launch does. 1 GiB a memset, a synchronisation every 4; its rate over the second half of the
# run against the same loop bare, and NVML's whole-GPU utilisation meanwhile.
cat > "$work/memset.py" <<'PY'
import sys, threading, time
import cupy, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
name, seconds = sys.argv[1], float(sys.argv[2])
size = 1 << 30
buf = cupy.empty(size, dtype=cupy.uint8)
stream = cupy.cuda.get_current_stream()
samples, stop = [], False
def sample():
    while not stop:
        samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        time.sleep(0.2)
t = threading.Thread(target=sample); t.start()
start = time.time(); n = 0; n_half = None
while time.time() - start < seconds:
    cupy.cuda.runtime.memsetAsync(buf.data.ptr, n & 0xff, size, stream.ptr); n += 1
    if n % 4 == 0: stream.synchronize()
    if n_half is None and time.time() - start >= seconds / 2:
        stream.synchronize(); n_half, t_half = n, time.time()
stream.synchronize(); rate = (n - n_half) / (time.time() - t_half); stop = True; t.join()
util = [u for (at, u) in samples if at >= t_half]
print(f"{name}: {rate:.1f} memsets/s, utilisation {sum(util) / max(len(util), 1):.1f} %")
PY
if ! python3 -c 'import cupy' 2>/dev/null; then echo "cupy: not installed; section 15 not run"; return; fi
python3 "$work/memset.py" bare 6 | tee "$work/memset-bare.txt"
CUDA_DEVICE_SM_LIMIT=25 under_cap memset.cache 0 python3 "$work/memset.py" limit-25 12 |
    tee "$work/memset-limited.txt"
local bare limited share
bare=$(sed -n 's/.*: \([0-9.]*\) memsets.*/\1/p' "$work/memset-bare.txt")
limited=$(sed -n 's/.*: \([0-9.]*\) memsets.*/\1/p' "$work/memset-limited.txt")
share=$(awk -v b="$bare" -v l="$limited" 'BEGIN { if (b > 0) printf "%.1f", 100 * l / b }')
[ -n "$share" ] && within "$share" 25
result $? "memsets under an SM limit of 25 %: ${share:-?} % of the bare rate"
}

section_16() {
echo "== 16. SM limit 25 %: matmuls beside a thread making calls the driver refuses"
# A call the driver refuses queues nothing and takes no tokens (SM limit, hook/README.md):
# taken at the gate, such calls lifted the limit (33bd322); given back after the answer, a
# control step that found one under way did (d914621, 94.5 % over the fake). A second thread
# sets 2^60 bytes at address 0 and launches a grid 65536 blocks down, in a loop, through the
# driver API; the first runs 4096^2 matmuls. Its rate over the second half against the same
# loop bare.
cat > "$work/refused.py" <<'PY'
import ctypes, sys, threading, time
import torch
name, seconds, spin = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "spin"
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
a = torch.randn(4096, 4096, device="cuda")
stop, refusals, answers = False, [0], set()
def refuse():
    torch.zeros(1, device="cuda"); torch.cuda.synchronize() # the context current here too
    while not stop:
        for rc in (cuda.cuMemsetD8_v2(0, 0, 1 << 60),
                   cuda.cuLaunchKernel(None, 0x7fffffff, 65536, 1, 128, 1, 1, 0, None, None, None)):
            refusals[0] += rc != 0; answers.add(rc)
t = threading.Thread(target=refuse)
if spin: t.start()
start = time.time(); n = 0; n_half = None
while time.time() - start < seconds:
    a = (a @ a).clamp_(-1, 1); n += 1
    if n % 8 == 0: torch.cuda.synchronize()
    if n_half is None and time.time() - start >= seconds / 2:
        torch.cuda.synchronize(); n_half, t_half = n, time.time()
torch.cuda.synchronize(); rate = (n - n_half) / (time.time() - t_half); stop = True
if spin: t.join()
print(f"{name}: {rate:.1f} matmuls/s, {refusals[0]} calls refused (answers {sorted(answers)})")
PY
python3 "$work/refused.py" bare 8 none | tee "$work/refused-bare.txt"
CUDA_DEVICE_SM_LIMIT=25 under_cap refused.cache 0 python3 "$work/refused.py" limit-25 12 spin |
    tee "$work/refused-limited.txt"
local bare limited share count
bare=$(sed -n 's/.*: \([0-9.]*\) matmuls.*/\1/p' "$work/refused-bare.txt")
limited=$(sed -n 's/.*: \([0-9.]*\) matmuls.*/\1/p' "$work/refused-limited.txt")
count=$(sed -n 's/.* \([0-9]*\) calls refused.*/\1/p' "$work/refused-limited.txt")
share=$(awk -v b="$bare" -v l="$limited" 'BEGIN { if (b > 0) printf "%.1f", 100 * l / b }')
[ "${count:-0}" -gt 0 ]
result $? "the driver refused the second thread's calls (${count:-0})"
[ -n "$share" ] && within "$share" 25
result $? "matmuls under 25 % beside refused calls: ${share:-?} % of the bare rate"
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
for section in "${sections[@]}"; do
    declare -F "section_$section" >/dev/null || { echo "gpu-check: no section $section"; exit 2; }
    "section_$section"
done
exit $failed
