#!/usr/bin/env bash
# build_cuda13.sh LIBVGPU - libvgpu.so built as the device plugin image builds it
# (deviceplugin/Dockerfile: `make -C hook CUDA_HOME=... all` in CUDA 13.0's devel image), here
# against CUDA 13.0's cuda.h from the pinned nvidia-cuda-runtime wheel (`make cuda13` at the
# repository root puts it in .tools/cuda13): it must build without a warning and export what
# LIBVGPU, built against the 12.x headers the other tests use, exports. CUDA 13's cuda.h no longer
# declares cuCtxCreate_v2 and _v3 (include/cuda_13.h does), and the image's build failed on them
# with nothing here to show it.
set -u
unset LD_PRELOAD
here=$(cd "$(dirname "$0")/.." && pwd)
lib=$1
include=${VGPU_CUDA13_INCLUDE:-$here/../.tools/cuda13/nvidia/cu13/include}
tmp=$(mktemp -d /tmp/vgpu-build-cuda13.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failed=0
check() { # check OK TEXT
    if [ "$1" = 0 ]; then echo "ok - $2"; else echo "FAIL - $2"; failed=1; fi
}

if [ ! -f "$include/cuda.h" ]; then
    echo "FAIL - no cuda.h in $include: run make cuda13 at the repository root"; exit 1
fi
version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$include/cuda.h")
[ "${version:-0}" -ge 13000 ]
check $? "the headers are CUDA 13's (CUDA_VERSION ${version:-none})"

# CUDA_HOME as the image sets it: the folder whose include/ holds cuda.h. NVML's header comes
# from the venv's nvidia-nvml-dev wheel (CUDA_HOME has none), the image's from its own toolkit.
# A make of its own: an outer one's flags (its jobserver, its command-line variables such as
# CUDA_INCLUDE, which would pick other headers) stay out.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CUDA_INCLUDE -u NVML_INCLUDE \
    make -s -C "$here" BUILD="$tmp/build" CUDA_HOME="$(dirname "$include")" all \
    >"$tmp/make.log" 2>&1
rc=$?
cat "$tmp/make.log"
check "$rc" "make all against CUDA $version's cuda.h"
! grep -Eq ':[0-9]+:[0-9]+: warning:' "$tmp/make.log"
check $? "no compiler warning"

exports() { nm -D --defined-only "$1" | awk '{ print $3 }' | sort; }
if [ "$rc" = 0 ]; then
    # The objects' debug line tables name the headers they were compiled from.
    readelf --debug-dump=line "$tmp/build/obj/cuda.o" 2>/dev/null | grep -qF "$include"
    check $? "compiled from the headers in $include"
    exports "$lib" >"$tmp/12.txt"
    exports "$tmp/build/libvgpu.so" >"$tmp/13.txt"
    differ=$(diff "$tmp/12.txt" "$tmp/13.txt")
    [ -z "$differ" ] && [ -s "$tmp/12.txt" ]
    check $? "the same $(wc -l <"$tmp/12.txt") exports as the library built against the 12.x headers${differ:+: $differ}"
fi
exit $failed
