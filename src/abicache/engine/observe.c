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
 *   l PATH   a folder listed (opendir, fdopendir, scandir, glob: a tool that picks among
 *            versions by listing a folder picks another when an entry appears)
 *   c TEXT   a command string a shell is given (`sh -c TEXT`, system(), popen()): the
 *            shell reads the variables it names from its environment, never through getenv
 *   w PATH   created, written, removed or renamed (a folder the build writes in is its own
 *            work, not an input: its listing is not recorded)
 *   x PID:PATH   the program of this process (from its start)
 *   R PID:       this process was started by abicache (ABICACHE_TRACE_PARENT); it dies with
 *                the process that started it (below: started())
 *   X PID:PATH   this process is about to exec PATH (where it is found: found() below)
 *   F PID:       that exec failed: the process goes on as it was
 *   S PID:PATH   this process spawned PID to run PATH (posix_spawn)
 *   U PATH       a program run where the observer cannot follow (system() or
 *                popen() with LD_PRELOAD or ABICACHE_TRACE_FD gone)
 * So every process the build started is named by its parent, whether or not it
 * reports itself: one that runs without the observer (statically linked, setuid,
 * LD_PRELOAD cleared, a loader that refused the library) leaves an exec with no
 * start after it, and the trace is known to be incomplete (observe.py parse()).
 * Paths are made absolute (the working directory, or a dirfd's folder, before
 * them) and never normalized: '..' is resolved by whoever reads them, through
 * the links the kernel follows. Without ABICACHE_TRACE_FD the library does
 * nothing. errno is kept as the wrapped call left it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <glob.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

extern char **environ;
static int trace_fd = -1;
static long trace_parent = -1;
static unsigned long long trace_started = 0;  /* its start time (observe.py parent_value), 0: not given */

#define RECORD_MAX (2 * PATH_MAX + 8)

static void put(char kind, int dirfd, const char *path) {
    if (trace_fd < 0 || path == NULL) return;
    int saved = errno;
    char line[RECORD_MAX];
    size_t n = 0;
    line[n++] = kind;
    if (kind != 'e' && kind != 'c' && path[0] != '/') {
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

/* A record about a process: kind, its pid, ':', then the path as given (not made absolute:
 * execvp's name is looked up in PATH). One write, as put()'s. */
static void put_pid(char kind, long pid, const char *path) {
    if (trace_fd < 0) return;
    int saved = errno;
    char line[RECORD_MAX];
    int n = snprintf(line, sizeof line, "%c%ld:", kind, pid);
    size_t len = path ? strnlen(path, PATH_MAX) : 0;
    if (n < 0 || (size_t)n + len + 1 > sizeof line) { errno = saved; return; }
    memcpy(line + n, path ? path : "", len);
    line[n + len] = '\0';
    ssize_t done = write(trace_fd, line, (size_t)n + len + 1);
    (void)done;
    errno = saved;
}

static void outcome(int ok, int dirfd, const char *path, char hit) {
    if (ok) put(hit, dirfd, path);
    else if (errno == ENOENT || errno == ENOTDIR) put('m', dirfd, path);
}

static const char fd_name[] = "ABICACHE_TRACE_FD=";
static const char parent_name[] = "ABICACHE_TRACE_PARENT=";

/* The command abicache started (the compiler driver, or a wrapper that execs it) is killed
 * when the thread that started it ends, however abicache ended: a builder killed by SIGKILL
 * (the OOM killer, a scheduler's timeout) runs no cleanup, and its compilers, in sessions of
 * their own so that Ctrl-C reaches abicache first (engine/interrupt.py), went on for minutes
 * writing into a scratch folder no one would read. Only that process: what it started (cc1plus,
 * ptxas, ld) finishes its step and starts no next one; a daemon it starts (a compiler cache's
 * server) must outlive it, and a fork clears the setting. abicache's threads wait for the
 * commands they start. A parent gone before the prctl: gone at once. */
static void started(long pid) {
    put_pid('R', pid, NULL);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if ((long)getppid() != trace_parent) raise(SIGKILL);
#endif
}

/* Only the command's own process reads ABICACHE_TRACE_PARENT: it takes the variable out of its
 * environment, so what it starts (an exec keeps the setting above) never sees it. So a process
 * that sees it and whose parent is another is that command, orphaned between abicache's fork and
 * this constructor (the builder killed while it started a compile): it dies where abicache is
 * gone. A later process of a daemon the command started (a compiler cache's server) never sees
 * the variable, and a process of a tool the observer cannot enter (a static wrapper) sees it
 * while abicache is alive. */
static void take_parent(void) {
    char **kept = environ;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, parent_name, sizeof parent_name - 1) != 0) *kept++ = *e;
    if (kept) *kept = NULL;
}

