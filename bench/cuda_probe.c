/*
 * nvshim CUDA probe: what CUDA itself sees, with no CUDA toolkit (driver API only).
 *
 * Loads libcuda.so.1 (argv[1] names another path), initialises the driver, and for each
 * device prints its name and UUID, creates a context and allocates and frees 1 MiB.
 * Prints exactly one JSON line on stdout:
 *
 *   {"probe":"nvshim-cuda-probe","version":1,"ok":true,"error":null,...,"devices":[...]}
 *
 * "error" is null, "driver not loaded" (no libcuda.so.1, a libcuda without the driver
 * API, or cuInit failing other than with CUDA_ERROR_NO_DEVICE), "no CUDA device"
 * (cuInit or cuDeviceGetCount found none) or "device failed" (a device's context or
 * allocation failed). "dev" lists the /dev/nvidia* nodes the process sees and
 * "cuda_visible_devices" the variable as set (null when unset). UUIDs are printed as
 * GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx whatever the device; for a MIG device
 * cuDeviceGetUuid_v2 gives the MIG instance's bytes (compare the hex digits).
 * Exit status: 0 when ok, 1 otherwise.
 *
 * Build: gcc -O2 -Wall -o cuda-probe cuda_probe.c -ldl
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_ERROR_NO_DEVICE 100
#define ALLOC_BYTES (1u << 20)

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*driver_version)(int *);
    CUresult (*count)(int *);
    CUresult (*get)(CUdevice *, int);
    CUresult (*name)(char *, int, CUdevice);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*error_name)(CUresult, const char **);
} cu;

static void put_string(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_error(const char *key, CUresult rc)
{
    const char *name = NULL;
    printf(",\"%s\":%d,\"%s_name\":", key, rc, key);
    if (rc && cu.error_name && cu.error_name(rc, &name) != 0)
        name = NULL;
    put_string(rc ? name : "CUDA_SUCCESS");
}

/* The /dev/nvidia* nodes (and nvidia-caps/ entries) this process can see. */
static void put_nodes(void)
{
    const char *dirs[] = {"/dev", "/dev/nvidia-caps"};
    int first = 1;
    fputs(",\"dev\":[", stdout);
    for (int i = 0; i < 2; i++) {
        DIR *dir = opendir(dirs[i]);
        struct dirent *ent;
        if (!dir)
            continue;
        while ((ent = readdir(dir))) {
            char path[300];
            if (strncmp(ent->d_name, "nvidia", 6) != 0 || !strcmp(ent->d_name, "nvidia-caps"))
                continue;
            snprintf(path, sizeof path, "%s%s", i ? "nvidia-caps/" : "", ent->d_name);
            if (!first)
                putchar(',');
            put_string(path);
            first = 0;
        }
        closedir(dir);
    }
    putchar(']');
}

static int finish(int ok, const char *error, const char *stage, const char *detail)
{
    printf(",\"ok\":%s,\"error\":", ok ? "true" : "false");
    put_string(error);
    fputs(",\"stage\":", stdout);
    put_string(stage);
    fputs(",\"detail\":", stdout);
    put_string(detail);
    fputs(",\"cuda_visible_devices\":", stdout);
    put_string(getenv("CUDA_VISIBLE_DEVICES"));
    put_nodes();
    puts("}");
    return ok ? 0 : 1;
}

static void *symbol(void *lib, const char *name, const char *fallback)
{
    void *sym = dlsym(lib, name);
    return sym || !fallback ? sym : dlsym(lib, fallback);
}

