/* nvshim-runtime, compiled: the same decisions as the sh front (nvshim/runtime/front.py,
 * which documents them), without a shell or any other process on the way.
 *
 * Built once per architecture (nvshim/runtime/frontbin.py: a static binary). It holds no
 * paths of its own: `nvshim install` copies it and fills PAYLOAD (key=value strings, NUL
 * separated) with what the sh front has written into its text: the interpreter and the
 * Python code, the default cache directory and configuration file, the slot directory's
 * name, the runc flag tables (nvshim.runtime.args) and the slot protocol's letters
 * (nvshim.runtime.slots). Whatever it cannot classify goes to Python, as in the sh front.
 *
 * What it adds: every object it trusts is checked through the descriptor it uses (the
 * cache directory and the slot directory walked from / with O_NOFOLLOW, fstat of each;
 * the cache file and the FIFOs fstat'ed as opened), the trigger-word search is a memmem
 * over the file as read, and the first answer's deadline is poll's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define PAYLOAD_SIZE 65536
#define PAYLOAD_MAGIC "nvshim-front-payload:unset"
#define PAYLOAD_HEAD "nvshim-front-payload:1"
#define CACHE_MAX 65536

__attribute__((used, aligned(64))) static const char PAYLOAD[PAYLOAD_SIZE] = PAYLOAD_MAGIC;
/* read through a volatile pointer: the compiler must not fold the unset text */
static const char *volatile payload_at = PAYLOAD;

static const char *execfn;
static char **args; /* the call's arguments (after the program) */
static int nargs;

/* ---- the payload ---------------------------------------------------------------- */

static const char *conf(const char *key) {
    const char *p = payload_at, *end = payload_at + PAYLOAD_SIZE;
    size_t klen = strlen(key);
    p += strlen(p) + 1; /* the head */
    while (p < end && *p) {
        size_t len = strnlen(p, (size_t)(end - p));
        if (len > klen && memcmp(p, key, klen) == 0 && p[klen] == '=')
            return p + klen + 1;
        p += len + 1;
    }
    return NULL;
}

static const char *need(const char *key) {
    const char *v = conf(key);
    if (!v) {
        fprintf(stderr, "nvshim-runtime: error: this front has no %s (reinstall nvshim)\n", key);
        exit(127);
    }
    return v;
}

/* whether NAME is a word of the space-separated LIST */
static int listed(const char *list, const char *name, size_t len) {
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ' ');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && memcmp(p, name, len) == 0)
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* ARG's flag name (after - or --), or NULL when ARG is no flag */
static const char *flag_name(const char *arg) {
    return arg[0] != '-' ? NULL : arg[1] == '-' ? arg + 2 : arg + 1;
}

/* ARG is -NAME or --NAME of LIST (with "=*" after it when EQ) */
static int flag_in(const char *list, const char *arg, int eq) {
    const char *name = flag_name(arg);
    if (!name)
        return 0;
    const char *e = strchr(name, '=');
    if (eq != (e != NULL))
        return 0;
    size_t len = e ? (size_t)(e - name) : strlen(name);
    return len > 0 && listed(list, name, len);
}

/* ARG is -A, --A, -B or --B */
static int is(const char *arg, const char *a, const char *b) {
    const char *name = flag_name(arg);
    return name && ((a && strcmp(name, a) == 0) || (b && strcmp(name, b) == 0));
}

/* ARG is -A=*, --A=*, -B=* or --B=* */
static int is_eq(const char *arg, const char *a, const char *b) {
    const char *name = flag_name(arg);
    if (!name)
        return 0;
    size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
    return (a && strncmp(name, a, la) == 0 && name[la] == '=') ||
           (b && strncmp(name, b, lb) == 0 && name[lb] == '=');
}

/* ---- ends ----------------------------------------------------------------------- */

static char *join(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s)
        abort();
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

