/* abicache's native front for the compiler launcher (launcher/front.py builds it, once
 * per store, with the C compiler; `abicache launcher` prints its path).
 *
 *     front COMPILER ARGS...
 *
 * serves a compile from its hit record (launcher/records.py) by stat alone: it computes
 * the record's name as records.name() does (sha256 of the store as written, the working
 * directory, the user and groups, the machine, abicache's version, the environment but
 * what a shell and make set anew for every run, and every word of the command), reads the record (a regular file of this user no one
 * else may write), checks its deadline and every witness, writes each output where the
 * compiler writes it (a copy renamed into place), prints what the compile printed, counts
 * the hit, and exits 0. Anything else — no record, a witness that moved, an error of any
 * kind — runs the launcher in Python (ABICACHE_PYTHON), which looks the compile up the
 * full way. So the front can only ever be slower, never wrong: what it serves is what the
 * Python launcher would serve.
 *
 * Run as a link named after a compiler (`g++ ARGS...`: `abicache launcher --links` makes them),
 * it is that compiler's launcher, as ccache is through /usr/lib/ccache.
 *
 * Where no record serves, a warm launcher may (launcher/warm.py): a fork of a Python process
 * that has imported what a miss needs, reached by an abstract socket, which answers the
 * compile's exit status; else (no server, another user's, a fork that died) Python runs.
 *
 * `front --abicache-serve-only COMPILER ARGS...` exits 75 instead of running Python (the
 * tests' way to see which one served), `front --abicache-name ...` prints the name, and
 * `front --abicache-warm-address` the warm launcher's socket name.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stddef.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifndef ABICACHE_VERSION
#error "built by launcher/front.py, which defines ABICACHE_VERSION, ABICACHE_PYTHON and ABICACHE_PATH"
#endif

#define FORMAT "abicache-launch 2"
#define MAX_HASHED (64 << 20)
#define MAX_RECORD (8 << 20)
#define LOG_MAX (1 << 20)
#define HANDED 75

extern char **environ;

/* ---- sha256 (FIPS 180-4) ------------------------------------------------------------ */

typedef struct { uint32_t h[8]; uint64_t len; unsigned char buf[64]; size_t used; } Sha;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(Sha *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha_init(Sha *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->used = 0;
}

static void sha_add(Sha *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->len += n;
    while (n) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->buf + s->used, p, take);
        s->used += take; p += take; n -= take;
        if (s->used == 64) { sha_block(s, s->buf); s->used = 0; }
    }
}

