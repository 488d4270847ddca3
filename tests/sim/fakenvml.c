/*
 * fakenvml.c - a fake libnvidia-ml.so.1 for nvshim's simulated GPU hosts.
 *
 * It answers the NVML calls a container runtime's discovery makes (through the
 * real pynvml) from a topology file written by tests/sim/simhost.py:
 *   - $FAKE_NVML_TOPOLOGY if set, else
 *   - "fake-nvml.topology" in the directory of this library (found with dladdr).
 *
 * Topology format, one record per line, '#' starts a comment:
 *   driver <version>            e.g. driver 550.90.12
 *   nvml <version>              e.g. nvml 12.550.90.12
 *   cuda <int>                  e.g. cuda 12040
 *   init_error <int>            NVML error code every nvmlInit* returns (0: none)
 *   gpu key=value ... name=<rest of line>
 *   mig key=value ... name=<rest of line>
 * "gpu" records come in NVML index order; "mig" records name their parent GPU's
 * index (parent=) and their position among its MIG devices (slot=).
 *
 * The compute mode set through nvmlDeviceSetComputeMode persists in a state file
 * ($FAKE_NVML_STATE, else "<topology>.state"), lines "compute_mode <uuid> <mode>",
 * so that a later process sees it.
 *
 * Struct layouts and enum values follow NVIDIA's public nvml.h.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h subset ------------------------------------------------------ */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT = 4,
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t layout");

/* ---- the simulated devices ---------------------------------------------- */

