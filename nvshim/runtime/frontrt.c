/* The C library of the compiled nvshim-runtime front on x86_64 (nvshim/runtime/frontbin.py
 * links front.c with this file and no libc): the start-up, the system calls and the few
 * string, memory and formatting functions front.c uses, under their C library names.
 *
 * Why: a static glibc binary spends about 0.2 ms of CPU before main on a VM (its CPU
 * feature and cache probing executes many CPUID instructions, each a VM exit, and it
 * touches some 25 more pages), and the front runs before every call an engine makes of
 * the runtime. This start-up does what the front needs and nothing else:
 *
 * - applies the binary's own relative relocations (it is a static PIE: loaded at a random
 *   address) and then makes the RELRO segment read-only, as glibc's static start-up does;
 * - sets the thread pointer to a block holding the stack protector's canary, taken from
 *   the kernel's AT_RANDOM bytes (-fstack-protector-strong reads it at %fs:0x28);
 * - keeps argv, the environment and the auxiliary vector for main, getenv, getauxval.
 *
 * The functions that run before the canary is in place carry no stack protector. The
 * _FORTIFY_SOURCE checks the front is built with call the __*_chk functions below, which
 * abort on an overflow as glibc's do. Memory comes from a static arena, and past it from
 * mmap; only mmap'd blocks are ever given back (a front lives for one call). */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "frontrt.c is the x86_64 front's C library: elsewhere the front links glibc"
#endif

#define NOSP __attribute__((no_stack_protector, used))

int main(int argc, char **argv);

char **environ;
static int errno_value;
static const unsigned long *auxv;

int *__errno_location(void) { return &errno_value; }

/* ---- system calls --------------------------------------------------------------- */

static NOSP long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

#define SYS(n, a, b, c, d, e, f) sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

/* a system call's result as the C library gives it: -1 and errno on failure */
static long ret(long r) {
    if (r < 0 && r > -4096) {
        errno_value = (int)-r;
        return -1;
    }
    return r;
}

__attribute__((noreturn)) void _exit(int status) {
    for (;;)
        SYS(SYS_exit_group, status, 0, 0, 0, 0, 0);
}

__attribute__((noreturn)) void exit(int status) { _exit(status); }

__attribute__((noreturn)) void abort(void) {
    SYS(SYS_kill, SYS(SYS_getpid, 0, 0, 0, 0, 0, 0), 6 /* SIGABRT */, 0, 0, 0, 0);
    _exit(134);
}

__attribute__((noreturn)) void __stack_chk_fail(void) { abort(); }

__attribute__((noreturn)) void __chk_fail(void) { abort(); }

/* a mode is passed only with O_CREAT or O_TMPFILE (as glibc reads it) */
#define NEEDS_MODE(flags) (((flags) & O_CREAT) || ((flags) & __O_TMPFILE) == __O_TMPFILE)

int openat(int dir, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int mode = NEEDS_MODE(flags) ? va_arg(ap, int) : 0;
    va_end(ap);
    return (int)ret(SYS(SYS_openat, dir, path, flags, mode, 0, 0));
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int mode = NEEDS_MODE(flags) ? va_arg(ap, int) : 0;
    va_end(ap);
    return openat(AT_FDCWD, path, flags, mode);
}

int close(int fd) { return (int)ret(SYS(SYS_close, fd, 0, 0, 0, 0, 0)); }

ssize_t read(int fd, void *buf, size_t n) { return ret(SYS(SYS_read, fd, buf, n, 0, 0, 0)); }

ssize_t write(int fd, const void *buf, size_t n) {
    return ret(SYS(SYS_write, fd, buf, n, 0, 0, 0));
}

int fstatat(int dir, const char *path, struct stat *st, int flags) {
    return (int)ret(SYS(SYS_newfstatat, dir, path, st, flags, 0, 0));
}

int fstat(int fd, struct stat *st) { return fstatat(fd, "", st, AT_EMPTY_PATH); }

int stat(const char *path, struct stat *st) { return fstatat(AT_FDCWD, path, st, 0); }

int unlink(const char *path) { return (int)ret(SYS(SYS_unlinkat, AT_FDCWD, path, 0, 0, 0, 0)); }

