/* A hit record's witnesses checked in one call (hits/native.py loads this with ctypes).

   record.py's _hold, for a record of hundreds of witnesses: a torch extension's build read
   about 580 system headers, which os.stat checks at ~4 us each in Python and ~2 us here
   (one lstat each: most are neither links nor files with other names). The same rules
   (record.py's module docstring), one witness at a time, in order:

     l  lstat: inode, size, mtime, ctime          t  lstat: inode, mode, owner, group
     s  stat (through links): the same as l       d  stat of a folder: the same as l
     f  lstat of a file reached by no link: the same as l, and it is no symbolic link
     n  the same as f, for a file with other hard links
     k  lstat: a symbolic link; then stat through it: the same as l
     c  stat: the same as l (record.py also checks that it is the C++ runtime loaded)
     a  lstat fails with ENOENT or ENOTDIR         m  the same as a

   Returns -1 where every witness holds, else the index of the first that does not.
   paths: n NUL-terminated paths, one after another. Many witnesses are split among a few
   threads, each checking a run of them: a stat is the kernel's walk of a path, which runs
   on every core at once (git's preload-index checks its index so); ~600 of a torch
   extension's record took 1.1 ms on one core of the 2-core machine, 0.76 ms on two. */

#define _GNU_SOURCE  /* dlinfo, sched_getaffinity */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <sys/inotify.h>
#include <sys/stat.h>

/* What its calls mean (hits/native.py ABI): bumped where one's meaning changes. A writer that
   finds no library of this source (an upgrade changed it, and the process built nothing) names
   one an older source built only where this number is the same. */
#define WITNESS_ABI 1

int abicache_witness_abi(void) {
    return WITNESS_ABI;
}

static int same(const struct stat *st, const int64_t *w) {
    return (int64_t)st->st_ino == w[0] && (int64_t)st->st_size == w[1] &&
           (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec == w[2] &&
           (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec == w[3];
}

static int hold_run(int n, const char *kinds, const char *paths, const int64_t *numbers) {
    struct stat st;
    const char *path = paths;
    for (int i = 0; i < n; i++, path += strlen(path) + 1) {
        const int64_t *w = numbers + 4 * (int64_t)i;
        switch (kinds[i]) {
        case 'a':
        case 'm':
            if (lstat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) return i;
            continue;
        case 't':
            if (lstat(path, &st) != 0 || (int64_t)st.st_ino != w[0] || (int64_t)st.st_mode != w[1] ||
                (int64_t)st.st_uid != w[2] || (int64_t)st.st_gid != w[3]) return i;
            continue;
        case 'l':
            if (lstat(path, &st) != 0 || !same(&st, w)) return i;
            continue;
        case 'f':
        case 'n':
            if (lstat(path, &st) != 0 || S_ISLNK(st.st_mode) || !same(&st, w)) return i;
            continue;
        case 'k':
            if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode) || stat(path, &st) != 0 || !same(&st, w)) return i;
            continue;
        case 's':
        case 'd':
        case 'c':
            if (stat(path, &st) != 0 || !same(&st, w)) return i;
            continue;
        default:  /* a kind this does not know: not held here */
            return i;
        }
    }
    return -1;
}

/* A thread's run of the witnesses: at least this many each (a thread costs ~30 us to start),
   on at most this many threads, never more than this process may run on at once. */
#define PER_THREAD 256
#define MOST_THREADS 4

struct run {
    int n, first;
    const char *kinds, *paths;
    const int64_t *numbers;
};

static void *check_run(void *arg) {
    struct run *r = arg;
    r->first = hold_run(r->n, r->kinds, r->paths, r->numbers);
    return NULL;
}

/* How many threads check n witnesses (tests/test_torch_hits.py asks). */
int abicache_threads(int n) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int threads = n / PER_THREAD;
    if (threads > cores) threads = cores;
    if (threads > MOST_THREADS) threads = MOST_THREADS;
    return threads < 1 ? 1 : threads;
}

