/* A hit record's witnesses checked in one call (hits/native.py loads this with ctypes).

   record.py's _hold, for a record of hundreds of witnesses: a torch extension's build read
   about 520 system headers, which os.stat checks at ~4 us each in Python and ~0.7 us here.
   The same rules (record.py's module docstring), one witness at a time, in order:

     l  lstat: inode, size, mtime, ctime          t  lstat: inode, mode, owner, group
     s  stat (through links): the same as l       d  stat of a folder: the same as l
     a  lstat fails with ENOENT or ENOTDIR         m  the same as a

   An s witness is taken with lstat first and stat only where it is a symbolic link, and
   flags[i] says what the in-process watch needs (store/watch.py): 1 a symbolic link,
   2 a file with other hard links. Returns -1 where every witness holds, else the index of
   the first that does not. paths: n NUL-terminated paths, one after another. */

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>

static int same(const struct stat *st, const int64_t *w) {
    return (int64_t)st->st_ino == w[0] && (int64_t)st->st_size == w[1] &&
           (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec == w[2] &&
           (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec == w[3];
}

int abicache_hold(int n, const char *kinds, const char *paths, const int64_t *numbers, unsigned char *flags) {
    struct stat st;
    const char *path = paths;
    for (int i = 0; i < n; i++, path += strlen(path) + 1) {
        const int64_t *w = numbers + 4 * (int64_t)i;
        flags[i] = 0;
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
        case 's':
            if (lstat(path, &st) != 0) return i;
            if (S_ISLNK(st.st_mode)) {
                flags[i] = 1;
                if (stat(path, &st) != 0) return i;
            } else if (st.st_nlink > 1 && !S_ISDIR(st.st_mode)) {
                flags[i] = 2;
            }
            if (!same(&st, w)) return i;
            continue;
        case 'd':
            if (stat(path, &st) != 0 || !same(&st, w)) return i;
            continue;
        default:  /* a kind this does not know ('c': record.py checks it): not held here */
            return i;
        }
    }
    return -1;
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
