#!/usr/bin/env bash
# gpu_check_script.sh - gpu-check.sh's own arithmetic, without a GPU: sections 6 and 12 read
# canned outputs through stand-ins for python3 and nvidia-smi on PATH, and must say PASS or FAIL
# as their figures deserve. The canned rates are those of the H200 runs of 2026-11-28
# (hook/README.md, "On a real GPU"): $h200 the first's, but for the pair without libvgpu
# (a-/b-bare-bare), which that run did not have (its 20.8 and 21.0 are invented); $h200b the
# second's section 6, all measured. In the first, section 12 printed FAIL with an empty share
# (awk took `printf ..., b > 0 ? ...` for output to a file named 0) over figures that pass; in
# the second, section 6 failed an unlimited tenant for taking more than 70 % of the pair's rate.
set -u
unset LD_PRELOAD
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/vgpu-gpu-check-script.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
# The nested make asks python3 where the header wheels are: the real one, not the stand-in.
real_python=$(command -v python3)
export LD_LIBRARY_PATH="$here/build/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
printf '#!/bin/sh\necho "GPU 0: stand-in"\n' >"$tmp/bin/nvidia-smi"
# python3: share.py NAME SECONDS BASE and burst.py MODE print what $CANNED says for NAME or MODE
# ("NAME RATE" lines; burst-limited also "held SECONDS"); drains.py FRAMEWORK its canned
# stderr (and exits 1 where CANNED says "crash FRAMEWORK"); `-c` (the import checks) succeeds.
cat >"$tmp/bin/python3" <<'EOF'
#!/bin/bash
rate() { awk -v n="$1" '$1 == n { print $2 }' "$CANNED"; }
case "$1" in
-c) exit 0 ;;
*drains.py) # FRAMEWORK smoke fails where CANNED says "missing FRAMEWORK"; FRAMEWORK alone
    # writes what libvgpu and drains.py would to stderr: CANNED's "stderr-FRAMEWORK LINE"s
    if [ "${3:-}" = smoke ]; then ! grep -qxF "missing $2" "$CANNED"; exit; fi
    sed -n "s/^stderr-$2 //p" "$CANNED" >&2
    ! grep -qxF "crash $2" "$CANNED" ;;
*share.py)
    r=$(rate "$2")
    [ -n "$r" ] || { echo "Traceback: $2 has no canned rate" >&2; exit 1; } # as a crash would
    if [ "$2" = bare ]; then echo "bare: $r kernels/s"; exit 0; fi
    # "hostpid-NAME PID": libvgpu's lines of a limited tenant (pid 4242) naming PID as NVML's
    # name for it ("none": no such line)
    p=$(rate "hostpid-$2")
    if [ -n "$p" ]; then
        echo "[vgpu INFO pid 4242] SM limit active (device 0: 30%)" >&2
        [ "$p" = none ] ||
            echo "[vgpu INFO pid 4242] host pid $p (NVML's name for this process)" >&2
    fi
    awk -v n="$2" -v r="$r" -v b="$4" 'BEGIN { printf "%s: %.1f kernels/s, %.1f %%\n", n, r, 100 * r / b }' ;;
*launch.py) rate launch ;; # µs per tiny kernel
*nvml_samples.py) # NVML's average over the half where CANNED has one ("nvml-NAME FIGURE")
    echo "NVML samples of $5: stand-in"
    for n in "$5" "$6"; do
        r=$(rate "nvml-$n")
        [ -z "$r" ] || echo "NVML's average over the measured half, $n (pid 1): $r %"
    done ;;
*burst.py)
    [ "$2" = limited ] && echo "after a light load, a large kernel held the next back $(rate held) s"
    echo "large kernels from 3 s on: $(rate "burst-$2")/s" ;;
*refused.py) # NAME SECONDS MODE: CANNED's "refused-NAME RATE" and "refused-count N"
    echo "$2: $(rate "refused-$2") matmuls/s, $(rate refused-count) calls refused (answers [1])" ;;
*) echo "python3 stand-in: unexpected $*" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/python3"

