// The baseline for the host carrier on a real GPU: plain pinned cuMemcpy of N bytes, device to
// host then host to device, timed with the driver API only (no runtime), as GB/s per direction.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { fprintf(stderr, "%s failed: %d\n", #x, r); return 1; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 1024;
    size_t n = mib << 20;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    void *h;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&d, n));
    CHECK(cuMemAllocHost(&h, n));
    CHECK(cuMemsetD8(d, 7, n));
    CHECK(cuMemcpyDtoH(h, d, n)); // warm up
    double t0 = now();
    CHECK(cuMemcpyDtoH(h, d, n));
    double t1 = now();
    CHECK(cuMemcpyHtoD(d, h, n));
    double t2 = now();
    printf("{\"bytes\": %zu, \"dtoh_gb_per_s\": %.2f, \"htod_gb_per_s\": %.2f}\n", n, n / (t1 - t0) / 1e9,
           n / (t2 - t1) / 1e9);
    return 0;
}