struct fake_dev {
    int is_mig;
    unsigned index; /* GPU: NVML index; MIG: slot among the parent's MIG devices */
    unsigned parent; /* MIG: parent GPU index */
    unsigned minor;
    char uuid[96];
    char name[96];
    char bus_id[32];
    unsigned domain, bus, device, pci_id, pci_subsys;
    unsigned long long mem_total, mem_used, mem_reserved; /* bytes */
    int cc_major, cc_minor;
    unsigned arch, brand;
    int mig_mode, mig_pending; /* -1: MIG not supported */
    unsigned mig_max;
    int numa; /* -1: NOT_SUPPORTED */
    int persistence; /* 0 disabled, 1 enabled (nvmlEnableState_t) */
    unsigned sm, ce, dec, enc, jpg, ofa;
    unsigned gi, ci, gi_slices, ci_slices;
    unsigned nvlinks; /* active NVLinks: to NVSwitches, or to the GPU nvlink_peer names */
    char nvlink_peer[32]; /* bus id of the GPU the links reach directly; empty: NVSwitch */
    int compute_mode; /* initial mode when the state file has none */
    int fail_code, fail_on_handle;
    char fail_only[512]; /* comma list of function names; empty: all */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static struct fake_dev *g_devs; /* GPUs first (by index), then MIG devices */
static unsigned g_ngpus, g_ndevs;
static char g_driver[80], g_nvml[80];
static int g_cuda;
static char g_state_path[PATH_MAX];

static void set_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

/* ---- topology parsing --------------------------------------------------- */

static int topology_path(char *out, size_t size)
{
    const char *env = getenv("FAKE_NVML_TOPOLOGY");
    if (env && *env) {
        set_str(out, size, env);
        return 0;
    }
    Dl_info info;
    char real[PATH_MAX];
    if (!dladdr((void *)&topology_path, &info) || !info.dli_fname)
        return -1;
    if (!realpath(info.dli_fname, real))
        return -1;
    char *slash = strrchr(real, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    if ((size_t)snprintf(out, size, "%s/fake-nvml.topology", real) >= size)
        return -1;
    return 0;
}

static int parse_uint(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || end == s || *end) ? -1 : 0;
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end || v < INT_MIN || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

/* Apply one key=value of a gpu or mig record; returns -1 on an unknown key or bad value. */
static int set_field(struct fake_dev *d, const char *key, const char *val)
{
    unsigned long long u;
    int i;
#define UFIELD(k, f)                                                                               \
    if (!strcmp(key, k))                                                                           \
        return parse_uint(val, &u) ? -1 : (d->f = u, 0);
#define IFIELD(k, f)                                                                               \
    if (!strcmp(key, k))                                                                           \
        return parse_int(val, &i) ? -1 : (d->f = i, 0);
#define SFIELD(k, f)                                                                               \
    if (!strcmp(key, k))                                                                           \
        return strlen(val) >= sizeof(d->f) ? -1 : (set_str(d->f, sizeof(d->f), val), 0);
    UFIELD("index", index)
    UFIELD("slot", index)
    UFIELD("parent", parent)
    UFIELD("minor", minor)
    SFIELD("uuid", uuid)
    SFIELD("name", name)
    SFIELD("bus_id", bus_id)
    UFIELD("domain", domain)
    UFIELD("bus", bus)
    UFIELD("device", device)
    UFIELD("pci_id", pci_id)
    UFIELD("pci_subsys", pci_subsys)
    UFIELD("mem_total", mem_total)
    UFIELD("mem_used", mem_used)
    UFIELD("mem_reserved", mem_reserved)
    IFIELD("cc_major", cc_major)
    IFIELD("cc_minor", cc_minor)
    UFIELD("arch", arch)
    UFIELD("brand", brand)
    IFIELD("mig_mode", mig_mode)
    IFIELD("mig_pending", mig_pending)
    UFIELD("mig_max", mig_max)
    IFIELD("numa", numa)
    IFIELD("persistence", persistence)
    UFIELD("sm", sm)
    UFIELD("ce", ce)
    UFIELD("dec", dec)
    UFIELD("enc", enc)
    UFIELD("jpg", jpg)
    UFIELD("ofa", ofa)
    UFIELD("gi", gi)
    UFIELD("ci", ci)
    UFIELD("gi_slices", gi_slices)
    UFIELD("ci_slices", ci_slices)
    UFIELD("nvlinks", nvlinks)
    SFIELD("nvlink_peer", nvlink_peer)
    IFIELD("compute_mode", compute_mode)
    IFIELD("fail", fail_code)
    IFIELD("fail_on_handle", fail_on_handle)
    SFIELD("fail_only", fail_only)
#undef UFIELD
#undef IFIELD
#undef SFIELD
    return -1;
}

/* Parse "key=value key=value ... name=rest of line" into d. */
static int parse_record(char *rest, struct fake_dev *d)
{
    memset(d, 0, sizeof(*d));
    d->mig_mode = d->mig_pending = -1;
    d->numa = -1;
    char *p = rest;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        char *eq = strchr(p, '=');
        if (!eq)
            return -1;
        *eq = '\0';
        char *key = p, *val = eq + 1;
        if (!strcmp(key, "name")) /* the name takes the rest of the line */
            return set_field(d, key, val);
        char *end = val + strcspn(val, " \t");
        char saved = *end;
        *end = '\0';
        if (set_field(d, key, val))
            return -1;
        p = saved ? end + 1 : end;
    }
    return 0;
}

static void free_topology(void)
{
    free(g_devs);
    g_devs = NULL;
    g_ngpus = g_ndevs = 0;
}

/* Load the topology; returns the init error it asks for (0), or -1 on a bad file. */
static int load_topology(int *init_error)
{
    char path[PATH_MAX];
    if (topology_path(path, sizeof(path))) {
        fprintf(stderr, "fake-nvml: cannot locate the topology file\n");
        return -1;
    }
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "fake-nvml: %s: %s\n", path, strerror(errno));
        return -1;
    }
    const char *state = getenv("FAKE_NVML_STATE");
    int n = (state && *state) ? snprintf(g_state_path, sizeof(g_state_path), "%s", state)
                              : snprintf(g_state_path, sizeof(g_state_path), "%.4000s.state", path);
    if (n < 0 || (size_t)n >= sizeof(g_state_path)) {
        fprintf(stderr, "fake-nvml: state file path too long\n");
        fclose(f);
        return -1;
    }

    struct fake_dev *gpus = NULL, *migs = NULL;
    unsigned ngpus = 0, nmigs = 0, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int bad = 0;
    *init_error = 0;
    g_driver[0] = g_nvml[0] = '\0';
    g_cuda = 0;
    while (!bad && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!*line || *line == '#')
            continue;
        char *sp = strchr(line, ' ');
        if (!sp) {
            bad = 1;
            break;
        }
        *sp = '\0';
        char *arg = sp + 1;
        if (!strcmp(line, "driver") && strlen(arg) < sizeof(g_driver)) {
            set_str(g_driver, sizeof(g_driver), arg);
        } else if (!strcmp(line, "nvml") && strlen(arg) < sizeof(g_nvml)) {
            set_str(g_nvml, sizeof(g_nvml), arg);
        } else if (!strcmp(line, "cuda")) {
            bad = parse_int(arg, &g_cuda);
        } else if (!strcmp(line, "init_error")) {
            bad = parse_int(arg, init_error);
        } else if (!strcmp(line, "gpu") || !strcmp(line, "mig")) {
            int mig = line[0] == 'm';
            struct fake_dev **arr = mig ? &migs : &gpus;
            unsigned *n = mig ? &nmigs : &ngpus;
            struct fake_dev *grown = realloc(*arr, (*n + 1) * sizeof(**arr));
            if (!grown) {
                bad = 1;
                break;
            }
            *arr = grown;
            struct fake_dev *d = &grown[*n];
            bad = parse_record(arg, d);
            d->is_mig = mig;
            if (!mig)
                d->index = *n;
            (*n)++;
        } else {
            bad = 1;
        }
    }
    free(line);
    fclose(f);
    for (unsigned i = 0; !bad && i < nmigs; i++)
        if (migs[i].parent >= ngpus)
            bad = 1;
    if (bad) {
        fprintf(stderr, "fake-nvml: %s: line %u: malformed record\n", path, lineno);
        free(gpus);
        free(migs);
        return -1;
    }
    free_topology();
    g_devs = calloc(ngpus + nmigs + 1, sizeof(*g_devs));
    if (!g_devs) {
        free(gpus);
        free(migs);
        return -1;
    }
    if (ngpus)
        memcpy(g_devs, gpus, ngpus * sizeof(*gpus));
    if (nmigs)
        memcpy(g_devs + ngpus, migs, nmigs * sizeof(*migs));
    g_ngpus = ngpus;
    g_ndevs = ngpus + nmigs;
    free(gpus);
    free(migs);
    return 0;
}

