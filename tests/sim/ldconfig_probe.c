/* A stand-in for the host's static ldconfig that reports what it was given: the fds it
 * inherited above 2, its arguments and environment, what its root holds, then (after
 * the chroot(".") that ldconfig -r . does) what the container root and its /proc hold.
 * One line on stdout, exit status 1: nvshim quotes the line in its error. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
static void list(const char *what, const char *dir) {
    DIR *d = opendir(dir);
    printf(" %s=", what);
    if (!d) { printf("(none)"); return; }
    struct dirent *e; int first = 1;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        printf("%s%s", first ? "" : ",", e->d_name); first = 0;
    }
    closedir(d);
}
int main(int argc, char **argv) {
    printf("probe fds=");
    for (int fd = 3; fd < 1024; fd++) if (fcntl(fd, F_GETFD) != -1) printf("%d,", fd);
    printf(" args=");
    for (int i = 1; i < argc; i++) printf("%s%s", i > 1 ? "," : "", argv[i]);
    printf(" env=");
    for (char **e = environ; *e; e++) printf("%s;", *e);
    list("top", "/");
    if (chroot(".") != 0 || chdir("/") != 0) { printf(" chroot=failed\n"); return 1; }
    list("root", "/");
    list("proc", "/proc");
    printf("\n");
    return 1;
}
