/* A CUDA driver-API program written against cuda.h-style declarations only, used by the shim's
 * tests over fakecuda. Roles:
 *   share creator SOCKET PATH   create a POSIX-shareable allocation, map, fill, export, send the
 *                               ticket FD over the Unix socket at SOCKET, wait for the importer's
 *                               byte, verify the importer's write
 *   share importer SOCKET PATH  receive the FD, import, map at another address, verify, write
 *   share resolve PATH          print, for wrapped and pass-through names, which library the entry
 *                               path resolves them to
 * PATH selects how driver functions are found: direct, dlsym, default, next, proc:VERSION,
 * procv1:VERSION, runtime:LIBRARY. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32; unsigned char flags[8];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemCreate(CUhandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUhandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUhandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemExportToShareableHandle(void *, CUhandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUhandle *, void *, int);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);

#define SIZE (2u << 20)
static const char *path;
static void *driver;

static void die(const char *what, int code) {
    fprintf(stderr, "share: %s failed: %d\n", what, code);
    exit(2);
}

/* Resolves a driver function through the selected entry path. */
static void *resolve(const char *name, void *direct) {
    void *p = NULL;
    if (!strcmp(path, "direct")) return direct;
    if (!driver) driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!strcmp(path, "dlsym")) p = dlsym(driver, name);
    else if (!strcmp(path, "default")) p = dlsym(RTLD_DEFAULT, name);
    else if (!strcmp(path, "next")) p = dlsym(RTLD_NEXT, name);
    else if (!strncmp(path, "proc:", 5)) {
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(driver, "cuGetProcAddress_v2");
        int status = -1;
        const char *base = name;
        char unsuffixed[128];
        const char *v2 = strstr(name, "_v2");
        if (v2 && v2[3] == 0 && strncmp(name, "cuMulticast", 11)) { /* ask by cuda.h's unsuffixed name */
            snprintf(unsuffixed, sizeof unsuffixed, "%.*s", (int)(v2 - name), name);
            base = unsuffixed;
        }
        CUresult r = gpa(base, &p, atoi(path + 5), 0, &status);
        if (r || status) die(name, r ? r : 1000 + status);
    } else if (!strncmp(path, "procv1:", 7)) {
        CUresult (*gpa)(const char *, void **, int, unsigned long long) = dlsym(driver, "cuGetProcAddress");
        CUresult r = gpa(name, &p, atoi(path + 7), 0);
        if (r) die(name, r);
    } else if (!strncmp(path, "runtime:", 8)) {
        void *rt = dlopen(path + 8, RTLD_NOW | RTLD_GLOBAL);
        if (!rt) die(dlerror(), 0);
        int (*ep)(const char *, void **, unsigned int, unsigned long long, int *) = dlsym(rt, "cudaGetDriverEntryPointByVersion");
        int status = -1;
        int r = ep(name, &p, 12030, 0, &status);
        if (r || status) die(name, r ? r : 1000 + status);
    }
    if (!p) die(name, -1);
    return p;
}

#define R(name) ((__typeof__(&name))resolve(#name, (void *)&name))

static void setup(void) {
    void *ctx;
    CUresult r;
    if ((r = R(cuInit)(0))) die("cuInit", r);
    if ((r = R(cuDevicePrimaryCtxRetain)(&ctx, 0))) die("retain", r);
    if ((r = R(cuCtxSetCurrent)(ctx))) die("setcurrent", r);
}

static CUdeviceptr map(CUhandle h) {
    CUdeviceptr va;
    CUmemAccessDesc access = {{1, 0}, 3};
    CUresult r;
    if ((r = R(cuMemAddressReserve)(&va, SIZE, 0, 0, 0))) die("reserve", r);
    if ((r = R(cuMemMap)(va, SIZE, 0, h, 0))) die("map", r);
    if ((r = R(cuMemSetAccess)(va, SIZE, &access, 1))) die("access", r);
    return va;
}