/* ---- handles ------------------------------------------------------------ */

/* The device behind a handle, or NULL when the handle is not one of ours. */
static struct fake_dev *lookup(nvmlDevice_t handle)
{
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)g_devs;
    if (!g_devs || p < base || p >= base + g_ndevs * sizeof(*g_devs))
        return NULL;
    if ((p - base) % sizeof(*g_devs))
        return NULL;
    return (struct fake_dev *)handle;
}

static struct fake_dev *parent_of(struct fake_dev *d)
{
    return d->is_mig ? &g_devs[d->parent] : d;
}

static int listed(const char *list, const char *fn)
{
    size_t n = strlen(fn);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, fn, n))
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* The injected failure for a call on d (or its parent GPU), 0 if none. */
static nvmlReturn_t injected(struct fake_dev *d, const char *fn)
{
    struct fake_dev *g = parent_of(d);
    if (!g->fail_code)
        return NVML_SUCCESS;
    if (g->fail_only[0] && !listed(g->fail_only, fn))
        return NVML_SUCCESS;
    return g->fail_code;
}

static nvmlReturn_t enter(nvmlDevice_t handle, struct fake_dev **out, const char *fn)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    struct fake_dev *d = lookup(handle);
    if (!d)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = injected(d, fn);
    if (r)
        return r;
    *out = d;
    return NVML_SUCCESS;
}