h200='bare 46.1
a-bare-bare 20.8
b-bare-bare 21.0
a-30-60 13.6
b-30-60 26.0
a-50-50 20.7
b-50-50 20.9
a-30-none 13.2
b-30-none 29.7
a-20-20 8.1
b-20-20 10.4
burst-bare 45.71
burst-limited 23.38
held 0.031'
h200b='bare 46.3
a-bare-bare 20.7
b-bare-bare 20.8
a-30-60 14.8
b-30-60 26.3
a-50-50 21.6
b-50-50 19.5
a-30-none 12.0
b-30-none 31.7
a-20-20 10.3
b-20-20 8.2'

# The fourth run's second command (2026-11-29, hook/results/gpu-check-h200-2026-11-29-b.txt):
# its throughput shares, as rates over a bare 46.3 that print them (the run read 46.2 and took
# its shares from unrounded rates), and as NVML's figures its sampler's mean readings (each
# NVML's average over the second before it; the one query over the half came after that run).
# The limiter held NVML's figures at the tenants' parts while the kernels two of the pairs ran
# missed theirs by 4.8-8.1 points.
h200c='bare 46.3
a-bare-bare 20.70
b-bare-bare 20.70
a-30-60 11.02
b-30-60 30.0
a-50-50 18.2
b-50-50 24.45
a-30-none 11.99
b-30-none 31.3
a-20-20 8.75
b-20-20 9.58
nvml-a-30-60 28.5
nvml-b-30-60 61.9
nvml-a-50-50 49.2
nvml-b-50-50 45.6
nvml-a-30-none 26.0
nvml-b-30-none 68.7
nvml-a-20-20 18.6
nvml-b-20-20 19.2'

failed=0
# check NAME RC PATTERNS CANNED SECTION...: gpu-check.sh must exit RC (0: every check passed, 1:
# one failed) and print every line of PATTERNS (those starting with ~ as extended regular
# expressions) but those starting with !, which it must not print; with RC 0, no FAIL line.
check() {
    local name=$1 rc=$2 patterns=$3 canned=$4; shift 4
    printf '%s\n' "$canned" >"$tmp/canned"
    local out got
    out=$(TMPDIR="$tmp" CANNED="$tmp/canned" PYTHON="$real_python" PATH="$tmp/bin:$PATH" \
        bash "$here/gpu-check.sh" "$@" 2>&1)
    got=$?
    local missing
    missing=$(while IFS= read -r p; do
        case "$p" in
        '!'*) ! grep -qF -- "${p#!}" <<<"$out" || echo "$p" ;; # a line that must not appear
        '~'*) grep -qE -- "${p#\~}" <<<"$out" || echo "$p" ;; # an extended regular expression
        *) grep -qF -- "$p" <<<"$out" || echo "$p" ;;
        esac
    done <<<"$patterns")
    if [ "$rc" = 0 ] && grep -q '^FAIL' <<<"$out"; then missing+=$'\n(no FAIL line)'; fi
    if [ -z "$missing" ] && [ "$got" = "$rc" ]; then
        echo "ok - $name"
    else
        echo "not ok - $name: exit $got (want $rc); missing:"; echo "$missing"
        echo "--- output"; echo "$out"; failed=1
    fi
}

# Section 16's arithmetic, over invented figures (the bare rate is section 3's on the H200, 366
# matmuls/s): the limited rate's share of the bare one, within 5 of 25, and the second thread's
# calls refused.
refused='refused-bare 366.0
refused-limit-25 92.0
refused-count 52000'
check "section 16: 25.1 % of the bare rate beside refused calls passes" 0 \
    "PASS the driver refused the second thread's calls (52000)
PASS matmuls under 25 % beside refused calls: 25.1 % of the bare rate" "$refused" 16
check "section 16: a limit lifted by refused calls fails" 1 \
    "FAIL matmuls under 25 % beside refused calls: 94.3 % of the bare rate" \
    "$(sed -e 's/^refused-limit-25 .*/refused-limit-25 345.0/' <<<"$refused")" 16
check "section 16: a second thread whose calls were not refused fails" 1 \
    "FAIL the driver refused the second thread's calls (0)" \
    "$(sed -e 's/^refused-count .*/refused-count 0/' <<<"$refused")" 16
check "H200 figures: section 12 computes its share (51.1 %) and passes" 0 \
    "PASS after a light load, a large kernel holds the next one back 0.031 s (< 1 s)