/* exec PROGRAM with HEAD (count N) before the call's arguments */
static void exec_with(const char *program, const char **head, int n) {
    char **argv = calloc((size_t)(n + nargs + 1), sizeof *argv);
    if (!argv)
        abort();
    for (int i = 0; i < n; i++)
        argv[i] = (char *)head[i];
    for (int i = 0; i < nargs; i++)
        argv[n + i] = args[i];
    execve(program, argv, environ);
}

/* says why PROGRAM could not be exec'd; the status a shell gives for it */
static int exec_error(const char *program) {
    int err = errno;
    fprintf(stderr, "nvshim-runtime: error: %s: %s\n", program, strerror(err));
    return err == ENOENT ? 127 : 126;
}

__attribute__((noreturn)) static void exec_failed(const char *program) {
    exit(exec_error(program));
}

/* py: Python decides (the sh front's py: interpreter -IS -c CODE $0 ARGS) */
__attribute__((noreturn)) static void py(void) {
    const char *interp = need("interpreter");
    const char *head[] = {interp, "-IS", "-c", need("code"), execfn};
    exec_with(interp, head, 5);
    exec_failed(interp);
}

__attribute__((noreturn)) static void exec_runtime(const char *rt) {
    const char *head[] = {rt};
    exec_with(rt, head, 1);
    exec_failed(rt);
}

/* the exit status a shell's $? gives for a child */
static int shell_status(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

/* run RT with the call's arguments as a child; its status as $? */
static int run_child(const char *rt) {
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        const char *head[] = {rt};
        exec_with(rt, head, 1);
        _exit(exec_error(rt));
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 1;
    return shell_status(status);
}

/* ---- trust ---------------------------------------------------------------------- */

/* newer: A's mtime after B's */
static int newer(const struct stat *a, const struct stat *b) {
    return a->st_mtim.tv_sec > b->st_mtim.tv_sec ||
           (a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec > b->st_mtim.tv_nsec);
}

/* the front cache's lines (each NUL-terminated in place); NULL when it cannot be used */
struct lines {
    char *buf;
    char *line[4096];
    int n;
};

static int read_lines(int fd, struct lines *out) {
    out->buf = malloc(CACHE_MAX + 1);
    if (!out->buf)
        abort();
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, out->buf + got, CACHE_MAX - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
        if (got == CACHE_MAX)
            return -1;
    }
    if (memchr(out->buf, 0, got))
        return -1;
    out->n = 0;
    char *p = out->buf, *end = out->buf + got;
    while (p < end) { /* a last line without its newline is not read, as by sh's read */
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break;
        if (out->n == (int)(sizeof out->line / sizeof *out->line))
            return -1;
        *nl = 0;
        out->line[out->n++] = p;
        p = nl + 1;
    }
    return 0;
}

static int executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           faccessat(AT_FDCWD, path, X_OK, AT_EACCESS) == 0;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* the file PATH as read (regular, opened without blocking) holds one of WORDS; true when
 * it is not a regular file or cannot be read (Python decides), as the sh front's grep */
