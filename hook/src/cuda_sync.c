/* cuda_sync.c - a synchronisation tells the SM limiter when none of the process's work runs on
 * its device any more (throttle.h): a process that exits before NVML has measured it stays
 * charged for what it prepaid, so a light one that waited on its kernels was charged the whole
 * GPU for its life. A context's synchronisation covers every stream; a stream's, or a query
 * that found its work done, covers that stream (PyTorch's copies to the host wait so), as a
 * synchronous copy to the host covers its default stream, and a wait for an event (XLA's and
 * PyTorch's waits) what its stream was given before its record; a stream destroyed may leave
 * work running that no later wait of its handle covers. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "throttle.h"

/* Whether a synchronisation by this thread on dev, of stream (a key; VGPU_ALL_STREAMS: the
 * current context), covers all the process's work there: the limiter's tests
 * (vgpu_throttle_may_drain), and for the current context or its default streams, that context
 * being dev's primary one. A context the library did not see made (through an export it does
 * not know) may run beside the primary one, and its own synchronisation would not cover the
 * primary's work. */
static int covers(int dev, uintptr_t stream, int of_current_context)
{
    return vgpu_throttle_may_drain(dev, stream) &&
           (!of_current_context || vgpu_primary_context_current(dev));
}

/* After a synchronisation of the current context answered rc: the current context's device
 * only. A launch is charged to its stream's device (launch_device_on), so it ran in a context
 * there, the primary one where the process made no other (vgpu_throttle_synced); another
 * device's work may run on. (Where the driver cannot name a stream's device the launch is
 * charged to the current context's, though it runs elsewhere: a green context's stream on a
 * driver before CUDA 12.5, whose device the green context already keeps from draining.) */
static CUresult current_context_synced(CUresult rc)
{
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS) {
        int dev = launch_device_on(NULL);
        if (covers(dev, VGPU_ALL_STREAMS, 1))
            vgpu_throttle_synced(dev, VGPU_ALL_STREAMS);
    }
    return rc;
}

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    if (!ready() || real.cuCtxSynchronize == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return current_context_synced(real.cuCtxSynchronize());
}

/* CUDA 13.0's synchronisation of a named context, NULL naming the current one (cuda_13.h): a
 * named one covers the process's work where it is a device's primary context, on that device,
 * while no context but a known primary one is current (any other, one the library did not see
 * made above all, may have had work launched in it, charged to its device); no other context's
 * does, as above. */
VGPU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    if (!ready() || real.cuCtxSynchronize_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuCtxSynchronize_v2(ctx);
    if (ctx == NULL)
        return current_context_synced(rc);
    int dev = vgpu_primary_device_of(ctx);
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS && covers(dev, VGPU_ALL_STREAMS, 0) &&
        vgpu_unknown_context_current() == 0)
        vgpu_throttle_synced(dev, VGPU_ALL_STREAMS);
    return rc;
}

/* A wait for stream (named through a _ptsz export: per_thread) through the driver's *wait:
 * once it answers CUDA_SUCCESS, the stream has no work left (cuda.h, cuStreamQuery: otherwise
 * CUDA_ERROR_NOT_READY). Its device is asked as a launch on it asks, so that the stream's
 * launches were charged there. */
static CUresult wait_stream(CUresult (*const *wait)(CUstream), CUstream stream, int per_thread)
{
    if (!ready() || *wait == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = (*wait)(stream);
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS) {
        int dev = launch_device_on(stream);
        uintptr_t key = vgpu_stream_key(stream, per_thread);
        if (covers(dev, key, vgpu_default_stream(stream)))
            vgpu_throttle_synced(dev, key);
    }
    return rc;
}

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    return wait_stream(&real.cuStreamSynchronize, stream, 0);
}

VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    return wait_stream(&real.cuStreamSynchronize_ptsz, stream, 1);
}

VGPU_EXPORT CUresult cuStreamQuery(CUstream stream)
{
    return wait_stream(&real.cuStreamQuery, stream, 0);
}

VGPU_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream)
{
    return wait_stream(&real.cuStreamQuery_ptsz, stream, 1);
}

/* A synchronous copy from device memory to host memory (as cudaMemcpy to the host may make)
 * is queued on the current context's default stream behind the work there: the legacy one in
 * the plain exports, the thread's own in the _ptds ones (cuda.h maps cuMemcpyDtoH and cuMemcpy
 * to them under CUDA_API_PER_THREAD_DEFAULT_STREAM, as it maps the streams' calls). It
 * "returns only once the copy has completed" (cuda_runtime_api.h, API synchronization
 * behavior), so its success drains that stream as the stream's synchronisation does. Only a
 * copy that surely waited counts: of some bytes (an empty one may return at once), from
 * memory of the current context's device that is not managed (which the driver may copy
 * another way), to memory the driver calls the host's and not managed (pinned) or does not
 * know (pageable: INVALID_VALUE, cuda.h). A copy within the device returns before it is done.
 * The driver is asked about the addresses only where the copy would drain. */