/* One device: name, UUID, context, allocation. Returns 1 when all of it worked. */
static int probe_device(int index)
{
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    CUuuid uuid;
    char name[256] = "";
    char text[48] = "";
    CUresult rc, ctx_rc = -1, alloc_rc = -1;

    printf("%s{\"index\":%d", index ? "," : "", index);
    rc = cu.get(&dev, index);
    if (rc == 0)
        rc = cu.name(name, sizeof name, dev);
    fputs(",\"name\":", stdout);
    put_string(rc == 0 ? name : NULL);
    if (rc == 0 && cu.uuid(&uuid, dev) == 0) {
        const unsigned char *b = uuid.bytes;
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                 b[12], b[13], b[14], b[15]);
    }
    fputs(",\"uuid\":", stdout);
    put_string(text[0] ? text : NULL);
    if (rc == 0) {
        ctx_rc = cu.ctx_create(&ctx, 0, dev);
        if (ctx_rc == 0) {
            alloc_rc = cu.mem_alloc(&ptr, ALLOC_BYTES);
            if (alloc_rc == 0)
                cu.mem_free(ptr);
            cu.ctx_destroy(ctx);
        }
    }
    put_error("ctx", rc ? rc : ctx_rc);
    put_error("alloc", alloc_rc);
    int ok = rc == 0 && text[0] && ctx_rc == 0 && alloc_rc == 0;
    printf(",\"ok\":%s}", ok ? "true" : "false");
    return ok;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "libcuda.so.1";
    int version = 0, count = 0, all_ok = 1;
    CUresult rc;
    char detail[512];

    printf("{\"probe\":\"nvshim-cuda-probe\",\"version\":1,\"library\":");
    put_string(path);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return finish(0, "driver not loaded", "dlopen", dlerror());
    cu.init = symbol(lib, "cuInit", NULL);
    cu.driver_version = symbol(lib, "cuDriverGetVersion", NULL);
    cu.count = symbol(lib, "cuDeviceGetCount", NULL);
    cu.get = symbol(lib, "cuDeviceGet", NULL);
    cu.name = symbol(lib, "cuDeviceGetName", NULL);
    cu.uuid = symbol(lib, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
    cu.ctx_create = symbol(lib, "cuCtxCreate_v2", "cuCtxCreate");
    cu.ctx_destroy = symbol(lib, "cuCtxDestroy_v2", "cuCtxDestroy");
    cu.mem_alloc = symbol(lib, "cuMemAlloc_v2", NULL);
    cu.mem_free = symbol(lib, "cuMemFree_v2", NULL);
    cu.error_name = symbol(lib, "cuGetErrorName", NULL);
    const char *names[] = {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet",
                           "cuDeviceGetName", "cuDeviceGetUuid_v2", "cuCtxCreate_v2",
                           "cuCtxDestroy_v2", "cuMemAlloc_v2", "cuMemFree_v2"};
    void *syms[] = {cu.init, cu.driver_version, cu.count, cu.get, cu.name, cu.uuid,
                    cu.ctx_create, cu.ctx_destroy, cu.mem_alloc, cu.mem_free};
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        if (!syms[i]) {
            snprintf(detail, sizeof detail, "%s has no %s: not the driver's libcuda", path,
                     names[i]);
            return finish(0, "driver not loaded", "dlsym", detail);
        }
    }
    rc = cu.init(0);
    put_error("init", rc);
    if (rc == CUDA_ERROR_NO_DEVICE)
        return finish(0, "no CUDA device", "cuInit", NULL);
    if (rc != 0)
        return finish(0, "driver not loaded", "cuInit", NULL);
    if (cu.driver_version(&version) == 0)
        printf(",\"driver_cuda\":\"%d.%d\"", version / 1000, version % 1000 / 10);
    rc = cu.count(&count);
    put_error("count_status", rc);
    printf(",\"count\":%d,\"devices\":[", rc == 0 ? count : 0);
    for (int i = 0; rc == 0 && i < count; i++)
        all_ok &= probe_device(i);
    putchar(']');
    if (rc != 0)
        return finish(0, "driver not loaded", "cuDeviceGetCount", NULL);
    if (count == 0)
        return finish(0, "no CUDA device", "cuDeviceGetCount", NULL);
    return finish(all_ok, all_ok ? NULL : "device failed", all_ok ? NULL : "device", NULL);
}