static int holds_any(const char *path, char **words, int nwords) {
    if (nwords == 0)
        return 1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 1;
    }
    size_t cap = (size_t)st.st_size + 1, got = 0;
    if (st.st_size < 0 || st.st_size > (64 << 20)) {
        close(fd);
        return 1;
    }
    char *buf = malloc(cap);
    if (!buf)
        abort();
    for (;;) {
        if (got == cap) { /* grown since fstat */
            cap *= 2;
            if (cap > ((size_t)64 << 20)) {
                close(fd);
                free(buf);
                return 1;
            }
            buf = realloc(buf, cap);
            if (!buf)
                abort();
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            close(fd);
            free(buf);
            return 1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    int found = 0;
    for (int i = 0; i < nwords && !found; i++)
        found = memmem(buf, got, words[i], strlen(words[i])) != NULL;
    free(buf);
    return found;
}

/* ---- the slots (nvshim.runtime.slots) ------------------------------------------- */

/* the directory behind FD (opened on the walk below) may be trusted as KIND: 'a' above the
 * cache directory (not writable by group or others unless sticky: /tmp), 'c' the cache
 * directory (not writable by group or others), 's' the slot directory (0700). SLOTS: as
 * the sh front's mine() sees the way to the slots (every directory root's, none with an
 * ACL); else as Python's trusted cache directory (nvshim.trusted.open_trusted_dir) and
 * the sh front's safe() together (/ root's or this user's, the others this user's) */
static int trusted_dir(int fd, char kind, int slots, int top) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    if (slots ? st.st_uid != 0 : st.st_uid != geteuid() && !(top && st.st_uid == 0))
        return 0;
    if (slots) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        static const char *const acls[] = {"system.posix_acl_access", "system.posix_acl_default"};
        for (int i = 0; i < 2; i++) {
            ssize_t r = getxattr(path, acls[i], NULL, 0);
            if (r >= 0 || (errno != ENODATA && errno != ENOTSUP))
                return 0;
        }
    }
    mode_t m = st.st_mode & 07777;
    switch (kind) {
    case 's':
        return m == 0700;
    case 'c':
        return !(m & (S_IWGRP | S_IWOTH));
    default:
        return !(m & (S_IWGRP | S_IWOTH)) || (m & S_ISVTX);
    }
}

/* the cache directory C (SUB NULL), or the slot directory C/SUB, as an fd: walked from
 * / one openat(O_NOFOLLOW) at a time, each directory fstat'ed as opened (trusted_dir);
 * -1 when C is not named plainly (as the sh front's safe()) or a directory fails */
static int walk(const char *c, const char *sub) {
    static const char plain[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._+@:-";
    size_t len = strlen(c);
    if (len < 2 || c[0] != '/' || c[len - 1] == '/' || strspn(c, plain) != len ||
        strstr(c, "//") || strstr(c, "/./") || strstr(c, "/../") ||
        strcmp(c + len - 2, "/.") == 0 || (len >= 3 && strcmp(c + len - 3, "/..") == 0) ||
        (sub && (!*sub || strchr(sub, '/') || strcmp(sub, ".") == 0 || strcmp(sub, "..") == 0)))
        return -1;
    int slots = sub != NULL;
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && !trusted_dir(fd, 'a', slots, 1)) {
        close(fd);
        return -1;
    }
    char *path = sub ? join(c, "/", sub) : strdup(c), *save = NULL;
    if (!path)
        abort();
    size_t cache_depth = 0, depth = 0;
    for (const char *p = c; *p; p++)
        cache_depth += *p == '/';
    for (char *part = strtok_r(path + 1, "/", &save); fd >= 0 && part;
         part = strtok_r(NULL, "/", &save)) {
        int next = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
        depth++;
        char kind = depth < cache_depth ? 'a' : depth == cache_depth ? 'c' : 's';
        if (fd >= 0 && !trusted_dir(fd, kind, slots, 0)) {
            close(fd);
            fd = -1;
        }
    }
    free(path);
    return fd;
}

/* a FIFO of this user's, as opened */
static int own_fifo(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_uid == geteuid();
}

static int own_fifo_at(int dir, const char *name) {
    struct stat st;
    return fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISFIFO(st.st_mode) &&
           st.st_uid == geteuid();
}

static int free_fd(int fd) { return fcntl(fd, F_GETFD) < 0 && errno == EBADF; }

/* FD moved to 10 or above (close-on-exec), out of the way of fds 5 and 6 */
static int high(int fd) {
    if (fd < 0)
        return -1;
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    close(fd);
    return moved;
}

