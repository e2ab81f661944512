#!/bin/bash
# nvml_samples.sh - gpu-check.sh section 6's nvml_samples.py, through pynvml, over the fake NVML:
# two tenants of test_contention (limits 50 / 50) share the fake GPU; the script must find each
# by its pid file, print its samples over the measured half with a mean near its share (the
# fake's samples give each process its time in the period) and NVML's own average over the
# half, say how far apart its stamps come, and write the raw samples. Then two unlimited
# tenants under FAKE_NVML_SAMPLE_WINNER=1 (one bit a sample): what it prints must tell that
# apart (each tenant in some periods only), as the H200's did.
# PYTHON: one with pynvml (make test passes ../.venv's; run.sh skips this test without it).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d /tmp/vgpu-nvml-samples.XXXXXX)
main=
trap 'pkill -P "${main:-0}" 2>/dev/null; kill "${main:-0}" 2>/dev/null; rm -rf "$work"' EXIT
awk '/cat > "\$work\/nvml_samples.py" <</ { f = 1; next } f && /^PY$/ { f = 0 } f' \
    "$here/gpu-check.sh" >"$work/nvml_samples.py"
export LIBCUDA_LOG_LEVEL=0
failed=0
say() { if [ "$1" = 0 ]; then echo "ok - $2"; else echo "not ok - $2"; failed=1; fi; }

# sample NAME A B: a test_contention pair (limits A / B) on a fake GPU of its own, the sampler
# beside it over 4 s; sets out (its output), tenants (their pids) and main (the pair's pid).
sample() {
    local name=$1
    mkdir -p "$work/$name"
    FAKE_GPU_SHARED=$work/$name/gpu.shm CONTENTION_DIR=$work/$name CONTENTION_SETTLE_S=2 \
        CONTENTION_MEASURE_S=3 "$here/build/tests/test_contention" "$2" "$3" \
        >"$work/$name/contention.log" 2>&1 &
    main=$!
    local t0; t0=$(date +%s.%N)
    tenants=()
    for _ in $(seq 50); do # its two tenants, forked at its start
        mapfile -t tenants < <(pgrep -P "$main")
        [ "${#tenants[@]}" -ge 2 ] && break
        sleep 0.1
    done
    echo "${tenants[0]:-}" >"$work/$name/a-50-50.pid"
    echo "${tenants[1]:-}" >"$work/$name/b-50-50.pid"
    out=$(LD_PRELOAD= FAKE_GPU_SHARED=$work/$name/gpu.shm "$python" "$work/nvml_samples.py" \
        "$t0" 4 "$work/$name" a-50-50 b-50-50 c-50-50 2>&1)
    echo "$out"
}

# The fake's exact samples: each tenant has every period, at about half the GPU.
sample exact 50 50
for t in a b; do
    mean=$(sed -n "s/^NVML samples of $t-50-50 (pid [0-9]*) in the measured half: [0-9]* of [0-9]* periods, smUtil mean \([0-9.]*\) %.*/\1/p" <<<"$out")
    awk -v m="${mean:-x}" 'BEGIN { exit !(m ~ /^[0-9.]+$/ && m >= 30 && m <= 70) }'
    say $? "tenant $t: NVML's mean over the measured half ${mean:-missing} % (30-70 over the fake's 50 / 50)"
done
for t in a b; do
    avg=$(sed -n "s/^NVML's average over the measured half, $t-50-50 (pid [0-9]*): \([0-9]*\) %$/\1/p" <<<"$out")
    awk -v m="${avg:-x}" 'BEGIN { exit !(m ~ /^[0-9]+$/ && m >= 30 && m <= 70) }'
    say $? "tenant $t: NVML's average over the measured half, asked once, ${avg:-missing} % (30-70)"
done
gap=$(sed -n 's/^NVML sample stamps in the measured half: [0-9]* distinct, the closest \([0-9.]*\) ms apart.*/\1/p' <<<"$out")
awk -v g="${gap:-x}" 'BEGIN { exit !(g ~ /^[0-9.]+$/ && g >= 100) }'
say $? "the fake's stamps are one a period: the closest ${gap:-missing} ms apart (its period 166)"
grep -q "^NVML samples of c-50-50: its pid unknown$" <<<"$out"
say $? "a tenant without a pid file is said to be unknown"
[ "$(awk -v a="${tenants[0]:-x}" '$1 == a' "$work/exact/samples-50-50.txt" | wc -l)" -ge 3 ]
say $? "raw samples of tenant a written (pid, stamp, smUtil)"
wait "$main"
say $? "the contention pair itself passed"

# One bit a sample (FAKE_NVML_SAMPLE_WINNER=1), two unlimited tenants: what the sampler prints
# must tell it from the above, as the H200's did (hook/README.md, "Fourth run"): each tenant in
# some periods only (one of them in all or none of 15 draws at even odds: 1 in 16 384), its
# readings NVML's averages over the second before each, so mostly under 90 (a second's 6
# periods all one tenant's: 1 in 32; one period at a time, each would be 90 or more), and
# NVML's averages over the half, asked once, adding up to the GPU's whole time (each period
# given whole to one of them), 85-101 %. (Not that no reading is 0, as none was on the H200:
# the fake lists no process in a window it did not run in, so over it that holds of any
# sampler.)
export FAKE_NVML_SAMPLE_WINNER=1
sample one-bit none none
for t in a b; do
    line=$(grep "^NVML samples of $t-50-50 (pid" <<<"$out")
    what="one bit a sample: tenant $t read in some periods only, as averages over a second"
    awk -v l="$line" 'BEGIN {
        ok = match(l, /: [0-9]+ of [0-9]+ periods/)
        split(substr(l, RSTART + 2, RLENGTH - 2), n, " ")
        ok = ok && match(l, />= 90 in [0-9.]+ %/)
        high = substr(l, RSTART + 9, RLENGTH - 11) + 0
        exit !(ok && n[1] > 0 && n[1] < n[3] && high < 50) }'
    say $? "$what (${line#*: })"
done
together=$(sed -n "s/^NVML's average over the measured half, [ab]-50-50 (pid [0-9]*): \([0-9]*\) %$/\1/p" \
    <<<"$out" | awk '{ s += $1; n++ } END { if (n == 2) print s }')
awk -v t="${together:-x}" 'BEGIN { exit !(t ~ /^[0-9]+$/ && t >= 85 && t <= 101) }'
say $? "one bit a sample: NVML's averages over the half, asked once, add up to ${together:-missing} % (85-101)"
wait "$main"
exit $failed