static void sha_hex(Sha *s, char out[65]) {
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha_add(s, &pad, 1);
    while (s->used != 56) sha_add(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_add(s, len, 8);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", s->h[i]);
}

/* ---- the record's name -------------------------------------------------------------- */

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int by_gid(const void *a, const void *b) {
    gid_t x = *(const gid_t *)a, y = *(const gid_t *)b;
    return x < y ? -1 : x > y;
}

static void add_part(Sha *s, const char *text, int first) {
    if (!first) sha_add(s, "\0\0", 2);
    sha_add(s, text, strlen(text));
}

/* records.py VOLATILE: set anew for every run by a shell and by make, left out of the name */
static int volatile_variable(const char *entry, size_t length) {
    static const char *const names[] = {"_", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKE_TERMOUT", "MAKE_TERMERR"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == length && strncmp(entry, names[i], length) == 0) return 1;
    return 0;
}

/* os.environ as Python makes it: entries with '=', the first of a name kept; sorted as bytes */
static int add_environment(Sha *s) {
    size_t n = 0;
    for (char **e = environ; *e; e++) n++;
    char **kept = calloc(n + 1, sizeof *kept);
    if (!kept) return -1;
    size_t k = 0;
    for (char **e = environ; *e; e++) {
        char *eq = strchr(*e, '=');
        if (!eq || volatile_variable(*e, (size_t)(eq - *e))) continue;
        size_t klen = (size_t)(eq - *e);
        int seen = 0;
        for (size_t j = 0; j < k && !seen; j++) seen = strncmp(kept[j], *e, klen + 1) == 0;
        if (!seen) kept[k++] = *e;
    }
    qsort(kept, k, sizeof *kept, by_bytes);
    sha_add(s, "\0\0", 2);
    for (size_t j = 0; j < k; j++) {
        if (j) sha_add(s, "", 1);
        sha_add(s, kept[j], strlen(kept[j]));
    }
    free(kept);
    return 0;
}

static int record_name(const char *root, char **argv, char out[65]) {
    char cwd[PATH_MAX], who[4096], line[1024];
    struct utsname u;
    if (!getcwd(cwd, sizeof cwd) || uname(&u) != 0) return -1;
    int count = getgroups(0, NULL);
    if (count < 0 || count > 4096) return -1;
    gid_t *groups = calloc((size_t)count + 1, sizeof *groups);
    if (!groups || getgroups(count, groups) < 0) { free(groups); return -1; }
    qsort(groups, (size_t)count, sizeof *groups, by_gid);
    int at = snprintf(who, sizeof who, "%u %u %u %u ", (unsigned)getuid(), (unsigned)geteuid(), (unsigned)getgid(),
                      (unsigned)getegid());
    int written = 0;
    for (int i = 0; i < count && at < (int)sizeof who - 16; i++) {
        if (i && groups[i] == groups[i - 1]) continue;  /* sorted(set(...)) */
        at += snprintf(who + at, sizeof who - (size_t)at, "%s%u", written++ ? " " : "", (unsigned)groups[i]);
    }
    free(groups);
    snprintf(line, sizeof line, "%s %s %s %s %s", u.sysname, u.nodename, u.release, u.version, u.machine);
    Sha s;
    sha_init(&s);
    add_part(&s, FORMAT, 1);
    add_part(&s, ABICACHE_VERSION, 0);
    add_part(&s, root, 0);
    add_part(&s, cwd, 0);
    add_part(&s, who, 0);
    add_part(&s, line, 0);
    if (add_environment(&s) != 0) return -1;
    sha_add(&s, "\0\0", 2);
    for (int i = 0; argv[i]; i++) {
        if (i) sha_add(&s, "", 1);
        sha_add(&s, argv[i], strlen(argv[i]));
    }
    sha_hex(&s, out);
    return 0;
}

/* ---- the store: hits/naming.py default_root ----------------------------------------- */

static int join(char *out, size_t size, const char *a, const char *b) {
    size_t n = strlen(a);
    int w = snprintf(out, size, "%s%s%s", a, n && a[n - 1] == '/' ? "" : "/", b);
    return w > 0 && (size_t)w < size ? 0 : -1;
}

static int expand_user(const char *path, char *out, size_t size) {
    if (path[0] != '~') return snprintf(out, size, "%s", path) < (int)size ? 0 : -1;
    if (path[1] != '\0' && path[1] != '/') return -1;  /* ~user: Python's answer */
    const char *home = getenv("HOME");
    if (!home) return -1;
    char trimmed[PATH_MAX];
    snprintf(trimmed, sizeof trimmed, "%s", home);
    size_t n = strlen(trimmed);
    while (n > 0 && trimmed[n - 1] == '/') trimmed[--n] = '\0';
    int w = snprintf(out, size, "%s%s", trimmed, path + 1);
    if (w <= 0) w = snprintf(out, size, "/");
    return w > 0 && (size_t)w < size ? 0 : -1;
}

/* whether the user's config file may set `dir` (it spells "dir", or escapes) */
static int config_may_name_dir(void) {
    const char *xdg = getenv("XDG_CONFIG_HOME");
    char base[PATH_MAX], path[PATH_MAX];
    if (xdg && xdg[0] == '/') snprintf(base, sizeof base, "%s", xdg);
    else {
        char home[PATH_MAX];
        if (expand_user("~", home, sizeof home) != 0) return 1;
        if (join(base, sizeof base, home, ".config") != 0) return 1;
    }
    if (join(path, sizeof path, base, "abicache/config.toml") != 0) return 1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : 1;
    static char data[1 << 20];
    ssize_t n = read(fd, data, sizeof data - 1);
    close(fd);
    if (n < 0) return 1;
    data[n] = '\0';
    return memmem(data, (size_t)n, "dir", 3) || memmem(data, (size_t)n, "\\u", 2) || memmem(data, (size_t)n, "\\U", 2);
}

static int default_root(char *out, size_t size) {
    const char *explicit = getenv("ABICACHE_DIR");
    if (explicit && explicit[0]) return expand_user(explicit, out, size);
    if (config_may_name_dir()) return -1;
    if (getenv("ANDROID_ROOT") && getenv("ANDROID_ROOT")[0]) return -1;
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return join(out, size, xdg, "abicache");
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') return -1;
    char cache[PATH_MAX];
    if (join(cache, sizeof cache, home, ".cache") != 0) return -1;
    return join(out, size, cache, "abicache");
}

/* ---- reading a record --------------------------------------------------------------- */

static char *read_record(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    char *data = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022) &&
        st.st_size <= MAX_RECORD && (data = malloc((size_t)st.st_size + 1))) {
        size_t got = 0;
        ssize_t n;
        while (got < (size_t)st.st_size && (n = read(fd, data + got, (size_t)st.st_size - got)) > 0) got += (size_t)n;
        if (got != (size_t)st.st_size) { free(data); data = NULL; }
        else { data[got] = '\0'; *size = got; }
    }
    close(fd);
    return data;
}

