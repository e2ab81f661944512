#!/bin/sh
# run.sh BUILD LIBVGPU [UNIT_DIR] - runs every C test with LIBVGPU preloaded over the fake
# driver; the unit tests (pure modules linked in) come from UNIT_DIR (default BUILD/tests).
# Each test gets its own shared-region file in a fresh temporary folder.
set -u
build=$1
units=${3:-$1/tests}
lib=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
tmp=$(mktemp -d /tmp/vgpu-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
preload=$lib
if [ "${VGPU_SANITIZED:-0}" = 1 ]; then
    # The sanitizer runtime must come first in the preload list.
    preload="$(${CC:-cc} -print-file-name=libasan.so) $lib"
    export ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
# faults.so (tests/faults.c) fails calls of libvgpu's on demand; its fcntl, mmap and malloc come
# after the sanitizers' interceptors, so not under them.
faults=$preload
[ "${VGPU_SANITIZED:-0}" = 1 ] || faults="$preload $(cd "$build" && pwd)/tests/faults.so"
export LD_LIBRARY_PATH="$build/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0

# run NAME ENV... -- COMMAND...: one test with its own region file, env and preload. A test
# that hangs (a limiter that never refills waits forever) fails after VGPU_TEST_TIMEOUT s.
run() {
    name=$1; shift
    start=$(date +%s)
    if timeout -k 5 "${VGPU_TEST_TIMEOUT:-300}" \
        env CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/$name.cache" LD_PRELOAD="$preload" "$@" \
        >"$tmp/$name.log" 2>&1; then
        echo "PASS $name ($(( $(date +%s) - start )) s, $(grep -c '^ok' "$tmp/$name.log") checks)"
    else
        echo "FAIL $name"; cat "$tmp/$name.log"; failed=1; touch "$tmp/failed"
    fi
}

run limits "$units/test_limits"
run settings "$units/test_settings"
run control "$units/test_control"
run locks "$units/test_locks"
run kernels "$units/test_kernels"
run ledger "$units/test_ledger"
run owner "$units/test_owner"
run graphs "$units/test_graphs"
run vmm "$units/test_vmm"
run alloc CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m "$build/tests/test_alloc"
# A driver before CUDA 12.8 (no cuStreamGetDevice): a stream's device through its context.
run alloc-old-driver CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m \
    FAKE_CUDA_NO_STREAM_DEVICE=1 "$build/tests/test_alloc"
run alloc-uncapped "$build/tests/test_alloc" uncapped
run alloc-exported CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" exported
run alloc-bound CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" bound
run alloc-map-race CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" map-race
run alloc-handler-inside CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" handler-inside
run alloc-teardown CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m LIBCUDA_LOG_LEVEL=3 \
    "$build/tests/test_alloc" teardown
run alloc-arrays-teardown CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" arrays-teardown
run alloc-arrays-race CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_NVML_MEMORY_NA=1 \
    "$build/tests/test_alloc" arrays-race
run alloc-arrays-green CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_alloc" arrays-green
run alloc-wide-pitch CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_PITCH_ALIGN=2048 \
    "$build/tests/test_alloc" wide-pitch
# A region file that cannot be used refuses CUDA (never a private region with a cap of its own)
# and is left as it was: a missing folder, a HAMi-core cache file (its magic 19920718 at offset
# 0, its v1 size), a short file, a region of another layout version, a symbolic link (to a file
# starting with zero bytes, which must not be taken for a fresh region), such a file itself, a
# FIFO, a folder, and a path where the file cannot be created.
refused() { # refused NAME FILE EXPECTED-LOG [ENV...]
    name=$1 file=$2 expected=$3; shift 3
    run "refused-$name" CUDA_DEVICE_MEMORY_SHARED_CACHE="$file" CUDA_DEVICE_MEMORY_LIMIT=1g "$@" \
        "$build/tests/test_alloc" refused "$expected"
}
refused missing "$tmp/no/such/dir.cache" "No such file or directory"
printf '\116\367\057\001\001\000\000\000' >"$tmp/hami.cache"
truncate -s 2008953 "$tmp/hami.cache"
refused hami "$tmp/hami.cache" "bad magic (not a libvgpu region, or a HAMi-core cache"
printf 'VGPUREG1\002\000\000\000' >"$tmp/short.cache"
truncate -s 4096 "$tmp/short.cache"
refused short "$tmp/short.cache" "too small"
printf 'VGPUREG1\003\000\000\000' >"$tmp/v3.cache"
truncate -s 198784 "$tmp/v3.cache"
refused version "$tmp/v3.cache" "unknown layout version"
{ head -c 4096 /dev/zero; echo "a file that is not a region"; } >"$tmp/zeros.data"
truncate -s 198784 "$tmp/zeros.data"
ln -s "$tmp/zeros.data" "$tmp/link.cache"
refused symlink "$tmp/link.cache" "symbolic link"
refused zeros "$tmp/zeros.data" "not a region"
mkfifo "$tmp/fifo.cache" && mkdir "$tmp/dir.cache"
refused fifo "$tmp/fifo.cache" "not a regular file"
refused dir "$tmp/dir.cache" "cannot open it read-write: Is a directory"
refused unwritable /proc/vgpu-test.cache "cannot create it"
# A limit in the environment the library rejects refuses CUDA too, naming the variable, and
# makes no region: left out, as until 2026-12-02, it was no cap (whoever wrote 16Gb meant one),
# written into a new region's header for the whole container.
refused bad-limit "$tmp/bad-limit.cache" "CUDA_DEVICE_MEMORY_LIMIT='16Gb' rejected" \
    CUDA_DEVICE_MEMORY_LIMIT=16Gb
refused bad-device-limit "$tmp/bad-device-limit.cache" \
    "CUDA_DEVICE_MEMORY_LIMIT_0='0.0001k' rejected: under one byte" CUDA_DEVICE_MEMORY_LIMIT_0=0.0001k
refused bad-sm-limit "$tmp/bad-sm-limit.cache" "CUDA_DEVICE_SM_LIMIT='101' rejected" \
    CUDA_DEVICE_SM_LIMIT=101
# Error paths a healthy system never takes, through faults.so: a kernel without open file
# description locks (before Linux 3.15) refuses CUDA, the region missing or present; host memory
# running out while an allocation is recorded loses nothing; no SIGBUS handler is logged, and
# the cap holds.
if [ "${VGPU_SANITIZED:-0}" = 0 ]; then
    refused no-ofd-new "$tmp/no-ofd.cache" "cannot check its folder's guard lock: Invalid argument" \
        FAULTS=ofd LD_PRELOAD="$faults"
    refused no-ofd-existing "$tmp/alloc.cache" "cannot lock it: Invalid argument" \
        FAULTS=ofd LD_PRELOAD="$faults"
    run host-memory CUDA_DEVICE_MEMORY_LIMIT=1g LD_PRELOAD="$faults" \
        "$build/tests/test_alloc" host-memory
    run no-sigbus-handler CUDA_DEVICE_MEMORY_LIMIT_0=3000m FAULTS=sigaction LD_PRELOAD="$faults" \
        sh -c "'$build/vgpu-demo-alloc' >'$tmp/no-handler.out' 2>&1; cat '$tmp/no-handler.out'
            grep -q 'cannot install the SIGBUS handler: a truncated region file will kill' \
                '$tmp/no-handler.out' &&
            grep -q '^refused at step 7 with 3000 MiB held$' '$tmp/no-handler.out'"
fi
# The library reads its environment with secure_getenv only (set-user-ID programs loaded
# through /etc/ld.so.preload must not take a region path or limits from their caller).
if nm -D --undefined-only "$lib" | grep -qw getenv; then
    echo "FAIL secure-getenv: libvgpu imports getenv"; failed=1
else
    echo "PASS secure-getenv (getenv not imported)"
fi
run procaddr CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_procaddr"
run procaddr-private CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_GPA_PRIVATE=1 \
    "$build/tests/test_procaddr" private
run procaddr-v1-as-v2 CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_GPA_V1_AS_V2=1 \
    "$build/tests/test_procaddr" v1-as-v2
# ... and with internal entry points too: both ABIs' answers one address, the newer's.
run procaddr-v1-as-v2-private CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_GPA_V1_AS_V2=1 \
    FAKE_CUDA_GPA_PRIVATE=1 "$build/tests/test_procaddr" v1-as-v2
run multiproc CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" fork-kill
# The holes of an adversarial review; the uids test needs folders another uid can enter.
chmod 711 "$tmp" && mkdir -m 755 "$tmp/shared"
run uids CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/shared/uids.cache" CUDA_DEVICE_MEMORY_LIMIT=1g \
    "$build/tests/test_multiproc" uids
run deleted CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" deleted
run lingering-exit CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" lingering-exit
run truncated CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" truncated
run truncated-unmappable CUDA_DEVICE_MEMORY_LIMIT=1g LD_PRELOAD="$faults" \
    "$build/tests/test_multiproc" truncated-unmappable
run kill-threads CUDA_DEVICE_MEMORY_LIMIT=1g LIBCUDA_LOG_LEVEL=0 \
    "$build/tests/test_multiproc" kill-threads
# Every slot taken by a live process, then by a dead one (errors only: 1024 processes log).
run slots CUDA_DEVICE_MEMORY_LIMIT=4g LIBCUDA_LOG_LEVEL=1 "$build/tests/test_multiproc" slots
run dead-mid-reservation CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" dead-mid-reservation
run stopped-sibling CUDA_DEVICE_MEMORY_LIMIT=1g LIBCUDA_LOG_LEVEL=1 "$build/tests/test_multiproc" stopped-sibling
run held-lock CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" held-lock
run older-layout CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" older-layout
run odd-generation CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" odd-generation
# Contexts of 20 MiB: NVML lists the process, so nothing is logged before the claim.
run blocked-stderr CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_CONTEXT_MIB=20 "$build/tests/test_multiproc" blocked-stderr
run replaced-descriptor CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" replaced-descriptor
run closed-descriptor CUDA_DEVICE_MEMORY_LIMIT=1g "$build/tests/test_multiproc" closed-descriptor
# Processes of one container starting together where there is no region file yet all share the
# one a peer creates (a guard held while the file is missing is not always a removed region).
run together CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_CONTEXT_MIB=20 "$build/tests/test_multiproc" together
# The demo vgpuctl runs: a 3000 MiB cap refuses the 7th 500 MiB step.
run demo CUDA_DEVICE_MEMORY_LIMIT_0=3000m sh -c \
    "$build/vgpu-demo-alloc | tee /dev/stderr | grep -q '^refused at step 7 with 3000 MiB held$'"
# /etc/ld.so.preload (how pods load it) with a scrubbed environment (env -i): only where a
# private mount namespace can be made (root with CAP_SYS_ADMIN), over a copy of /etc.
can_bind_mount() {
    mkdir -p "$tmp/probe-a" "$tmp/probe-b" &&
        unshare -m sh -c "mount --bind '$tmp/probe-a' '$tmp/probe-b'" 2>/dev/null
}
if [ "${VGPU_SANITIZED:-0}" = 0 ] && command -v unshare >/dev/null && can_bind_mount; then
    cp -a /etc "$tmp/etc" && echo "$lib" >"$tmp/etc/ld.so.preload"
    if unshare -m sh -c "mount --bind '$tmp/etc' /etc && env -i \
        CUDA_DEVICE_MEMORY_LIMIT_0=3000m CUDA_DEVICE_MEMORY_SHARED_CACHE='$tmp/preload.cache' \
        '$build/vgpu-demo-alloc'" >"$tmp/preload.log" 2>&1 &&
        grep -q '^refused at step 7 with 3000 MiB held$' "$tmp/preload.log"; then
        echo "PASS preload-file (/etc/ld.so.preload, env -i)"
    else
        echo "FAIL preload-file"; cat "$tmp/preload.log"; failed=1
    fi
else
    echo "SKIP preload-file (needs a private mount namespace to provide /etc/ld.so.preload)"
fi
# closed-descriptor over a region on overlayfs (a container's own /tmp, outside a pod), whose
# mappings older kernels show under the layer's device and inode, not the ones fstat gives.
overlay="lowerdir=$tmp/ov/lower,upperdir=$tmp/ov/upper,workdir=$tmp/ov/work"
if [ "${VGPU_SANITIZED:-0}" = 0 ] && command -v unshare >/dev/null && can_bind_mount &&
    mkdir -p "$tmp/ov/lower" "$tmp/ov/upper" "$tmp/ov/work" "$tmp/ov/merged" &&
    unshare -m sh -c "mount -t overlay none -o '$overlay' '$tmp/ov/merged'" 2>/dev/null; then
    run closed-descriptor-overlay CUDA_DEVICE_MEMORY_LIMIT=1g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/ov/merged/region.cache" \
        unshare -m sh -c "mount -t overlay none -o '$overlay' '$tmp/ov/merged' && exec \"\$@\"" \
        sh "$build/tests/test_multiproc" closed-descriptor
else
    echo "SKIP closed-descriptor-overlay (needs a private mount namespace and overlayfs)"
fi
# The device plugin's settings file, mounted read-only at /usr/local/vgpu/vgpu.env (here over a
# tmpfs on /usr/local in a private mount namespace, as the runtime mounts it): it alone sets the
# limits and the region path, whatever the environment drops (env -i) or says.
# settings NAME MODE FILE-TEXT EXPECTED-LOG [ENV...]: the demo under that file, which must print
# EXPECTED-LOG (a grep -E pattern; "refused at step 7 with 3000 MiB held" is the file's cap).
settings() {
    name=$1 mode=$2 text=$3 expect=$4; shift 4
    printf '%b' "$text" >"$tmp/$name.env"
    unshare -m sh -c "mount -t tmpfs -o mode=755 none /usr/local && mkdir /usr/local/vgpu &&
        cp '$tmp/$name.env' /usr/local/vgpu/vgpu.env && chmod $mode /usr/local/vgpu/vgpu.env &&
        mount --bind -o ro /usr/local/vgpu/vgpu.env /usr/local/vgpu/vgpu.env &&
        exec env -i LD_PRELOAD='$preload' LD_LIBRARY_PATH='$build/fake' $* '$build/vgpu-demo-alloc'" \
        >"$tmp/$name.log" 2>&1
    if grep -Eq "$expect" "$tmp/$name.log"; then
        echo "PASS $name"
    else
        echo "FAIL $name (expected: $expect)"; cat "$tmp/$name.log"; failed=1
    fi
}
# with_settings NAME FILE-TEXT COMMAND...: `run NAME COMMAND...` where FILE-TEXT is the settings
# file (mounted read-only, as above).
with_settings() {
    name=$1 text=$2; shift 2
    printf '%b' "$text" >"$tmp/$name.env"
    run "$name" unshare -m sh -c "mount -t tmpfs -o mode=755 none /usr/local &&
        mkdir /usr/local/vgpu && cp '$tmp/$name.env' /usr/local/vgpu/vgpu.env &&
        chmod 644 /usr/local/vgpu/vgpu.env &&
        mount --bind -o ro /usr/local/vgpu/vgpu.env /usr/local/vgpu/vgpu.env && exec \"\$@\"" \
        sh "$@"
}
if [ "${VGPU_SANITIZED:-0}" = 0 ] && command -v unshare >/dev/null && can_bind_mount; then
    capped='^refused at step 7 with 3000 MiB held$'
    settings settings-env-i 644 \
        "# vgpu-device-plugin\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/settings-a.cache\n" \
        "$capped"
    [ -s "$tmp/settings-a.cache" ] || { echo "FAIL settings-env-i: no region at the file's path"; failed=1; }
    # The pod's own env asking for more, and for a region of its own: both ignored, and said so.
    settings settings-env-override 444 \
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/settings-b.cache" \
        "$capped" CUDA_DEVICE_MEMORY_LIMIT_0=80g CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/own.cache"
    grep -q "CUDA_DEVICE_MEMORY_LIMIT_0=80g ignored: .* says CUDA_DEVICE_MEMORY_LIMIT_0=3000m" \
        "$tmp/settings-env-override.log" && [ ! -e "$tmp/own.cache" ] && [ -s "$tmp/settings-b.cache" ] ||
        { echo "FAIL settings-env-override: no warning, or the environment's region was used"; failed=1; }
    # A region whose header an earlier process (or a tampering one) wrote with a larger cap.
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$tmp/settings-c.cache" CUDA_DEVICE_MEMORY_LIMIT_0=80g \
        LD_PRELOAD="$preload" "$build/vgpu-demo-alloc" --max-steps 1 >/dev/null 2>&1
    settings settings-over-region 644 \
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/settings-c.cache\n" \
        "$capped"
    grep -q "using the settings file's values" "$tmp/settings-over-region.log" ||
        { echo "FAIL settings-over-region: the region's cap was not reported as overridden"; failed=1; }
    # A file that cannot be trusted or read refuses CUDA, naming the file and the reason.
    settings settings-writable 666 "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n" \
        "settings file /usr/local/vgpu/vgpu.env: writable by group or others.*CUDA is refused"
    settings settings-malformed 644 "CUDA_DEVICE_MEMORY_LIMIT_0 3000m\n" \
        "settings file /usr/local/vgpu/vgpu.env: line 1 is not NAME=VALUE"
    # A value the library rejects would leave that limit off: the file is refused instead.
    settings settings-bad-value 644 \
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000mb\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/settings-d.cache\n" \
        "CUDA_DEVICE_MEMORY_LIMIT_0='3000mb' rejected"
    # So would an empty one (unset: no cap), which the plugin never writes.
    settings settings-empty-value 644 \
        "CUDA_DEVICE_MEMORY_LIMIT_0=\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/settings-e.cache\n" \
        "a limit in it was rejected \(above\); CUDA is refused"
    grep -q "CUDA_DEVICE_MEMORY_LIMIT_0='' rejected: empty" "$tmp/settings-empty-value.log" ||
        { echo "FAIL settings-empty-value: the empty value was not named"; failed=1; }
    settings settings-empty 644 "" "does not set CUDA_DEVICE_MEMORY_SHARED_CACHE"
    for name in writable malformed bad-value empty; do
        grep -q "CUDA start failed: CUDA_ERROR_NOT_PERMITTED" "$tmp/settings-$name.log" ||
            { echo "FAIL settings-$name: CUDA was not refused"; failed=1; }
    done
    # Each GPU's cap follows the file's NVIDIA_VISIBLE_DEVICES order, not CUDA's; a GPU the file
    # does not name gets nothing (the fake's GPUs A and B: see tests/test_devices.c).
    gpu_a=GPU-10111213-1415-1617-1819-1a1b1c1d1e1f gpu_b=GPU-20212223-2425-2627-2829-2a2b2c2d2e2f
    with_settings devices-listed "NVIDIA_VISIBLE_DEVICES=$gpu_b,$gpu_a\nCUDA_DEVICE_MEMORY_LIMIT_0=2g\nCUDA_DEVICE_MEMORY_LIMIT_1=1g\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/devices-listed.cache\n" \
        "$build/tests/test_devices" listed
    with_settings devices-unassigned "NVIDIA_VISIBLE_DEVICES=$gpu_a\nCUDA_DEVICE_MEMORY_LIMIT_0=1g\nCUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/devices-unassigned.cache\n" \
        env FAKE_CUDA_DEVICES=17 "$build/tests/test_devices" unassigned
    grep -q "CUDA device 1 is $gpu_b, which the device plugin did not assign" \
        "$tmp/devices-unassigned.log" ||
        { echo "FAIL devices-unassigned: the unassigned GPU was not named in the log"; failed=1; }
else
    echo "SKIP settings-file (needs a private mount namespace to mount /usr/local/vgpu/vgpu.env)"
fi
# A process that reorders the GPUs (CUDA_VISIBLE_DEVICES) keeps each GPU's cap.
run devices-swapped CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g \
    FAKE_GPU_SHARED="$tmp/devices-swapped.shm" "$build/tests/test_devices" swapped
run devices-hinted CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g \
    NVIDIA_VISIBLE_DEVICES=GPU-10111213-1415-1617-1819-1a1b1c1d1e1f,GPU-20212223-2425-2627-2829-2a2b2c2d2e2f \
    "$build/tests/test_devices" hinted
run devices-claim-wait CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g \
    "$build/tests/test_devices" claim-wait
# A GPU past the region's 16 device records: nothing on it while any limit is set.
run devices-past-records CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CUDA_DEVICES=17 \
    "$build/tests/test_devices" past-records limited
grep -q "CUDA device 16: the shared region keeps the limits of 16 GPUs" \
    "$tmp/devices-past-records.log" ||
    { echo "FAIL devices-past-records: the log did not say why device 16 was refused"; failed=1; }
run devices-past-records-sm CUDA_DEVICE_SM_LIMIT=30 FAKE_CUDA_DEVICES=17 \
    "$build/tests/test_devices" past-records sm
run devices-past-records-uncapped FAKE_CUDA_DEVICES=17 \
    "$build/tests/test_devices" past-records uncapped
# The fake GPU shared by processes (FAKE_GPU_SHARED): sharing, NVML, memory, kill -9, graphs.
run fake-gpu FAKE_GPU_SHARED="$tmp/fake-gpu.shm" FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_LAZY_MIB=100 \
    "$build/tests/test_fake_gpu"
# Context and driver memory counted: a context of 300 MiB, 100 MiB of modules loaded at the
# first launch, under a 1 GiB cap; and again with NVML naming processes by other pids.
run footprint CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_LAZY_MIB=100 "$build/tests/test_footprint"
run footprint-pidns CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-pidns.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_LAZY_MIB=100 FAKE_NVML_PID_OFFSET=100000 \
    "$build/tests/test_footprint"
run footprint-together CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-together.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXTS_TOGETHER=2 \
    LIBCUDA_LOG_LEVEL=3 "$build/tests/test_footprint" together
run footprint-together-green CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-together-green.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXTS_TOGETHER=2 LIBCUDA_LOG_LEVEL=3 \
    "$build/tests/test_footprint" together-green
run footprint-bystander CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-by.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXTS_TOGETHER=2 \
    "$build/tests/test_footprint" bystander
# A pid no context made it remember is never learnt from an allocation; a learnt pid NVML
# stops listing while the process holds a context (none released since) leaves it counted.
run footprint-no-candidates CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-nc.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_LAZY_MIB=100 FAKE_NVML_PID_OFFSET=100000 \
    "$build/tests/test_footprint" no-candidates
run footprint-wrong-pid-gone CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-wp.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_NVML_PID_OFFSET=100000 \
    "$build/tests/test_footprint" wrong-pid-gone
# ... and so when a context was released before, NVML listing the process after it (another
# context remains): that release does not stand for the pid's going.
run footprint-wrong-pid-gone-after-release CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-wpr.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 FAKE_NVML_PID_OFFSET=100000 "$build/tests/test_footprint" wrong-pid-gone-after-release
# ... and so for a process of created contexts only (cuCtxCreate), one destroyed before: the
# primary context is inactive, yet a context remains.
run footprint-wrong-pid-gone-created CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-wpc.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 FAKE_NVML_PID_OFFSET=100000 "$build/tests/test_footprint" wrong-pid-gone-created
# ... and so when the pid's owner exits first and a release comes after, another context left.
for case in destroyed-after-gone released-after-gone; do
    run "footprint-$case" CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-$case.shm" \
        FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_CREATED_CONTEXT_MIB=200 FAKE_NVML_PID_OFFSET=100000 \
        "$build/tests/test_footprint" "$case"
done
run footprint-released-unmeasured CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-ru.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" released-unmeasured
run footprint-released-last-listed CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-rll.shm" FAKE_CUDA_CONTEXT_MIB=300 FAKE_NVML_PID_OFFSET=100000 \
    "$build/tests/test_footprint" released-last-listed
# In a pid namespace (a container's), a process's own pid may be another tenant's host pid.
if [ "${VGPU_SANITIZED:-0}" = 0 ] && unshare -pf --mount-proc true 2>/dev/null; then
    run footprint-together-pidns CUDA_DEVICE_MEMORY_LIMIT=1g \
        FAKE_GPU_SHARED="$tmp/footprint-together-pidns.shm" FAKE_CUDA_CONTEXT_MIB=300 \
        FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXTS_TOGETHER=2 LIBCUDA_LOG_LEVEL=3 \
        unshare -pf --mount-proc sh -c '"$0" together-pidns; exit $?' "$build/tests/test_footprint"
else
    echo "SKIP footprint-together-pidns (needs unshare -p: a pid namespace of its own)"
fi
run footprint-created-contexts CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-created.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" created-contexts
run footprint-second-context CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-second.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXTS_TOGETHER=2 \
    "$build/tests/test_footprint" second-context
run footprint-pool-cache CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-pool.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" pool-cache
run footprint-pool-bounds CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-bounds.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" pool-bounds
run footprint-pool-sync-free CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-sync.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" pool-sync-free
run footprint-pool-many CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-many.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" pool-many
run footprint-green CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-green.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" green
run footprint-green-too-big CUDA_DEVICE_MEMORY_LIMIT=400m \
    FAKE_GPU_SHARED="$tmp/footprint-green-big.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" green-too-big
run footprint-unmeasured-contexts CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-unmeasured.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" unmeasured-contexts
run footprint-limits CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-limits.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" limits
# The same with one GPU, as most containers have.
run footprint-limits-one-device CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-one.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits
run footprint-limits-stream CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-limits-stream.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits-stream
run footprint-limits-refused CUDA_DEVICE_MEMORY_LIMIT=1g \
    FAKE_GPU_SHARED="$tmp/footprint-limits-refused.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits-refused
run footprint-limits-no-context CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-no-context.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits-no-context
run footprint-limits-contexts CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-contexts.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" limits-contexts
run footprint-limits-many-contexts CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-many.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=1 "$build/tests/test_footprint" limits-many-contexts
run footprint-limits-reset-inside CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-reset.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_MEM_MIB=500 "$build/tests/test_footprint" limits-reset-inside
# A launch from inside the library's locks (a signal handler's) never waits for them.
run footprint-limits-inside-locks CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-inside.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits-inside-locks
run footprint-limits-inside-launch CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-inside-launch.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    "$build/tests/test_footprint" limits-inside-launch
run footprint-limits-retain-race CUDA_DEVICE_MEMORY_LIMIT=2g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-retain-race.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" limits-retain-race
run footprint-limits-one-device-twice CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-twice.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" limits-one-device-twice
run footprint-limits-green-given-up CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-green-up.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=1 "$build/tests/test_footprint" limits-green-given-up
run footprint-limits-green-stream CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_CUDA_NO_STREAM_DEVICE=1 FAKE_GPU_SHARED="$tmp/footprint-limits-green-stream.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_CREATED_CONTEXT_MIB=200 \
    "$build/tests/test_footprint" limits-green-stream
# Before CUDA 12.5 nothing names a green context's stream's context or device.
run footprint-limits-green-stream-12.4 CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_VISIBLE_DEVICES=0 \
    FAKE_CUDA_NO_STREAM_DEVICE=1 FAKE_CUDA_NO_STREAM_CTX_V2=1 \
    FAKE_GPU_SHARED="$tmp/footprint-limits-green-stream-old.shm" FAKE_CUDA_CONTEXT_MIB=300 \
    FAKE_CUDA_CREATED_CONTEXT_MIB=200 "$build/tests/test_footprint" limits-green-stream
run footprint-retain-race CUDA_DEVICE_MEMORY_LIMIT=512m FAKE_GPU_SHARED="$tmp/footprint-race.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_footprint" retain-race
# gpu-check.sh section 10's script over the fake: it tells this library from one that lets that
# memory go uncounted (f22d062's fails its three checks).
if command -v python3 >/dev/null; then
    run held-over-fake CUDA_DEVICE_MEMORY_LIMIT=2g FAKE_GPU_SHARED="$tmp/held.shm" \
        FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_CREATED_CONTEXT_MIB=200 \
        python3 "$(dirname "$0")/gpu_held.py"
else
    echo "SKIP held-over-fake (no python3)"
fi
# gpu-check.sh section 6's NVML sampler, through pynvml over the fake NVML. A script's test:
# under the sanitizers it cannot run here, where pgrep hangs in textdomain() with libasan alone
# preloaded (procps-ng's, 2026-11-29).
if [ "${VGPU_SANITIZED:-0}" = 1 ]; then
    echo "SKIP nvml-samples (pgrep hangs with libasan preloaded; the sampler is not the library)"
elif "${PYTHON:-python3}" -c 'import pynvml' 2>/dev/null; then
    run nvml-samples PYTHON="${PYTHON:-python3}" bash "$(dirname "$0")/nvml_samples.sh"
else
    echo "SKIP nvml-samples (${PYTHON:-python3} has no pynvml)"
fi
# gpu-check.sh's alloc+free timing, through the fake driver here.
run alloc-pairs sh "$(dirname "$0")/alloc_pairs.sh" "$build"
# gpu-check.sh's own arithmetic (sections 6 and 12) over canned outputs of the H200 run.
run gpu-check-script bash "$(dirname "$0")/gpu_check_script.sh"
# libvgpu.so built as the device plugin image builds it, against CUDA 13.0's cuda.h (the image's
# build, not the sanitizers').
if [ "${VGPU_SANITIZED:-0}" = 1 ]; then
    echo "SKIP build-cuda13 (the image's build: make test runs it)"
else
    run build-cuda13 bash "$(dirname "$0")/build_cuda13.sh" "$lib"
fi
# Every ABI cuGetProcAddress may answer for a hooked name has a wrapper, and no name the library
# wraps or calls is renamed by a macro it does not undo: the headers built against (CUDA_INCLUDE,
# from the Makefile), CUDA 13.0's and 13.1's (make cuda13 at the root).
run abi-coverage bash "$(dirname "$0")/abi_coverage.sh" \
    "${CUDA_INCLUDE:-/usr/local/cuda/include}/cudaTypedefs.h" \
    "$(dirname "$0")/../../.tools/cuda13/nvidia/cu13/include/cudaTypedefs.h" \
    "$(dirname "$0")/../../.tools/cuda131/nvidia/cu13/include/cudaTypedefs.h"
# A graph's allocation nodes take memory when it is launched or uploaded: counted then.
run graph-memory CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/graph-memory.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_graph_memory"
run graph-memory-setters CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/graph-setters.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_graph_memory" setters
run footprint-nvml-na CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_GPU_SHARED="$tmp/footprint-na.shm" \
    FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_LAZY_MIB=100 FAKE_NVML_MEMORY_NA=1 \
    "$build/tests/test_footprint" na
# The hammer takes both cores; the limiter tests measure time, so they run after it (the two
# limited ones together: they mostly sleep; the unlimited one alone: it needs a free core).
run hammer CUDA_DEVICE_MEMORY_LIMIT=256m LIBCUDA_LOG_LEVEL=0 \
    HAMMER_SECONDS="${HAMMER_SECONDS:-10}" "$build/tests/test_multiproc" hammer
run throttle-30 CUDA_DEVICE_SM_LIMIT=30 "$build/tests/test_throttle" 30 &
t30=$!
# ... the second with the one GPU most containers have (the gate's device not asked of the
# driver then: cuda_driver.h, launch_device_on), the first with the fake's two.
run throttle-60 CUDA_DEVICE_SM_LIMIT=60 FAKE_CUDA_DEVICES=1 "$build/tests/test_throttle" 60 &
t60=$!
wait $t30 $t60
# Graphs with a conditional WHILE node (their work unknown to the limiter) under a limit of 20:
# alone, since beside the two above under the sanitizer the half-second case read 36 %.
run throttle-while CUDA_DEVICE_SM_LIMIT=20 "$build/tests/test_throttle" 20 while
run throttle-none "$build/tests/test_throttle" none
# Two GPUs, a limit on the second only: launches are charged to their own device.
run throttle-second-gpu CUDA_DEVICE_SM_LIMIT_1=40 "$build/tests/test_throttle" 40 second-gpu
# The limiter's thread cannot be made for a second (pthread_create fails): launches wait.
run throttle-nothread CUDA_DEVICE_SM_LIMIT=50 "$build/tests/test_throttle" 50 nothread
# ... and its NVML thread never can: NVML is read on the limiter's own thread.
run throttle-nosampler CUDA_DEVICE_SM_LIMIT=50 "$build/tests/test_throttle" 50 nosampler
# An application's NVML shutdowns past its own inits leave the library's; with no NVML reading
# at all, each period of its work is charged as the whole GPU's.
run throttle-nvml-shutdown CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 nvml-shutdown
run throttle-nvml-blind CUDA_DEVICE_SM_LIMIT=25 FAKE_NVML_UTIL_FAILS=1 \
    "$build/tests/test_throttle" 25 nvml-blind
grep -q "NVML gives no utilisation reading of device 0" "$tmp/throttle-nvml-blind.log" ||
    { echo "FAIL throttle-nvml-blind: the log did not say the limit went blind"; failed=1; }
run throttle-nvml-blind-light-start CUDA_DEVICE_SM_LIMIT=25 FAKE_NVML_UTIL_FAILS=1 \
    "$build/tests/test_throttle" 25 nvml-blind-light-start
run throttle-nvml-blind-threads CUDA_DEVICE_SM_LIMIT=25 FAKE_NVML_UTIL_FAILS=1 \
    "$build/tests/test_throttle" 25 nvml-blind-threads
# The library's threads (the watcher, the sampler) take none of the application's signals.
run throttle-signals CUDA_DEVICE_SM_LIMIT=30 "$build/tests/test_throttle" 30 signals
# A process in a slot past the 256th is charged as the rest of its container.
run throttle-memsets CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 memsets
run throttle-graph-memsets CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 graph-memsets
run throttle-refused CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 refused
# ... from a thread in a loop, each refusal taking 1 ms in the driver, as checks may.
run throttle-refused-spinning CUDA_DEVICE_SM_LIMIT=25 FAKE_CUDA_REFUSE_US=1000 \
    "$build/tests/test_throttle" 25 refused-spinning
# Launches made while the driver answers another, 7 deep (past the library's stack of 4
# unanswered calls), with refused calls beside them within the stack: none of those charged.
run throttle-nested CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 nested
run throttle-many-processes CUDA_DEVICE_SM_LIMIT=25 "$build/tests/test_throttle" 25 many-processes
run throttle-nvml-not-found CUDA_DEVICE_SM_LIMIT=25 FAKE_NVML_UTIL_NOT_FOUND=1 \
    "$build/tests/test_throttle" 25 nvml-blind-light-start
# After a cuCtxSynchronize that covers all its work, nothing of a process runs: it prepays
# nothing until its next launch; it goes on prepaying where another context, or another
# thread's launch during the synchronisation, may leave work running (NVML silent for the
# test's length). The same after a stream's synchronisation or a
# query that found it done, where every kernel since the last covering cuCtxSynchronize ran on
# that stream (the default streams named every way; a stream on the second of two GPUs), not
# where one ran on another, a query found it busy, another thread waited (one made after the
# launching one exited among them), or the stream was destroyed while its kernel ran. With
# two GPUs, a cuCtxSynchronize drains its own GPU (and starts stream drains again there, and
# covers a kernel launched on its stream while the other GPU's context was current), not the
# other's, nor its own where another context was made or another thread launched. No
# context, default-stream or copy drain is taken while a context libvgpu did not see made is
# current, nor after work launched in one and the primary made current again (cuCtxSetCurrent,
# cuCtxPushCurrent, cuCtxPopCurrent, CUDA 2.0's too). CUDA 13.0's cuCtxSynchronize_v2 drains
# the primary context it names (or the current one, NULL) while a known primary one or none is
# current, not the other GPU's named, nor a context libvgpu did not see made, named or current.
# Nor does a cuCtxSynchronize where the kernel ran on a stream made (cuStreamCreate, or with a
# priority) while a context libvgpu did not see made was current, the primary current again. A synchronous copy to the host drains its default stream where
# every kernel ran there (each export, cuMemcpy's too; on the second of two GPUs), not where one ran
# on another, the copy was refused, went within the device, from the host or within it, copied
# nothing, or came from managed memory, another GPU's, or memory the driver could not name.
# A wait for an event (cuEventSynchronize, or cuEventQuery finding it done) drains where a wait
# for its stream would have at its record (each record export; the default streams; an earlier
# event of two; on the second of two GPUs), not where the query found it busy, a kernel came
# after the record, another stream had a kernel or was the one recorded, the event was
# recorded again elsewhere (or meanwhile, inside the driver's record, or waited for inside
# such a record), refused a record,
# recorded in a capture, or destroyed and its handle made anew, another thread waited, it was
# recorded in a context libvgpu did not see made, or the process made or opened an
# interprocess event. Each case's debug log says "drained" exactly where it drains (the line
# gpu-check.sh section 14 counts under PyTorch, CuPy and JAX).
# NVML silent: the fake's sample periods start at multiples of their length in CLOCK_MONOTONIC,
# so a period of an hour ended inside a case once an hour of uptime (CI, 2026-11-30:
# `-default-streams` measured, 0.052 s prepaid); 10^12 ms is longer than any uptime.
silent_ms=1000000000000
for case in alone context green during bursts stream legacy legacy-ptsz per-thread \
    per-thread-ptsz query query-ptsz second-device context-sync-first two-streams \
    other-stream default-streams query-busy other-thread destroyed destroyed-v1 dead-thread \
    context-sync-second-device context-elsewhere-second-device \
    context-sync-first-second-device launched-elsewhere-second-device context-second-device \
    green-second-device during-second-device unseen-context unseen-context-stream \
    unseen-context-copy unseen-context-left unseen-context-pushed-over unseen-context-popped \
    unseen-context-pushed-over-v1 unseen-context-popped-v1 unseen-context-sync-v2 \
    context-sync-v2 context-sync-v2-current context-sync-v2-named-second-device \
    context-sync-v2-elsewhere-second-device context-sync-v2-no-current context-sync-v2-proc-address \
    context-sync-v2-unseen-named unseen-context-stream-made unseen-context-stream-made-priority \
    copy copy-v1 copy-ptds copy-second-device copy-other-stream copy-default-streams \
    copy-refused copy-unified copy-unified-ptds copy-pinned copy-within-device copy-from-host \
    copy-within-host copy-empty copy-managed copy-from-second-device copy-unnamed event \
    event-query event-legacy event-per-thread event-with-flags event-with-flags-ptsz \
    event-earlier event-second-device event-query-busy event-then-launch event-two-streams \
    event-other-stream event-default-streams event-rerecorded event-rerecorded-meanwhile \
    event-waited-meanwhile event-record-refused event-captured event-captured-external event-destroyed \
    event-destroyed-v1 event-other-thread event-unseen-context event-interprocess \
    event-ipc-opened; do
    devices=1
    case "$case" in *second-device) devices=2 ;; esac
    run "throttle-drain-$case" CUDA_DEVICE_SM_LIMIT=50 FAKE_GPU_SHARED="$tmp/drain-$case.shm" \
        FAKE_CUDA_DEVICES=$devices FAKE_NVML_SAMPLE_MS=$silent_ms LIBCUDA_LOG_LEVEL=4 \
        "$build/tests/test_throttle" 50 drain "$case"
