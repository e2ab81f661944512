/* cuda_memset.c - a memset of device memory is a kernel the driver writes: under an SM limit it
 * passes the limiter's gate as a launch does, at vgpu_memset_blocks (throttle.h). Before, a
 * container that only set memory ran free of its limit (tests/test_throttle.c, memsets: 95.7 %
 * of the fake GPU under a limit of 25; 99.0 % of an H200's, hook/README.md). Every ABI
 * cudaTypedefs.h lists for the six names is wrapped: CUDA 2.0's (32-bit pointer and sizes),
 * 3.2's _v2, the per-thread default stream's _v2_ptds and _ptsz. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "region.h"
#include "throttle.h"

/* As launches do (cuda_launch.c): every 1024th memset of a thread, and its first, stamps the
 * slot's last_launch_unix_ns, so that the node monitor does not take a process that only sets
 * memory for an idle one. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned memsets_here;

/* The SM limiter's gate for a memset of `bytes` on stream (NULL: a default stream, the
 * per-thread one where per_thread); with no limit one predictable branch. */
static inline void gate(uint64_t bytes, CUstream stream, int per_thread)
{
    if (__builtin_expect((memsets_here++ & 1023) == 0, 0))
        vgpu_region_note_launch();
    if (__builtin_expect(vgpu_throttle_enabled, 0))
        vgpu_throttle_launch(launch_device_on(stream), vgpu_memset_blocks(bytes),
                             vgpu_stream_key(stream, per_thread));
}

VGPU_EXPORT CUresult cuMemsetD8(v1_ptr dst, unsigned char value, unsigned int n)
{
    if (!ready() || real.cuMemsetD8 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n, NULL, 0);
    return vgpu_answered(real.cuMemsetD8(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    if (!ready() || real.cuMemsetD8_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n, NULL, 0);
    return vgpu_answered(real.cuMemsetD8_v2(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n)
{
    if (!ready() || real.cuMemsetD8_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n, NULL, 1);
    return vgpu_answered(real.cuMemsetD8_v2_ptds(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                     CUstream stream)
{
    if (!ready() || real.cuMemsetD8Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n, stream, 0);
    return vgpu_answered(real.cuMemsetD8Async(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                          CUstream stream)
{
    if (!ready() || real.cuMemsetD8Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n, stream, 1);
    return vgpu_answered(real.cuMemsetD8Async_ptsz(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D8(v1_ptr dst, unsigned int pitch, unsigned char value,
                                  unsigned int width, unsigned int height)
{
    if (!ready() || real.cuMemsetD2D8 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D8(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char value,
                                     size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D8_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D8_v2(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned char value,
                                          size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D8_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height, NULL, 1);
    return vgpu_answered(real.cuMemsetD2D8_v2_ptds(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char value,
                                       size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D8Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height, stream, 0);
    return vgpu_answered(real.cuMemsetD2D8Async(dst, pitch, value, width, height, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned char value,
                                            size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D8Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height, stream, 1);
    return vgpu_answered(real.cuMemsetD2D8Async_ptsz(dst, pitch, value, width, height, stream));
}

VGPU_EXPORT CUresult cuMemsetD16(v1_ptr dst, unsigned short value, unsigned int n)
{
    if (!ready() || real.cuMemsetD16 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 2, NULL, 0);
    return vgpu_answered(real.cuMemsetD16(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t n)
{
    if (!ready() || real.cuMemsetD16_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 2, NULL, 0);
    return vgpu_answered(real.cuMemsetD16_v2(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short value, size_t n)
{
    if (!ready() || real.cuMemsetD16_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 2, NULL, 1);
    return vgpu_answered(real.cuMemsetD16_v2_ptds(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n,
                                      CUstream stream)
{
    if (!ready() || real.cuMemsetD16Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 2, stream, 0);
    return vgpu_answered(real.cuMemsetD16Async(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short value, size_t n,
                                           CUstream stream)
{
    if (!ready() || real.cuMemsetD16Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 2, stream, 1);
    return vgpu_answered(real.cuMemsetD16Async_ptsz(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D16(v1_ptr dst, unsigned int pitch, unsigned short value,
                                   unsigned int width, unsigned int height)
{
    if (!ready() || real.cuMemsetD2D16 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 2, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D16(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short value,
                                      size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D16_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 2, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D16_v2(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned short value,
                                           size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D16_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 2, NULL, 1);
    return vgpu_answered(real.cuMemsetD2D16_v2_ptds(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short value,
                                        size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D16Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 2, stream, 0);
    return vgpu_answered(real.cuMemsetD2D16Async(dst, pitch, value, width, height, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned short value,
                                             size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D16Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 2, stream, 1);
    return vgpu_answered(real.cuMemsetD2D16Async_ptsz(dst, pitch, value, width, height, stream));
}

VGPU_EXPORT CUresult cuMemsetD32(v1_ptr dst, unsigned int value, unsigned int n)
{
    if (!ready() || real.cuMemsetD32 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 4, NULL, 0);
    return vgpu_answered(real.cuMemsetD32(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n)
{
    if (!ready() || real.cuMemsetD32_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 4, NULL, 0);
    return vgpu_answered(real.cuMemsetD32_v2(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n)
{
    if (!ready() || real.cuMemsetD32_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 4, NULL, 1);
    return vgpu_answered(real.cuMemsetD32_v2_ptds(dst, value, n));
}

VGPU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n,
                                      CUstream stream)
{
    if (!ready() || real.cuMemsetD32Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 4, stream, 0);
    return vgpu_answered(real.cuMemsetD32Async(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n,
                                           CUstream stream)
{
    if (!ready() || real.cuMemsetD32Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)n * 4, stream, 1);
    return vgpu_answered(real.cuMemsetD32Async_ptsz(dst, value, n, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D32(v1_ptr dst, unsigned int pitch, unsigned int value,
                                   unsigned int width, unsigned int height)
{
    if (!ready() || real.cuMemsetD2D32 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 4, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D32(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int value,
                                      size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D32_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 4, NULL, 0);
    return vgpu_answered(real.cuMemsetD2D32_v2(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned int value,
                                           size_t width, size_t height)
{
    if (!ready() || real.cuMemsetD2D32_v2_ptds == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 4, NULL, 1);
    return vgpu_answered(real.cuMemsetD2D32_v2_ptds(dst, pitch, value, width, height));
}

VGPU_EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int value,
                                        size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D32Async == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 4, stream, 0);
    return vgpu_answered(real.cuMemsetD2D32Async(dst, pitch, value, width, height, stream));
}

VGPU_EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned int value,
                                             size_t width, size_t height, CUstream stream)
{
    if (!ready() || real.cuMemsetD2D32Async_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate((uint64_t)width * height * 4, stream, 1);
    return vgpu_answered(real.cuMemsetD2D32Async_ptsz(dst, pitch, value, width, height, stream));
}