static int64_t ns(struct timespec t) { return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec; }

/* whether the file holds the bytes of that sha256 (a file its stat says moved, written again
 * the same: a configure step's output in a clean build folder) */
static int same_bytes(const char *path, const char *sha) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= MAX_HASHED;
    Sha s;
    sha_init(&s);
    char buf[1 << 16], hex[65];
    ssize_t n;
    while (ok && (n = read(fd, buf, sizeof buf)) != 0) {
        if (n < 0) { ok = 0; break; }
        sha_add(&s, buf, (size_t)n);
    }
    close(fd);
    if (!ok) return 0;
    sha_hex(&s, hex);
    return strcmp(hex, sha) == 0;
}

/* one witness (hits/record.py's letters; 'c' is the Python launcher's to judge); sha: the
 * file's sha256 where its bytes may stand for a stat that moved ("" where not) */
static int holds(char kind, const char *path, const int64_t w[4], const char *sha) {
    struct stat st;
    int rc = kind == 's' || kind == 'd' ? stat(path, &st) : lstat(path, &st);
    if (kind == 'a' || kind == 'm') return rc != 0 && (errno == ENOENT || errno == ENOTDIR);
    if (rc != 0) return 0;
    if (kind == 't')
        return (int64_t)st.st_ino == w[0] && (int64_t)st.st_mode == w[1] && (int64_t)st.st_uid == w[2] &&
               (int64_t)st.st_gid == w[3];
    if (kind != 'l' && kind != 's' && kind != 'd') return 0;
    if ((int64_t)st.st_ino == w[0] && (int64_t)st.st_size == w[1] && ns(st.st_mtim) == w[2] &&
        ns(st.st_ctim) == w[3])
        return 1;
    return kind == 's' && strlen(sha) == 64 && (int64_t)st.st_size == w[1] && same_bytes(path, sha);
}

/* the entry folder's names, sorted, '/'-joined, as the record holds them */
static int same_names(const char *folder, const char *expected) {
    DIR *dir = opendir(folder);
    if (!dir) return 0;
    char *names[4096];
    size_t n = 0, total = 0;
    struct dirent *d;
    int ok = 1;
    while ((d = readdir(dir))) {
        if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, "..") || !strcmp(d->d_name, ".abicache-stamp") ||
            !strcmp(d->d_name, ".abicache-deps") || !strncmp(d->d_name, ".abicache-s.", 12))
            continue;  /* the entry's stamps: records.py leaves them out */
        if (n == 4096 || !(names[n] = strdup(d->d_name))) { ok = 0; break; }
        total += strlen(names[n++]) + 1;
    }
    closedir(dir);
    if (ok) {
        qsort(names, n, sizeof *names, by_bytes);
        char *joined = malloc(total + 1), *at = joined;
        ok = joined != NULL;
        for (size_t i = 0; ok && i < n; i++) at += sprintf(at, "%s%s", i ? "/" : "", names[i]);
        if (ok) { *at = '\0'; ok = strcmp(joined, expected) == 0; }
        free(joined);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    return ok;
}

/* ---- serving ------------------------------------------------------------------------ */