ssize_t getxattr(const char *path, const char *name, void *value, size_t size) {
    return ret(SYS(SYS_getxattr, path, name, value, size, 0, 0));
}

/* the commands that take an int; the front uses no other with an argument */
int fcntl(int fd, int cmd, ...) {
    int arg = 0;
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC || cmd == F_SETFD || cmd == F_SETFL) {
        va_list ap;
        va_start(ap, cmd);
        arg = va_arg(ap, int);
        va_end(ap);
    }
    return (int)ret(SYS(SYS_fcntl, fd, cmd, arg, 0, 0, 0));
}

int dup3(int old, int new, int flags) { return (int)ret(SYS(SYS_dup3, old, new, flags, 0, 0, 0)); }

mode_t umask(mode_t mask) { return (mode_t)SYS(SYS_umask, mask, 0, 0, 0, 0, 0); }

uid_t getuid(void) { return (uid_t)SYS(SYS_getuid, 0, 0, 0, 0, 0, 0); }

uid_t geteuid(void) { return (uid_t)SYS(SYS_geteuid, 0, 0, 0, 0, 0, 0); }

gid_t getgid(void) { return (gid_t)SYS(SYS_getgid, 0, 0, 0, 0, 0, 0); }

gid_t getegid(void) { return (gid_t)SYS(SYS_getegid, 0, 0, 0, 0, 0, 0); }

pid_t getpid(void) { return (pid_t)SYS(SYS_getpid, 0, 0, 0, 0, 0, 0); }

int poll(struct pollfd *fds, nfds_t n, int timeout) {
    return (int)ret(SYS(SYS_poll, fds, n, timeout, 0, 0, 0));
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    return (int)ret(SYS(SYS_clock_gettime, clock, ts, 0, 0, 0, 0));
}

int execve(const char *path, char *const argv[], char *const envp[]) {
    return (int)ret(SYS(SYS_execve, path, argv, envp, 0, 0, 0));
}

/* the child only execs or exits: no handlers to run, no locks to reset */
pid_t fork(void) { return (pid_t)ret(SYS(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0)); }

pid_t waitpid(pid_t pid, int *status, int options) {
    return (pid_t)ret(SYS(SYS_wait4, pid, status, options, 0, 0, 0));
}

/* with AT_EACCESS, as glibc: the kernel's faccessat2, else (an older kernel) the plain
 * faccessat where the real and effective ids are the same; otherwise refused */
int faccessat(int dir, const char *path, int mode, int flags) {
    long r = SYS(SYS_faccessat2, dir, path, mode, flags, 0, 0);
    if (r != -ENOSYS)
        return (int)ret(r);
    if (flags & ~AT_EACCESS)
        return (int)ret(-EINVAL);
    if ((flags & AT_EACCESS) && (getuid() != geteuid() || getgid() != getegid()))
        return (int)ret(-EACCES);
    return (int)ret(SYS(SYS_faccessat, dir, path, mode, 0, 0, 0));
}

NOSP unsigned long getauxval(unsigned long type) {
    for (const unsigned long *a = auxv; a && a[0] != AT_NULL; a += 2)
        if (a[0] == type)
            return a[1];
    errno_value = ENOENT;
    return 0;
}

/* ---- memory --------------------------------------------------------------------- */

/* no loop here may become a call to itself: built with -fno-tree-loop-distribute-patterns */
void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d < s)
        while (n--)
            *d++ = *s++;
    else
        while (n--)
            d[n] = s[n];
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y)
            return *x - *y;
    return 0;
}

void *memchr(const void *s, int c, size_t n) {
    const unsigned char *p = s;
    for (; n; n--, p++)
        if (*p == (unsigned char)c)
            return (void *)p;
    return NULL;
}

void *memmem(const void *hay, size_t hn, const void *needle, size_t nn) {
    const unsigned char *h = hay, *n = needle;
    if (nn == 0)
        return (void *)h;
    for (size_t i = 0; nn <= hn && i <= hn - nn; i++) {
        const unsigned char *p = memchr(h + i, n[0], hn - nn - i + 1);
        if (!p)
            return NULL;
        i = (size_t)(p - h);
        if (memcmp(p, n, nn) == 0)
            return (void *)p;
    }
    return NULL;
}