static int not_managed(CUdeviceptr ptr)
{
    unsigned long long managed = 0; /* cuda.h: "a boolean", of no stated size */
    return vgpu_pointer_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) ==
               CUDA_SUCCESS &&
           managed == 0;
}

static int device_memory_of(int dev, CUdeviceptr ptr)
{
    unsigned int type = 0;
    int ordinal = -1;
    if (vgpu_pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE || !not_managed(ptr))
        return 0;
    return __atomic_load_n(&vgpu_one_device, __ATOMIC_RELAXED) ||
           (vgpu_pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) ==
                CUDA_SUCCESS &&
            ordinal == dev);
}

static int host_memory(CUdeviceptr ptr)
{
    unsigned int type = 0;
    CUresult rc = vgpu_pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
    return rc == CUDA_ERROR_INVALID_VALUE ||
           (rc == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST && not_managed(ptr));
}

/* After a synchronous copy that answered rc: drains as above (per_thread: a _ptds export). */
static CUresult copied(CUresult rc, CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                       int per_thread)
{
    if (!vgpu_throttle_enabled || rc != CUDA_SUCCESS || bytes == 0)
        return rc;
    int dev = launch_device_on(NULL);
    uintptr_t stream = vgpu_stream_key(NULL, per_thread);
    if (covers(dev, stream, 1) && device_memory_of(dev, src) && host_memory(dst))
        vgpu_throttle_synced(dev, stream);
    return rc;
}

/* A copy to dst on the host through *copy (cuMemcpyDtoH_v2 or its _ptds), as wait_stream. */
static CUresult copy_to_host(CUresult (*const *copy)(void *, CUdeviceptr, size_t), void *dst,
                             CUdeviceptr src, size_t bytes, int per_thread)
{
    if (!ready() || *copy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return copied((*copy)(dst, src, bytes), (CUdeviceptr)(uintptr_t)dst, src, bytes, per_thread);
}

VGPU_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy_to_host(&real.cuMemcpyDtoH_v2, dst, src, bytes, 0);
}

VGPU_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy_to_host(&real.cuMemcpyDtoH_v2_ptds, dst, src, bytes, 1);
}

VGPU_EXPORT CUresult cuMemcpyDtoH(void *dst, v1_ptr src, unsigned int bytes)
{
    if (!ready() || real.cuMemcpyDtoH == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return copied(real.cuMemcpyDtoH(dst, src, bytes), (CUdeviceptr)(uintptr_t)dst, src, bytes, 0);
}

/* cuMemcpy copies between any two addresses of the unified space (cudaMemcpy with
 * cudaMemcpyDefault). */
static CUresult unified_copy(CUresult (*const *copy)(CUdeviceptr, CUdeviceptr, size_t),
                             CUdeviceptr dst, CUdeviceptr src, size_t bytes, int per_thread)
{
    if (!ready() || *copy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return copied((*copy)(dst, src, bytes), dst, src, bytes, per_thread);
}

VGPU_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return unified_copy(&real.cuMemcpy, dst, src, bytes, 0);
}

VGPU_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return unified_copy(&real.cuMemcpy_ptds, dst, src, bytes, 1);
}

/* A stream belongs to the context current at its making, and any thread may launch on it
 * later, whatever context is current then: made in a context other than a primary one the
 * library knows, its work may run where the primary context's synchronisation does not wait
 * (vgpu_other_context_current). */
static CUresult stream_made(CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        vgpu_other_context_current();
    return rc;
}

VGPU_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    if (!ready() || real.cuStreamCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return stream_made(real.cuStreamCreate(stream, flags));
}

VGPU_EXPORT CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags,
                                                int priority)
{
    if (!ready() || real.cuStreamCreateWithPriority == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return stream_made(real.cuStreamCreateWithPriority(stream, flags, priority));
}

/* The limiter is told before the driver lets the handle go (after it, its device cannot be
 * asked). */
static CUresult destroy_stream(CUresult (*const *destroy)(CUstream), CUstream stream)
{
    if (!ready() || *destroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_throttle_enabled && !vgpu_default_stream(stream))
        vgpu_throttle_stream_gone(launch_device_on(stream), vgpu_stream_key(stream, 0));
    return (*destroy)(stream);
}

VGPU_EXPORT CUresult cuStreamDestroy(CUstream stream)
{
    return destroy_stream(&real.cuStreamDestroy, stream);
}

VGPU_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    return destroy_stream(&real.cuStreamDestroy_v2, stream);
}

