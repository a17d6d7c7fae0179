/* A driver-API client written against cuda.h-style declarations only (no CUDA headers):
 * create, reserve, map, grant access, copy in and out, read through the pointer, clean up.
 * Linked against fakecuda's libcuda.so.1 like any CUDA program links libcuda. */
#include <stdio.h>
#include <string.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuGetErrorName(CUresult error, const char **name);

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult r_ = (call);                                                        \
        if (r_ != 0) {                                                               \
            const char *n_ = "?";                                                    \
            cuGetErrorName(r_, &n_);                                                 \
            printf("error %s at %s\n", n_, #call);                                  \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main(void) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.requestedHandleTypes = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0));
    printf("granularity=%zu\n", gran);

    size_t size = 2 * gran;
    CUmemGenericAllocationHandle h;
    CUdeviceptr p;
    CHECK(cuMemCreate(&h, size, &prop, 0));
    CHECK(cuMemAddressReserve(&p, size, 0, 0, 0));
    CHECK(cuMemMap(p, size, 0, h, 0));
    CUmemAccessDesc access = {{1, 0}, 3};
    CHECK(cuMemSetAccess(p, size, &access, 1));

    const char msg[] = "hello from C";
    char back[sizeof msg];
    CHECK(cuMemcpyHtoD_v2(p + gran, msg, sizeof msg));
    CHECK(cuMemcpyDtoH_v2(back, p + gran, sizeof msg));
    printf("roundtrip=%s\n", strcmp(back, msg) == 0 ? "ok" : "mismatch");
    printf("direct=%c\n", ((const char *)(size_t)p)[gran]);

    const char *name = "";
    CUresult bad = cuMemRelease(0xdeadbeef);
    cuGetErrorName(bad, &name);
    printf("bad_release=%s\n", name);

    CHECK(cuMemUnmap(p, size));
    CHECK(cuMemAddressFree(p, size));
    CHECK(cuMemRelease(h));
    printf("done\n");
    return 0;
}