PASS back-to-back large kernels then get 51.1 % of the bare rate (50 ± 5)" "$h200" 12
check "H200 figures: section 6 expects a filled GPU's share of what two bare processes do" 0 \
    "PASS two processes without libvgpu each measured (45.1 / 45.6 %)
PASS two processes without libvgpu: 90.7 % together
PASS limits 30 / 60: shares 29.5 / 56.4 %, expected 30.0 / 60.0 (their limits)
PASS limits 50 / 50: shares 44.9 / 45.3 %, expected 45.4 / 45.4 (50 / 50 % of the 90.7 %
PASS limits 50 / 50: the GPU busy 90.2 % together (>= 90.7 - 5)
the issue's figures, printed only: 50/50 with >= 95 together, here 90.2
PASS limits 30 / none: shares 28.6 / 64.4 %, expected 27.2 / >= 58.5 (30 % of the 90.7 %
PASS limits 30 / none: the GPU busy 93 % together (>= 90.7 - 5)
the issue's figures, printed only: 30 + unlimited -> 30 / >= 65, here 28.6 / 64.4
PASS limits 20 / 20: shares 17.6 / 22.6 %, expected 20.0 / 20.0 (their limits)" "$h200" 6
check "H200 second run: an unlimited tenant taking more than 70 % of the pair passes" 0 \
    "PASS two processes without libvgpu: 89.6 % together
PASS limits 30 / 60: shares 32.0 / 56.8 %, expected 30.0 / 60.0 (their limits)
PASS limits 50 / 50: shares 46.7 / 42.1 %, expected 44.8 / 44.8
PASS limits 30 / none: shares 25.9 / 68.5 %, expected 26.9 / >= 57.7
PASS limits 30 / none: the GPU busy 94.4 % together
PASS limits 20 / 20: shares 22.2 / 17.7 %, expected 20.0 / 20.0
NVML samples of a-bare-bare: stand-in
NVML samples of a-20-20: stand-in" "$h200b" 6
check "an unlimited tenant under what the other leaves fails" 1 \
    "FAIL limits 30 / none: shares 25.9 / 56.2 %, expected 26.9 / >= 57.7" \
    "$(sed -e 's/^b-30-none .*/b-30-none 26.0/' <<<"$h200b")" 6
# The first 50/50 pair of that run: one tenant got 37.4 % where 45 was its part.
check "a tenant held 8 points under its part fails" 1 \
    "FAIL limits 50 / 50: shares 37.3 / 53.1 %
-- $tmp/" "$(sed -e 's/^a-50-50 .*/a-50-50 17.2/' -e 's/^b-50-50 .*/b-50-50 24.5/' <<<"$h200")" 6
check "two tenants leaving the GPU idle fail the busy check" 1 \
    "FAIL limits 30 / none: the GPU busy 76.3 % together" \
    "$(sed -e 's/^b-30-none .*/b-30-none 22.0/' <<<"$h200")" 6
check "a tenant that measured nothing fails, and its pair's busy check is not run" 1 \
    "FAIL limits 30 / none: a tenant measured nothing (28.6 / none %)
!limits 30 / none: the GPU busy
PASS limits 20 / 20" "$(sed -e '/^b-30-none /d' <<<"$h200")" 6
# A tenant that took the other's pid for its own is charged the other's GPU time (over the
# fake it was held back for good), and one that learnt none is limited by the whole GPU's use:
# the pair fails, and its shares are not judged.
check "a limited tenant that learnt another process's pid, or none, fails its pair" 1 \
    "FAIL limits 30 / 60: each limited tenant learnt its own pid as NVML's name for it: a-30-60 \
(pid 4242) learnt 4243
!limits 30 / 60: shares
PASS limits 50 / 50: each limited tenant learnt its own pid as NVML's name for it
PASS limits 50 / 50: shares
FAIL limits 20 / 20: each limited tenant learnt its own pid as NVML's name for it: b-20-20 \
(pid 4242) learnt none" \
    "$(printf '%s\n' "$h200" 'hostpid-a-30-60 4243' 'hostpid-b-30-60 4242' 'hostpid-a-50-50 4242' \
        'hostpid-b-20-20 none')" 6
check "limited tenants that learnt their own pids pass" 0 \
    "PASS limits 30 / 60: each limited tenant learnt its own pid as NVML's name for it
PASS limits 30 / 60: shares 29.5 / 56.4 %" \
    "$(printf '%s\nhostpid-a-30-60 4242\nhostpid-b-30-60 4242' "$h200")" 6
check "a pair without libvgpu that measured one process stops the section" 1 \
    "FAIL two processes without libvgpu each measured (45.1 / none %)
!limits 30 / 60" \
    "$(sed -e '/^b-bare-bare /d' <<<"$h200")" 6
check "a pair without libvgpu doing 60 % together stops the section" 1 \
    "FAIL two processes without libvgpu: 60.6 % together
!limits 30 / 60" \
    "$(sed -e 's/^a-bare-bare .*/a-bare-bare 13.9/' -e 's/^b-bare-bare .*/b-bare-bare 14.0/' <<<"$h200")" 6
check "H200 fourth run: kernels off their parts fail, NVML's figures held at them pass" 1 \
    "FAIL limits 30 / 60: shares 23.8 / 64.8 %, expected 30.0 / 60.0 (their limits)
PASS limits 30 / 60: NVML's average over the half 28.5 / 61.9 %, expected 30 / 60 (90.4 together): the limiter held what it reads
kernels run less NVML's figure: -4.7 / 2.9 points
FAIL limits 50 / 50: shares 39.3 / 52.8 %, expected 44.7 / 44.7
PASS limits 50 / 50: NVML's average over the half 49.2 / 45.6 %, expected 47.4 / 47.4 (94.8 together)
PASS limits 30 / none: NVML's average over the half 26.0 / 68.7 %, expected 30 / (no limit) (94.7 together)
PASS limits 20 / 20: shares 18.9 / 20.7 %
PASS limits 20 / 20: NVML's average over the half 18.6 / 19.2 %, expected 20 / 20" "$h200c" 6
check "NVML's figures off a tenant's part fail: the limiter did not hold its own input" 1 \
    "FAIL limits 50 / 50: NVML's average over the half 58.0 / 36.8 %, expected 47.4 / 47.4" \
    "$(sed -e 's/^nvml-a-50-50 .*/nvml-a-50-50 58.0/' -e 's/^nvml-b-50-50 .*/nvml-b-50-50 36.8/' \
        <<<"$h200c")" 6
check "without NVML's figures the limiter's input is said to be unchecked" 0 \
    "NVML's average over the half not read: the limiter's input not checked
!NVML's average over the half 2" "$h200b" 6
# Section 4 for real over the fake driver (alloc-pairs loads libcuda.so.1 from build/fake), the
# tiny kernel's timings canned: each kind its median of 3 rounds, alloc+free pairs with 1, 8
# and 32 processes bare and under libvgpu, and make bench.
check "section 4 over the fake: medians of the tiny kernel, alloc-pairs and bench" 0 \
    "round 3, us per tiny kernel: without the hook 9.5, with it 9.5, under a limit of 90 9.5
medians: 9.500 us bare; the hook adds 0.000 us (0.0 %)
alloc+free pairs of 2 MiB, 32 processes at once, ns per pair
~medians: [0-9]+ ns bare, [0-9]+ under libvgpu: the library adds -?[0-9]+ ns
PASS alloc-pairs ran bare and under libvgpu with 1, 8 and 32 processes, each a figure
alloc+free pair, 32 processes:" "launch 9.5" 4
check "a limit of 50 that gave 65 % fails section 12" 1 \
    "FAIL back-to-back large kernels then get 65.6 % of the bare rate" \
    "$(sed -e 's/^burst-limited .*/burst-limited 30.0/' <<<"$h200")" 12
check "a large kernel holding the next back 2 s fails section 12" 1 \
    "FAIL after a light load, a large kernel holds the next one back 2.5 s" \
    "$(sed -e 's/^held .*/held 2.5/' <<<"$h200")" 12
# Section 14's reading of a framework's stderr: invented lines (no GPU has run it yet) in the
# forms drains.py and libvgpu write. A way that must drain and logged no drain fails, one that
# must not and logged one fails, a way that raised fails whatever it logged, a framework that is
# not installed or that runs no kernel without libvgpu is said so and skipped, one whose script
# died under libvgpu fails.
drained='[vgpu DEBUG pid 7] device 0: drained by a wait for the context: nothing is prepaid until the next launch'
sections14="stderr-torch way torch.cuda.synchronize drains: begin
stderr-torch [vgpu DEBUG pid 7] device 0: utilisation 3.0% (limit 20%)
stderr-torch $drained
stderr-torch way torch.cuda.synchronize: end
stderr-torch way torch-side-stream none: begin
stderr-torch way torch-side-stream: end
stderr-torch way torch-backward report: begin
stderr-torch way torch-backward: end
stderr-cupy way cupy-asnumpy drains: begin
stderr-cupy $drained
stderr-cupy $drained
stderr-cupy way cupy-asnumpy: end
missing jax"
check "section 14: waits that drained where they must, and not where they must not, pass" 0 \
    "PASS torch: its ways ran (exit 0)
PASS torch.cuda.synchronize: the wait drained (1 drain lines)
PASS torch-side-stream: the wait did not drain (0 drain lines)
torch-backward: 0 drain lines, printed only
PASS cupy-asnumpy: the wait drained (2 drain lines)
jax: not installed, or no kernel ran without libvgpu; its ways not run
!jax: its ways ran" "$sections14" 14
check "section 14: a wait that did not drain where it must, or drained where it must not, fails" 1 \
    "FAIL torch.cuda.synchronize: the wait drained (0 drain lines)
FAIL torch-side-stream: the wait did not drain (1 drain lines)
PASS cupy-asnumpy: the wait drained (2 drain lines)" \
    "$(sed -e '3d' -e "5a stderr-torch $drained" <<<"$sections14")" 14
check "section 14: a way that raised fails, and a framework whose script died fails" 1 \
    "FAIL torch-side-stream: the wait did not drain (0 drain lines; error RuntimeError: CUDA error)
FAIL cupy: its ways ran (exit 1)" \
    "$(sed -e '5a stderr-torch way torch-side-stream: error RuntimeError: CUDA error' \
        <<<"$sections14"; echo "crash cupy")" 14

# gpu-session.sh, the wrapper for a lent machine: each section under its own limit, its output
# and a failed section's folder where such a machine returns them, a section past the deadline
# skipped and said so.
session() { # session NAME CANNED ARGS...: runs gpu-session.sh; sets out and got, names the case
    name=$1; printf '%s\n' "$2" >"$tmp/canned"; shift 2
    rm -rf "$tmp/out"
    out=$(CANNED="$tmp/canned" PYTHON="$real_python" PATH="$tmp/bin:$PATH" \
        bash "$here/gpu-session.sh" "$tmp/out" "$@" 2>&1)
    got=$?
}
verdict() { # verdict STATUS: the session case named last passed (STATUS 0) or failed
    if [ "$1" = 0 ]; then echo "ok - gpu-session: $name"; return; fi
    echo "not ok - gpu-session: $name (exit $got)"; echo "$out"; failed=1
}
session "exit 1, both sections' output in gpu-check.txt, the failed one's folder alone in kept.tgz" \
    "$(sed -e 's/^burst-limited .*/burst-limited 30.0/' <<<"$h200")" 100 12:60 6:60
[ "$got" = 1 ] && grep -qF "FAIL back-to-back large kernels then get 65.6 %" "$tmp/out/gpu-check.txt" &&
    grep -qF -- "-- section 12: exit 1" "$tmp/out/gpu-check.txt" &&
    grep -qF -- "-- section 6: exit 0" "$tmp/out/gpu-check.txt" &&
    tar -tzf "$tmp/out/kept.tgz" | grep -q '/burst-limited.txt$' &&
    ! tar -tzf "$tmp/out/kept.tgz" | grep -q 'a-30-60'
verdict $?
session "a section with under 25 s left is skipped, and the run says it failed" "$h200" 20 12:60
[ "$got" = 1 ] && grep -qF "== section 12 skipped" "$tmp/out/gpu-check.txt" &&
    [ ! -e "$tmp/out/kept.tgz" ]
verdict $?
session "exit 0 when every section passed" "$h200" 300 12:60
[ "$got" = 0 ] && grep -qF -- "-- section 12: exit 0" "$tmp/out/gpu-check.txt"
verdict $?
exit $failed
