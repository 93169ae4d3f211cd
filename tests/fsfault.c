/* A filesystem fault layer, loaded with LD_PRELOAD: what a shared filesystem
 * (NFS, Lustre, a volume shared by pods) does to a cache, made to happen here.
 *
 *   ABICACHE_FAULT_NOLINK=1    link()/linkat() fail with EPERM (vfat, some FUSE and object mounts)
 *   ABICACHE_FAULT_NOFLOCK=1   flock() fails with ENOLCK (NFS without lockd, some Lustre mounts)
 *   ABICACHE_FAULT_NAME_MAX=N  a name longer than N bytes fails with ENAMETOOLONG, and pathconf
 *                              says N (eCryptfs home folders: 143)
 *   ABICACHE_FAULT_PATHCONF=M  pathconf says M instead (a filesystem that claims more than it takes)
 *
 * and, armed from the process itself (ctypes: abicache_fault_arm), one injected
 * error: the at-th call of open, stat, lstat, rename, link, mkdir, unlink,
 * rmdir, opendir, utime or chmod whose path contains a substring fails with
 * the given errno (ENOENT, EBUSY, ESTALE: a concurrent writer or remover on
 * another machine). at = 0 only counts, so a test learns how many steps an
 * operation takes and then fails each one in turn.
 *
 * Built by the tests (tests/test_shared_fs.py, bench/faults.py) with the
 * system compiler: cc -shared -fPIC fsfault.c -o libfsfault.so -ldl
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

static char armed_path[4096];
static int armed_errno;
static long armed_at;
static long calls;
static long injected;
static int held;  /* counting stopped (abicache_fault_hold) */

void abicache_fault_arm(const char *substring, int err, long at) {
    snprintf(armed_path, sizeof armed_path, "%s", substring ? substring : "");
    armed_errno = err;
    __atomic_store_n(&armed_at, at, __ATOMIC_SEQ_CST);
    __atomic_store_n(&calls, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&injected, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&held, 0, __ATOMIC_SEQ_CST);
}

/* Stop (1) or resume (0) counting: a test's own work (its builder) is not under test. */
void abicache_fault_hold(int on) { __atomic_store_n(&held, on, __ATOMIC_SEQ_CST); }

long abicache_fault_calls(void) { return __atomic_load_n(&calls, __ATOMIC_SEQ_CST); }
long abicache_fault_injected(void) { return __atomic_load_n(&injected, __ATOMIC_SEQ_CST); }

/* Whether path's last name is longer than ABICACHE_FAULT_NAME_MAX (errno set). */
static long name_max(void) {
    const char *v = getenv("ABICACHE_FAULT_NAME_MAX");
    return v ? atol(v) : 0;
}

static int too_long(const char *path) {
    long max = name_max();
    if (max <= 0 || !path) return 0;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if ((long)strlen(name) <= max) return 0;
    errno = ENAMETOOLONG;
    return 1;
}

static long claimed(void) {
    const char *v = getenv("ABICACHE_FAULT_PATHCONF");
    return v ? atol(v) : name_max();
}

long pathconf(const char *path, int what) {
    static long (*real)(const char *, int);
    if (!real) real = (long (*)(const char *, int))dlsym(RTLD_NEXT, "pathconf");
    return what == _PC_NAME_MAX && claimed() > 0 ? claimed() : real(path, what);
}

long fpathconf(int fd, int what) {
    static long (*real)(int, int);
    if (!real) real = (long (*)(int, int))dlsym(RTLD_NEXT, "fpathconf");
    return what == _PC_NAME_MAX && claimed() > 0 ? claimed() : real(fd, what);
}

/* Whether this call fails (errno set): a name too long, or the armed call number on a matching path. */
static int fault(const char *path) {
    if (too_long(path))
        return 1;
    if (!armed_path[0] || !path || __atomic_load_n(&held, __ATOMIC_SEQ_CST) || !strstr(path, armed_path))
        return 0;
    long n = __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
    if (n != __atomic_load_n(&armed_at, __ATOMIC_SEQ_CST))
        return 0;
    __atomic_add_fetch(&injected, 1, __ATOMIC_SEQ_CST);
    errno = armed_errno;
    return 1;
}