/* An event captures the work its stream was given before the record (cuda.h, cuEventRecord),
 * so its wait covers what a wait for that stream would have covered then: the limiter keeps it
 * (vgpu_throttle_event_recorded) where that wait would have drained, until the next launch.
 * A record in a stream capture does not record the event: a plain one makes it a captured
 * event, whose wait fails (CUDA_ERROR_CAPTURED_EVENT) and so drains nothing, and one with
 * CU_EVENT_RECORD_EXTERNAL, which is refused outside a capture, adds a node to the graph and
 * leaves the event as it was; that one is never kept. (`since`: vgpu_throttle_event_recording
 * before the driver's call, under an SM limit only.) */
static CUresult recorded(CUresult rc, CUevent event, CUstream stream, unsigned int flags,
                         int per_thread, unsigned long since)
{
    int dev = -1;
    uintptr_t key = vgpu_stream_key(stream, per_thread);
    if (rc == CUDA_SUCCESS && (flags & CU_EVENT_RECORD_EXTERNAL) == 0) {
        dev = launch_device_on(stream);
        dev = covers(dev, key, vgpu_default_stream(stream)) ? dev : -1;
    }
    vgpu_throttle_event_recorded(dev, key, (uintptr_t)event, since);
    return rc;
}

/* A record through *plain (cuEventRecord or its _ptsz), or else through *with_flags
 * (cuEventRecordWithFlags or its _ptsz) with flags; per_thread: a _ptsz export. */
static CUresult record_event(CUresult (*const *plain)(CUevent, CUstream),
                             CUresult (*const *with_flags)(CUevent, CUstream, unsigned int),
                             CUevent event, CUstream stream, unsigned int flags, int per_thread)
{
    if (!ready() || (plain != NULL ? *plain == NULL : *with_flags == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    int limited = vgpu_throttle_enabled;
    unsigned long since = limited ? vgpu_throttle_event_recording() : 0;
    CUresult rc = plain != NULL ? (*plain)(event, stream) : (*with_flags)(event, stream, flags);
    return limited ? recorded(rc, event, stream, flags, per_thread, since) : rc;
}

VGPU_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    return record_event(&real.cuEventRecord, NULL, event, stream, 0, 0);
}

VGPU_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream)
{
    return record_event(&real.cuEventRecord_ptsz, NULL, event, stream, 0, 1);
}

VGPU_EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags)
{
    return record_event(NULL, &real.cuEventRecordWithFlags, event, stream, flags, 0);
}

VGPU_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream,
                                                 unsigned int flags)
{
    return record_event(NULL, &real.cuEventRecordWithFlags_ptsz, event, stream, flags, 1);
}

/* An interprocess event may be recorded by another process (cuda.h, cuIpcOpenEventHandle), and
 * its wait then covers that one's work, not this one's: once the process makes or opens one,
 * no event's wait drains (the limiter is told whether or not a limit is set yet). */
VGPU_EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    if (!ready() || real.cuEventCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if ((flags & CU_EVENT_INTERPROCESS) != 0)
        vgpu_throttle_events_shared();
    return real.cuEventCreate(event, flags);
}

VGPU_EXPORT CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle)
{
    if (!ready() || real.cuIpcOpenEventHandle == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_throttle_events_shared();
    return real.cuIpcOpenEventHandle(event, handle);
}

/* A wait for event through *wait: CUDA_SUCCESS once all the work it captured is done (cuda.h,
 * cuEventQuery: otherwise CUDA_ERROR_NOT_READY). */
static CUresult wait_event(CUresult (*const *wait)(CUevent), CUevent event)
{
    if (!ready() || *wait == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = (*wait)(event);
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS)
        vgpu_throttle_event_done((uintptr_t)event);
    return rc;
}

VGPU_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    return wait_event(&real.cuEventSynchronize, event);
}

VGPU_EXPORT CUresult cuEventQuery(CUevent event)
{
    return wait_event(&real.cuEventQuery, event);
}

/* Forgotten before the driver lets the handle go: a new event may get it, and before its first
 * record its wait returns at once (cuda.h, cuEventRecord). */
static CUresult destroy_event(CUresult (*const *destroy)(CUevent), CUevent event)
{
    if (!ready() || *destroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_throttle_enabled)
        vgpu_throttle_event_gone((uintptr_t)event);
    return (*destroy)(event);
}

VGPU_EXPORT CUresult cuEventDestroy(CUevent event)
{
    return destroy_event(&real.cuEventDestroy, event);
}

VGPU_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    return destroy_event(&real.cuEventDestroy_v2, event);
}
