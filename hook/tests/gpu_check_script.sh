#!/usr/bin/env bash
# gpu_check_script.sh - gpu-check.sh's own arithmetic, without a GPU: sections 6 and 12 read
# canned outputs through stand-ins for python3 and nvidia-smi on PATH, and must say PASS or FAIL
# as their figures deserve. The canned rates are those of the H200 run of 2026-11-28
# (hook/README.md, "On a real GPU"); there, section 12 printed FAIL with an empty share (awk took
# `printf ..., b > 0 ? ...` for output to a file named 0) over figures that pass.
set -u
unset LD_PRELOAD
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/vgpu-gpu-check-script.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
printf '#!/bin/sh\necho "GPU 0: stand-in"\n' >"$tmp/bin/nvidia-smi"
# python3: share.py NAME SECONDS BASE and burst.py MODE print what $CANNED says for NAME or MODE
# ("NAME RATE" lines; burst-limited also "held SECONDS"); `-c` (the import checks) succeeds.
cat >"$tmp/bin/python3" <<'EOF'
#!/bin/bash
rate() { awk -v n="$1" '$1 == n { print $2 }' "$CANNED"; }
case "$1" in
-c) exit 0 ;;
*share.py)
    r=$(rate "$2")
    if [ "$2" = bare ]; then echo "bare: $r kernels/s"; exit 0; fi
    awk -v n="$2" -v r="$r" -v b="$4" 'BEGIN { printf "%s: %.1f kernels/s, %.1f %%\n", n, r, 100 * r / b }' ;;
*burst.py)
    [ "$2" = limited ] && echo "after a light load, a large kernel held the next back $(rate held) s"
    echo "large kernels from 3 s on: $(rate "burst-$2")/s" ;;
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

failed=0
# check NAME PATTERN CANNED SECTION...: gpu-check.sh's output must match every line of PATTERN.
check() {
    local name=$1 patterns=$2 canned=$3; shift 3
    printf '%s\n' "$canned" >"$tmp/canned"
    local out
    out=$(TMPDIR="$tmp" CANNED="$tmp/canned" PATH="$tmp/bin:$PATH" bash "$here/gpu-check.sh" "$@" 2>&1)
    local missing
    missing=$(while IFS= read -r p; do grep -qF -- "$p" <<<"$out" || echo "$p"; done <<<"$patterns")
    if [ -z "$missing" ]; then
        echo "ok - $name"
    else
        echo "not ok - $name: missing"; echo "$missing"; echo "--- output"; echo "$out"; failed=1
    fi
}

check "H200 figures: section 12 computes its share (51.1 %) and passes" \
    "PASS after a light load, a large kernel holds the next one back 0.031 s (< 1 s)
PASS back-to-back large kernels then get 51.1 % of the bare rate (50 ± 5)" "$h200" 12
check "H200 figures: section 6 expects each limit's part of what two bare processes do" \
    "PASS two processes without libvgpu: 45.1 / 45.6 %, 90.7 % together
PASS limits 30 / 60: shares 29.5 / 56.4 %, expected 27.2 / 54.4
PASS limits 50 / 50: shares 44.9 / 45.3 %, expected 45.4 / 45.4
PASS limits 50 / 50: the GPU busy 90.2 % together (>= 90.7 - 5
PASS limits 30 / none: shares 28.6 / 64.4 %, expected 27.2 / 63.5
PASS limits 20 / 20: shares 17.6 / 22.6 %, expected 18.1 / 18.1" "$h200" 6
# The first 50/50 pair of that run: one tenant got 37.4 % where 45 was its part.
check "a tenant held 8 points under its part fails" \
    "FAIL limits 50 / 50: shares 37.3 / 53.1 %" "$(sed -e 's/^a-50-50 .*/a-50-50 17.2/' \
    -e 's/^b-50-50 .*/b-50-50 24.5/' <<<"$h200")" 6
check "two tenants leaving the GPU idle fail the busy check" \
    "FAIL limits 30 / none: the GPU busy 76.3 % together" \
    "$(sed -e 's/^b-30-none .*/b-30-none 22.0/' <<<"$h200")" 6
check "a limit of 50 that gave 65 % fails section 12" \
    "FAIL back-to-back large kernels then get 65.6 % of the bare rate" \
    "$(sed -e 's/^burst-limited .*/burst-limited 30.0/' <<<"$h200")" 12
check "a large kernel holding the next back 2 s fails section 12" \
    "FAIL after a light load, a large kernel holds the next one back 2.5 s" \
    "$(sed -e 's/^held .*/held 2.5/' <<<"$h200")" 12
exit $failed
