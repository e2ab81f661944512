#!/usr/bin/env bash
# gpu-session.sh OUTDIR DEADLINE SECTION:SECONDS... - gpu-check.sh on a machine lent for a few
# minutes: builds once, then runs each SECTION under its own `timeout` of SECONDS (cut to what
# is left of DEADLINE seconds from the start; a section with under 25 s left is skipped and
# says so), so that a wedged section loses only itself and the command ends before its lease.
# Everything printed goes to OUTDIR/gpu-check.txt as well; the work folders of failed sections
# (region files, section 6's tenant logs) are packed into OUTDIR/kept.tgz, one file, for a
# machine that is given back. Example (the H200 run of 2026-11-28, hook/README.md):
#   gpu-session.sh "$OUT" 520 1:90 5:90 2:90 11:60 3:90 6:240 9:90 10:120 12:120 7:120 13:150 4:150
# Exit: 0 when every section that ran passed, 1 otherwise, 2 on bad arguments or a failed build.
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { echo "usage: gpu-session.sh OUTDIR DEADLINE SECTION:SECONDS..." >&2; exit 2; }
out=$1 deadline=$2; shift 2
case "$deadline" in '' | *[!0-9]*) echo "gpu-session: DEADLINE must be seconds" >&2; exit 2 ;; esac
for spec in "$@"; do
    [[ $spec =~ ^[0-9]+:[0-9]+$ ]] || { echo "gpu-session: $spec is not SECTION:SECONDS" >&2; exit 2; }
done
mkdir -p "$out" || exit 2
export PYTHONUNBUFFERED=1
# gpu-check.sh keeps a failed section's folder under $TMPDIR: here, to be packed at the end.
export TMPDIR; TMPDIR=$(mktemp -d /tmp/vgpu-gpu-session.XXXXXX)
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

session() {
    echo "== machine"
    date -u
    nproc
    nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current,memory.total,memory.used \
        --format=csv
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
    echo "== build"
    if ! make -j"$(nproc)" -C "$here" gpu-check-build >"$TMPDIR/make.log" 2>&1; then
        tail -n 40 "$TMPDIR/make.log"; echo "gpu-session: the build failed"; return 2
    fi
    echo "built at $(elapsed) s"
    local spec section limit left rc failed=0
    for spec in "$@"; do
        section=${spec%%:*} limit=${spec#*:}
        left=$((deadline - $(elapsed)))
        if [ "$left" -lt 25 ]; then echo "== section $section skipped: $left s left"; failed=1; continue; fi
        [ "$limit" -gt "$left" ] && limit=$left
        timeout -k 5 "$limit" bash "$here/gpu-check.sh" "$section"
        rc=$?
        echo "-- section $section: exit $rc (limit $limit s) at $(elapsed) s"
        [ "$rc" = 0 ] || failed=1
    done
    echo "== done at $(elapsed) s"
    return $failed
}

session "$@" 2>&1 | tee "$out/gpu-check.txt"
rc=${PIPESTATUS[0]}
kept=("$TMPDIR"/vgpu-gpu-check.*) # gpu-check.sh removes a section's folder when it passed
if [ -e "${kept[0]}" ]; then
    tar -czf "$out/kept.tgz" -C "$TMPDIR" "${kept[@]#"$TMPDIR"/}" &&
        echo "gpu-session: failed sections' folders in $out/kept.tgz"
fi
rm -rf "$TMPDIR"
exit "$rc"