#ifdef __linux__
/* No such process; one that has ended and waits for its parent to reap it (a zombie still
 * answers kill(), for as long as its parent, a shell or a scheduler, takes); or another process
 * by that pid, started at another time (pids are reused: 32768 of them where pid_max is the
 * default). Its state is read with the system call itself, so that it is never reported as an
 * input of the build. */
static int abicache_gone(void) {
    if (kill((pid_t)trace_parent, 0) == -1 && errno == ESRCH) return 1;
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", trace_parent);
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    ssize_t got = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (got <= 0) return 0;
    stat[got] = '\0';
    const char *field = strrchr(stat, ')');  /* "pid (name) state ...": the name may hold anything */
    if (!field || field[1] != ' ') return 0;
    field += 2;  /* the 3rd field, the state */
    if (*field == 'Z' || *field == 'X') return 1;
    for (int n = 3; n < 22 && field; n++) {  /* the 22nd, its start time */
        field = strchr(field, ' ');
        if (field) field++;
    }
    return field && trace_started && strtoull(field, NULL, 10) != trace_started;
}
#endif

__attribute__((constructor)) static void start(void) {
    for (char **e = environ; e && *e; e++) {  /* not getenv: that is wrapped */
        if (strncmp(*e, fd_name, sizeof fd_name - 1) == 0) {
            int fd = atoi(*e + sizeof fd_name - 1);
            if (fd > 2 && fcntl(fd, F_GETFD) != -1) trace_fd = fd;
        } else if (strncmp(*e, parent_name, sizeof parent_name - 1) == 0) {
            const char *value = *e + sizeof parent_name - 1, *started_at = strchr(value, ':');
            trace_parent = atol(value);
            if (started_at) trace_started = strtoull(started_at + 1, NULL, 10);
        }
    }
#ifdef ABICACHE_LOADER_AUDIT
    return;  /* the loader's auditor (LD_AUDIT): it reports what the loader reads, never a start */
#endif
    /* Variables the loader and libc read for themselves, never through getenv: which
     * libraries load, the locale (gcc's input charset), the time zone (__DATE__). */
    static const char *const unseen[] = {"LD_LIBRARY_PATH", "GCONV_PATH", "LOCPATH", "LANG", "LC_ALL",
                                         "LC_CTYPE", "TZ", NULL};
    for (const char *const *name = unseen; *name; name++) put('e', AT_FDCWD, *name);
    char exe[PATH_MAX];
    ssize_t got = readlink("/proc/self/exe", exe, sizeof exe - 1);
    long pid = (long)getpid();
    if (got > 0) { exe[got] = '\0'; put_pid('x', pid, exe); }
    if (trace_parent <= 0) return;
    take_parent();
    if ((long)getppid() == trace_parent) started(pid);
#ifdef __linux__
    else if (abicache_gone()) raise(SIGKILL);
#endif
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
        else put('w', AT_FDCWD, path); \
        return fd; }
OPEN(open)
OPEN(open64)

#define OPENAT(name) \
    int name(int dirfd, const char *path, int flags, ...) { \
        REAL(name); va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap); \
        int fd = real(dirfd, path, flags, mode); \
        if (fd >= 0 ? reading(flags) : 1) outcome(fd >= 0, dirfd, path, 'r'); \
        else put('w', dirfd, path); \
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
        if (f ? plain_read : 1) { outcome(f != NULL, AT_FDCWD, path, 'r'); } else put('w', AT_FDCWD, path); \
        return f; }
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

/* ---- what the build changes: a folder it writes in is its own work ----
 * A driver removes its temporary files from a signal handler (gcc on SIGINT): these are
 * resolved when the library loads, never by dlsym inside a handler (not async-signal-safe:
 * a handler that interrupted malloc or the loader would wait for ever). */

static int (*real_unlink)(const char *), (*real_rmdir)(const char *), (*real_mkdir)(const char *, mode_t);
static int (*real_unlinkat)(int, const char *, int), (*real_mkdirat)(int, const char *, mode_t);
static int (*real_rename)(const char *, const char *), (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);

