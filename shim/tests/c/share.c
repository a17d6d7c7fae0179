/* A CUDA driver-API program written against cuda.h-style declarations only, used by the shim's
 * tests over fakecuda. Roles:
 *   share creator SOCKET PATH   create a POSIX-shareable allocation, map, fill, export, send the
 *                               ticket FD over the Unix socket at SOCKET, wait for the importer's
 *                               byte, verify the importer's write
 *   share importer SOCKET PATH  receive the FD, import, map at another address, verify, write
 *   share resolve PATH          print, for wrapped and pass-through names, which library the entry
 *                               path resolves them to
 *   share pool SOCKET PATH      create a POSIX-shareable memory pool, export it, send the FD over
 *                               the Unix socket at SOCKET (unless it is -), say so, wait for a
 *                               line on stdin, destroy it, say so, wait for another line
 *   share pool-import SOCKET PATH
 *                               receive a pool FD, import the pool, say so, wait for a line on
 *                               stdin, destroy it, say so, wait for another line
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
#include <dirent.h>
#include <sys/wait.h>

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
typedef struct {
    int allocType; int handleTypes; CUmemLocation location; void *win32; size_t maxSize;
    unsigned char rest[56];
} CUmemPoolProps;
CUresult cuMemPoolCreate(void **, const CUmemPoolProps *);
CUresult cuMemPoolExportToShareableHandle(void *, void *, int, unsigned long long);
CUresult cuMemPoolDestroy(void *);
CUresult cuMemPoolImportFromShareableHandle(void **, void *, int, unsigned long long);

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

/* A new POSIX-shareable allocation of SIZE bytes on device 0. */
static CUhandle create_allocation(void) {
    CUmemAllocationProp prop = {1, 1, {1, 0}, 0, {0}};
    CUhandle h;
    CUresult r;
    if ((r = R(cuMemCreate)(&h, SIZE, &prop, 0))) die("create", r);
    return h;
}

/* The allocation's export as a POSIX FD. */
static int export_fd(CUhandle h) {
    int fd;
    CUresult r;
    if ((r = R(cuMemExportToShareableHandle)(&fd, h, 1, 0))) die("export", r);
    return fd;
}

/* Says `what` of the pool, waits for a line on stdin, closes `fd` (unless it is -1), destroys
 * the pool, says so, and waits for another line. */
static void destroy_when_told(const char *what, void *pool, int fd) {
    char line[16];
    CUresult r;
    printf("%s %p\n", what, pool);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) die("stdin", 0);
    if (fd != -1) close(fd);
    if ((r = R(cuMemPoolDestroy)(pool))) die("pool destroy", r);
    printf("destroyed\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) die("stdin", 0);
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

CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *, CUhandle);
CUresult cuMemRetainAllocationHandle(CUhandle *, void *);
typedef struct { unsigned int n; size_t size; unsigned long long types, flags; } CUmulticastObjectProp;
CUresult cuMulticastGetGranularity(size_t *, const CUmulticastObjectProp *, int);
CUresult cuMulticastCreate(CUhandle *, const CUmulticastObjectProp *);

/* Calls every wrapped entry point with inputs whose outcome the shim must not change, and
 * prints each result code: the test runs this with and without the shim and compares. */