static int copy_into_place(const char *from, const char *to) {
    char temp[PATH_MAX];
    if (snprintf(temp, sizeof temp, "%s.abicache-%d.tmp", to, (int)getpid()) >= (int)sizeof temp) return -1;
    int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0) return -1;
    int out = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  /* its mode by the umask, as the compiler's */
    if (out < 0) { close(in); return -1; }
    char buf[1 << 16];
    ssize_t n;
    int ok = 1;
    while ((n = read(in, buf, sizeof buf)) > 0) {
        for (ssize_t done = 0, w; done < n; done += w)
            if ((w = write(out, buf + done, (size_t)(n - done))) <= 0) { ok = 0; break; }
        if (!ok) break;
    }
    ok = ok && n == 0;
    close(in);
    if (close(out) != 0) ok = 0;
    if (ok && rename(temp, to) == 0) return 0;
    unlink(temp);
    return -1;
}

static void print_file(const char *folder, const char *name, int fd) {
    char path[PATH_MAX];
    if (join(path, sizeof path, folder, name) != 0) return;
    int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0) return;
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        for (ssize_t done = 0, w; done < n; done += w)
            if ((w = write(fd, buf + done, (size_t)(n - done))) <= 0) { close(in); return; }
    close(in);
}

static int folder_of_exists(const char *path) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    char *slash = strrchr(copy, '/');
    struct stat st;
    if (!slash) return 1;  /* the working directory */
    if (slash == copy) return 1;
    *slash = '\0';
    return stat(copy, &st) == 0 && S_ISDIR(st.st_mode);
}

static void count_hit(const char *root, double seconds) {
    char path[PATH_MAX], line[256];
    if (join(path, sizeof path, root, "v3/log/stats.jsonl") != 0) return;
    struct timeval now;
    gettimeofday(&now, NULL);
    int n = snprintf(line, sizeof line,
                     "{\"time\": %.3f, \"pid\": %d, \"hits_local\": 1, \"kind:cc.compile:hits\": 1, "
                     "\"seconds_saved\": %.3f}\n", now.tv_sec + now.tv_usec / 1e6, (int)getpid(), seconds);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size + n > LOG_MAX) return;  /* Python rotates */
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) { ssize_t ignored = write(fd, line, (size_t)n); (void)ignored; }
    close(fd);
}

/* 0: served; -1: the Python launcher decides */
static int serve(char **argv) {
    char root[PATH_MAX], real[PATH_MAX], name[65], path[PATH_MAX];
    if (default_root(root, sizeof root) != 0 || !realpath(root, real)) return -1;
    if (record_name(root, argv, name) != 0) return -1;
    if (snprintf(path, sizeof path, "%s/v3/hits/%s", real, name) >= (int)sizeof path) return -1;
    size_t size = 0;
    char *data = read_record(path, &size);
    if (!data) return -1;
    int result = -1;
    char *newline = memchr(data, '\n', size);
    long witnesses, outputs, text;
    char magic[64];
    if (!newline || sscanf(data, "abicache-launch %63s %ld %ld %ld", magic, &witnesses, &outputs, &text) != 4 ||
        strcmp(magic, "2") != 0 || witnesses < 0 || outputs < 1 || text < 0 ||
        (size_t)(newline + 1 - data) + (size_t)witnesses * 32 + (size_t)text != size)
        goto done;
    const unsigned char *numbers = (const unsigned char *)newline + 1;
    char *body = newline + 1 + witnesses * 32;
    size_t fields_wanted = 7 + (size_t)outputs + 2 * (size_t)witnesses, found = 0;
    char **field = calloc(fields_wanted, sizeof *field);
    if (!field) goto done;
    for (char *at = body; at <= data + size && found < fields_wanted; at += strlen(at) + 1) field[found++] = at;
    if (found != fields_wanted || field[fields_wanted - 1] + strlen(field[fields_wanted - 1]) != data + size) {
        free(field);
        goto done;
    }
    const char *kinds = field[6], *entry = field[2];
    struct timeval now;
    gettimeofday(&now, NULL);
    double clock = now.tv_sec + now.tv_usec / 1e6;
    int ok = strcmp(field[1], real) == 0 && clock < atof(field[0]) && strlen(kinds) == (size_t)witnesses;
    for (long i = 0; ok && i < witnesses; i++) {
        int64_t w[4];
        memcpy(w, numbers + 32 * i, 32);  /* little-endian int64s: this machine's order on x86-64 and arm64 */
        ok = holds(kinds[i], field[7 + outputs + i], w, field[7 + outputs + witnesses + i]);
    }
    ok = ok && same_names(entry, field[3]);
    for (long i = 0; ok && i < outputs; i++) ok = folder_of_exists(field[7 + i]);
    for (long i = 0; ok && i < outputs; i++) {
        char from[PATH_MAX], leaf[32];
        snprintf(leaf, sizeof leaf, "output-%ld", i);
        ok = join(from, sizeof from, entry, leaf) == 0 && copy_into_place(from, field[7 + i]) == 0;
    }
    if (ok) {
        struct stat st;
        if (stat(entry, &st) == 0 && clock - (double)st.st_mtim.tv_sec >= atof(field[4])) utimes(entry, NULL);
        print_file(entry, "stdout", 1);
        print_file(entry, "stderr", 2);
        count_hit(real, atof(field[5]));
        result = 0;
    }
    free(field);
done:
    free(data);
    return result;
}

