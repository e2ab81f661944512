#!/usr/bin/env python3
"""gpu_held.py - memory held without an allocation to show for it, under a 2 GiB cap: gpu-check.sh
section 10 on a GPU, and `held-over-fake` in tests/run.sh over the fake driver (where each
created context holds FAKE_CUDA_CREATED_CONTEXT_MIB). Driver API and NVML through ctypes, with
libvgpu.so preloaded: (a) 512 MiB created, mapped and released stay counted until unmapped;
(b) cuCtxCreate until refused: NVML's figure for the process stays within the cap; (c) 512 MiB
freed with cuMemFreeAsync into a pool that keeps it stay counted: a plain allocation of what the
cap has left beside them fits, 64 MiB more does not; (d) a graph allocating 1 GiB is counted when
it runs: the rest of the cap fits beside it, 64 MiB more or a second such graph does not, and a
trim after it is destroyed gives the room back (a second such graph is refused too, though a
driver may share the first's memory with it on the same stream); (e) a 4 KiB stack a thread is
counted at once, an 8 KiB one refused, NVML's figure within the cap; (f) green contexts until
refused (or 16): NVML's figure stays within the cap, what the first held is printed (and whether
its stack limit is its own or the primary context's), and all of it is given back when they are
destroyed. Exit 0, or 1 on a failed check."""
import ctypes
import os
import sys

cuda, nvml = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libnvidia-ml.so.1")
MiB, CAP = 1 << 20, 2048 << 20
ok = True
def call(what, *args, want=0):
    rc = getattr(cuda, what)(*args)
    if rc != want:
        print(f"{what}: CUresult {rc}, not {want}")
        sys.exit(1)
def free_now():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    return free.value
class Process(ctypes.Structure):   # nvmlProcessInfo_t (v3 list)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
def nvml_held():
    handle, count, procs = ctypes.c_void_p(), ctypes.c_uint(64), (Process * 64)()
    if (nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
            or nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), procs)):
        return -1
    mine = [p.used for p in procs[:count.value] if p.pid == os.getpid()]
    return mine[0] if mine and mine[0] < 2**63 else -1
def expect(good, text):
    global ok
    print(("ok - " if good else "FAIL - ") + text)
    ok = ok and good
class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Location),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
call("cuInit", 0)
call("cuDeviceGet", ctypes.byref(dev), 0)
call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
call("cuCtxSetCurrent", ctx)
ptr = ctypes.c_uint64()
call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(4 * MiB))
call("cuMemFree_v2", ptr)

# (a)
prop = Prop(type=1, location=Location(type=1, id=0))   # pinned, on device 0
handle, va = ctypes.c_uint64(), ctypes.c_uint64()
before = free_now()
call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(512 * MiB), ctypes.byref(prop),
     ctypes.c_ulonglong(0))
call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(512 * MiB), ctypes.c_size_t(0),
     ctypes.c_uint64(0), ctypes.c_ulonglong(0))
call("cuMemMap", va, ctypes.c_size_t(512 * MiB), ctypes.c_size_t(0), handle,
     ctypes.c_ulonglong(0))
call("cuMemRelease", handle)
mapped = free_now()
call("cuMemUnmap", va, ctypes.c_size_t(512 * MiB))
unmapped = free_now()
call("cuMemAddressFree", va, ctypes.c_size_t(512 * MiB))
expect(before - mapped >= 500 * MiB and abs(unmapped - before) <= 16 * MiB,
       f"created, mapped, released: {(before - mapped) // MiB} MiB still counted; "
       f"unmapped: {(before - unmapped) // MiB} MiB")

# (b)
made, rc = [], 0
while len(made) < 16:
    c = ctypes.c_void_p()
    rc = cuda.cuCtxCreate_v2(ctypes.byref(c), 0, dev)
    if rc != 0:
        break
    made.append(c)
held = nvml_held()
print(f"{len(made)} contexts created, then CUresult {rc}; NVML: {held // MiB} MiB held")
expect(rc == 2 and 0 < held <= CAP + 4 * MiB,
       "cuCtxCreate refused (out of memory) before NVML's figure passed the cap")
for c in made:
    call("cuCtxDestroy_v2", c)
call("cuCtxSetCurrent", ctx)

# (c)
pool, keep = ctypes.c_void_p(), ctypes.c_uint64(2**64 - 1)
call("cuDeviceGetMemPool", ctypes.byref(pool), dev)
call("cuMemPoolSetAttribute", pool, 4, ctypes.byref(keep))   # RELEASE_THRESHOLD: keep all
call("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(512 * MiB), ctypes.c_void_p(None))
call("cuMemFreeAsync", ptr, ctypes.c_void_p(None))
call("cuCtxSynchronize")
left = free_now()
plain = ctypes.c_uint64()
fits = cuda.cuMemAlloc_v2(ctypes.byref(plain), ctypes.c_size_t(left - 16 * MiB))
more = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 * MiB))
held = nvml_held()
print(f"pool keeps 512 MiB; {left // MiB} MiB left: rc {fits}, 64 MiB more: rc {more}; "
      f"NVML: {held // MiB} MiB held")
expect(fits == 0 and more == 2 and 0 < held <= CAP + 4 * MiB,
       "a pool's cache stays counted: the rest of the cap fits, no more, within the cap")

# (d)
class PoolProps(ctypes.Structure):   # CUmemPoolProps
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int),
                ("location", Location), ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
class AllocNode(ctypes.Structure):   # CUDA_MEM_ALLOC_NODE_PARAMS
    _fields_ = [("poolProps", PoolProps), ("accessDescs", ctypes.c_void_p),
                ("accessDescCount", ctypes.c_size_t), ("bytesize", ctypes.c_size_t),
                ("dptr", ctypes.c_uint64)]
