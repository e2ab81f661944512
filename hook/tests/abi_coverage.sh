#!/usr/bin/env bash
# abi_coverage.sh TYPEDEFS_H... - for each CUDA version's headers (cudaTypedefs.h, cuda.h beside
# it), src/cuda.c's table of wrappers against what a runtime may be given:
# - every ABI cudaTypedefs.h lists for a name the library hooks has a wrapper. It names each
#   ABI PFN_<name>_v<version>[_ptsz]: what cuGetProcAddress answers for <name> asked at <version>
#   or later (until the next one), the per-thread-stream flavour with _ptsz/_ptds. The library
#   swaps the driver's answer for its wrapper only where its table has a HOOK(export, "name",
#   version, per_thread) for that ABI; for any other the caller gets the driver's export,
#   unwatched (an allocation uncounted, a wait not seen). CUDA 13's
#   PFN_cuCtxSynchronize_v13000 (the context named: a runtime built for 13.0 asks for
#   cuCtxSynchronize and gets cuCtxSynchronize_v2) had none before 11a15db;
# - no export the library wraps or calls is renamed by a cuda.h macro still in force where the
#   wrappers are written (include/cuda_v1.h and src/cuda_driver.h #undef those they know): HOOK
#   and CALL_ONLY take `#name` as written but the wrapper and real.name as the macro makes them,
#   so a new rename would swap ABIs silently.
# And once, over all the headers: every HOOK entry is an ABI one of them lists (a typo'd version
# or name would wrap nothing), and every HOOK line of the table was read.
set -u
unset LD_PRELOAD
here=$(cd "$(dirname "$0")/.." && pwd)
failed=0
fail() { echo "FAIL - $1"; failed=1; }
table="$here/src/cuda.c"
# "name version per_thread export" for every HOOK entry of the table
hooks=$(sed -n 's/^ *HOOK(\([A-Za-z0-9_]*\), "\([A-Za-z0-9_]*\)", \([0-9]*\), \([01]\)).*/\2 \3 \4 \1/p' \
    "$table")
lines=$(grep -c '^ *HOOK(' "$table")
if [ "$(wc -l <<<"$hooks")" -ne "$lines" ] || [ "$lines" -lt 100 ]; then
    fail "src/cuda.c's table: $(wc -l <<<"$hooks") HOOK entries read of $lines lines"
    exit 1
fi
# every export the library defines as a wrapper or resolves to call
names=$( (awk '{ print $4 }' <<<"$hooks"
    grep -o 'CALL_ONLY([A-Za-z0-9_]*)' "$table" | sed 's/CALL_ONLY(\(.*\))/\1/') | sort -u)
listed="" # every "name version per_thread" some header lists
for typedefs in "$@"; do
    if [ ! -f "$typedefs" ]; then
        fail "no $typedefs (make cuda13 at the repository root fetches CUDA 13.0's and 13.1's)"
        continue
    fi
    cuda_h="$(dirname "$typedefs")/cuda.h"
    version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda_h")
    missing="" seen=0
    for abi in $(grep -oE 'PFN_cu[A-Za-z0-9]+_v[0-9]+(_ptsz|_ptds)?\)' "$typedefs" |
        sed 's/^PFN_//; s/)$//' | sort -u); do
        name=${abi%_v*}
        case "$abi" in
        *_ptsz | *_ptds) pt=1 since=${abi##*_v} since=${since%_*} ;;
        *) pt=0 since=${abi##*_v} ;;
        esac
        listed+="$name $since $pt"$'\n'
        grep -q "^$name " <<<"$hooks" || continue # a name the library does not hook
        seen=$((seen + 1))
        grep -q "^$name $since $pt " <<<"$hooks" || missing+=" $abi"
    done
    if [ -z "$missing" ] && [ "$seen" -gt 100 ]; then
        echo "ok - CUDA ${version:-?}: the $seen ABIs cudaTypedefs.h lists for hooked names all have a wrapper"
    else
        fail "CUDA ${version:-?}: $seen ABIs of hooked names read; without a wrapper:${missing:- none}"
    fi
    # The macros in force where the wrappers are written (src/cuda_driver.h after cuda.h and
    # its #undefs), "NAME TARGET", for the table's names, but a name defined as itself (or as its
    # own per-thread flavour, itself without __CUDA_API_PER_THREAD_DEFAULT_STREAM)
    macros=$("${CC:-cc}" -std=c11 -D_GNU_SOURCE -E -dM -I"$here/include" \
        -I"$(dirname "$cuda_h")" "$here/src/cuda_driver.h" 2>&1)
    if ! grep -q '^#define CUDA_VERSION ' <<<"$macros"; then
        fail "CUDA ${version:-?}: src/cuda_driver.h not preprocessed: $(head -n 3 <<<"$macros")"
        continue
    fi
    renamed=$(sed -n 's/^#define \(cu[A-Za-z0-9_]*\) \(.*\)$/\1 \2/p' <<<"$macros" |
        while read -r name target; do
            grep -qx "$name" <<<"$names" || continue
            case "$target" in "$name" | "__CUDA_API_PTSZ($name)" | "__CUDA_API_PTDS($name)") continue ;; esac
            echo "$name -> $target"
        done)
    if [ -z "$renamed" ]; then
        echo "ok - CUDA ${version:-?}: no name of the table renamed by a macro left in force"
    else
        fail "CUDA ${version:-?}: renamed by a macro in force: $(tr '\n' ';' <<<"$renamed")"
    fi
done
unlisted=$(while read -r name since pt export; do
    flavour=""
    [ "$pt" = 1 ] && flavour=" per-thread"
    grep -qx "$name $since $pt" <<<"$listed" || echo "$export ($name at $since$flavour)"
done <<<"$hooks")
if [ "$#" -gt 0 ] && [ -z "$unlisted" ]; then
    echo "ok - each of the table's $lines wrappers is an ABI the headers list"
else
    fail "wrappers of ABIs no header lists: $(tr '\n' ';' <<<"$unlisted")"
fi
exit $failed