static int sock(const char *where, int listening) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    snprintf(a.sun_path, sizeof a.sun_path, "%s", where);
    if (listening) {
        if (bind(s, (void *)&a, sizeof a) || listen(s, 1)) die("bind", 0);
        int c = accept(s, NULL, NULL);
        close(s);
        return c;
    }
    for (int i = 0; i < 500; i++) {
        if (!connect(s, (void *)&a, sizeof a)) return s;
        usleep(10000);
    }
    die("connect", 0);
    return -1;
}

static void send_fd(int s, int fd) {
    char byte = 'T', cbuf[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec io = {&byte, 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(s, &m, 0) != 1) die("sendmsg", 0);
}

static int recv_fd(int s) {
    char byte, cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    int fd;
    if (recvmsg(s, &m, 0) != 1) die("recvmsg", 0);
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

static unsigned char pattern(size_t i, int salt) { return (unsigned char)(i * 131 + salt); }

static void fill(CUdeviceptr va, int salt) {
    static unsigned char buf[SIZE];
    for (size_t i = 0; i < SIZE; i++) buf[i] = pattern(i, salt);
    CUresult r = R(cuMemcpyHtoD_v2)(va, buf, SIZE);
    if (r) die("htod", r);
}

static void verify(CUdeviceptr va, int salt) {
    static unsigned char buf[SIZE];
    CUresult r = R(cuMemcpyDtoH_v2)(buf, va, SIZE);
    if (r) die("dtoh", r);
    for (size_t i = 0; i < SIZE; i++)
        if (buf[i] != pattern(i, salt)) {
            fprintf(stderr, "share: byte %zu is %d, expected %d\n", i, buf[i], pattern(i, salt));
            exit(3);
        }
}

static void lib_of(const char *name) {
    Dl_info info;
    void *p = resolve(name, dlsym(RTLD_DEFAULT, name));
    if (!dladdr(p, &info) || !info.dli_fname) die("dladdr", 0);
    const char *slash = strrchr(info.dli_fname, '/');
    printf("%s %s\n", name, slash ? slash + 1 : info.dli_fname);
}

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    path = argv[argc - 1];
    if (!strcmp(argv[1], "resolve")) {
        const char *names[] = {"cuInit", "cuMemCreate", "cuMemMap", "cuMemExportToShareableHandle",
                               "cuMemImportFromShareableHandle", "cuMemGetAllocationGranularity",
                               "cuMulticastBindMem_v2", "cuMemcpyHtoD_v2", "cuDevicePrimaryCtxRetain"};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) lib_of(names[i]);
        return 0;
    }
    setup();
    CUresult r;
    if (!strcmp(argv[1], "creator")) {
        CUmemAllocationProp prop = {1, 1, {1, 0}, 0, {0}};
        CUhandle h;
        int fd;
        if ((r = R(cuMemCreate)(&h, SIZE, &prop, 0))) die("create", r);
        CUdeviceptr va = map(h);
        fill(va, 7);
        if ((r = R(cuMemExportToShareableHandle)(&fd, h, 1, 0))) die("export", r);
        int s = sock(argv[2], 1);
        send_fd(s, fd);
        close(fd); /* the exporter closes its FD right after sending */
        char done;
        if (read(s, &done, 1) != 1) die("read", 0);
        verify(va, 9);
        printf("creator handle=%#llx ok\n", h);
        return 0;
    }
    if (!strcmp(argv[1], "importer")) {
        int s = sock(argv[2], 0);
        int fd = recv_fd(s);
        CUhandle h;
        if ((r = R(cuMemImportFromShareableHandle)(&h, (void *)(uintptr_t)fd, 1))) die("import", r);
        close(fd);
        CUdeviceptr va = map(h);
        if ((r = R(cuMemRelease)(h))) die("release", r); /* the mapping keeps it alive */
        verify(va, 7);
        fill(va, 9);
        if (write(s, "d", 1) != 1) die("write", 0);
        printf("importer handle=%#llx ok\n", h);
        return 0;
    }
    return 64;
}