/* blocks: a header with the usable size; ARENA first, then one mapping each */
#define ARENA (1 << 20)
#define ALIGN 16
static unsigned char arena[ARENA] __attribute__((aligned(ALIGN)));
static size_t arena_used;

struct block {
    size_t size;
    size_t mapped; /* the mapping's length, 0 in the arena */
};

void *malloc(size_t n) {
    if (n > ((size_t)1 << 40)) {
        errno_value = ENOMEM;
        return NULL;
    }
    size_t need = (sizeof(struct block) + n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    struct block *b;
    if (need <= ARENA - arena_used) {
        b = (struct block *)(arena + arena_used);
        arena_used += need;
        b->mapped = 0;
    } else {
        long p = SYS(SYS_mmap, 0, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p < 0 && p > -4096) {
            errno_value = ENOMEM;
            return NULL;
        }
        b = (struct block *)p;
        b->mapped = need;
    }
    b->size = n;
    return b + 1;
}

void *calloc(size_t count, size_t size) {
    if (size && count > (size_t)-1 / size) {
        errno_value = ENOMEM;
        return NULL;
    }
    void *p = malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void free(void *p) {
    if (!p)
        return;
    struct block *b = (struct block *)p - 1;
    if (b->mapped)
        SYS(SYS_munmap, b, b->mapped, 0, 0, 0, 0);
}

void *realloc(void *p, size_t n) {
    if (!p)
        return malloc(n);
    struct block *b = (struct block *)p - 1;
    void *q = malloc(n);
    if (q) {
        memcpy(q, p, b->size < n ? b->size : n);
        free(p);
    }
    return q;
}

/* ---- strings -------------------------------------------------------------------- */

size_t strlen(const char *s) {
    const char *p = s;
    while (*p)
        p++;
    return (size_t)(p - s);
}

size_t strnlen(const char *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n])
        n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    for (; *a && *a == *b; a++, b++)
        ;
    return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n && *a && *a == *b; n--, a++, b++)
        ;
    return n ? (unsigned char)*a - (unsigned char)*b : 0;
}

char *strchr(const char *s, int c) {
    for (;; s++) {
        if (*s == (char)c)
            return (char *)s;
        if (!*s)
            return NULL;
    }
}

char *strrchr(const char *s, int c) {
    const char *found = NULL;
    for (;; s++) {
        if (*s == (char)c)
            found = s;
        if (!*s)
            return (char *)found;
    }
}

char *strstr(const char *hay, const char *needle) {
    return memmem(hay, strlen(hay), needle, strlen(needle));
}

size_t strspn(const char *s, const char *accept) {
    size_t n = 0;
    while (s[n] && strchr(accept, s[n]))
        n++;
    return n;
}

char *strtok_r(char *s, const char *delim, char **save) {
    if (!s)
        s = *save;
    while (*s && strchr(delim, *s))
        s++;
    if (!*s) {
        *save = s;
        return NULL;
    }
    char *token = s;
    while (*s && !strchr(delim, *s))
        s++;
    if (*s)
        *s++ = 0;
    *save = s;
    return token;
}

char *strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

/* base 10 only (glibc's atoi is strtol(s, NULL, 10)); saturates as strtol does */
long strtol(const char *s, char **end, int base) {
    if (base != 10)
        abort();
    const char *p = s;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    int negative = *p == '-';
    if (*p == '-' || *p == '+')
        p++;
    const char *digits = p;
    unsigned long v = 0, limit = negative ? 0UL - (unsigned long)LONG_MIN : (unsigned long)LONG_MAX;
    int over = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned long d = (unsigned long)(*p - '0');
        if (v > (limit - d) / 10)
            over = 1;
        else
            v = v * 10 + d;
    }
    if (end)
        *end = (char *)(p == digits ? s : p);
    if (over) {
        errno_value = ERANGE;
        return negative ? LONG_MIN : LONG_MAX;
    }
    return negative ? (long)(0UL - v) : (long)v;
}