static int say(int fd, const char *text) {
    size_t len = strlen(text);
    while (len) {
        ssize_t w = write(fd, text, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        text += w;
        len -= (size_t)w;
    }
    return 0;
}

/* answers on fd 5, one a line */
struct reader {
    char buf[8192];
    size_t have;
    char line[8192];
};

/* the next line (without its newline) into r->line: 1; end of file, an error or the
 * deadline (milliseconds from now, -1 none): 0 */
static int next_line(struct reader *r, int fd, int wait_ms) {
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        char *nl = memchr(r->buf, '\n', r->have);
        if (nl) {
            size_t len = (size_t)(nl - r->buf);
            memcpy(r->line, r->buf, len);
            r->line[len] = 0;
            r->have -= len + 1;
            memmove(r->buf, nl + 1, r->have);
            return 1;
        }
        if (r->have == sizeof r->buf)
            return 0;
        if (wait_ms >= 0) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            long spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (spent >= wait_ms)
                return 0;
            int ready = poll(&p, 1, (int)(wait_ms - spent));
            if (ready < 0 && errno == EINTR)
                continue;
            if (ready <= 0)
                return 0;
        }
        ssize_t got = read(fd, r->buf + r->have, sizeof r->buf - r->have);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        r->have += (size_t)got;
    }
}

static char letter(const char *key) { return need(key)[0]; }

static int answer_is(const char *line, char code) { return line[0] == code && line[1] == 0; }

/* an answer "CODE ARG": ARG, else NULL */
static const char *answer_arg(const char *line, char code) {
    return line[0] == code && line[1] == ' ' ? line + 2 : NULL;
}

static int runtime_arg(const char *a) {
    return a && (a[0] == '/' || (a[0] == '.' && a[1] == '/'));
}

/* srv: the call served by nvshim-runtimed through one of its slots; returns when the
 * daemon did not take it (nothing was done): then Python does it */