def allocating_graph(mib):
    graph, alloc, release, exe = (ctypes.c_void_p() for _ in range(4))
    params = AllocNode(poolProps=PoolProps(allocType=1, location=Location(type=1, id=0)),
                       bytesize=mib * MiB)
    call("cuGraphCreate", ctypes.byref(graph), 0)
    call("cuGraphAddMemAllocNode", ctypes.byref(alloc), graph, None, ctypes.c_size_t(0),
         ctypes.byref(params))
    call("cuGraphAddMemFreeNode", ctypes.byref(release), graph, ctypes.byref(alloc),
         ctypes.c_size_t(1), ctypes.c_uint64(params.dptr))
    call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
    call("cuGraphDestroy", graph)
    return exe
call("cuMemFree_v2", plain)
call("cuMemPoolTrimTo", pool, ctypes.c_size_t(0))
first, second = allocating_graph(1024), allocating_graph(1024)
before = free_now()
call("cuGraphLaunch", first, ctypes.c_void_p(None))
call("cuCtxSynchronize")
left = free_now()
fits = cuda.cuMemAlloc_v2(ctypes.byref(plain), ctypes.c_size_t(left - 16 * MiB))
more = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 * MiB))
other = cuda.cuGraphLaunch(second, ctypes.c_void_p(None))
held = nvml_held()
print(f"graph allocating 1024 MiB launched: {(before - left) // MiB} MiB counted; rest of the cap: "
      f"rc {fits}, 64 MiB more: rc {more}, a second such graph: rc {other}; NVML: {held // MiB} MiB")
expect(before - left >= 1000 * MiB and fits == 0 and more == 2 and 0 < held <= CAP + 4 * MiB,
       "a graph's allocations are counted when it runs, within the cap")
if fits == 0:
    call("cuMemFree_v2", plain)
call("cuCtxSynchronize")
call("cuGraphExecDestroy", first)
call("cuDeviceGraphMemTrim", dev)
after = free_now()
expect(abs(after - before) <= 16 * MiB,
       f"destroyed and trimmed: {(before - after) // MiB} MiB still counted")
call("cuGraphExecDestroy", second)

# (e)
STACK = 0   # CU_LIMIT_STACK_SIZE
before = free_now()
call("cuCtxSetLimit", STACK, ctypes.c_size_t(4096))
raised = free_now()
bigger = cuda.cuCtxSetLimit(STACK, ctypes.c_size_t(8192))
held = nvml_held()
print(f"4 KiB stacks: {(before - raised) // MiB} MiB counted; 8 KiB: rc {bigger}; "
      f"NVML: {held // MiB} MiB")
expect(before - raised >= 256 * MiB and bigger == 2 and 0 < held <= CAP + 4 * MiB,
       "a raised stack is counted at once, one past the cap refused, within the cap")
call("cuCtxSetLimit", STACK, ctypes.c_size_t(1024))

# (f) A green context retains the primary context and holds resources of its own (cuda.h); what
# it holds on this GPU is printed, since the cap reserves the container's context size for it.
if not hasattr(cuda, "cuGreenCtxCreate"):
    print("skipped (f): this driver has no green contexts (CUDA 12.4)")
else:
    # CUdevResource is 144 bytes in CUDA 12.4-13's cuda.h; room for a larger one.
    resource, desc = (ctypes.c_ubyte * 1024)(), ctypes.c_void_p()
    call("cuDeviceGetDevResource", dev, resource, 1)                 # CU_DEV_RESOURCE_TYPE_SM
    call("cuDevResourceGenerateDesc", ctypes.byref(desc), resource, 1)
    greens, rc = [], 0
    before = first = nvml_held()
    while len(greens) < 16:
        green = ctypes.c_void_p()
        rc = cuda.cuGreenCtxCreate(ctypes.byref(green), desc, dev, 1)   # CU_GREEN_CTX_DEFAULT_STREAM
        if rc != 0:
            break
        greens.append(green)
        if len(greens) == 1:
            first = nvml_held()
            # Whether a green context's limits are its own, as the library counts them (cuda.h
            # does not say): the primary context's stack raised to 2 KiB, the green one's read.
            # Printed only, a driver's refusal included: what the answer is, is the question.
            own, as_ctx, popped = ctypes.c_size_t(), ctypes.c_void_p(), ctypes.c_void_p()
            rc = cuda.cuCtxSetLimit(STACK, ctypes.c_size_t(2048)) or \
                cuda.cuCtxFromGreenCtx(ctypes.byref(as_ctx), green) or \
                cuda.cuCtxPushCurrent_v2(as_ctx)
            if rc == 0:
                rc = cuda.cuCtxGetLimit(ctypes.byref(own), STACK)
                cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
            cuda.cuCtxSetLimit(STACK, ctypes.c_size_t(1024))
            print(f"the primary context's stack at 2 KiB, the green context's reads {own.value} "
                  f"bytes ({'shared' if own.value == 2048 else 'its own'})" if rc == 0 else
                  f"the green context's stack could not be read: CUresult {rc}")
    held = nvml_held()
    print(f"{len(greens)} green contexts, then CUresult {rc}; the first held "
          f"{(first - before) // MiB} MiB; NVML: {held // MiB} MiB held")
    expect((rc == 2 or len(greens) == 16) and 0 < held <= CAP + 4 * MiB,
           "green contexts made until refused (out of memory) or 16, NVML's figure within the cap")
    for green in greens:
        call("cuGreenCtxDestroy", green)
    after = nvml_held()
    expect(abs(after - before) <= 16 * MiB,
           f"all destroyed: {(after - before) // MiB} MiB more held than before them")
sys.exit(0 if ok else 1)