int atoi(const char *s) { return (int)strtol(s, NULL, 10); }

char *getenv(const char *name) {
    size_t n = strlen(name);
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* glibc's texts for what the front can meet (exec, open, fork) */
char *strerror(int err) {
    static const struct {
        int err;
        const char *text;
    } texts[] = {
        {EPERM, "Operation not permitted"},
        {ENOENT, "No such file or directory"},
        {EIO, "Input/output error"},
        {E2BIG, "Argument list too long"},
        {ENOEXEC, "Exec format error"},
        {EAGAIN, "Resource temporarily unavailable"},
        {ENOMEM, "Cannot allocate memory"},
        {EACCES, "Permission denied"},
        {EFAULT, "Bad address"},
        {ENOTDIR, "Not a directory"},
        {EISDIR, "Is a directory"},
        {EINVAL, "Invalid argument"},
        {ENFILE, "Too many open files in system"},
        {EMFILE, "Too many open files"},
        {ETXTBSY, "Text file busy"},
        {ENAMETOOLONG, "File name too long"},
        {ELOOP, "Too many levels of symbolic links"},
        {ELIBBAD, "Accessing a corrupted shared library"},
        {ERANGE, "Numerical result out of range"},
    };
    static char unknown[32];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        if (texts[i].err == err)
            return (char *)texts[i].text;
    snprintf(unknown, sizeof unknown, "Unknown error %d", err);
    return unknown;
}

/* ---- formatting: %s, %d and %% only (all front.c writes) ------------------------ */

static size_t put(char *out, size_t cap, size_t at, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++, at++)
        if (at + 1 < cap)
            out[at] = s[i];
    return at;
}

int vsnprintf(char *out, size_t cap, const char *fmt, va_list ap) {
    size_t at = 0;
    for (const char *p = fmt; *p; p++) {
        if (*p != '%') {
            at = put(out, cap, at, p, 1);
            continue;
        }
        p++;
        if (*p == 's') {
            const char *s = va_arg(ap, const char *);
            s = s ? s : "(null)";
            at = put(out, cap, at, s, strlen(s));
        } else if (*p == 'd') {
            long v = va_arg(ap, int);
            char digits[24], *d = digits + sizeof digits;
            unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;
            do
                *--d = (char)('0' + u % 10);
            while (u /= 10);
            if (v < 0)
                *--d = '-';
            at = put(out, cap, at, d, (size_t)(digits + sizeof digits - d));
        } else if (*p == '%') {
            at = put(out, cap, at, "%", 1);
        } else {
            abort(); /* a format this file does not know: a bug in front.c */
        }
    }
    if (cap)
        out[at < cap ? at : cap - 1] = 0;
    return (int)at;
}

int snprintf(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n;
}

/* stdout and stderr are their fds, unbuffered: every write is whole or fails */
FILE *stdout = (FILE *)1;
FILE *stderr = (FILE *)2;

static int write_all(FILE *stream, const char *s, size_t n) {
    int fd = stream == stdout ? 1 : 2;
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno_value == EINTR)
            continue;
        if (w <= 0)
            return EOF;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

int fputs(const char *s, FILE *stream) { return write_all(stream, s, strlen(s)); }

int fflush(FILE *stream) {
    (void)stream;
    return 0;
}