__attribute__((constructor)) static void resolve_changes(void) {
    real_unlink = (__typeof__(real_unlink))dlsym(RTLD_NEXT, "unlink");
    real_rmdir = (__typeof__(real_rmdir))dlsym(RTLD_NEXT, "rmdir");
    real_mkdir = (__typeof__(real_mkdir))dlsym(RTLD_NEXT, "mkdir");
    real_unlinkat = (__typeof__(real_unlinkat))dlsym(RTLD_NEXT, "unlinkat");
    real_mkdirat = (__typeof__(real_mkdirat))dlsym(RTLD_NEXT, "mkdirat");
    real_rename = (__typeof__(real_rename))dlsym(RTLD_NEXT, "rename");
    real_renameat = (__typeof__(real_renameat))dlsym(RTLD_NEXT, "renameat");
    real_renameat2 = (__typeof__(real_renameat2))dlsym(RTLD_NEXT, "renameat2");
}

#define CHANGED(call, ...) do { int rc_ = (call); if (rc_ == 0) { __VA_ARGS__; } return rc_; } while (0)
#define LOADED(fn) if (real_##fn == NULL) resolve_changes()

int unlink(const char *path) { LOADED(unlink); CHANGED(real_unlink(path), put('w', AT_FDCWD, path)); }
int rmdir(const char *path) { LOADED(rmdir); CHANGED(real_rmdir(path), put('w', AT_FDCWD, path)); }
int mkdir(const char *path, mode_t mode) { LOADED(mkdir); CHANGED(real_mkdir(path, mode), put('w', AT_FDCWD, path)); }
int unlinkat(int dirfd, const char *path, int flags) {
    LOADED(unlinkat); CHANGED(real_unlinkat(dirfd, path, flags), put('w', dirfd, path)); }
int mkdirat(int dirfd, const char *path, mode_t mode) {
    LOADED(mkdirat); CHANGED(real_mkdirat(dirfd, path, mode), put('w', dirfd, path)); }
int rename(const char *from, const char *to) {
    LOADED(rename); CHANGED(real_rename(from, to), put('w', AT_FDCWD, from); put('w', AT_FDCWD, to)); }
int renameat(int fromfd, const char *from, int tofd, const char *to) {
    LOADED(renameat); CHANGED(real_renameat(fromfd, from, tofd, to), put('w', fromfd, from); put('w', tofd, to)); }
int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned int flags) {
    LOADED(renameat2);
    CHANGED(real_renameat2(fromfd, from, tofd, to, flags), put('w', fromfd, from); put('w', tofd, to)); }

/* ---- folders listed: glibc's own callers of opendir (scandir, glob) call it inside libc ---- */