static void srv(const char *c) {
    const char *name = conf("slots");
    if (!name || !*name || geteuid() != 0)
        return;
    for (int i = 4; i <= 7; i++)
        if (!free_fd(i))
            return;
    int dir = walk(c, name);
    if (dir < 0)
        return;
    if (!own_fifo_at(dir, "0.r")) {
        close(dir);
        return;
    }
    int slots = atoi(need("slot-count"));
    if (slots <= 0) {
        close(dir);
        return;
    }
    pid_t me = getpid();
    int k = (int)(me % slots), claimed = 0;
    char rname[32], uname[32], text[64];
    mode_t mask = umask(0);
    umask(mask);
    for (int i = 0; i < slots; i++, k = (k + 1) % slots) {
        char cname[32];
        snprintf(rname, sizeof rname, "%d.r", k);
        snprintf(uname, sizeof uname, "%d.u", k);
        snprintf(cname, sizeof cname, "%d.c", k);
        if (!own_fifo_at(dir, rname) || !own_fifo_at(dir, uname))
            continue;
        int cfd = openat(dir, cname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                         0666 & ~mask);
        if (cfd < 0)
            continue;
        snprintf(text, sizeof text, "%d\n", (int)me);
        claimed = say(cfd, text) == 0;
        close(cfd);
        break;
    }
    if (!claimed) {
        close(dir);
        return;
    }
    /* K.r read-write first (the read-only open then never waits), kept at fd 5 */
    int hold = openat(dir, rname, O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    int reply = hold < 0 ? -1 : high(openat(dir, rname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (hold >= 0)
        close(hold);
    int up = reply < 0 ? -1 : high(openat(dir, uname, O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    close(dir);
    int ok = up >= 0 && dup3(reply, 5, O_CLOEXEC) == 5 && dup3(up, 6, O_CLOEXEC) == 6;
    if (reply >= 0)
        close(reply);
    if (up >= 0)
        close(up);
    if (!ok || !own_fifo(5) || !own_fifo(6)) {
        close(5);
        close(6);
        return;
    }
    /* talk */
    static struct reader r;
    char line_out[64];
    snprintf(line_out, sizeof line_out, "%d %d\n", (int)me, nargs);
    say(6, line_out);
    const char go[] = {letter("go"), '\n', 0}, done[] = {letter("done"), '\n', 0},
               no[] = {letter("no"), '\n', 0};
    int wait_ms = atoi(need("ack-wait")) * 1000;
    int got = next_line(&r, 5, wait_ms);
    if (got && answer_is(r.line, letter("accepted"))) {
        say(6, go);
    } else if (got && answer_is(r.line, letter("declined"))) {
        say(6, done);
        close(5);
        close(6);
        return;
    } else if (!got || r.line[0] == 0 || answer_is(r.line, letter("timeout"))) {
        say(6, no);
        close(5);
        close(6);
        return;
    } else {
        close(5);
        close(6);
        return;
    }
    const char *spawned = NULL;
    char *rt = NULL;
    while (next_line(&r, 5, -1)) {
        const char *a;
        if (answer_is(r.line, letter("timeout")))
            continue;
        if ((a = answer_arg(r.line, letter("exec"))) && runtime_arg(a)) {
            say(6, done);
            close(5);
            close(6);
            exec_runtime(a);
        }
        if ((a = answer_arg(r.line, letter("spawn"))) && runtime_arg(a)) {
            free(rt);
            rt = strdup(a);
            spawned = rt;
            snprintf(line_out, sizeof line_out, "%d\n", run_child(rt));
            say(6, line_out);
            continue;
        }
        if ((a = answer_arg(r.line, letter("exit"))) && a[0] >= '0' && a[0] <= '9' &&
            strspn(a, "0123456789") == strlen(a) && strlen(a) <= 9) {
            say(6, done);
            exit(atoi(a) & 255);
        }
        break;
    }
    close(5);
    close(6);
    /* the daemon lost the call it had taken: it fails; Python deletes what runc created */
    if (spawned) {
        const char *interp = need("interpreter");
        const char *head[] = {interp, "-IS", "-c", need("lost-code"), execfn, spawned};
        exec_with(interp, head, 6);
        exec_failed(interp);
    }
    fputs("nvshim-runtime: error: nvshim-runtimed stopped answering\n", stderr);
    exit(1);
}

/* ---- the call ------------------------------------------------------------------- */

/* labelled ID: the low-level runtime's state of ID may hold nvshim's exec-env annotation */
static int labelled(const char *rt, const char *sr, const char *id) {
    const char *base = strrchr(rt, '/');
    base = base ? base + 1 : rt;
    int crun = strcmp(base, "crun") == 0;
    char *dir = join(sr && *sr ? sr : crun ? "/run/crun" : "/run/runc", "/", id);
    char *state = join(dir, crun ? "/config.json" : "/state.json", "");
    free(dir);
    struct stat st;
    if (stat(state, &st) != 0 || !S_ISREG(st.st_mode)) {
        free(state);
        return 0;
    }
    char *word = (char *)need("exec-env");
    int found = holds_any(state, &word, 1);
    free(state);
    return found;
}

/* the exec marker of container ID in cache directory C */
static char *marker_path(const char *c, const char *id) {
    char *dir = join(c, "/", need("marker-dir"));
    char *path = join(dir, "/", id);
    free(dir);
    return path;
}

static int odd_id(const char *id) {
    return strcmp(id, ".") == 0 || strcmp(id, "..") == 0 || strchr(id, '/') != NULL;
}

int main(int argc, char **argv) {
    if (strcmp(payload_at, PAYLOAD_HEAD) != 0) {
        fputs("nvshim-runtime: error: this front was never installed (run nvshim install)\n",
              stderr);
        return 127;
    }
    execfn = (const char *)getauxval(AT_EXECFN);
    if (!execfn || !*execfn)
        execfn = argv[0] ? argv[0] : "nvshim-runtime";
    args = argv + 1;
    nargs = argc > 0 ? argc - 1 : 0;

    /* the global flags, up to the command */
    int h = 0, n = 0;
    char v = 0;
    const char *cmd = NULL, *sr = NULL;
    const char *gbool = need("global-bool"), *gvalue = need("global-value");
    for (int i = 0; i < nargs; i++) {
        const char *a = args[i];
        n = i + 1;
        if (strcmp(a, "--") == 0) {
            if (i + 1 < nargs) {
                cmd = args[i + 1];
                n = i + 2;
            }
            break;
        }
        if (flag_in(gbool, a, 0))
            continue;
        if (is(a, "root", NULL)) {
            if (i + 1 < nargs)
                sr = args[i + 1];
            i++;
            continue;
        }
        if (is_eq(a, "root", NULL)) {
            sr = strchr(a, '=') + 1;
            continue;
        }
        if (flag_in(gvalue, a, 0)) {
            i++;
            continue;
        }
        if (flag_in(gvalue, a, 1))
            continue;
        if (is(a, "h", "help")) {
            h = 1;
            continue;
        }
        if (is(a, "v", NULL)) {
            if (v == 'l')
                py();
            v = 's';
            continue;
        }
        if (is(a, "version", NULL)) {
            if (v == 's')
                py();
            v = 'l';
            continue;
        }
        if (a[0] == '-' && a[1])
            py();
        cmd = a;
        break;
    }
    if (!cmd)
        n = nargs;

    const char *env_c = getenv("NVSHIM_CACHE_DIR");
    const char *c = env_c && *env_c ? env_c : need("cache-dir");
    if (c[0] != '/')
        c = need("cache-dir");
    const char *env_cfg = getenv("NVSHIM_CONFIG");
    const char *cfg = env_cfg && *env_cfg ? env_cfg : need("config");

    /* the cache, checked and read through the one open file */
    int cdir = walk(c, NULL);
    if (cdir < 0)
        py();
    int f = openat(cdir, need("front-cache"), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(cdir);
    struct stat fst, cst;
    if (f < 0 || fstat(f, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_uid != geteuid() ||
        (fst.st_mode & (S_IWGRP | S_IWOTH)))
        py();
    int cfg_present = stat(cfg, &cst) == 0;
    if (!cfg_present && errno != ENOENT)
        py();
    if (cfg_present && !newer(&fst, &cst))
        py();
    static struct lines cache;
    if (read_lines(f, &cache) != 0 || cache.n < 3)
        py();
    close(f);
    char *want = join("nvshim ", need("version"), "");
    if (strcmp(cache.line[0], want) != 0 || strcmp(cache.line[1], cfg) != 0 ||
        strcmp(cache.line[2], cfg_present ? "present" : "missing") != 0)
        py();
    free(want);
    const char *path = getenv("PATH");
    const char *rt = NULL;
    int i = 3;
    for (; i + 1 < cache.n && cache.line[i][0]; i += 2)
        if (!rt && strcmp(cache.line[i], path ? path : "") == 0)
            rt = cache.line[i + 1];
    char **words = NULL;
    int nwords = 0;
    if (i < cache.n && cache.line[i][0] == 0) {
        words = cache.line + i + 1;
        while (i + 1 + nwords < cache.n && words[nwords][0])
            nwords++;
    }
    if (rt && !(rt[0] == '/' && executable_file(rt)))
        rt = NULL;

    char *version_line = join("nvshim-runtime version ", need("version"), "\n");
    int create = cmd && (strcmp(cmd, "create") == 0 || strcmp(cmd, "run") == 0);
    int exec_ = cmd && strcmp(cmd, "exec") == 0;
    int delete = cmd && strcmp(cmd, "delete") == 0;
#define PASS()                                                                             \
    do {                                                                                   \
        if (!rt)                                                                           \
            py();                                                                          \
        if (!h && v)                                                                       \
            fputs(version_line, stdout), fflush(stdout);                                   \
    } while (0)
    if (!create && !exec_ && !delete) {
        PASS();
        exec_runtime(rt);
    }

    const char *id = NULL, *bundle = NULL;
    int mk = 0;
    if (!h && create) {
        if (v)
            py();
        const char *cbool = need("create-bool"), *cvalue = need("create-value"),
                   *rbool = need("run-bool");
        char s = 'o';
        int nb = 0, np = 0;
        for (int k = n; k < nargs; k++) {
            const char *a = args[k];
            if (s == 'o') {
                if (strcmp(a, "--") == 0)
                    s = 'p';
                else if (is(a, "h", "help")) {
                    h = 1;
                    break;
                } else if (is(a, "b", "bundle"))
                    s = 'b';
                else if (is_eq(a, "b", "bundle")) {
                    bundle = strchr(a, '=') + 1;
                    nb++;
                } else if (flag_in(cbool, a, 0))
                    ;
                else if (flag_in(cvalue, a, 0))
                    s = 'v';
                else if (flag_in(cvalue, a, 1))
                    ;
                else if (flag_in(rbool, a, 0)) {
                    if (strcmp(cmd, "run") != 0)
                        py();
                } else if (a[0] == '-' && a[1])
                    py();
                else {
                    id = a;
                    np++;
                }
            } else if (s == 'b') {
                bundle = a;
                nb++;
                s = 'o';
            } else if (s == 'v')
                s = 'o';
            else {
                id = a;
                np++;
            }
        }
        if (!h) {
            if (!((s == 'o' || s == 'p') && nb <= 1 && np == 1))
                py();
            if (odd_id(id))
                py();
            char *mid = marker_path(c, id);
            mk = exists(mid);
            free(mid);
        }
    } else if (!h && exec_) {
        const char *ebool = need("exec-bool"), *evalue = need("exec-value");
        char s = 'e';
        for (int k = n; k < nargs; k++) {
            const char *a = args[k];
            if (s == 'e') {
                if (strcmp(a, "--") == 0)
                    s = 'i';
                else if (flag_in(ebool, a, 0))
                    ;
                else if (flag_in(evalue, a, 0))
                    s = 'v';
                else if (flag_in(evalue, a, 1))
                    ;
                else if (is(a, "h", "help")) {
                    h = 1;
                    break;
                } else if (a[0] == '-' && a[1])
                    py();
                else {
                    id = a;
                    break;
                }
            } else if (s == 'v')
                s = 'e';
            else {
                id = a;
                break;
            }
        }
        if (!h && id && *id) {
            if (odd_id(id))
                py();
            if (exists(marker_path(c, id)))
                py();
            if (labelled(rt ? rt : "", sr, id))
                py();
        }
    } else if (!h && delete) {
        for (int k = n; k < nargs; k++) {
            const char *a = args[k];
            if (is(a, "f", "force"))
                continue;
            if (a[0] == '-' && a[1]) {
                id = NULL;
                break;
            }
            if (id && *id) {
                id = NULL;
                break;
            }
            id = a;
        }
        if (id && *id && !odd_id(id)) {
            char *mid = marker_path(c, id);
            struct stat ms;
            if (stat(mid, &ms) == 0) {
                int swept = 0;
                const char *name = conf("slots");
                if (ms.st_size > 0 && name && *name) {
                    char *d = join(c, "/", name);
                    char *zero = join(d, "/0.r", "");
                    struct stat zs;
                    swept = stat(zero, &zs) == 0 && S_ISFIFO(zs.st_mode);
                    free(d);
                    free(zero);
                }
                mk = !swept;
            }
            if (mk) {
                PASS();
                int status = run_child(rt);
                if (status == 0)
                    unlink(mid);
                return status;
            }
        }
    }
    if (!create || h) {
        PASS();
        exec_runtime(rt);
    }
    /* a create or run: may its config.json ask for a GPU? */
    char *j = join(bundle && *bundle ? bundle : ".", "/config.json", "");
    if (holds_any(j, words, nwords)) {
        srv(c);
        py();
    }
    /* a stale marker (a deleted container's, not removed): Python drops it */
    if (mk || !rt)
        py();
    exec_runtime(rt);
}