/* at most 4 KiB a call: the front's messages are one line */
int vfprintf(FILE *stream, const char *fmt, va_list ap) {
    char text[4096];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    size_t len = (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
    return write_all(stream, text, len) == 0 ? (int)len : -1;
}

int fprintf(FILE *stream, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(stream, fmt, ap);
    va_end(ap);
    return n;
}

/* ---- _FORTIFY_SOURCE's checked calls -------------------------------------------- */

void *__memcpy_chk(void *dst, const void *src, size_t n, size_t room) {
    if (n > room)
        __chk_fail();
    return memcpy(dst, src, n);
}

void *__memmove_chk(void *dst, const void *src, size_t n, size_t room) {
    if (n > room)
        __chk_fail();
    return memmove(dst, src, n);
}

void *__memset_chk(void *dst, int c, size_t n, size_t room) {
    if (n > room)
        __chk_fail();
    return memset(dst, c, n);
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t room) {
    if (n > room)
        __chk_fail();
    return read(fd, buf, n);
}

int __snprintf_chk(char *out, size_t cap, int flag, size_t room, const char *fmt, ...) {
    (void)flag;
    if (cap > room)
        __chk_fail();
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n;
}

int __fprintf_chk(FILE *stream, int flag, const char *fmt, ...) {
    (void)flag;
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(stream, fmt, ap);
    va_end(ap);
    return n;
}

/* ---- start-up ------------------------------------------------------------------- */

extern const Elf64_Ehdr __ehdr_start __attribute__((visibility("hidden")));
extern Elf64_Dyn _DYNAMIC[] __attribute__((visibility("hidden")));

/* this binary's relative relocations, applied where the kernel loaded it (nothing else
 * may touch a pointer before); anything else in them is a build this file cannot run */
static NOSP void relocate(uintptr_t base) {
    uintptr_t rela = 0, size = 0, ent = sizeof(Elf64_Rela);
    for (Elf64_Dyn *d = _DYNAMIC; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_RELA)
            rela = base + d->d_un.d_ptr;
        else if (d->d_tag == DT_RELASZ)
            size = d->d_un.d_val;
        else if (d->d_tag == DT_RELAENT)
            ent = d->d_un.d_val;
        else if (d->d_tag == DT_REL || d->d_tag == DT_RELR)
            SYS(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    }
    for (uintptr_t at = rela; at < rela + size; at += ent) {
        const Elf64_Rela *r = (const Elf64_Rela *)at;
        if (ELF64_R_TYPE(r->r_info) != R_X86_64_RELATIVE)
            SYS(SYS_exit_group, 127, 0, 0, 0, 0, 0);
        *(uintptr_t *)(base + r->r_offset) = base + (uintptr_t)r->r_addend;
    }
}

/* the thread pointer's block: itself at 0, the stack protector's canary at 0x28 */
static uintptr_t tcb[8] __attribute__((aligned(64)));

__attribute__((visibility("hidden"), noreturn)) NOSP void nvshim_front_start(long *sp);

__attribute__((visibility("hidden"), noreturn)) NOSP void nvshim_front_start(long *sp) {
    uintptr_t base = (uintptr_t)&__ehdr_start;
    relocate(base);
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    environ = argv + argc + 1;
    char **e = environ;
    while (*e)
        e++;
    auxv = (const unsigned long *)(e + 1);
    const Elf64_Phdr *ph = (const Elf64_Phdr *)getauxval(AT_PHDR);
    unsigned long phnum = getauxval(AT_PHNUM);
    for (unsigned long i = 0; ph && i < phnum; i++) {
        if (ph[i].p_type != PT_GNU_RELRO)
            continue;
        uintptr_t from = (base + ph[i].p_vaddr) & ~(uintptr_t)4095;
        uintptr_t to = (base + ph[i].p_vaddr + ph[i].p_memsz) & ~(uintptr_t)4095;
        if (to > from && SYS(SYS_mprotect, from, to - from, PROT_READ, 0, 0, 0) != 0)
            SYS(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    }
    const unsigned char *random = (const unsigned char *)getauxval(AT_RANDOM);
    uintptr_t canary = 0;
    for (int i = 0; random && i < (int)sizeof canary; i++)
        canary |= (uintptr_t)random[i] << (8 * i);
    if (!random)
        SYS(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    tcb[0] = (uintptr_t)tcb;
    tcb[5] = canary & ~(uintptr_t)0xff; /* a NUL first, as glibc's: no string copy forges it */
    if (SYS(SYS_arch_prctl, 0x1002 /* ARCH_SET_FS */, tcb, 0, 0, 0, 0) != 0)
        SYS(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    exit(main(argc, argv));
}

__asm__(".text\n"
        ".global _start\n"
        ".type _start, @function\n"
        "_start:\n"
        "    xor %rbp, %rbp\n"
        "    mov %rsp, %rdi\n"
        "    and $-16, %rsp\n"
        "    call nvshim_front_start\n"
        "    hlt\n");
