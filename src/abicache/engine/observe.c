/* abicache's build observer, preloaded (LD_PRELOAD) into a compiler driver
 * and every tool it runs (cc1plus, as, ld, cicc, ptxas, ...). It reports what
 * steered the build and no dependency file lists: files read by the driver,
 * the assembler and the linker, files looked for and not found (a header that
 * would shadow the one used, a __has_include probe, a library tried), the
 * environment variables read, and which programs ran.
 *
 * One record per event, appended to the file descriptor named by
 * ABICACHE_TRACE_FD (inherited by every process of the build), each a kind
 * byte, a path or name, and a NUL (a path may hold any other byte):
 *   r PATH   opened for reading
 *   s PATH   found by stat or access
 *   m PATH   looked for and not there (ENOENT, ENOTDIR)
 *   e NAME   environment variable read
 *   x PATH   the program of this process
 * Paths are made absolute (the working directory, or a dirfd's folder, before
 * them) and never normalized: '..' is resolved by whoever reads them, through
 * the links the kernel follows. Without ABICACHE_TRACE_FD the library does
 * nothing. errno is kept as the wrapped call left it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;
static int trace_fd = -1;

#define RECORD_MAX (2 * PATH_MAX + 8)

static void put(char kind, int dirfd, const char *path) {
    if (trace_fd < 0 || path == NULL) return;
    int saved = errno;
    char line[RECORD_MAX];
    size_t n = 0;
    line[n++] = kind;
    if (kind != 'e' && path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (getcwd(line + n, PATH_MAX) == NULL) { errno = saved; return; }
            n += strlen(line + n);
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t got = readlink(link, line + n, PATH_MAX);
            if (got <= 0) { errno = saved; return; }
            n += (size_t)got;
        }
        line[n++] = '/';
    }
    size_t len = strnlen(path, PATH_MAX);
    if (n + len + 1 > sizeof line) { errno = saved; return; }
    memcpy(line + n, path, len);
    n += len;
    line[n++] = '\0';
    ssize_t done = write(trace_fd, line, n);  /* O_APPEND: one record, one write */
    (void)done;
    errno = saved;
}

static void outcome(int ok, int dirfd, const char *path, char hit) {
    if (ok) put(hit, dirfd, path);
    else if (errno == ENOENT || errno == ENOTDIR) put('m', dirfd, path);
}

__attribute__((constructor)) static void start(void) {
    static const char name[] = "ABICACHE_TRACE_FD=";
    for (char **e = environ; e && *e; e++) {  /* not getenv: that is wrapped */
        if (strncmp(*e, name, sizeof name - 1) == 0) {
            int fd = atoi(*e + sizeof name - 1);
            if (fd > 2 && fcntl(fd, F_GETFD) != -1) trace_fd = fd;
        }
    }
    char exe[PATH_MAX];
    ssize_t got = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (got > 0) { exe[got] = '\0'; put('x', AT_FDCWD, exe); }
}

#define REAL(name) \
    static __typeof__(name) *real = NULL; \
    if (real == NULL) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

static int reading(int flags) { return (flags & O_ACCMODE) == O_RDONLY && !(flags & (O_CREAT | O_TRUNC)); }

static mode_t mode_of(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN(name, ...) \
    int name(const char *path, int flags, ...) { \
        REAL(name); va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap); \
        int fd = real(path, flags, mode); \
        if (fd >= 0 ? reading(flags) : 1) outcome(fd >= 0, AT_FDCWD, path, 'r'); \
        return fd; }
OPEN(open)
OPEN(open64)

#define OPENAT(name) \
    int name(int dirfd, const char *path, int flags, ...) { \
        REAL(name); va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap); \
        int fd = real(dirfd, path, flags, mode); \
        if (fd >= 0 ? reading(flags) : 1) outcome(fd >= 0, dirfd, path, 'r'); \
        return fd; }
OPENAT(openat)
OPENAT(openat64)

int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
#define OPEN2(name) \
    int name(const char *path, int flags) { REAL(name); int fd = real(path, flags); \
        if (fd >= 0 ? reading(flags) : 1) { outcome(fd >= 0, AT_FDCWD, path, 'r'); } return fd; }
OPEN2(__open_2)
OPEN2(__open64_2)
#define OPENAT2(name) \
    int name(int dirfd, const char *path, int flags) { REAL(name); int fd = real(dirfd, path, flags); \
        if (fd >= 0 ? reading(flags) : 1) { outcome(fd >= 0, dirfd, path, 'r'); } return fd; }
OPENAT2(__openat_2)
OPENAT2(__openat64_2)

#define FOPEN(name) \
    FILE *name(const char *path, const char *mode) { REAL(name); FILE *f = real(path, mode); \
        int plain_read = mode && mode[0] == 'r' && strchr(mode, '+') == NULL; \
        if (f ? plain_read : 1) { outcome(f != NULL, AT_FDCWD, path, 'r'); } return f; }
FOPEN(fopen)
FOPEN(fopen64)

#define STAT(name, type) \
    int name(const char *path, type *buf) { REAL(name); int rc = real(path, buf); \
        outcome(rc == 0, AT_FDCWD, path, 's'); return rc; }
STAT(stat, struct stat)
STAT(lstat, struct stat)
STAT(stat64, struct stat64)
STAT(lstat64, struct stat64)

#define FSTATAT(name, type) \
    int name(int dirfd, const char *path, type *buf, int flags) { REAL(name); int rc = real(dirfd, path, buf, flags); \
        if (path && path[0]) { outcome(rc == 0, dirfd, path, 's'); } return rc; }
FSTATAT(fstatat, struct stat)
FSTATAT(fstatat64, struct stat64)

/* programs built against glibc < 2.33 call these instead of stat */
int __xstat(int ver, const char *path, struct stat *buf);
int __lxstat(int ver, const char *path, struct stat *buf);
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
#define XSTAT(name, type) \
    int name(int ver, const char *path, type *buf) { REAL(name); int rc = real(ver, path, buf); \
        outcome(rc == 0, AT_FDCWD, path, 's'); return rc; }
XSTAT(__xstat, struct stat)
XSTAT(__lxstat, struct stat)
XSTAT(__xstat64, struct stat64)
XSTAT(__lxstat64, struct stat64)

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    REAL(statx);
    int rc = real(dirfd, path, flags, mask, buf);
    if (path && path[0]) outcome(rc == 0, dirfd, path, 's');
    return rc;
}

int access(const char *path, int mode) {
    REAL(access);
    int rc = real(path, mode);
    outcome(rc == 0, AT_FDCWD, path, 's');
    return rc;
}

int faccessat(int dirfd, const char *path, int mode, int flags) {
    REAL(faccessat);
    int rc = real(dirfd, path, mode, flags);
    outcome(rc == 0, dirfd, path, 's');
    return rc;
}

char *getenv(const char *name) {
    REAL(getenv);
    put('e', AT_FDCWD, name);
    return real(name);
}

char *secure_getenv(const char *name) {
    REAL(secure_getenv);
    put('e', AT_FDCWD, name);
    return real(name);
}