/* ---- the warm launcher (launcher/warm.py) ------------------------------------------- */

static int by_text(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the server's abstract socket name, as warm.address() computes it; -1 where a part is unreadable */
static int warm_address(struct sockaddr_un *addr, socklen_t *length) {
    Sha s;
    char text[PATH_MAX], hex[65];
    sha_init(&s);
    add_part(&s, "abicache-warm 1", 1);
    snprintf(text, sizeof text, "%u", (unsigned)getuid());
    add_part(&s, text, 0);
    snprintf(text, sizeof text, "%u", (unsigned)getgid());
    add_part(&s, text, 0);
    int n = getgroups(0, NULL);
    gid_t *groups = n > 0 ? calloc((size_t)n, sizeof *groups) : NULL;
    if (n < 0 || (n > 0 && (!groups || getgroups(n, groups) != n))) { free(groups); return -1; }
    qsort(groups, (size_t)n, sizeof *groups, by_gid);
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < n && used < sizeof text - 16; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%u", i ? "," : "", (unsigned)groups[i]);
    free(groups);
    if (used >= sizeof text - 16) return -1;
    add_part(&s, text, 0);
    static const char *const spaces[] = {"/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/user"};
    used = 0;
    for (int i = 0; i < 3; i++) {
        char link[256];
        ssize_t k = readlink(spaces[i], link, sizeof link - 1);
        if (k <= 0) return -1;
        link[k] = '\0';
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s", i ? "," : "", link);
    }
    add_part(&s, text, 0);
    struct stat root;
    if (stat("/", &root) != 0) return -1;
    snprintf(text, sizeof text, "%llu:%llu", (unsigned long long)root.st_dev, (unsigned long long)root.st_ino);
    add_part(&s, text, 0);
    int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got < 0) return -1;
    text[got] = '\0';  /* warm.py reads as much, up to a NUL */
    add_part(&s, text, 0);
    add_part(&s, ABICACHE_VERSION, 0);
    add_part(&s, ABICACHE_PYTHON, 0);
    add_part(&s, ABICACHE_PATH, 0);
    size_t count = 0;
    for (char **e = environ; *e; e++) count++;
    char **chosen = calloc(count + 1, sizeof *chosen);
    if (!chosen) return -1;
    size_t k = 0;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "PYTHON", 6) == 0 || strncmp(*e, "LC_", 3) == 0 || strncmp(*e, "HOME=", 5) == 0 ||
            strncmp(*e, "LANG=", 5) == 0) chosen[k++] = *e;
    qsort(chosen, k, sizeof *chosen, by_text);
    for (size_t i = 0; i < k; i++) add_part(&s, chosen[i], 0);
    free(chosen);
    sha_hex(&s, hex);
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    static const char prefix[] = "abicache-warm-";  /* after the abstract namespace's NUL */
    memcpy(addr->sun_path + 1, prefix, sizeof prefix - 1);
    memcpy(addr->sun_path + sizeof prefix, hex, 40);
    *length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sizeof prefix + 40);
    return 0;
}

static volatile sig_atomic_t warm_pid = 0, forwarded = 0;

static void forward(int sig) {
    if (warm_pid > 0) kill((pid_t)warm_pid, sig);
    forwarded = sig;
}

static int send_all(int fd, const char *data, size_t n) {
    while (n) {
        ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        data += k;
        n -= (size_t)k;
    }
    return 0;
}

