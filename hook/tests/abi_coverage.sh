#!/usr/bin/env bash
# abi_coverage.sh TYPEDEFS_H... - every ABI a cudaTypedefs.h lists for a name libvgpu.so hooks has
# a wrapper in src/cuda.c's table. cudaTypedefs.h names each ABI PFN_<name>_v<version>[_ptsz]:
# what cuGetProcAddress answers for <name> asked at <version> or later (until the next one), the
# per-thread-stream flavour with _ptsz/_ptds. The library swaps the driver's answer for its
# wrapper only where its table has a HOOK(export, "name", version, per_thread) for that ABI; for
# any other the caller gets the driver's export, unwatched (an allocation uncounted, a wait not
# seen). CUDA 13's PFN_cuCtxSynchronize_v13000 (the context named: a runtime built for 13.0 asks
# for cuCtxSynchronize and gets cuCtxSynchronize_v2) had none before 11a15db.
set -u
unset LD_PRELOAD
here=$(cd "$(dirname "$0")/.." && pwd)
failed=0
# "name version per_thread" for every HOOK entry of the table
hooks=$(sed -n 's/^ *HOOK([A-Za-z0-9_]*, "\([A-Za-z0-9_]*\)", \([0-9]*\), \([01]\)).*/\1 \2 \3/p' \
    "$here/src/cuda.c")
[ "$(wc -l <<<"$hooks")" -ge 100 ] ||
    { echo "FAIL - src/cuda.c's HOOK table read: $(wc -l <<<"$hooks") entries"; exit 1; }
for typedefs in "$@"; do
    if [ ! -f "$typedefs" ]; then
        echo "FAIL - no $typedefs"; failed=1; continue
    fi
    version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$(dirname "$typedefs")/cuda.h")
    missing="" seen=0
    for abi in $(grep -oE 'PFN_cu[A-Za-z0-9]+_v[0-9]+(_ptsz|_ptds)?\)' "$typedefs" |
        sed 's/^PFN_//; s/)$//' | sort -u); do
        name=${abi%_v*}
        case "$abi" in *_ptsz | *_ptds) pt=1 since=${abi##*_v} since=${since%_*} ;; *) pt=0 since=${abi##*_v} ;; esac
        grep -q "^$name " <<<"$hooks" || continue # a name the library does not hook
        seen=$((seen + 1))
        grep -qx "$name $since $pt" <<<"$hooks" || missing+=" $abi"
    done
    if [ -z "$missing" ] && [ "$seen" -gt 100 ]; then
        echo "ok - CUDA ${version:-?}: the $seen ABIs cudaTypedefs.h lists for hooked names all have a wrapper"
    else
        echo "FAIL - CUDA ${version:-?}: $seen ABIs of hooked names read; without a wrapper:${missing:- none}"
        failed=1
    fi
done
exit $failed