static void probe(void) {
    CUmemAllocationProp posix = {1, 1, {1, 0}, 0, {0}}, plain = {1, 0, {1, 0}, 0, {0}};
    CUmemAllocationProp bad_location = {1, 0, {1, 99}, 0, {0}};
    CUmulticastObjectProp mc = {2, 2u << 20, 1, 0}, mc_none = {0, 2u << 20, 1, 0};
    size_t g = 0;
    CUhandle h = 0;
    CUdeviceptr va = 0;
    int fd = -1;
    CUmemAccessDesc rw = {{1, 0}, 3}, bad_access = {{1, 0}, 2};
    CUresult code = R(cuMemGetAllocationGranularity)(&g, &posix, 0);
    printf("granularity %d %zu\n", code, g);
    printf("granularity_recommended %d\n", R(cuMemGetAllocationGranularity)(&g, &posix, 1));
    printf("granularity_bad_option %d\n", R(cuMemGetAllocationGranularity)(&g, &posix, 7));
    printf("granularity_null %d\n", R(cuMemGetAllocationGranularity)(&g, NULL, 0));
    printf("create_zero_size %d\n", R(cuMemCreate)(&h, 0, &posix, 0));
    printf("create_unaligned %d\n", R(cuMemCreate)(&h, 4096, &posix, 0));
    printf("create_bad_device %d\n", R(cuMemCreate)(&h, SIZE, &bad_location, 0));
    printf("create_null_prop %d\n", R(cuMemCreate)(&h, SIZE, NULL, 0));
    printf("create_plain %d\n", R(cuMemCreate)(&h, SIZE, &plain, 0));
    printf("release_plain %d\n", R(cuMemRelease)(h));
    printf("release_bogus %d\n", R(cuMemRelease)(0x1234));
    printf("map_bogus %d\n", R(cuMemMap)(0x7000000000, SIZE, 0, 0x1234, 0));
    printf("unmap_unmapped %d\n", R(cuMemUnmap)(0x7000000000, SIZE));
    printf("access_unmapped %d\n", R(cuMemSetAccess)(0x7000000000, SIZE, &rw, 1));
    printf("export_bogus %d\n", R(cuMemExportToShareableHandle)(&fd, 0x1234, 1, 0));
    printf("import_closed_fd %d\n", R(cuMemImportFromShareableHandle)(&h, (void *)(uintptr_t)987, 1));
    printf("properties_bogus %d\n", R(cuMemGetAllocationPropertiesFromHandle)(&posix, 0x1234));
    printf("retain_unmapped %d\n", R(cuMemRetainAllocationHandle)(&h, (void *)0x7000000000));
    code = R(cuMulticastGetGranularity)(&g, &mc, 0);
    printf("mc_granularity %d %zu\n", code, g);
    printf("mc_create_no_devices %d\n", R(cuMulticastCreate)(&h, &mc_none));
    /* A tracked allocation's observable results. */
    printf("create_posix %d\n", R(cuMemCreate)(&h, SIZE, &posix, 0));
    printf("reserve %d\n", R(cuMemAddressReserve)(&va, SIZE, 0, 0, 0));
    printf("map_offset_beyond %d\n", R(cuMemMap)(va, SIZE, SIZE, h, 0));
    printf("map %d\n", R(cuMemMap)(va, SIZE, 0, h, 0));
    printf("map_again %d\n", R(cuMemMap)(va, SIZE, 0, h, 0));
    printf("access_bad_flags %d\n", R(cuMemSetAccess)(va, SIZE, &bad_access, 1));
    printf("access %d\n", R(cuMemSetAccess)(va, SIZE, &rw, 1));
    CUmemAllocationProp got = {0};
    code = R(cuMemGetAllocationPropertiesFromHandle)(&got, h);
    printf("properties %d %d %d %d %d\n", code, got.type,
           got.requestedHandleTypes, got.location.type, got.location.id);
    printf("export_fabric %d\n", R(cuMemExportToShareableHandle)(&fd, h, 8, 0));
    printf("export_flags %d\n", R(cuMemExportToShareableHandle)(&fd, h, 1, 1));
    printf("unmap %d\n", R(cuMemUnmap)(va, SIZE));
    printf("release %d\n", R(cuMemRelease)(h));
}

/* Counts this process's memfds and names its cuinterpose sockets. */
static void describe_fds(const char *who) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int memfds = 0;
    while ((e = readdir(d))) {
        char link[64], target[256];
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n < 0) continue;
        target[n] = 0;
        if (strstr(target, "memfd:")) memfds++;
        if (!strncmp(target, "socket:", 7)) {
            struct sockaddr_un a;
            socklen_t len = sizeof a;
            if (!getsockname(fd, (void *)&a, &len) && a.sun_family == AF_UNIX && strstr(a.sun_path, "cuinterpose-"))
                printf("%s socket %s\n", who, strrchr(a.sun_path, '/') + 1);
        }
    }
    closedir(d);
    printf("%s memfds %d\n", who, memfds);
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
    if (!strcmp(argv[1], "probe")) {
        probe();
        return 0;
    }
    if (!strcmp(argv[1], "fork")) {
        /* Export once (the shim caches the driver's FD), then fork: the child must hold
         * neither the control socket nor the cached FD, and must not answer as the parent. */
        CUhandle h = create_allocation();
        export_fd(h); /* the FD stays open */
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            describe_fds("child");
            printf("child cuInit %d\n", R(cuInit)(0));
            CUmemAllocationProp p2 = {1, 1, {1, 0}, 0, {0}};
            printf("child cuMemCreate %d\n", R(cuMemCreate)(&h, SIZE, &p2, 0));
            fflush(stdout);
            _exit(0);
        }
        int status;
        waitpid(child, &status, 0);
        describe_fds("parent");
        return 0;
    }
    if (!strcmp(argv[1], "pool")) {
        CUmemPoolProps props = {1, 1, {1, 0}, 0, 0, {0}};
        void *pool;
        int fd;
        if ((r = R(cuMemPoolCreate)(&pool, &props))) die("pool create", r);
        if ((r = R(cuMemPoolExportToShareableHandle)(&fd, pool, 1, 0))) die("pool export", r);
        if (strcmp(argv[2], "-")) send_fd(sock(argv[2], 1), fd);
        destroy_when_told("exported", pool, fd);
        return 0;
    }
    if (!strcmp(argv[1], "pool-import")) {
        int fd = recv_fd(sock(argv[2], 0));
        void *pool;
        if ((r = R(cuMemPoolImportFromShareableHandle)(&pool, (void *)(uintptr_t)fd, 1, 0)))
            die("pool import", r);
        close(fd);
        destroy_when_told("imported", pool, -1);
        return 0;
    }
    if (!strcmp(argv[1], "creator")) {
        CUhandle h = create_allocation();
        CUdeviceptr va = map(h);
        fill(va, 7);
        int fd = export_fd(h);
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