/* the request: its header and the fds (working directory, stdin, stdout, stderr) in one message */
static int send_request(int fd, char **argv) {
    int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0) return -1;
    for (int i = 0; i < 3; i++)
        if (fcntl(i, F_GETFD) < 0) { close(cwd); return -1; }  /* a closed stream: Python's way */
    size_t length = 0, argc = 0;
    for (char **a = argv; *a; a++, argc++) length += strlen(*a) + 1;
    for (char **e = environ; *e; e++) length += strlen(*e) + 1;
    char *payload = malloc(length ? length : 1), *at = payload;
    if (!payload) { close(cwd); return -1; }
    for (char **a = argv; *a; a++) at = stpcpy(at, *a) + 1;
    for (char **e = environ; *e; e++) at = stpcpy(at, *e) + 1;
    mode_t mask = umask(0);
    umask(mask);
    char head[128];
    int n = snprintf(head, sizeof head, "abicache-warm 1 %o %zu %zu\n", (unsigned)mask, argc, length);
    int fds[4] = {cwd, 0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec io = {head, (size_t)n};
    struct msghdr msg = {0};
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t sent;
    do sent = sendmsg(fd, &msg, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    close(cwd);
    int ok = sent >= 0 && (sent == n || send_all(fd, head + sent, (size_t)(n - sent)) == 0) &&
             send_all(fd, payload, length) == 0;
    free(payload);
    return ok ? 0 : -1;
}

/* one line of the answer; -1 at its end (or after wait_ms without one, where wait_ms >= 0) */
static int answer_line(int fd, char *line, size_t size, int wait_ms) {
    size_t used = 0;
    while (used < size - 1) {
        if (wait_ms >= 0) {
            struct pollfd p = {fd, POLLIN, 0};
            int r = poll(&p, 1, wait_ms);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
        }
        ssize_t k = read(fd, line + used, 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        if (line[used] == '\n') { line[used] = '\0'; return 0; }
        used++;
    }
    return -1;
}

/* a compile served by a warm launcher: its exit status; -1 where none answered (Python runs it) */
static int warm(char **argv) {
    const char *off = getenv("ABICACHE_WARM");
    if ((off && strcmp(off, "0") == 0) || getenv("ABICACHE_TRACE_FD")) return -1;
    struct sockaddr_un addr;
    socklen_t length;
    if (warm_address(&addr, &length) != 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct ucred peer;
    socklen_t size = sizeof peer;
    char line[64];
    long pid = 0;
    if (connect(fd, (struct sockaddr *)&addr, length) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != geteuid() ||
        send_request(fd, argv) != 0 || answer_line(fd, line, sizeof line, 10000) != 0 ||
        sscanf(line, "pid %ld", &pid) != 1 || pid <= 0) {
        close(fd);
        return -1;
    }
    warm_pid = (sig_atomic_t)pid;
    static const int signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction act = {0};
    act.sa_handler = forward;  /* no SA_RESTART: a read it interrupts is read again */
    for (size_t i = 0; i < sizeof signals / sizeof *signals; i++) sigaction(signals[i], &act, NULL);
    int status;
    int got = answer_line(fd, line, sizeof line, -1);
    close(fd);
    if (got == 0 && sscanf(line, "status %d", &status) == 1 && !forwarded) return status;
    if (got == 0 && strcmp(line, "exec") == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "abicache: cannot run %s: %s\n", argv[0], strerror(errno));
        return 127;
    }
    if (forwarded) {  /* the build stopped the compile: this process ends by the signal it sent */
        signal(forwarded, SIG_DFL);
        raise(forwarded);
        return 128 + forwarded;
    }
    return -1;  /* the fork died: Python runs the compile again, the whole way */
}

static int hand_over(char **argv) {
    int n = 0;
    while (argv[n]) n++;
    char **args = calloc((size_t)n + 4, sizeof *args);
    if (!args) return 127;
    args[0] = ABICACHE_PYTHON;
    args[1] = "-c";
    /* sys.path holds '' (the working directory) for -c: dropped, so no file of the build folder is
     * imported as a module; abicache's own folder first (ABICACHE_PATH, a Python literal) */
    args[2] = "import sys; sys.path[:] = [" ABICACHE_PATH ", *(p for p in sys.path if p)]; "
              "from abicache.cli import main; from abicache.launcher.warm import after; "
              "raise SystemExit(after(main(sys.argv[1:])))";
    for (int i = 0; i < n; i++) args[3 + i] = argv[i];
    execv(ABICACHE_PYTHON, args);
    fprintf(stderr, "abicache: cannot run %s: %s; running the compiler as written\n", ABICACHE_PYTHON, strerror(errno));
    execvp(argv[0], argv);
    fprintf(stderr, "abicache: cannot run %s: %s\n", argv[0], strerror(errno));
    return 127;
}

/* Masquerading (as ccache's /usr/lib/ccache): run as a link named after a compiler (`g++`, put
 * first on PATH, or named by CXX), the compiler is the first program of that name on PATH that
 * is not this one. */
static int find_real(const char *name, char *out, size_t size) {
    char self[PATH_MAX], candidate[PATH_MAX], real[PATH_MAX];
    const char *path = getenv("PATH");
    if (!realpath("/proc/self/exe", self) || !path) return -1;
    for (const char *at = path; ; at = strchr(at, ':') + 1) {
        size_t n = strcspn(at, ":");
        if (snprintf(candidate, sizeof candidate, "%.*s/%s", (int)n, n ? at : ".", name) < (int)sizeof candidate &&
            access(candidate, X_OK) == 0 && realpath(candidate, real) && strcmp(real, self) != 0) {
            struct stat st;
            if (stat(candidate, &st) == 0 && S_ISREG(st.st_mode)) return snprintf(out, size, "%s", candidate) < (int)size ? 0 : -1;
        }
        if (!at[n]) return -1;
    }
}

/* launcher/command.py family(): gcc, g++, cc, c++, clang, clang++ (a target prefix, a version
 * suffix: x86_64-linux-gnu-g++-12, clang-17) or nvcc */
static int compiler_name(const char *name) {
    static const char *const known[] = {"clang++", "clang", "g++", "gcc", "c++", "cc"};
    char stem[256];
    if (strcmp(name, "nvcc") == 0) return 1;
    if (snprintf(stem, sizeof stem, "%s", name) >= (int)sizeof stem) return 0;
    size_t n = strlen(stem);
    if (n && stem[n - 1] >= '0' && stem[n - 1] <= '9') {
        while (n && ((stem[n - 1] >= '0' && stem[n - 1] <= '9') || stem[n - 1] == '.')) stem[--n] = '\0';
        while (n && stem[n - 1] == '-') stem[--n] = '\0';
    }
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        size_t k = strlen(known[i]);
        if (strcmp(stem, known[i]) == 0 || (n > k && stem[n - k - 1] == '-' && strcmp(stem + n - k, known[i]) == 0))
            return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *called = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    if (compiler_name(called)) {  /* a link named after a compiler */
        static char real[PATH_MAX];
        if (find_real(called, real, sizeof real) != 0) {
            fprintf(stderr, "abicache: no %s on PATH but this launcher (%s)\n", called, argv[0]);
            return 127;
        }
        argv[0] = real;
        if (serve(argv) == 0) return 0;
        int status = warm(argv);
        return status >= 0 ? status : hand_over(argv);
    }
    if (argc > 1 && strcmp(argv[1], "--abicache-name") == 0) {
        char root[PATH_MAX], name[65];
        if (argc < 3 || default_root(root, sizeof root) != 0 || record_name(root, argv + 2, name) != 0) return 1;
        printf("%s\n", name);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--abicache-warm-address") == 0) {
        struct sockaddr_un addr;
        socklen_t length;
        if (warm_address(&addr, &length) != 0) return 1;
        printf("%.*s\n", (int)(length - offsetof(struct sockaddr_un, sun_path) - 1), addr.sun_path + 1);
        return 0;
    }
    int only = argc > 1 && strcmp(argv[1], "--abicache-serve-only") == 0;
    char **command = argv + 1 + only;
    if (!command[0]) {
        fprintf(stderr, "usage: %s COMPILER ARGS... (abicache's compiler launcher)\n", argv[0]);
        return 2;
    }
    if (serve(command) == 0) return 0;
    if (only) return HANDED;
    int status = warm(command);
    return status >= 0 ? status : hand_over(command);
}