done
# A light load, then large kernels: a debt in blocks the measured GPU time does not back; also
# where NVML has no per-process samples (the whole GPU's utilisation stands for the container's).
# One after the other: beside the second, the 200 ms kernels once read 41.9 % under 50 over the
# 6 s window of that time (46.1-54.0 % alone over today's 10 s, 2026-11-28; test_throttle.c).
run throttle-burst CUDA_DEVICE_SM_LIMIT=50 "$build/tests/test_throttle" 50 burst
run throttle-burst-whole-gpu CUDA_DEVICE_SM_LIMIT=20 FAKE_NVML_NO_PROCESS_UTIL=1 \
    "$build/tests/test_throttle" 20 burst
# ... with each per-process NVML query taking 200 ms: a reading then averages the periods since
# the last, and is charged for all of them (charged as one, the 200 ms kernels kept the GPU
# 91.2-92.6 % busy under 50; read on the limiter's thread, the 20 ms ones got 10.0 %).
run throttle-burst-slow-nvml CUDA_DEVICE_SM_LIMIT=50 FAKE_NVML_SLOW_MS=200 \
    "$build/tests/test_throttle" 50 burst
# Bursts after idle time; with a lone kernel after each, of 2000 or 100 blocks, a rate step comes
# in the idle time after every burst (that period's demand cut the rate tenfold: the bursts got
# 1.8-19.4 and 3.2-13.8 % under 20, src/control.h).
run throttle-idle-bursts CUDA_DEVICE_SM_LIMIT=20 "$build/tests/test_throttle" 20 idle-bursts
run throttle-tail-bursts CUDA_DEVICE_SM_LIMIT=20 "$build/tests/test_throttle" 20 tail-bursts
run throttle-small-tail-bursts CUDA_DEVICE_SM_LIMIT=20 "$build/tests/test_throttle" 20 \
    small-tail-bursts