static void put_fd(char kind, int fd) {
    char link[64], where[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t got = readlink(link, where, sizeof where - 1);
    if (got > 0 && where[0] == '/') { where[got] = '\0'; put(kind, AT_FDCWD, where); }
}

DIR *opendir(const char *path) {
    REAL(opendir);
    DIR *dir = real(path);
    outcome(dir != NULL, AT_FDCWD, path, 'l');
    return dir;
}

DIR *fdopendir(int fd) {
    REAL(fdopendir);
    int saved = errno;
    DIR *dir = real(fd);
    if (dir != NULL) { put_fd('l', fd); errno = saved; }
    return dir;
}

#define SCANDIR(name, entry) \
    int name(const char *path, struct entry ***list, int (*keep)(const struct entry *), \
             int (*order)(const struct entry **, const struct entry **)) { \
        REAL(name); int n = real(path, list, keep, order); outcome(n >= 0, AT_FDCWD, path, 'l'); return n; }
SCANDIR(scandir, dirent)
SCANDIR(scandir64, dirent64)

int scandirat(int dirfd, const char *path, struct dirent ***list, int (*keep)(const struct dirent *),
              int (*order)(const struct dirent **, const struct dirent **)) {
    REAL(scandirat);
    int n = real(dirfd, path, list, keep, order);
    outcome(n >= 0, dirfd, path, 'l');
    return n;
}

/* The folder a pattern lists first (its parts before the first with a wildcard), and the
 * folder of each match (the deeper folders it listed to find them). */
static void globbed(const char *pattern, size_t count, char **found) {
    if (pattern == NULL) return;
    char fixed[PATH_MAX];
    size_t end = 0, i = 0;
    for (; pattern[i] && i < sizeof fixed - 1; i++) {
        if (strchr("*?[", pattern[i]) != NULL) break;
        if (pattern[i] == '/') end = i;
    }
    if (pattern[i] == '\0') return;  /* no wildcard: nothing was listed */
    if (end == 0 && pattern[0] == '/') end = 1;
    memcpy(fixed, pattern, end);
    fixed[end] = '\0';
    put('l', AT_FDCWD, end ? fixed : ".");
    for (size_t k = 0; k < count && found && found[k]; k++) {
        const char *slash = strrchr(found[k], '/');
        if (slash == NULL || (size_t)(slash - found[k]) >= sizeof fixed) continue;
        memcpy(fixed, found[k], (size_t)(slash - found[k]));
        fixed[slash - found[k]] = '\0';
        if (fixed[0]) put('l', AT_FDCWD, fixed);
    }
}

#define GLOB(name, type) \
    int name(const char *pattern, int flags, int (*err)(const char *, int), type *out) { \
        REAL(name); int rc = real(pattern, flags, err, out); int saved = errno; \
        globbed(pattern, rc == 0 && out ? out->gl_pathc : 0, rc == 0 && out ? out->gl_pathv : NULL); \
        errno = saved; return rc; }
GLOB(glob, glob_t)
GLOB(glob64, glob64_t)

/* ---- every process started is named by the one that starts it ---- */

static int preloaded(char *const envp[]) {
    /* Whether a child with this environment loads the observer and finds its descriptor
     * (as far as the variables say: the loader may still refuse, which the missing start shows). */
    int fd = 0, preload = 0;
    for (char *const *e = envp; e && *e; e++) {
        if (strncmp(*e, fd_name, sizeof fd_name - 1) == 0) fd = 1;
        else if (strncmp(*e, "LD_PRELOAD=", 11) == 0 && strstr(*e, "libabicache_observe") != NULL) preload = 1;
    }
    return fd && preload;
}

/* The program as the exec will find it, by the path it is found at (not where its links lead:
 * a retargeted link is another program): made absolute, and a name without a slash looked up
 * in PATH as execvp does, through the wrapped access(), so the places tried and not found are
 * recorded too (a program put earlier in PATH is another program). */
static const char *found(const char *file, int search, char *out, size_t size) {
    if (file == NULL || file[0] == '/') return file;
    if (strchr(file, '/') != NULL || !search) {
        if (getcwd(out, size) == NULL || strlen(out) + strlen(file) + 2 > size) return file;
        strcat(out, "/");
        strcat(out, file);
        return out;
    }
    const char *path = "/bin:/usr/bin";  /* execvp's default */
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        size_t len = (size_t)(end - dir);
        if (len + strlen(file) + 2 <= size) {
            memcpy(out, len ? dir : ".", len ? len : 1);
            size_t n = len ? len : 1;
            out[n] = '/';
            strcpy(out + n + 1, file);
            if (access(out, X_OK) == 0) return out;
        }
        if (*end == '\0') return file;
        dir = end;
    }
}

/* The text after each "-c" of a command line (a shell's command string; a compiler's -c is
 * followed by a source's name, which names no variable). */
static void put_command(const char *text) {
    if (strnlen(text, PATH_MAX) >= PATH_MAX)  /* more than put() records: the build is not trusted */
        put('U', AT_FDCWD, "/bin/sh (a command string too long to record)");
    else
        put('c', AT_FDCWD, text);
}

static void commands(char *const argv[]) {
    for (char *const *a = argv; a && *a && a[1]; a++)
        if (strcmp(*a, "-c") == 0) put_command(a[1]);
}

#define EXEC_BEFORE(path, search) \
    char where_[PATH_MAX]; put_pid('X', (long)getpid(), found((path), (search), where_, sizeof where_)); \
    commands(argv)
#define EXEC_FAILED() put_pid('F', (long)getpid(), NULL)

int execve(const char *path, char *const argv[], char *const envp[]) {
    REAL(execve); EXEC_BEFORE(path, 0); int rc = real(path, argv, envp); EXEC_FAILED(); return rc; }
int execv(const char *path, char *const argv[]) {
    REAL(execv); EXEC_BEFORE(path, 0); int rc = real(path, argv); EXEC_FAILED(); return rc; }