int abicache_hold(int n, const char *kinds, const char *paths, const int64_t *numbers) {
    int threads = abicache_threads(n);
    if (threads == 1) return hold_run(n, kinds, paths, numbers);
    struct run runs[MOST_THREADS];
    pthread_t ids[MOST_THREADS];
    int started[MOST_THREADS] = {0}, at = 0;
    const char *path = paths;
    for (int t = 0; t < threads; t++) {  /* run t: witnesses [at, end), its paths from path on */
        int end = (int)((int64_t)n * (t + 1) / threads);
        runs[t] = (struct run){end - at, -1, kinds + at, path, numbers + 4 * (int64_t)at};
        for (; at < end; at++) path += strlen(path) + 1;
    }
    sigset_t all, was;  /* signals stay the caller's: the threads start with every one blocked */
    sigfillset(&all);
    int masked = pthread_sigmask(SIG_SETMASK, &all, &was) == 0;
    for (int t = 1; t < threads; t++)  /* a thread that cannot start: its run is checked here below */
        started[t] = pthread_create(&ids[t], NULL, check_run, &runs[t]) == 0;
    if (masked) pthread_sigmask(SIG_SETMASK, &was, NULL);
    check_run(&runs[0]);
    int first = -1;
    for (int t = 0, base = 0; t < threads; base += runs[t].n, t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else if (t > 0) check_run(&runs[t]);
        if (first < 0 && runs[t].first >= 0) first = base + runs[t].first;  /* the first in order, as one thread says */
    }
    return first;
}

/* The in-process watch's inotify_add_watch calls in one native call (store/watch.py arms
   ~210 for a torch extension's record: ~3 ms through ctypes one by one). wds[i]: the watch
   descriptor of path i. Returns -1 where every one was armed, else the index of the first
   that was not (out of watches, a path gone: the watch falls back to stat). */
int abicache_arm(int fd, int n, const char *paths, const uint32_t *masks, int32_t *wds) {
    const char *path = paths;
    for (int i = 0; i < n; i++, path += strlen(path) + 1) {
        wds[i] = inotify_add_watch(fd, path, masks[i]);
        if (wds[i] < 0) return i;
    }
    return -1;
}

/* The folders holding a symbolic link among the parts of each of n folders (NUL-terminated,
   one after another): store/watch.py _link_holders' answers, in its order, with its rules (a
   folder's parts are what is left between '/'s once its first and last '/'s are taken off;
   each prefix a part ends is lstat'ed; where it is a link, the prefix before it, or "/", is a
   holder). A prefix the folder before had too is not asked again (a record's folders are
   sorted and share most of their parts): ~70 lstats for a torch
   extension's 47 folders, where Python's os.path.islink of each cost ~0.5 ms. Writes the
   holders NUL-terminated to out; returns how many bytes, or -1 where out (size bytes) is too
   small or a folder too long (watch.py asks Python then). */
long abicache_holders(int n, const char *folders, char *out, long size) {
    char s[PATH_MAX + 2], prev[PATH_MAX + 2];  /* 16 KiB of stack: ctypes lets threads call at once */
    unsigned char link[PATH_MAX + 2], prev_link[PATH_MAX + 2];
    size_t prev_len = 0;
    long used = 0;
    const char *folder = folders;
    for (int k = 0; k < n; k++, folder += strlen(folder) + 1) {
        const char *part = folder;
        while (*part == '/') part++;
        size_t len = strlen(part);
        while (len > 0 && part[len - 1] == '/') len--;
        if (len + 1 > PATH_MAX) return -1;
        s[0] = '/';
        memcpy(s + 1, part, len);
        size_t end = len + 1, same = 0, parent = 0;
        s[end] = '\0';
        while (same < end && same < prev_len && s[same] == prev[same]) same++;
        for (size_t i = 1; i <= end; i++) {
            if (i < end && s[i] != '/') continue;
            if (i <= same && (i == prev_len || prev[i] == '/')) {
                link[i] = prev_link[i];
            } else {
                struct stat st;
                char kept = s[i];
                s[i] = '\0';
                link[i] = lstat(s, &st) == 0 && S_ISLNK(st.st_mode);
                s[i] = kept;
            }
            if (link[i]) {
                size_t holder = parent ? parent : 1;  /* s[0:parent], or "/" */
                if (used + (long)holder + 1 > size) return -1;
                memcpy(out + used, s, holder);
                out[used + (long)holder] = '\0';
                used += (long)holder + 1;
            }
            parent = i;
        }
        memcpy(prev, s, end + 1);
        memcpy(prev_link, link, end + 1);
        prev_len = end;
    }
    return used;
}

/* The file the library this process loaded by that soname came from (native/loaded.py's
   libstdcxx_path for a c witness, without importing that module and ctypes' dlinfo: ~0.5 ms
   of a torch extension's hit). Returns 0 with the path in out, or -1 where the library is
   not loaded, has no absolute path or the path does not fit (record.py asks Python then). */
int abicache_loaded(const char *soname, char *out, int size) {
    void *handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL) return -1;
    struct link_map *map = NULL;
    int found = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL &&
                map->l_name[0] == '/' && strlen(map->l_name) < (size_t)size;
    if (found) strcpy(out, map->l_name);
    dlclose(handle);
    return found ? 0 : -1;
}