# Two processes of one container: its GPU-time account is theirs together; both must run (held
# for good, one reads 0), and split the limit evenly (test_throttle.c says why they did not).
run throttle-siblings CUDA_DEVICE_SM_LIMIT=30 FAKE_GPU_SHARED="$tmp/siblings.shm" \
    FAKE_CUDA_DEVICES=1 FAKE_CUDA_CONTEXT_MIB=300 "$build/tests/test_throttle" 30 siblings
# Containers sharing one GPU (the fake's time-sliced model, NVML's per-process samples): each
# pair of tenants and the graph case has its own fake GPU, so they run at once (they sleep).
contention() { # contention NAME ARGS...
    name=$1; shift
    mkdir -p "$tmp/$name"
    run "contention-$name" FAKE_GPU_SHARED="$tmp/$name/gpu.shm" CONTENTION_DIR="$tmp/$name" \
        LIBCUDA_LOG_LEVEL=1 "$build/tests/test_contention" "$@"
}
# Short-lived processes of one container one after another, each prepaying its time until
# NVML has measured it.
(FAKE_CUDA_DEVICES=1 contention chain-20 chain 20) # one GPU, as a vGPU container has
contention 30-60 30 60 &
c1=$!
contention 50-50 50 50 &
c2=$!
contention 30-none 30 none &
wait $c1 $c2 $!
contention 20-20 20 20 &
c1=$!
contention graph-25 graph 25 &
c2=$!
# NVML naming the tenants by other pids (a container's pid namespace), their contexts holding
# memory as on a GPU: the host pids are learnt.
FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXT_MIB=100 contention 30-none-pidns 30 none &
wait $c1 $c2 $!
# ... and both contexts made at the same moment (pods started together): neither host pid can
# be told from the context; each is learnt by an allocation (the library's probe).
FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXT_MIB=100 FAKE_CUDA_CONTEXTS_TOGETHER=2 \
    contention 30-60-together 30 60 &