static int flag(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "1") == 0;
}

#define REAL(ret, name, ...) \
    static ret (*real)(__VA_ARGS__); \
    if (!real) real = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

static mode_t mode_of(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN(name) \
    int name(const char *path, int flags, ...) { \
        va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap); \
        REAL(int, #name, const char *, int, ...); \
        if (fault(path)) return -1; \
        return real(path, flags, m); \
    }
OPEN(open)
OPEN(open64)

#define OPENAT(name) \
    int name(int dirfd, const char *path, int flags, ...) { \
        va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap); \
        REAL(int, #name, int, const char *, int, ...); \
        if (fault(path)) return -1; \
        return real(dirfd, path, flags, m); \
    }
OPENAT(openat)
OPENAT(openat64)

#define STAT(name, type) \
    int name(const char *path, type *st) { \
        REAL(int, #name, const char *, type *); \
        if (fault(path)) return -1; \
        return real(path, st); \
    }
STAT(stat, struct stat)
STAT(lstat, struct stat)
STAT(stat64, struct stat64)
STAT(lstat64, struct stat64)

#define FSTATAT(name, type) \
    int name(int dirfd, const char *path, type *st, int flags) { \
        REAL(int, #name, int, const char *, type *, int); \
        if (fault(path)) return -1; \
        return real(dirfd, path, st, flags); \
    }
FSTATAT(fstatat, struct stat)
FSTATAT(fstatat64, struct stat64)

int rename(const char *old, const char *new_) {
    REAL(int, "rename", const char *, const char *);
    if (fault(old) || too_long(new_)) return -1;
    return real(old, new_);
}

int renameat(int od, const char *old, int nd, const char *new_) {
    REAL(int, "renameat", int, const char *, int, const char *);
    if (fault(old) || too_long(new_)) return -1;
    return real(od, old, nd, new_);
}

int link(const char *old, const char *new_) {
    REAL(int, "link", const char *, const char *);
    if (flag("ABICACHE_FAULT_NOLINK")) { errno = EPERM; return -1; }
    if (fault(new_)) return -1;
    return real(old, new_);
}

int linkat(int od, const char *old, int nd, const char *new_, int flags) {
    REAL(int, "linkat", int, const char *, int, const char *, int);
    if (flag("ABICACHE_FAULT_NOLINK")) { errno = EPERM; return -1; }
    if (fault(new_)) return -1;
    return real(od, old, nd, new_, flags);
}

int flock(int fd, int op) {
    REAL(int, "flock", int, int);
    if (flag("ABICACHE_FAULT_NOFLOCK")) { errno = ENOLCK; return -1; }
    return real(fd, op);
}

int mkdir(const char *path, mode_t mode) {
    REAL(int, "mkdir", const char *, mode_t);
    if (fault(path)) return -1;
    return real(path, mode);
}

int unlink(const char *path) {
    REAL(int, "unlink", const char *);
    if (fault(path)) return -1;
    return real(path);
}

int rmdir(const char *path) {
    REAL(int, "rmdir", const char *);
    if (fault(path)) return -1;
    return real(path);
}

DIR *opendir(const char *path) {
    REAL(DIR *, "opendir", const char *);
    if (fault(path)) return NULL;
    return real(path);
}

int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags) {
    REAL(int, "utimensat", int, const char *, const struct timespec *, int);
    const char *named = path;  /* NULL: futimens() on dirfd itself */
    if (named != NULL && fault(named)) return -1;
    return real(dirfd, path, times, flags);
}

int chmod(const char *path, mode_t mode) {
    REAL(int, "chmod", const char *, mode_t);
    if (fault(path)) return -1;
    return real(path, mode);
}