int execvp(const char *file, char *const argv[]) {
    REAL(execvp); EXEC_BEFORE(file, 1); int rc = real(file, argv); EXEC_FAILED(); return rc; }
int execvpe(const char *file, char *const argv[], char *const envp[]) {
    REAL(execvpe); EXEC_BEFORE(file, 1); int rc = real(file, argv, envp); EXEC_FAILED(); return rc; }
int fexecve(int fd, char *const argv[], char *const envp[]) {
    REAL(fexecve); char link[64]; snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    EXEC_BEFORE(link, 0); int rc = real(fd, argv, envp); EXEC_FAILED(); return rc; }
int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
    REAL(execveat); EXEC_BEFORE(path, 0); int rc = real(dirfd, path, argv, envp, flags); EXEC_FAILED(); return rc; }

/* execl, execlp and execle call glibc's inner execve, which no preload sees: their
 * arguments are gathered here (counted first: all of them, however many) and passed on
 * to the wrapped execve and execvp. */
static size_t counted(va_list ap) {
    size_t n = 1;  /* the first argument, named */
    while (va_arg(ap, char *) != NULL) n++;
    return n;
}

static void gathered(char **args, size_t n, const char *first, va_list ap) {
    args[0] = (char *)first;
    for (size_t i = 1; i < n; i++) args[i] = va_arg(ap, char *);
    args[n] = NULL;
    (void)va_arg(ap, char *);  /* the NULL: what follows it is execle's environment */
}

#define ARGS(first, ap, args) \
    va_list ap; va_start(ap, first); size_t n_ = counted(ap); va_end(ap); \
    char **args = __builtin_alloca((n_ + 1) * sizeof(char *)); \
    va_start(ap, first); gathered(args, n_, first, ap)

int execl(const char *path, const char *arg, ...) {
    ARGS(arg, ap, args); va_end(ap); return execve(path, args, environ); }
int execlp(const char *file, const char *arg, ...) {
    ARGS(arg, ap, args); va_end(ap); return execvp(file, args); }
int execle(const char *path, const char *arg, ...) {
    ARGS(arg, ap, args); char *const *env = va_arg(ap, char *const *); va_end(ap); return execve(path, args, env); }

#define SPAWN(name, search) \
    int name(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions, \
             const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) { \
        REAL(name); pid_t child = 0; char where[PATH_MAX]; \
        const char *as_found = found(path, (search), where, sizeof where); \
        int rc = real(&child, path, actions, attr, argv, envp); \
        if (rc == 0) { put_pid('S', (long)child, as_found); commands(argv); } \
        if (pid) { *pid = child; } \
        return rc; }
SPAWN(posix_spawn, 0)
SPAWN(posix_spawnp, 1)

/* system() and popen() run /bin/sh through glibc's inner spawn: the shell names itself when
 * it starts; what the observer can tell here is only that it will not. */
int system(const char *command) {
    REAL(system);
    if (command && !preloaded(environ)) put('U', AT_FDCWD, "/bin/sh");
    if (command) put_command(command);
    return real(command);
}
FILE *popen(const char *command, const char *mode) {
    REAL(popen);
    if (!preloaded(environ)) put('U', AT_FDCWD, "/bin/sh");
    if (command) put_command(command);
    return real(command, mode);
}

/* ---- what the loader reads for itself (LD_AUDIT: this source built with ABICACHE_LOADER_AUDIT) ----
 * The loader opens the program's libraries, preloads and plugins (dlopen: a gcc -fplugin=)
 * with its own open, which no preload sees. An audit library is told each path the loader
 * tries (a library put earlier in the search would be loaded instead) and each object it
 * maps. It lives in a namespace of its own and interposes on nothing, so it never says that
 * a process started: where the preload is gone, no start is reported and the trace is known
 * to be incomplete. */

unsigned int la_version(unsigned int version) {
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    (void)cookie; (void)flag;
    if (trace_fd >= 0 && name && strchr(name, '/') != NULL) {  /* a bare soname is not a path */
        struct stat st;
        outcome(stat(name, &st) == 0, AT_FDCWD, name, 's');
    }
    return (char *)name;
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)lmid; (void)cookie;
    if (map && map->l_name && map->l_name[0] == '/') put('r', AT_FDCWD, map->l_name);
    return 0;  /* no symbol binding to audit */
}