c1=$!
# Tenant A's context taking 300 ms to make, B starting and allocating its weights meanwhile: B's
# pid is new in NVML's list across A's context beside A's own (which the fake left out while it
# held 0 bytes: A then took B's pid for its own, was charged B's GPU time, and held back got
# 0.0 % in all of 3 runs; in CI on 7eb231b, 0.0 % once, by the same order by chance).
CONTENTION_SLOW_CONTEXT_MS=300 contention 30-60-slow-context 30 60 &
c2=$!
# NVML's per-process query taking 400 ms (its calls can be slow): the refills go on meanwhile
# (src/sampler.h). Made on the limiter's own thread, the tenant at 30 got 4.2-4.4 % (and
# 33.4-36.8 % on a thread of its own asking each of the fake's 2 devices, the limit naming 16).
FAKE_NVML_SLOW_MS=400 contention 30-none-slow-nvml 30 none
wait $c1 $c2
# A sibling of tenant A (a memory cap, as a vGPU container has) whose host pid was never
# learnt exits while A only launches: A's readings reap its slot (unreaped, it stayed in every
# reading, its pid unknown and the container's host pids with it, until a claim, refusal or
# memory query).
FAKE_NVML_PID_OFFSET=100000 FAKE_CUDA_CONTEXT_MIB=100 CUDA_DEVICE_MEMORY_LIMIT=4g \
    CONTENTION_DEAD_SIBLING=1.5 contention 30-none-dead-sibling 30 none
# Graphs made executable through the CUDA 10/11 exports, which CUDA 11 builds call, and graphs
# changed once executable (a kernel's grid, a child graph, nodes enabled): the cost follows; an
# update the driver refused: it does not; setters after an update, naming the nodes the graph
# was instantiated from (that the fake, and on a GPU the driver, takes them; their cost is
# test_graphs'); a graph made after 5000 others (the old fixed table
# held 4096), one whose destroy was refused. gpu-check.sh runs the same cases on a GPU.
pids=
for abi in v1 v2-update update-refused update-set update-enable set-params set-params-v1 \
        node-set child-set enable-half crowded destroy-refused; do
    contention "graph-25-$abi" graph 25 "$abi" &
    pids="$pids $!"
done
wait $pids
[ -e "$tmp/failed" ] && failed=1
[ $failed = 0 ] && echo "hook tests: all passed" || echo "hook tests: FAILED"
exit $failed