#define ENTER(handle, d)                                                                           \
    struct fake_dev *d = NULL;                                                                     \
    do {                                                                                           \
        nvmlReturn_t r_ = enter(handle, &d, __func__);                                             \
        if (r_)                                                                                    \
            return r_;                                                                             \
    } while (0)

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *value)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ---- init and system queries --------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount) {
        g_refcount++;
    } else {
        int init_error = 0;
        if (load_topology(&init_error))
            ret = NVML_ERROR_UNKNOWN;
        else if (init_error)
            ret = init_error;
        else
            g_refcount = 1;
        if (ret)
            free_topology();
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!g_refcount)
        ret = NVML_ERROR_UNINITIALIZED;
    else if (--g_refcount == 0)
        free_topology();
    pthread_mutex_unlock(&g_lock);
    return ret;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case 23: return "Ran out of critical resources, other than memory";
    case 24: return "The requested frequency is not supported";
    case 25: return "The provided version is invalid/unsupported";
    case 26: return "The requested functionality has been deprecated";
    case 27: return "The system is not ready for the request";
    case 28: return "No GPUs were found";
    case 29: return "Resource not in correct state to perform requested operation";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, g_driver);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, g_nvml);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    *cudaDriverVersion = g_cuda;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device enumeration ----------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_ngpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *d = &g_devs[index];
    if (d->fail_on_handle && d->fail_code)
        return d->fail_code;
    *device = (nvmlDevice_t)d;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_ndevs; i++) {
        if (!strcmp(g_devs[i].uuid, uuid)) {
            struct fake_dev *g = parent_of(&g_devs[i]);
            if (g->fail_on_handle && g->fail_code)
                return g->fail_code;
            *device = (nvmlDevice_t)&g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (!g_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_ngpus; i++) {
        struct fake_dev *d = &g_devs[i];
        /* accept the 8-digit or the legacy 4-digit domain form */
        const char *tail = strchr(d->bus_id, ':');
        const char *want_tail = strchr(pciBusId, ':');
        if (!strcasecmp(d->bus_id, pciBusId) ||
            (tail && want_tail && !strcasecmp(tail, want_tail) &&
             strtoul(pciBusId, NULL, 16) == d->domain)) {
            if (d->fail_on_handle && d->fail_code)
                return d->fail_code;
            *device = (nvmlDevice_t)d;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    ENTER(device, d);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *index = d->index;
    return NVML_SUCCESS;
}

/* ---- identity --------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER(device, d);
    return copy_out(name, length, d->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER(device, d);
    return copy_out(uuid, length, d->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER(device, d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *g = parent_of(d); /* a MIG device reports its parent's PCI location */
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", g->domain, g->bus,
             g->device);
    set_str(pci->busId, sizeof(pci->busId), g->bus_id);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_id;
    pci->pciSubSystemId = g->pci_subsys;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    ENTER(device, d);
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *minorNumber = d->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    ENTER(device, d);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *g = parent_of(d);
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    ENTER(device, d);
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = parent_of(d)->arch;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type)
{
    ENTER(device, d);
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    *type = (int)parent_of(d)->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    ENTER(device, d);
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *g = parent_of(d);
    if (g->numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)g->numa;
    return NVML_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ENTER(device, d);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* v1 counts reserved memory as used */
    memory->total = d->mem_total;
    memory->used = d->mem_used + d->mem_reserved;
    memory->free = d->mem_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ENTER(device, d);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = d->mem_total;
    memory->reserved = d->mem_reserved;
    memory->used = d->mem_used;
    memory->free = d->mem_total - d->mem_used - d->mem_reserved;
    return NVML_SUCCESS;
}

/* ---- MIG ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode)
{
    ENTER(device, d);
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = (unsigned)d->mig_mode;
    *pendingMode = (unsigned)(d->mig_pending < 0 ? d->mig_mode : d->mig_pending);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    ENTER(device, d);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *mode = d->persistence;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    ENTER(device, d);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = d->mig_mode == 1 ? d->mig_max : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    ENTER(device, d);
    if (!migDevice || d->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= d->mig_max)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = g_ngpus; i < g_ndevs; i++) {
        if (g_devs[i].parent == d->index && g_devs[i].index == index) {
            *migDevice = (nvmlDevice_t)&g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    ENTER(device, d);
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = (unsigned)d->is_mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                 nvmlDevice_t *device)
{
    ENTER(migDevice, d);
    if (!device || !d->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)parent_of(d);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    ENTER(device, d);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    ENTER(device, d);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = d->ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                               nvmlDeviceAttributes_t *attributes)
{
    ENTER(device, d);
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) /* nvml.h: only MIG device handles are supported */
        return NVML_ERROR_NOT_SUPPORTED;
    attributes->multiprocessorCount = d->sm;
    attributes->sharedCopyEngineCount = d->ce;
    attributes->sharedDecoderCount = d->dec;
    attributes->sharedEncoderCount = d->enc;
    attributes->sharedJpegCount = d->jpg;
    attributes->sharedOfaCount = d->ofa;
    attributes->gpuInstanceSliceCount = d->gi_slices;
    attributes->computeInstanceSliceCount = d->ci_slices;
    attributes->memorySizeMB = d->mem_total >> 20;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device,
                                            nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ---- compute mode (persisted in the state file) ----------------------------------- */

/* Read the state file's mode for uuid into *mode (left alone if none). */
static void state_read_mode(const char *uuid, int *mode)
{
    int fd = open(g_state_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    flock(fd, LOCK_SH);
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    char key[32], id[96];
    int value;
    while (getline(&line, &cap, f) >= 0) {
        if (sscanf(line, "%31s %95s %d", key, id, &value) == 3 && !strcmp(key, "compute_mode") &&
            !strcmp(id, uuid))
            *mode = value;
    }
    free(line);
    fclose(f); /* closes fd and drops the lock */
}

/* Replace uuid's mode in the state file, under an exclusive lock. */
static int state_write_mode(const char *uuid, int mode)
{
    int fd = open(g_state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX)) {
        close(fd);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || st.st_size > (1 << 20)) {
        close(fd);
        return -1;
    }
    size_t old_len = (size_t)st.st_size;
    size_t out_cap = old_len + 256;
    char *old = malloc(old_len + 1), *out = malloc(out_cap);
    if (!old || !out || pread(fd, old, old_len, 0) != (ssize_t)old_len) {
        free(old);
        free(out);
        close(fd);
        return -1;
    }
    old[old_len] = '\0';
    size_t n = 0;
    char prefix[160];
    snprintf(prefix, sizeof(prefix), "compute_mode %s ", uuid);
    for (char *p = old; *p;) {
        size_t len = strcspn(p, "\n");
        if (strncmp(p, prefix, strlen(prefix))) {
            memcpy(out + n, p, len);
            n += len;
            out[n++] = '\n';
        }
        p += len;
        if (*p == '\n')
            p++;
    }
    n += (size_t)snprintf(out + n, out_cap - n, "%s%d\n", prefix, mode);
    int rc = (ftruncate(fd, 0) || pwrite(fd, out, n, 0) != (ssize_t)n) ? -1 : 0;
    free(old);
    free(out);
    close(fd);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    ENTER(device, d);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *g = parent_of(d);
    int value = g->compute_mode;
    state_read_mode(g->uuid, &value);
    *mode = value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, int mode)
{
    ENTER(device, d);
    if (mode < 0 || mode >= NVML_COMPUTEMODE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    if (state_write_mode(d->uuid, mode)) {
        fprintf(stderr, "fake-nvml: %s: %s\n", g_state_path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* ---- NVLink ------------------------------------------------------------------ */

#define NVML_NVLINK_MAX_LINKS 18
#define NVML_NVLINK_DEVICE_TYPE_GPU 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2

static nvmlReturn_t nvlink_check(struct fake_dev *d, unsigned int link)
{
    if (d->is_mig || !d->nvlinks)
        return NVML_ERROR_NOT_SUPPORTED;
    return link >= NVML_NVLINK_MAX_LINKS ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive)
{
    ENTER(device, d);
    nvmlReturn_t r = nvlink_check(d, link);
    if (r)
        return r;
    if (!isActive)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = link < d->nvlinks;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        int *type)
{
    ENTER(device, d);
    nvmlReturn_t r = nvlink_check(d, link);
    if (r)
        return r;
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlinks)
        return NVML_ERROR_NOT_SUPPORTED;
    *type = d->nvlink_peer[0] ? NVML_NVLINK_DEVICE_TYPE_GPU : NVML_NVLINK_DEVICE_TYPE_SWITCH;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci)
{
    ENTER(device, d);
    nvmlReturn_t r = nvlink_check(d, link);
    if (r)
        return r;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlinks || !d->nvlink_peer[0])
        return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof(*pci));
    set_str(pci->busId, sizeof(pci->busId), d->nvlink_peer);
    return NVML_SUCCESS;
}

/* ---- topology (go-gpuallocator scores GPU pairs with it for preferred allocations) ----
 * Both GPUs on one board: INTERNAL; on one NUMA node: NODE (across host bridges); else
 * SYSTEM. The same level for an NVLink pair: the allocator adds NVLink scores itself.
 * MIG devices answer NOT_SUPPORTED, as on real boards. */

#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                        nvmlDevice_t device2, int *pathInfo)
{
    ENTER(device1, a);
    struct fake_dev *b;
    nvmlReturn_t r = enter(device2, &b, __func__);
    if (r)
        return r;
    if (!pathInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a->is_mig || b->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    if (a == b)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (a->numa >= 0 && a->numa == b->numa)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

/* ---- GPU and compute instances (what go-nvlib asks for a MIG device's profile) ---------
 * A GPU-instance handle and a compute-instance handle are the first MIG device of that
 * instance. Profile indexes 0..6 (NVML_GPU_INSTANCE_PROFILE_1_SLICE .. _6_SLICE, and the
 * compute-instance ones alike) stand for 1, 2, 3, 4, 7, 8 and 6 slices; a profile's id is
 * its index; the other indexes are NOT_SUPPORTED. Only engine profile 0 (shared) exists. */

typedef struct fake_dev *nvmlGpuInstance_t;
typedef struct fake_dev *nvmlComputeInstance_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount;
    unsigned int sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

static const unsigned k_profile_slices[] = {1, 2, 3, 4, 7, 8, 6};
#define PROFILE_KINDS (sizeof(k_profile_slices) / sizeof(k_profile_slices[0]))

static unsigned profile_index(unsigned slices)
{
    for (unsigned i = 0; i < PROFILE_KINDS; i++)
        if (k_profile_slices[i] == slices)
            return i;
    return 0;
}

/* The first MIG device of GPU `gpu` in GPU instance `gi` (and compute instance `ci`, unless -1). */
static struct fake_dev *find_instance(struct fake_dev *gpu, unsigned gi, long ci)
{
    for (unsigned i = g_ngpus; i < g_ndevs; i++) {
        struct fake_dev *m = &g_devs[i];
        if (m->parent == gpu->index && m->gi == gi && (ci < 0 || m->ci == (unsigned)ci))
            return m;
    }
    return NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    ENTER(device, d);
    if (!gpuInstance || d->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    struct fake_dev *m = find_instance(d, id, -1);
    if (!m)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = m;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                          unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance)
{
    ENTER((nvmlDevice_t)gpuInstance, g);
    if (!computeInstance || !g->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_dev *m = find_instance(parent_of(g), g->gi, id);
    if (!m)
        return NVML_ERROR_NOT_FOUND;
    *computeInstance = m;
    return NVML_SUCCESS;
}

/* A GPU instance's size in memory slices (eighths of the parent's memory, rounded up). */
static unsigned gi_memory_slices(struct fake_dev *gpu, struct fake_dev *m)
{
    unsigned long long eighth = gpu->mem_total / 8 ? gpu->mem_total / 8 : 1;
    unsigned size = (unsigned)((m->mem_total + eighth - 1) / eighth);
    return size < 1 ? 1 : size > 8 ? 8 : size;
}

/* Where GPU instance `gi` of `gpu` sits among the 8 memory slices: the instances placed in
 * order of their ids, each at the first free start aligned to its size. */
static void gi_placement(struct fake_dev *gpu, unsigned gi, nvmlInstancePlacement_t *out)
{
    unsigned used = 0;
    out->start = out->size = 0;
    for (unsigned id = 0; id <= 14; id++) {
        struct fake_dev *m = find_instance(gpu, id, -1);
        if (!m)
            continue;
        unsigned size = gi_memory_slices(gpu, m), align = size > 4 ? 8 : size == 3 ? 4 : size;
        unsigned mask = ((1u << size) - 1), start = 0;
        while (start + size <= 8 && (used & (mask << start)))
            start += align;
        if (start + size > 8)
            start = 0;
        used |= mask << start;
        if (id == gi) {
            out->start = start;
            out->size = size;
            return;
        }
    }
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                           nvmlGpuInstanceInfo_t *info)
{
    ENTER((nvmlDevice_t)gpuInstance, g);
    if (!info || !g->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof(*info));
    info->device = (nvmlDevice_t)parent_of(g);
    info->id = g->gi;
    info->profileId = profile_index(g->gi_slices);
    gi_placement(parent_of(g), g->gi, &info->placement);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info)
{
    ENTER((nvmlDevice_t)computeInstance, c);
    if (!info || !c->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof(*info));
    info->device = (nvmlDevice_t)parent_of(c);
    info->gpuInstance = find_instance(parent_of(c), c->gi, -1);
    info->id = c->ci;
    info->profileId = profile_index(c->ci_slices);
    info->placement.size = c->ci_slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                               nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    ENTER(device, d);
    if (!info || d->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1 || profile >= PROFILE_KINDS)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    info->id = profile;
    info->sliceCount = k_profile_slices[profile];
    for (unsigned i = g_ngpus; i < g_ndevs; i++) { /* what the topology's instances show */
        struct fake_dev *m = &g_devs[i];
        if (m->parent == d->index && m->gi_slices == info->sliceCount) {
            info->multiprocessorCount = m->sm;
            info->memorySizeMB = m->mem_total >> 20;
            info->copyEngineCount = m->ce;
            info->decoderCount = m->dec;
            info->encoderCount = m->enc;
            info->jpegCount = m->jpg;
            info->ofaCount = m->ofa;
            info->instanceCount = 7 / info->sliceCount;
        }
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    ENTER((nvmlDevice_t)gpuInstance, g);
    if (!info || !g->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (profile >= PROFILE_KINDS || engProfile != 0 || k_profile_slices[profile] > g->gi_slices)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    info->id = profile;
    info->sliceCount = k_profile_slices[profile];
    return NVML_SUCCESS;
}
