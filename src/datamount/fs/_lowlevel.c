/* datamount.fs._lowlevel: libfuse3's low-level (inode) loop, outside the GIL.
 *
 * One job: run libfuse's multi-threaded session loop without the GIL, answer
 * from a native inode table and the disk tier's block files what needs no
 * decision, and call the Python side (fs.lowlevel.Ops) for everything else,
 * with the GIL held only for that call. Python stays the control plane: it
 * decides every miss, prefetch, listing and version pin; what it told the
 * table (attributes, where a cached file's blocks are) is what the native
 * side serves from.
 *
 * Served here: lookup, getattr and forget of names the table knows; reads of
 * a file whose every block was in the disk tier when it was opened (each
 * block file checked once per handle: header, identity, size, XXH3-64 of the
 * data; then plain preads, and the next block files asked into the page
 * cache ahead of a sequential reader); open and release of a one-block file
 * whose block the table knows, with its block checked at the first read and
 * a Python handle pinned to that same version opened on the first miss. The
 * table learns where such a block is from lookups and listings, and from the
 * file-ahead prefetch once it has written the block (Session.cached); the
 * native opens of those files are logged for the prefetch, which takes them
 * in batches (Session.take_opens, woken by an eventfd).
 *
 * The inode table: one node per name the kernel or a listing was told of,
 * numbered from 1 (the root) upwards and never reused or freed for the
 * session's life, so an inode number names one path for the mount's life. A
 * node keeps its parent, its name, its attributes as Python last gave them
 * and when they expire (never, with no attribute TTL), where its one cached
 * block is, and the kernel's lookup count. Lookups by (parent, name) go
 * through a chained hash table. One rwlock guards it all; it is never held
 * across a call into Python or any file I/O.
 *
 * rw_mount (`writable`): the table serves no attributes and no block files
 * (writes change what a name holds behind it), and the writes, names and
 * setattr go to Python. An open file that is unlinked or renamed over takes
 * a hidden name in its folder first, as libfuse's high-level API does
 * without hard_remove (Python takes that rename as the unlink it is, and the
 * hidden name is unlinked at the last release); `names` makes each change of
 * names one step. A rename moves the node with its name; a name that goes
 * leaves its node detached (no path), still known by number.
 *
 * Calls into Python: a libfuse worker thread keeps one Python thread state
 * for its life (made at its first call, deleted when the thread ends), so a
 * call costs taking and giving back the GIL, not a new thread state. Python
 * answers a tuple (success) or a negative errno (an int). Every buffer Python
 * writes into (a read's reply) is a memoryview of exactly the request's size.
 *
 * Safety: every length from Python is checked against the buffer it
 * describes; no Python object is touched without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#define XXH_INLINE_ALL /* header-only: Debian's libxxhash-dev */
#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX >= 0x030D0000
#define IS_FINALIZING() Py_IsFinalizing()
#else
#define IS_FINALIZING() _Py_IsFinalizing()
#endif

#define MAX_IO (1024 * 1024) /* FUSE_MAX_MAX_PAGES (256) x 4 KiB */
#define NEVER INT64_MAX
/* native opens of prefetched files waiting for Session.take_opens; beyond,
 * the oldest are dropped (the prefetch only loses look-ahead) */
#define OPENS_MAX 4096

/* -- the inode table ------------------------------------------------------ */

struct blocks;
static void blocks_free(struct blocks *b);

struct node {
    fuse_ino_t parent;
    char *name;          /* NUL-terminated; "" for the root */
    size_t name_len;
    fuse_ino_t next;     /* the next node in this hash chain, 0 at the end */
    uint64_t nlookup;    /* the kernel's references (atomic) */
    int has_attr;
    int64_t expires;     /* CLOCK_MONOTONIC ns; NEVER */
    mode_t mode;
    uint64_t size;
    int64_t mtime_ns;
    nlink_t nlink;
    uid_t uid;
    gid_t gid;
    struct blocks *desc; /* a one-block file whose block is in the disk tier: opened natively */
    int kernel_has;      /* a native open of `desc`'s version happened: keep_cache */
    int ahead;           /* `desc` came from the file-ahead prefetch: report its next native open */
    int open_count;      /* open handles (atomic): an unlinked open file is hidden */
    int hidden;          /* renamed to a hidden name while open; unlinked at its last release */
    int detached;        /* its name is gone (unlinked, renamed over): no path */
};

struct table {
    pthread_rwlock_t lock;
    struct node **nodes; /* indexed by inode number; [0] unused */
    fuse_ino_t count;    /* nodes in use, the root included: the next is count + 1 */
    fuse_ino_t capacity;
    fuse_ino_t *buckets; /* first node of each chain, 0 for none */
    size_t n_buckets;    /* a power of two */
};

static uint64_t hash_name(fuse_ino_t parent, const char *name, size_t len)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)parent;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* lock held (either way): the node of `name` in `parent`, 0 when none */
static fuse_ino_t table_find(struct table *t, fuse_ino_t parent, const char *name, size_t len)
{
    fuse_ino_t ino = t->buckets[hash_name(parent, name, len) & (t->n_buckets - 1)];
    while (ino) {
        struct node *n = t->nodes[ino];
        if (n->parent == parent && n->name_len == len && memcmp(n->name, name, len) == 0)
            return ino;
        ino = n->next;
    }
    return 0;
}

/* write lock held: double the buckets */
static int table_rehash(struct table *t)
{
    size_t n_buckets = t->n_buckets * 2;
    fuse_ino_t *buckets = calloc(n_buckets, sizeof(*buckets));
    if (!buckets)
        return -ENOMEM;
    for (fuse_ino_t ino = 2; ino <= t->count; ino++) {
        struct node *n = t->nodes[ino];
        if (n->detached)
            continue;
        size_t b = hash_name(n->parent, n->name, n->name_len) & (n_buckets - 1);
        n->next = buckets[b];
        buckets[b] = ino;
    }
    free(t->buckets);
    t->buckets = buckets;
    t->n_buckets = n_buckets;
    return 0;
}

/* write lock held: the node of `name` in `parent`, made when missing; 0 when
 * out of memory */
static fuse_ino_t table_get_or_add(struct table *t, fuse_ino_t parent, const char *name, size_t len)
{
    fuse_ino_t ino = table_find(t, parent, name, len);
    if (ino)
        return ino;
    if (t->count + 1 >= t->capacity) {
        fuse_ino_t capacity = t->capacity * 2;
        struct node **nodes = realloc(t->nodes, capacity * sizeof(*nodes));
        if (!nodes)
            return 0;
        t->nodes = nodes;
        t->capacity = capacity;
    }
    if (t->count + 1 > t->n_buckets && table_rehash(t) != 0)
        return 0;
    struct node *n = calloc(1, sizeof(*n));
    if (!n)
        return 0;
    n->name = malloc(len + 1);
    if (!n->name) {
        free(n);
        return 0;
    }
    memcpy(n->name, name, len);
    n->name[len] = '\0';
    n->name_len = len;
    n->parent = parent;
    ino = ++t->count;
    t->nodes[ino] = n;
    size_t b = hash_name(parent, name, len) & (t->n_buckets - 1);
    n->next = t->buckets[b];
    t->buckets[b] = ino;
    return ino;
}

static int table_init(struct table *t)
{
    memset(t, 0, sizeof(*t));
    t->capacity = 1024;
    t->n_buckets = 1024;
    t->nodes = calloc(t->capacity, sizeof(*t->nodes));
    t->buckets = calloc(t->n_buckets, sizeof(*t->buckets));
    struct node *root = calloc(1, sizeof(*root));
    char *name = calloc(1, 1);
    if (!t->nodes || !t->buckets || !root || !name) {
        free(t->nodes);
        free(t->buckets);
        free(root);
        free(name);
        return -ENOMEM;
    }
    root->name = name;
    t->nodes[FUSE_ROOT_ID] = root;
    t->count = FUSE_ROOT_ID;
    pthread_rwlock_init(&t->lock, NULL);
    return 0;
}

static void table_free(struct table *t)
{
    if (!t->nodes)
        return;
    for (fuse_ino_t ino = 1; ino <= t->count; ino++) {
        blocks_free(t->nodes[ino]->desc);
        free(t->nodes[ino]->name);
        free(t->nodes[ino]);
    }
    free(t->nodes);
    free(t->buckets);
    t->nodes = NULL;
    pthread_rwlock_destroy(&t->lock);
}

/* write lock held: take `ino` out of its hash chain */
static void table_unchain(struct table *t, fuse_ino_t ino)
{
    struct node *n = t->nodes[ino];
    fuse_ino_t *at = &t->buckets[hash_name(n->parent, n->name, n->name_len) & (t->n_buckets - 1)];
    while (*at && *at != ino)
        at = &t->nodes[*at]->next;
    if (*at)
        *at = n->next;
    n->next = 0;
}

/* write lock held: `ino`'s name is gone; the node stays (the kernel and open
 * handles may still name it by number), with no path */
static void table_detach(struct table *t, fuse_ino_t ino)
{
    if (ino <= FUSE_ROOT_ID || ino > t->count || t->nodes[ino]->detached)
        return;
    table_unchain(t, ino);
    t->nodes[ino]->detached = 1;
}

/* write lock held: `ino` is now `name` in `parent` (whatever was there is
 * detached first); 0 or -ENOMEM */
static int table_move(struct table *t, fuse_ino_t ino, fuse_ino_t parent, const char *name,
                      size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, name, len);
    copy[len] = '\0';
    fuse_ino_t there = table_find(t, parent, name, len);
    if (there && there != ino)
        table_detach(t, there);
    struct node *n = t->nodes[ino];
    if (!n->detached)
        table_unchain(t, ino);
    free(n->name);
    n->name = copy;
    n->name_len = len;
    n->parent = parent;
    n->detached = 0;
    size_t b = hash_name(parent, name, len) & (t->n_buckets - 1);
    n->next = t->buckets[b];
    t->buckets[b] = ino;
    return 0;
}

/* lock held: "/a/b" of `ino` in a new buffer (the root is "/"); NULL with
 * *err set: ENOENT when `ino` is not in the table or has no name now,
 * ENOMEM */
static char *table_path(struct table *t, fuse_ino_t ino, size_t *out_len, int *err)
{
    if (ino == 0 || ino > t->count) {
        *err = ENOENT;
        return NULL;
    }
    size_t len = 0;
    for (fuse_ino_t i = ino; i != FUSE_ROOT_ID; i = t->nodes[i]->parent) {
        if (t->nodes[i]->detached) {
            *err = ENOENT;
            return NULL;
        }
        len += t->nodes[i]->name_len + 1;
    }
    if (len == 0)
        len = 1;
    char *path = malloc(len + 1);
    if (!path) {
        *err = ENOMEM;
        return NULL;
    }
    path[len] = '\0';
    path[0] = '/';
    size_t end = len;
    for (fuse_ino_t i = ino; i != FUSE_ROOT_ID; i = t->nodes[i]->parent) {
        struct node *n = t->nodes[i];
        end -= n->name_len;
        memcpy(path + end, n->name, n->name_len);
        path[--end] = '/';
    }
    *out_len = len;
    return path;
}

/* -- cached blocks: the disk tier's files, read without Python ------------- */

/* The block file format (read/cache/blockfile.py, FORMAT_VERSION 2): a header
 * "<8sHIIIQQQQ" (magic, version, lengths of store / key / etag, block index,
 * object size, data length, XXH3-64 of the data), then store, key and etag,
 * then the data, compact (right after) or paged (header and data each padded
 * to whole pages): the file size tells which. */
#define BLOCK_MAGIC "DMBLOCK\n"
#define BLOCK_VERSION 2
#define HEADER_SIZE 54
#define PAGE 4096
#define SLOTS 8 /* verified block files kept open per handle: one per stream */
#define AHEAD 8 /* block files a sequential reader has read into the page cache ahead */

struct slot {
    uint64_t index;
    int fd;           /* -1: empty */
    off_t data_off;
    uint64_t length;
};

struct blocks {
    uint64_t block_size;
    uint64_t size;
    uint64_t count;
    char *ident;      /* store, key and etag, back to back */
    size_t n_store, n_key, n_etag;
    char **paths;     /* count of them */
    pthread_mutex_t lock;
    struct slot slots[SLOTS];
    unsigned next;    /* the slot the next verified file takes */
    uint64_t ahead_until; /* block files below this index were asked into the page cache */
};

/* what fi->fh points at: Python's handle (0: none yet, for a file opened
 * natively), and its blocks when cached on disk */
struct open_file {
    unsigned long long py_fh;
    struct blocks *blocks;
    fuse_ino_t ino;
    int flags;
    pthread_mutex_t lock; /* a natively opened file's Python handle, made on its first miss */
};

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t pages(uint64_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

static void blocks_free(struct blocks *b)
{
    if (!b)
        return;
    for (unsigned i = 0; i < SLOTS; i++)
        if (b->slots[i].fd >= 0)
            close(b->slots[i].fd);
    if (b->paths)
        for (uint64_t i = 0; i < b->count; i++)
            free(b->paths[i]);
    free(b->paths);
    free(b->ident);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

/* GIL held: the blocks Python described (read/cache/blockfile.CachedBlocks:
 * block_size, size, store, key, etag, paths), or NULL (None, or not usable) */
static struct blocks *blocks_from(PyObject *desc)
{
    unsigned long long block_size, size;
    const char *store, *key, *etag;
    Py_ssize_t n_store, n_key, n_etag;
    PyObject *paths;
    if (desc == Py_None)
        return NULL;
    if (!PyTuple_Check(desc) ||
        !PyArg_ParseTuple(desc, "KKy#y#y#O", &block_size, &size, &store, &n_store, &key, &n_key,
                          &etag, &n_etag, &paths) ||
        !PyTuple_Check(paths)) {
        PyErr_Clear();
        return NULL;
    }
    uint64_t count = block_size ? (size + block_size - 1) / block_size : 0;
    if (block_size == 0 || (uint64_t)PyTuple_GET_SIZE(paths) != count)
        return NULL;
    struct blocks *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    pthread_mutex_init(&b->lock, NULL);
    for (unsigned i = 0; i < SLOTS; i++)
        b->slots[i].fd = -1;
    b->block_size = block_size;
    b->size = size;
    b->count = count;
    b->n_store = (size_t)n_store;
    b->n_key = (size_t)n_key;
    b->n_etag = (size_t)n_etag;
    b->ident = malloc(b->n_store + b->n_key + b->n_etag + 1);
    b->paths = calloc(count ? count : 1, sizeof(*b->paths));
    if (!b->ident || !b->paths)
        goto fail;
    memcpy(b->ident, store, b->n_store);
    memcpy(b->ident + b->n_store, key, b->n_key);
    memcpy(b->ident + b->n_store + b->n_key, etag, b->n_etag);
    for (uint64_t i = 0; i < count; i++) {
        Py_ssize_t len;
        const char *path = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(paths, i), &len);
        if (!path) {
            PyErr_Clear();
            goto fail;
        }
        b->paths[i] = strndup(path, (size_t)len);
        if (!b->paths[i])
            goto fail;
    }
    return b;
fail:
    blocks_free(b);
    return NULL;
}

static int same_version(const struct blocks *a, const struct blocks *b)
{
    return a && b && a->size == b->size && a->n_store == b->n_store && a->n_key == b->n_key &&
           a->n_etag == b->n_etag &&
           memcmp(a->ident, b->ident, a->n_store + a->n_key + a->n_etag) == 0;
}

/* a copy of `d` (a node's description) for one open file: its own slots */
static struct blocks *blocks_clone(const struct blocks *d)
{
    struct blocks *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    pthread_mutex_init(&b->lock, NULL);
    for (unsigned i = 0; i < SLOTS; i++)
        b->slots[i].fd = -1;
    b->block_size = d->block_size;
    b->size = d->size;
    b->count = d->count;
    b->n_store = d->n_store;
    b->n_key = d->n_key;
    b->n_etag = d->n_etag;
    size_t n_ident = d->n_store + d->n_key + d->n_etag;
    b->ident = malloc(n_ident + 1);
    b->paths = calloc(d->count ? d->count : 1, sizeof(*b->paths));
    if (!b->ident || !b->paths)
        goto fail;
    memcpy(b->ident, d->ident, n_ident);
    for (uint64_t i = 0; i < d->count; i++)
        if (!(b->paths[i] = strdup(d->paths[i])))
            goto fail;
    return b;
fail:
    blocks_free(b);
    return NULL;
}

/* Open block `index`'s file and check it is exactly that block, whole: its
 * data read into `data` (block_size bytes). The fd, or -1 (no such file, or
 * not this block: Python reads it, and removes a bad one). */
static int block_open(struct blocks *b, uint64_t index, char *data, off_t *data_off,
                      uint64_t *length)
{
    int fd = open(b->paths[index], O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n_ident = b->n_store + b->n_key + b->n_etag;
    size_t n_head = HEADER_SIZE + n_ident;
    unsigned char *head = malloc(n_head);
    struct stat st;
    if (!head || fstat(fd, &st) != 0 || pread(fd, head, n_head, 0) != (ssize_t)n_head)
        goto bad;
    uint64_t expected = index + 1 < b->count ? b->block_size : b->size - index * b->block_size;
    uint64_t len = le64(head + 38);
    if (memcmp(head, BLOCK_MAGIC, 8) != 0 || (head[8] | head[9] << 8) != BLOCK_VERSION ||
        le32(head + 10) != b->n_store || le32(head + 14) != b->n_key ||
        le32(head + 18) != b->n_etag || le64(head + 22) != index || le64(head + 30) != b->size ||
        len != expected || memcmp(head + HEADER_SIZE, b->ident, n_ident) != 0)
        goto bad;
    off_t off;
    if ((uint64_t)st.st_size == n_head + len)
        off = (off_t)n_head;
    else if ((uint64_t)st.st_size == pages(n_head) + pages(len))
        off = (off_t)pages(n_head);
    else
        goto bad;
    if (pread(fd, data, len, off) != (ssize_t)len || XXH3_64bits(data, len) != le64(head + 46))
        goto bad;
    free(head);
    *data_off = off;
    *length = len;
    return fd;
bad:
    free(head);
    close(fd);
    return -1;
}

/* A reader that reached block `index` for the first time, with the block
 * before it read (it holds a slot): a sequential reader. Ask the kernel to
 * read the next AHEAD block files into the page cache (the disk works while
 * the reader copies), as Python's prefetch window would have fetched them
 * from the disk tier. */
static void blocks_ahead(struct blocks *b, uint64_t index)
{
    uint64_t from, to = index + 1 + AHEAD;
    int sequential = 0;
    pthread_mutex_lock(&b->lock);
    for (unsigned i = 0; i < SLOTS && !sequential && index > 0; i++)
        sequential = b->slots[i].fd >= 0 && b->slots[i].index == index - 1;
    from = b->ahead_until > index + 1 ? b->ahead_until : index + 1;
    if (to > b->count)
        to = b->count;
    if (sequential && from < to)
        b->ahead_until = to;
    pthread_mutex_unlock(&b->lock);
    if (!sequential)
        return;
    for (uint64_t i = from; i < to; i++) {
        int fd = open(b->paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
}

/* Read [off, off + size) of the object from its cached block files into
 * `buf`: the bytes read, or -1 when a block is not on disk (or not whole). */
static ssize_t blocks_read(struct blocks *b, char *buf, size_t size, uint64_t off)
{
    if (off >= b->size)
        return 0;
    if (size > b->size - off)
        size = (size_t)(b->size - off);
    size_t done = 0;
    char *scratch = NULL;
    while (done < size) {
        uint64_t pos = off + done;
        uint64_t index = pos / b->block_size;
        uint64_t within = pos - index * b->block_size;
        size_t want = size - done;
        int fd = -1;
        off_t data_off = 0;
        uint64_t length = 0;
        pthread_mutex_lock(&b->lock);
        for (unsigned i = 0; i < SLOTS; i++) {
            if (b->slots[i].fd >= 0 && b->slots[i].index == index) {
                fd = dup(b->slots[i].fd); /* another read may close the slot's meanwhile */
                data_off = b->slots[i].data_off;
                length = b->slots[i].length;
                break;
            }
        }
        pthread_mutex_unlock(&b->lock);
        if (fd < 0) {
            if (b->count > 1)
                blocks_ahead(b, index);
            /* checked whole: straight into the reply when it takes the whole
             * block (a small file read at once), else through a scratch buffer */
            uint64_t expected =
                index + 1 < b->count ? b->block_size : b->size - index * b->block_size;
            int direct = within == 0 && want >= expected;
            if (!direct && !scratch && !(scratch = malloc(b->block_size)))
                return -1;
            fd = block_open(b, index, direct ? buf + done : scratch, &data_off, &length);
            if (fd < 0) {
                free(scratch);
                return -1;
            }
            if (want > length - within)
                want = (size_t)(length - within);
            if (!direct)
                memcpy(buf + done, scratch + within, want);
            done += want;
            pthread_mutex_lock(&b->lock);
            struct slot *slot = &b->slots[b->next];
            b->next = (b->next + 1) % SLOTS;
            if (slot->fd >= 0)
                close(slot->fd);
            slot->index = index;
            slot->fd = fd;
            slot->data_off = data_off;
            slot->length = length;
            pthread_mutex_unlock(&b->lock);
            continue;
        }
        if (want > length - within)
            want = (size_t)(length - within);
        ssize_t got = pread(fd, buf + done, want, data_off + (off_t)within);
        close(fd);
        if (got != (ssize_t)want) {
            free(scratch);
            return -1;
        }
        done += want;
    }
    free(scratch);
    return (ssize_t)done;
}

/* -- the session ---------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *ops;        /* fs.lowlevel.Ops: the Python side */
    struct fuse_session *se;
    struct table table;
    double timeout;       /* entry / attr / negative timeouts for the kernel, s */
    int64_t attr_ttl_ns;  /* how long the table serves attributes; NEVER */
    unsigned max_threads;
    int writable;         /* rw_mount: no attributes served from the table; writes served */
    pthread_mutex_t names; /* one change of names at a time: unlink, rename, hidden files */
    unsigned hidden_seq;  /* the last hidden name's number */
    int mounted;
    pthread_t loop_thread;
    int looping;
    /* served without Python (atomic) */
    uint64_t native_lookups;
    uint64_t native_getattrs;
    uint64_t native_opens;
    uint64_t native_reads;
    uint64_t native_read_bytes;
    uint64_t python_calls;
    uint64_t native_prefetched; /* files Session.cached handed over */
    /* native opens of prefetched files, for Session.take_opens: the
     * file-ahead prefetch follows every open (`opens_fd` becomes readable
     * when the log is no longer empty) */
    pthread_mutex_t opens_lock;
    fuse_ino_t opens[OPENS_MAX];
    size_t n_opens;
    int opens_fd;         /* an eventfd; -1 before init */
    int opens_closed;     /* exit() was called: take_opens answers None */
} Session;

/* -- the GIL: one kept thread state per libfuse worker ---------------------- */

static pthread_key_t tstate_key;
static pthread_once_t tstate_once = PTHREAD_ONCE_INIT;

static void tstate_drop(void *arg)
{
    /* the worker thread ends: delete its thread state (not while the
     * interpreter shuts down: then it goes with the interpreter) */
    PyThreadState *ts = arg;
    if (!ts || IS_FINALIZING())
        return;
    /* not PyGILState_Release: the thread's exit may have cleared CPython's own
     * thread-specific binding before this destructor runs */
    PyEval_RestoreThread(ts);
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent(); /* and gives the GIL back */
}

static void tstate_key_make(void)
{
    pthread_key_create(&tstate_key, tstate_drop);
}

static void gil_enter(void)
{
    pthread_once(&tstate_once, tstate_key_make);
    PyThreadState *ts = pthread_getspecific(tstate_key);
    if (ts) {
        PyEval_RestoreThread(ts);
        return;
    }
    PyGILState_Ensure(); /* makes this thread's state; kept until the thread ends */
    pthread_setspecific(tstate_key, PyThreadState_Get());
}

static void gil_leave(void)
{
    PyEval_SaveThread();
}

/* GIL held: call ops.<name>(args...); a new reference, or NULL with the error
 * reported (unraisable: the funnel in fs.lowlevel catches everything, so this
 * is a bug) */
static PyObject *call_ops(Session *s, const char *name, const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *args = Py_VaBuildValue(format, va);
    va_end(va);
    if (!args) {
        PyErr_WriteUnraisable(s->ops);
        return NULL;
    }
    if (!PyTuple_Check(args)) {
        PyObject *one = PyTuple_Pack(1, args);
        Py_DECREF(args);
        if (!one) {
            PyErr_WriteUnraisable(s->ops);
            return NULL;
        }
        args = one;
    }
    PyObject *method = PyObject_GetAttrString(s->ops, name);
    PyObject *result = method ? PyObject_Call(method, args, NULL) : NULL;
    Py_XDECREF(method);
    Py_DECREF(args);
    __atomic_add_fetch(&s->python_calls, 1, __ATOMIC_RELAXED);
    if (!result)
        PyErr_WriteUnraisable(s->ops);
    return result;
}

/* GIL held: the errno of an answer that is a negative int, else 0 */
static int answer_errno(PyObject *result)
{
    if (!result)
        return EIO;
    if (PyLong_Check(result)) {
        long code = PyLong_AsLong(result);
        if (code < 0 && code > -4096)
            return (int)-code;
        if (code < 0 || PyErr_Occurred()) {
            PyErr_Clear();
            return EIO;
        }
    }
    return 0;
}

/* GIL held: `path` as a str in the filesystem encoding (surrogateescape); a
 * new reference, or NULL with the error reported */
static PyObject *py_fspath(Session *s, const char *path, size_t len)
{
    PyObject *p = PyUnicode_DecodeFSDefaultAndSize(path, (Py_ssize_t)len);
    if (!p)
        PyErr_WriteUnraisable(s->ops);
    return p;
}

/* GIL held: the handle `fh` Python gave back to it; the release's errno */
static int release_handle(Session *s, unsigned long long fh)
{
    PyObject *r = call_ops(s, "release", "(K)", fh);
    int err = answer_errno(r);
    Py_XDECREF(r);
    return err;
}

/* GIL held: ops.<method>(path) or ops.<method>(path, *arg), the path as a
 * str in the filesystem encoding (surrogateescape); the answer (a new
 * reference or NULL) and in *err its errno */
static PyObject *call_path(Session *s, const char *method, const char *path, size_t len,
                           const int *arg, int *err)
{
    PyObject *py_path = py_fspath(s, path, len);
    PyObject *r = !py_path ? NULL
                  : arg    ? call_ops(s, method, "(Oi)", py_path, *arg)
                           : call_ops(s, method, "(O)", py_path);
    Py_XDECREF(py_path);
    *err = answer_errno(r);
    return r;
}

struct attrs {
    mode_t mode;
    uint64_t size;
    int64_t mtime_ns;
    nlink_t nlink;
    uid_t uid;
    gid_t gid;
    struct blocks *desc; /* owned until node_set_attrs takes it; attrs_drop frees it */
};

static void attrs_drop(struct attrs *a)
{
    blocks_free(a->desc);
    a->desc = NULL;
}

/* GIL held: a stat tuple (mode, size, mtime_ns, nlink, uid, gid) from Python */
static int parse_attrs(PyObject *tuple, struct attrs *a)
{
    unsigned long mode, nlink, uid, gid;
    unsigned long long size;
    long long mtime;
    PyObject *desc = Py_None;
    a->desc = NULL;
    if (!PyTuple_Check(tuple) ||
        !PyArg_ParseTuple(tuple, "kKLkkk|O", &mode, &size, &mtime, &nlink, &uid, &gid, &desc)) {
        PyErr_Clear();
        return -EIO;
    }
    a->desc = blocks_from(desc);
    if (a->desc && (a->desc->count != 1 || a->desc->size != size))
        attrs_drop(a); /* natively opened: one-block files only */
    a->mode = (mode_t)mode;
    a->size = size;
    a->mtime_ns = mtime;
    a->nlink = (nlink_t)nlink;
    a->uid = (uid_t)uid;
    a->gid = (gid_t)gid;
    return 0;
}

/* ops.<method>(path) answering attributes, the GIL taken for the call; 0 or
 * an errno */
static int call_attrs(Session *s, const char *method, const char *path, size_t len,
                      struct attrs *a)
{
    int err;
    gil_enter();
    PyObject *r = call_path(s, method, path, len, NULL, &err);
    if (!err && parse_attrs(r, a) != 0)
        err = EIO;
    Py_XDECREF(r);
    gil_leave();
    return err;
}

/* write lock held; takes a->desc */
static void node_set_attrs(Session *s, struct node *n, struct attrs *a)
{
    if (!same_version(n->desc, a->desc))
        n->kernel_has = 0;
    blocks_free(n->desc);
    n->desc = a->desc;
    a->desc = NULL;
    n->mode = a->mode;
    n->size = a->size;
    n->mtime_ns = a->mtime_ns;
    n->nlink = a->nlink;
    n->uid = a->uid;
    n->gid = a->gid;
    n->has_attr = 1;
    n->expires = s->attr_ttl_ns == NEVER ? NEVER : now_ns() + s->attr_ttl_ns;
}

/* lock held: the node's attributes as a struct stat */
static void node_stat(fuse_ino_t ino, const struct node *n, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_mode = n->mode;
    st->st_nlink = n->nlink;
    st->st_size = (off_t)n->size;
    st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
    st->st_blksize = 4096;
    st->st_uid = n->uid;
    st->st_gid = n->gid;
    st->st_mtim.tv_sec = n->mtime_ns / 1000000000LL;
    st->st_mtim.tv_nsec = n->mtime_ns % 1000000000LL;
    st->st_atim = st->st_mtim;
    st->st_ctim = st->st_mtim;
}

static int node_fresh(const struct node *n)
{
    return n->has_attr && (n->expires == NEVER || now_ns() < n->expires);
}

/* the path of `ino`, or NULL (then ENOENT: no such inode; or ENOMEM) */
static char *ino_path(Session *s, fuse_ino_t ino, size_t *len, int *err)
{
    pthread_rwlock_rdlock(&s->table.lock);
    char *path = table_path(&s->table, ino, len, err);
    pthread_rwlock_unlock(&s->table.lock);
    return path;
}

/* the path of `ino`, or NULL with the request answered (ENOENT, ENOMEM) */
static char *path_or_reply(fuse_req_t req, Session *s, fuse_ino_t ino, size_t *len)
{
    int err = 0;
    char *path = ino_path(s, ino, len, &err);
    if (!path)
        fuse_reply_err(req, err);
    return path;
}

/* the path of `name` in `parent` */
static char *child_path(Session *s, fuse_ino_t parent, const char *name, size_t *len, int *err)
{
    size_t parent_len;
    char *dir = ino_path(s, parent, &parent_len, err);
    if (!dir)
        return NULL;
    size_t name_len = strlen(name);
    size_t sep = parent_len > 1 ? 1 : 0;
    char *path = malloc(parent_len + sep + name_len + 1);
    if (!path) {
        free(dir);
        *err = ENOMEM;
        return NULL;
    }
    size_t at = parent_len > 1 ? parent_len : 0;
    memcpy(path, dir, at);
    path[at] = '/';
    memcpy(path + at + 1, name, name_len + 1);
    *len = at + 1 + name_len;
    free(dir);
    return path;
}

/* the path of `name` in `parent`, or NULL with the request answered */
static char *child_or_reply(fuse_req_t req, Session *s, fuse_ino_t parent, const char *name,
                            size_t *len)
{
    int err = 0;
    char *path = child_path(s, parent, name, len, &err);
    if (!path)
        fuse_reply_err(req, err);
    return path;
}

static void fill_entry(Session *s, fuse_ino_t ino, const struct node *n, struct fuse_entry_param *e)
{
    memset(e, 0, sizeof(*e));
    e->ino = ino;
    e->attr_timeout = s->timeout;
    e->entry_timeout = s->timeout;
    node_stat(ino, n, &e->attr);
}

struct dirent_in {
    char *name;
    size_t name_len;
    struct attrs a;
    int has_attrs;
    off_t next;
};

static void entries_free(struct dirent_in *entries, ssize_t count)
{
    for (ssize_t i = 0; i < count; i++) {
        free(entries[i].name);
        attrs_drop(&entries[i].a);
    }
    free(entries);
}


/* GIL held: the entries Python gave, copied out of its objects; the count,
 * or a negative errno */
static ssize_t take_entries(PyObject *list, struct dirent_in **out)
{
    if (!PyList_Check(list))
        return -EIO;
    Py_ssize_t count = PyList_GET_SIZE(list);
    struct dirent_in *entries = calloc(count ? (size_t)count : 1, sizeof(*entries));
    if (!entries)
        return -ENOMEM;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        PyObject *name, *attrs;
        long long next;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OOL", &name, &attrs, &next) ||
            !PyBytes_Check(name)) {
            PyErr_Clear();
            goto fail;
        }
        struct dirent_in *d = &entries[i];
        d->name_len = (size_t)PyBytes_GET_SIZE(name);
        d->name = malloc(d->name_len + 1);
        if (!d->name)
            goto fail;
        memcpy(d->name, PyBytes_AS_STRING(name), d->name_len + 1);
        if (memchr(d->name, '\0', d->name_len) || memchr(d->name, '/', d->name_len))
            goto fail;
        d->has_attrs = parse_attrs(attrs, &d->a) == 0;
        d->next = (off_t)next;
    }
    *out = entries;
    return count;
fail:
    entries_free(entries, count);
    return -EIO;
}

static int is_dot(const char *name)
{
    return strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
}

/* write lock held: the entries of folder `parent` into the table (no kernel
 * reference taken: the kernel has not been told of them) */
static void table_add_entries(Session *s, fuse_ino_t parent, struct dirent_in *entries,
                              ssize_t count)
{
    for (ssize_t i = 0; i < count; i++) {
        struct dirent_in *d = &entries[i];
        if (!d->has_attrs || is_dot(d->name))
            continue;
        fuse_ino_t child = table_get_or_add(&s->table, parent, d->name, d->name_len);
        if (!child)
            return;
        node_set_attrs(s, s->table.nodes[child], &d->a);
    }
}

/* write lock held: `name` in `parent` with attributes `a` (taken), and one
 * more kernel reference: the kernel's entry in *e; 0 or ENOMEM */
static int table_enter(Session *s, fuse_ino_t parent, const char *name, struct attrs *a,
                       struct fuse_entry_param *e, fuse_ino_t *out)
{
    fuse_ino_t ino = table_get_or_add(&s->table, parent, name, strlen(name));
    if (!ino) {
        attrs_drop(a);
        return ENOMEM;
    }
    struct node *n = s->table.nodes[ino];
    node_set_attrs(s, n, a);
    fill_entry(s, ino, n, e);
    __atomic_add_fetch(&n->nlookup, 1, __ATOMIC_RELAXED);
    if (out)
        *out = ino;
    return 0;
}

/* `name` in `parent` into the table with attributes `a` (taken), and its
 * entry to the kernel */
static void reply_entered(fuse_req_t req, Session *s, fuse_ino_t parent, const char *name,
                          struct attrs *a)
{
    struct fuse_entry_param e;
    pthread_rwlock_wrlock(&s->table.lock);
    int err = table_enter(s, parent, name, a, &e, NULL);
    pthread_rwlock_unlock(&s->table.lock);
    if (err)
        fuse_reply_err(req, err);
    else
        fuse_reply_entry(req, &e);
}

/* -- the operations ------------------------------------------------------- */

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
    Session *s = userdata;
    conn->max_write = MAX_IO; /* libfuse derives max_pages (the read size) from it */
    conn->want &= ~FUSE_CAP_FLOCK_LOCKS;
    conn->want &= ~FUSE_CAP_POSIX_LOCKS;
    gil_enter();
    PyObject *r = call_ops(s, "init", "(IIIIIIII)", conn->proto_major, conn->proto_minor,
                           conn->max_readahead, conn->max_write, conn->max_read,
                           conn->capable, conn->want, s->max_threads);
    Py_XDECREF(r);
    gil_leave();
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    Session *s = fuse_req_userdata(req);
    struct fuse_entry_param e;
    size_t name_len = strlen(name);

    pthread_rwlock_rdlock(&s->table.lock);
    fuse_ino_t ino = table_find(&s->table, parent, name, name_len);
    if (ino && node_fresh(s->table.nodes[ino])) {
        struct node *n = s->table.nodes[ino];
        fill_entry(s, ino, n, &e);
        __atomic_add_fetch(&n->nlookup, 1, __ATOMIC_RELAXED);
        pthread_rwlock_unlock(&s->table.lock);
        __atomic_add_fetch(&s->native_lookups, 1, __ATOMIC_RELAXED);
        fuse_reply_entry(req, &e);
        return;
    }
    pthread_rwlock_unlock(&s->table.lock);

    int err = 0;
    size_t len;
    char *path = child_or_reply(req, s, parent, name, &len);
    if (!path)
        return;
    /* (attributes, the parent's other entries when its listing is newly
     * complete, or None): one lookup in a folder fills the table for all */
    struct attrs a = {0};
    struct dirent_in *siblings = NULL;
    ssize_t n_siblings = 0;
    gil_enter();
    PyObject *r = call_path(s, "lookup", path, len, NULL, &err);
    if (!err) {
        PyObject *attrs, *more;
        if (!PyTuple_Check(r) || !PyArg_ParseTuple(r, "OO", &attrs, &more) ||
            parse_attrs(attrs, &a) != 0) {
            PyErr_Clear();
            err = EIO;
        } else if (more != Py_None) {
            n_siblings = take_entries(more, &siblings);
            if (n_siblings < 0)
                n_siblings = 0;
        }
    }
    Py_XDECREF(r);
    gil_leave();
    free(path);
    if (n_siblings) {
        pthread_rwlock_wrlock(&s->table.lock);
        table_add_entries(s, parent, siblings, n_siblings);
        pthread_rwlock_unlock(&s->table.lock);
        entries_free(siblings, n_siblings);
    }
    if (err == ENOENT) {
        /* a negative entry the kernel keeps for the timeout */
        memset(&e, 0, sizeof(e));
        e.entry_timeout = s->timeout;
        fuse_reply_entry(req, &e);
        return;
    }
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    reply_entered(req, s, parent, name, &a);
}

static void forget_one(Session *s, fuse_ino_t ino, uint64_t nlookup)
{
    pthread_rwlock_rdlock(&s->table.lock);
    if (ino >= 1 && ino <= s->table.count)
        __atomic_sub_fetch(&s->table.nodes[ino]->nlookup, nlookup, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&s->table.lock);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    /* the node stays: an inode number names one path for the mount's life */
    forget_one(fuse_req_userdata(req), ino, nlookup);
    fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    Session *s = fuse_req_userdata(req);
    for (size_t i = 0; i < count; i++)
        forget_one(s, forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    struct stat st;
    (void)fi;
    pthread_rwlock_rdlock(&s->table.lock);
    if (ino >= 1 && ino <= s->table.count && node_fresh(s->table.nodes[ino])) {
        node_stat(ino, s->table.nodes[ino], &st);
        pthread_rwlock_unlock(&s->table.lock);
        __atomic_add_fetch(&s->native_getattrs, 1, __ATOMIC_RELAXED);
        fuse_reply_attr(req, &st, s->timeout);
        return;
    }
    pthread_rwlock_unlock(&s->table.lock);

    int err = 0;
    size_t len;
    char *path = path_or_reply(req, s, ino, &len);
    if (!path)
        return;
    struct attrs a = {0};
    err = call_attrs(s, "getattr", path, len, &a);
    free(path);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    pthread_rwlock_wrlock(&s->table.lock);
    struct node *n = s->table.nodes[ino];
    node_set_attrs(s, n, &a);
    node_stat(ino, n, &st);
    pthread_rwlock_unlock(&s->table.lock);
    fuse_reply_attr(req, &st, s->timeout);
}

static void open_file_free(struct open_file *of)
{
    blocks_free(of->blocks);
    pthread_mutex_destroy(&of->lock);
    free(of);
}

/* Python's open of `ino` into `of`: its handle, and the blocks when `of` has
 * none yet; 0 or an errno. A one-block file's cached blocks become its
 * node's, so its next opens are native. */
static int python_open(Session *s, struct open_file *of, fuse_ino_t ino, int *keep)
{
    int err = 0;
    size_t len;
    char *path = ino_path(s, ino, &len, &err);
    if (!path)
        return err;
    int changed = 0, opened = 0;
    unsigned long long fh = 0;
    struct attrs a = {0};
    struct blocks *blocks = NULL;
    gil_enter();
    PyObject *r = call_path(s, "open", path, len, &of->flags, &err);
    if (!err) {
        /* (fh, keep_cache, attrs of a changed version or None, cached blocks or None) */
        PyObject *attrs = NULL, *desc = NULL;
        if (!PyTuple_Check(r) || !PyArg_ParseTuple(r, "KpOO", &fh, keep, &attrs, &desc)) {
            PyErr_Clear();
            err = EIO;
        } else {
            opened = 1;
            blocks = blocks_from(desc);
            if (attrs != Py_None) {
                changed = 1;
                if (parse_attrs(attrs, &a) != 0)
                    err = EIO;
            }
        }
    }
    if (err && opened) /* opened, but the answer is unusable: give the handle back */
        release_handle(s, fh);
    Py_XDECREF(r);
    gil_leave();
    free(path);
    if (err) {
        blocks_free(blocks);
        attrs_drop(&a);
        return err;
    }
    pthread_rwlock_wrlock(&s->table.lock);
    struct node *n = s->table.nodes[ino];
    if (changed)
        node_set_attrs(s, n, &a);
    if (blocks && blocks->count == 1 && !same_version(n->desc, blocks)) {
        blocks_free(n->desc);
        n->desc = blocks_clone(blocks);
    }
    if (same_version(n->desc, blocks))
        n->kernel_has = 1; /* the kernel may cache pages of this version from now on */
    pthread_rwlock_unlock(&s->table.lock);
    if (changed) /* drop the kernel's attributes and pages: no read stops at the old size */
        fuse_lowlevel_notify_inval_inode(s->se, ino, 0, 0);
    of->py_fh = fh;
    of->blocks = blocks;
    return 0;
}

/* A natively opened file needs Python (a block not on disk): a Python handle
 * pinned to exactly the version the native open served; 0 or an errno. */
static int python_handle(Session *s, struct open_file *of)
{
    int err = 0;
    if (!of->blocks) /* opened by Python: it has a handle (ids start at 1) */
        return EBADF;
    pthread_mutex_lock(&of->lock);
    if (!of->py_fh) {
        size_t len;
        char *path = ino_path(s, of->ino, &len, &err);
        if (path) {
            struct blocks *b = of->blocks;
            gil_enter();
            PyObject *py_path = py_fspath(s, path, len);
            PyObject *r = py_path ? call_ops(s, "open_version", "(Oy#y#y#K)", py_path, b->ident,
                                             (Py_ssize_t)b->n_store, b->ident + b->n_store,
                                             (Py_ssize_t)b->n_key,
                                             b->ident + b->n_store + b->n_key,
                                             (Py_ssize_t)b->n_etag, (unsigned long long)b->size)
                                  : NULL;
            err = answer_errno(r);
            if (!err) {
                of->py_fh = PyLong_AsUnsignedLongLong(r);
                if (PyErr_Occurred()) {
                    PyErr_Clear();
                    of->py_fh = 0;
                    err = EIO;
                }
            }
            Py_XDECREF(r);
            Py_XDECREF(py_path);
            gil_leave();
            free(path);
        }
    }
    pthread_mutex_unlock(&of->lock);
    return err;
}

/* one more open handle of `ino` (rw_mount: an unlinked open file is hidden) */
static void node_opened(Session *s, fuse_ino_t ino)
{
    if (!s->writable)
        return;
    pthread_rwlock_rdlock(&s->table.lock);
    if (ino >= 1 && ino <= s->table.count)
        __atomic_add_fetch(&s->table.nodes[ino]->open_count, 1, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&s->table.lock);
}

/* The end of an open file: Python's handle released, and, when it was the
 * last handle of a hidden file (unlinked while open), the hidden name
 * unlinked; the errno of the release. */
static int close_file(Session *s, struct open_file *of)
{
    int err = 0;
    if (of->py_fh) {
        gil_enter();
        err = release_handle(s, of->py_fh);
        gil_leave();
    }
    fuse_ino_t ino = of->ino;
    open_file_free(of);
    if (!s->writable) /* nothing is unlinked on a read-only mount: no open counts */
        return err;
    pthread_rwlock_rdlock(&s->table.lock);
    int last_hidden = 0;
    if (ino >= 1 && ino <= s->table.count) {
        struct node *n = s->table.nodes[ino];
        last_hidden = __atomic_sub_fetch(&n->open_count, 1, __ATOMIC_RELAXED) == 0 && n->hidden;
    }
    pthread_rwlock_unlock(&s->table.lock);
    if (!last_hidden)
        return err;
    pthread_mutex_lock(&s->names); /* (an open by number may have come in between) */
    pthread_rwlock_rdlock(&s->table.lock);
    struct node *n = s->table.nodes[ino];
    last_hidden = n->hidden && __atomic_load_n(&n->open_count, __ATOMIC_RELAXED) == 0;
    pthread_rwlock_unlock(&s->table.lock);
    if (last_hidden) {
        int gone = 0;
        size_t len;
        char *path = ino_path(s, ino, &len, &gone);
        if (path) {
            gil_enter();
            Py_XDECREF(call_path(s, "unlink", path, len, NULL, &gone));
            gil_leave();
            free(path);
        }
        pthread_rwlock_wrlock(&s->table.lock);
        s->table.nodes[ino]->hidden = 0;
        table_detach(&s->table, ino);
        pthread_rwlock_unlock(&s->table.lock);
    }
    pthread_mutex_unlock(&s->names);
    return err;
}

/* a native open of a prefetched file, for Session.take_opens */
static void opens_push(Session *s, fuse_ino_t ino)
{
    pthread_mutex_lock(&s->opens_lock);
    if (s->n_opens == OPENS_MAX) { /* nobody took them: drop the oldest */
        memmove(s->opens, s->opens + 1, (OPENS_MAX - 1) * sizeof(*s->opens));
        s->n_opens--;
    }
    s->opens[s->n_opens++] = ino;
    int wake = s->n_opens == 1;
    pthread_mutex_unlock(&s->opens_lock);
    if (wake) {
        uint64_t one = 1;
        if (write(s->opens_fd, &one, sizeof(one)) < 0) { /* (an eventfd does not fail here) */
        }
    }
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    struct open_file *of = calloc(1, sizeof(*of));
    if (!of) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    pthread_mutex_init(&of->lock, NULL);
    of->ino = ino;
    of->flags = fi->flags;
    int keep = 0, report = 0;

    /* a one-block file whose block is on disk, attributes fresh: no Python */
    pthread_rwlock_rdlock(&s->table.lock);
    if (ino >= 1 && ino <= s->table.count) {
        struct node *n = s->table.nodes[ino];
        if (S_ISREG(n->mode) && n->desc && node_fresh(n) &&
            (fi->flags & O_ACCMODE) == O_RDONLY && (of->blocks = blocks_clone(n->desc))) {
            keep = __atomic_exchange_n(&n->kernel_has, 1, __ATOMIC_RELAXED);
            report = __atomic_exchange_n(&n->ahead, 0, __ATOMIC_RELAXED);
            __atomic_add_fetch(&s->native_opens, 1, __ATOMIC_RELAXED);
        }
    }
    pthread_rwlock_unlock(&s->table.lock);
    if (report)
        opens_push(s, ino);
    if (!of->blocks) {
        int err = python_open(s, of, ino, &keep);
        if (err) {
            open_file_free(of);
            fuse_reply_err(req, err);
            return;
        }
    }
    node_opened(s, ino);
    fi->fh = (uint64_t)(uintptr_t)of;
    fi->keep_cache = keep ? 1 : 0;
    fi->direct_io = 0;
    if (fuse_reply_open(req, fi) == -ENOENT)
        close_file(s, of); /* the opener was interrupted: no release will come */
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    struct open_file *of = (struct open_file *)(uintptr_t)fi->fh;
    (void)ino;
    if (size > MAX_IO)
        size = MAX_IO;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    if (of->blocks && off >= 0) {
        ssize_t n = blocks_read(of->blocks, buf, size, (uint64_t)off);
        if (n >= 0) {
            __atomic_add_fetch(&s->native_reads, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&s->native_read_bytes, (uint64_t)n, __ATOMIC_RELAXED);
            fuse_reply_buf(req, buf, (size_t)n);
            free(buf);
            return;
        }
    }
    int err = of->py_fh ? 0 : python_handle(s, of);
    if (err) {
        free(buf);
        fuse_reply_err(req, err);
        return;
    }
    long long got = -EIO;
    gil_enter();
    PyObject *view = PyMemoryView_FromMemory(buf, (Py_ssize_t)size, PyBUF_WRITE);
    PyObject *r = view ? call_ops(s, "read_into", "(KLO)", of->py_fh, (long long)off, view)
                       : NULL;
    if (!view)
        PyErr_WriteUnraisable(s->ops);
    if (r && PyLong_Check(r)) {
        got = PyLong_AsLongLong(r);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            got = -EIO;
        }
    }
    int keep_buf = 0;
    if (view) { /* the buffer is ours again: no view of it may outlive the call */
        PyObject *released = PyObject_CallMethod(view, "release", NULL);
        if (released) {
            Py_DECREF(released);
        } else { /* still exported (a bug of the Python side): leak, never free it */
            PyErr_WriteUnraisable(s->ops);
            keep_buf = 1;
        }
    }
    Py_XDECREF(view);
    Py_XDECREF(r);
    gil_leave();
    if (got < 0)
        fuse_reply_err(req, got > -4096 ? (int)-got : EIO);
    else if ((unsigned long long)got > size)
        fuse_reply_err(req, EIO); /* more than the buffer holds: a bug, never sent */
    else
        fuse_reply_buf(req, buf, (size_t)got);
    if (!keep_buf)
        free(buf);
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    fuse_reply_err(req, close_file(fuse_req_userdata(req), (struct open_file *)(uintptr_t)fi->fh));
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = path_or_reply(req, s, ino, &len);
    if (!path)
        return;
    unsigned long long dh = 0;
    gil_enter();
    PyObject *r = call_path(s, "opendir", path, len, NULL, &err);
    if (!err) {
        dh = PyLong_AsUnsignedLongLong(r);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            err = EIO;
        }
    }
    Py_XDECREF(r);
    gil_leave();
    free(path);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    fi->fh = dh;
    if (s->attr_ttl_ns == NEVER) {
        /* listings never expire (the namespace keeps them as long): the kernel
         * may keep the entries and serve the next listing of this folder itself */
        fi->cache_readdir = 1;
        fi->keep_cache = 1;
    }
    if (fuse_reply_open(req, fi) == -ENOENT) {
        gil_enter();
        Py_XDECREF(call_ops(s, "releasedir", "(K)", dh));
        gil_leave();
    }
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi, int plus)
{
    Session *s = fuse_req_userdata(req);
    struct dirent_in *entries = NULL;
    ssize_t count;
    gil_enter();
    PyObject *r = call_ops(s, "readdir", "(KLni)", (unsigned long long)fi->fh, (long long)off,
                           (Py_ssize_t)size, plus);
    int err = answer_errno(r);
    count = err ? -err : take_entries(r, &entries);
    Py_XDECREF(r);
    gil_leave();
    if (count < 0) {
        fuse_reply_err(req, (int)-count);
        return;
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        goto done;
    }
    size_t used = 0;
    pthread_rwlock_wrlock(&s->table.lock);
    for (ssize_t i = 0; i < count; i++) {
        struct dirent_in *d = &entries[i];
        struct fuse_entry_param e;
        struct node *n = NULL;
        fuse_ino_t child = 0;
        memset(&e, 0, sizeof(e));
        if (is_dot(d->name)) {
            e.attr.st_ino = ino; /* the kernel takes no reference on '.' and '..' */
            e.attr.st_mode = S_IFDIR;
        } else {
            child = table_get_or_add(&s->table, ino, d->name, d->name_len);
            if (!child)
                break;
            n = s->table.nodes[child];
            if (d->has_attrs)
                node_set_attrs(s, n, &d->a);
            if (n->has_attr)
                fill_entry(s, child, n, &e);
            else {
                e.attr.st_ino = child;
                e.attr.st_mode = d->a.mode;
            }
        }
        size_t need;
        if (plus) {
            if (!n || !n->has_attr)
                e.ino = 0; /* no entry for the kernel: it looks the name up itself */
            need = fuse_add_direntry_plus(req, buf + used, size - used, d->name, &e, d->next);
        } else {
            need = fuse_add_direntry(req, buf + used, size - used, d->name, &e.attr, d->next);
        }
        if (need > size - used)
            break; /* full: the kernel asks again from this entry's offset */
        used += need;
        if (plus && e.ino)
            __atomic_add_fetch(&n->nlookup, 1, __ATOMIC_RELAXED);
    }
    pthread_rwlock_unlock(&s->table.lock);
    fuse_reply_buf(req, buf, used);
    free(buf);
done:
    entries_free(entries, count);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    readdir_common(req, ino, size, off, fi, 0);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi)
{
    readdir_common(req, ino, size, off, fi, 1);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    (void)ino;
    gil_enter();
    PyObject *r = call_ops(s, "releasedir", "(K)", (unsigned long long)fi->fh);
    int err = answer_errno(r);
    Py_XDECREF(r);
    gil_leave();
    fuse_reply_err(req, err);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
    Session *s = fuse_req_userdata(req);
    struct statvfs sv;
    unsigned long bsize, frsize, namemax;
    unsigned long long blocks, bfree, bavail, files, ffree;
    (void)ino;
    memset(&sv, 0, sizeof(sv));
    gil_enter();
    PyObject *r = call_ops(s, "statfs", "()");
    int err = answer_errno(r);
    if (!err && (!PyTuple_Check(r) ||
                 !PyArg_ParseTuple(r, "kkKKKKKk", &bsize, &frsize, &blocks, &bfree, &bavail,
                                   &files, &ffree, &namemax))) {
        PyErr_Clear();
        err = EIO;
    }
    Py_XDECREF(r);
    gil_leave();
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    sv.f_bsize = bsize;
    sv.f_frsize = frsize;
    sv.f_blocks = blocks;
    sv.f_bfree = bfree;
    sv.f_bavail = bavail;
    sv.f_files = files;
    sv.f_ffree = ffree;
    sv.f_namemax = namemax;
    fuse_reply_statfs(req, &sv);
}

static void ll_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = path_or_reply(req, s, ino, &len);
    if (!path)
        return;
    gil_enter();
    Py_XDECREF(call_path(s, "access", path, len, &mask, &err));
    gil_leave();
    free(path);
    fuse_reply_err(req, err);
}

/* -- names and writes (rw_mount; on a read-only mount the kernel refuses
 * writes itself, and Python answers EROFS to the rest) --------------------- */

/* ops.<method>(path of `name` in `parent`, arg) making that name: the kernel
 * gets its entry (mkdir, mknod; link and symlink, which Python refuses) */
static void new_entry(fuse_req_t req, fuse_ino_t parent, const char *name, const char *method,
                      unsigned arg)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = child_or_reply(req, s, parent, name, &len);
    if (!path)
        return;
    struct attrs a = {0};
    gil_enter();
    PyObject *p = py_fspath(s, path, len);
    PyObject *r = p ? call_ops(s, method, "(OI)", p, arg) : NULL;
    err = answer_errno(r);
    if (!err && parse_attrs(r, &a) != 0)
        err = EIO;
    Py_XDECREF(r);
    Py_XDECREF(p);
    gil_leave();
    free(path);
    if (err)
        fuse_reply_err(req, err);
    else
        reply_entered(req, s, parent, name, &a);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    new_entry(req, parent, name, "mkdir", (unsigned)mode);
}

static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                     dev_t rdev)
{
    (void)rdev;
    new_entry(req, parent, name, "mknod", (unsigned)mode);
}

static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    (void)link;
    new_entry(req, parent, name, "symlink", 0);
}

static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    (void)ino;
    new_entry(req, newparent, newname, "link", 0);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    fuse_reply_err(req, EINVAL); /* a blob namespace has no symbolic links */
}

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = child_path(s, parent, name, &len, &err);
    struct open_file *of = path ? calloc(1, sizeof(*of)) : NULL;
    if (!of) {
        free(path);
        fuse_reply_err(req, path ? ENOMEM : err);
        return;
    }
    pthread_mutex_init(&of->lock, NULL);
    of->flags = fi->flags;
    struct attrs a = {0};
    unsigned long long fh = 0;
    int opened = 0;
    gil_enter();
    PyObject *p = py_fspath(s, path, len);
    PyObject *r = p ? call_ops(s, "create", "(OIi)", p, (unsigned)mode, fi->flags) : NULL;
    err = answer_errno(r);
    if (!err) {
        /* (fh, the new file's attributes) */
        PyObject *attrs;
        if (!PyTuple_Check(r) || !PyArg_ParseTuple(r, "KO", &fh, &attrs)) {
            PyErr_Clear();
            err = EIO;
        } else {
            opened = 1;
            if (parse_attrs(attrs, &a) != 0)
                err = EIO;
        }
    }
    if (err && opened) /* made, but the answer is unusable: give the handle back */
        release_handle(s, fh);
    Py_XDECREF(r);
    Py_XDECREF(p);
    gil_leave();
    free(path);
    struct fuse_entry_param e;
    if (!err) {
        pthread_rwlock_wrlock(&s->table.lock);
        err = table_enter(s, parent, name, &a, &e, &of->ino);
        pthread_rwlock_unlock(&s->table.lock);
        if (err) { /* no node: give the handle back */
            gil_enter();
            release_handle(s, fh);
            gil_leave();
        }
    }
    if (err) {
        attrs_drop(&a);
        open_file_free(of);
        fuse_reply_err(req, err);
        return;
    }
    of->py_fh = fh;
    node_opened(s, of->ino);
    fi->fh = (uint64_t)(uintptr_t)of;
    fi->keep_cache = 0;
    fi->direct_io = 0;
    if (fuse_reply_create(req, &e, fi) == -ENOENT) { /* interrupted: no release, no forget */
        forget_one(s, of->ino, 1);
        close_file(s, of);
    }
}

static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    struct open_file *of = (struct open_file *)(uintptr_t)fi->fh;
    (void)ino;
    int err = of->py_fh ? 0 : python_handle(s, of);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    long long done = -EIO;
    gil_enter();
    PyObject *r = call_ops(s, "write", "(Ky#L)", of->py_fh, buf, (Py_ssize_t)size,
                           (long long)off);
    if (r && PyLong_Check(r)) {
        done = PyLong_AsLongLong(r);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            done = -EIO;
        }
    }
    Py_XDECREF(r);
    gil_leave();
    if (done < 0)
        fuse_reply_err(req, done > -4096 ? (int)-done : EIO);
    else if ((unsigned long long)done > size)
        fuse_reply_err(req, EIO); /* more than was written: a bug, never told */
    else
        fuse_reply_write(req, (size_t)done);
}

/* ops.<method>(fh) of an open file with a Python handle (else nothing to do) */
static void handle_call(fuse_req_t req, struct fuse_file_info *fi, const char *method)
{
    Session *s = fuse_req_userdata(req);
    struct open_file *of = (struct open_file *)(uintptr_t)fi->fh;
    int err = 0;
    if (of->py_fh) {
        gil_enter();
        PyObject *r = call_ops(s, method, "(K)", of->py_fh);
        err = answer_errno(r);
        Py_XDECREF(r);
        gil_leave();
    }
    fuse_reply_err(req, err);
}

static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    handle_call(req, fi, "flush");
}

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    (void)datasync;
    handle_call(req, fi, "fsync");
}

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    size_t len;
    char *path = path_or_reply(req, s, ino, &len);
    if (!path)
        return;
    struct open_file *of = fi ? (struct open_file *)(uintptr_t)fi->fh : NULL;
    struct attrs a = {0};
    gil_enter();
    PyObject *p = py_fspath(s, path, len);
    /* (path, fh or 0, which of FUSE_SET_ATTR_*, mode, uid, gid, size): the attributes after */
    PyObject *r = p ? call_ops(s, "setattr", "(OKiIIIL)", p, of ? of->py_fh : 0ULL, to_set,
                               (unsigned)attr->st_mode, (unsigned)attr->st_uid,
                               (unsigned)attr->st_gid, (long long)attr->st_size)
                    : NULL;
    int err = answer_errno(r);
    if (!err && parse_attrs(r, &a) != 0)
        err = EIO;
    Py_XDECREF(r);
    Py_XDECREF(p);
    gil_leave();
    free(path);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    struct stat st;
    pthread_rwlock_wrlock(&s->table.lock);
    struct node *n = s->table.nodes[ino];
    node_set_attrs(s, n, &a);
    node_stat(ino, n, &st);
    pthread_rwlock_unlock(&s->table.lock);
    fuse_reply_attr(req, &st, s->timeout);
}

/* the node of `name` in `parent` when it has open handles, else 0 */
static fuse_ino_t open_node(Session *s, fuse_ino_t parent, const char *name)
{
    pthread_rwlock_rdlock(&s->table.lock);
    fuse_ino_t ino = table_find(&s->table, parent, name, strlen(name));
    if (ino && __atomic_load_n(&s->table.nodes[ino]->open_count, __ATOMIC_RELAXED) <= 0)
        ino = 0;
    pthread_rwlock_unlock(&s->table.lock);
    return ino;
}

/* `names` held: the open file `ino` at `path` (in `parent`) takes a hidden
 * name in the same folder, as libfuse's high-level API does (no hard_remove):
 * Python takes the rename to it as the unlink it is (fs.kept), and the open
 * handles keep a path until the last release unlinks it; 0 or an errno */
static int hide(Session *s, fuse_ino_t parent, fuse_ino_t ino, const char *path, size_t len)
{
    char name[64];
    int n_name = snprintf(name, sizeof(name), ".fuse_hidden%08llx%08x", (unsigned long long)ino,
                          ++s->hidden_seq);
    const char *slash = memrchr(path, '/', len);
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    char *hidden = malloc(dir_len + (size_t)n_name + 1);
    if (!hidden)
        return ENOMEM;
    memcpy(hidden, path, dir_len);
    memcpy(hidden + dir_len, name, (size_t)n_name + 1);
    int err;
    gil_enter();
    PyObject *old = py_fspath(s, path, len);
    PyObject *new = old ? py_fspath(s, hidden, dir_len + (size_t)n_name) : NULL;
    PyObject *r = new ? call_ops(s, "rename", "(OO)", old, new) : NULL;
    err = answer_errno(r);
    Py_XDECREF(r);
    Py_XDECREF(new);
    Py_XDECREF(old);
    gil_leave();
    free(hidden);
    if (!err) {
        pthread_rwlock_wrlock(&s->table.lock);
        err = -table_move(&s->table, ino, parent, name, (size_t)n_name);
        s->table.nodes[ino]->hidden = 1;
        pthread_rwlock_unlock(&s->table.lock);
    }
    return err;
}

/* unlink or rmdir (`method`) of `name` in `parent`; an open file takes a
 * hidden name instead (folders are never open: opendir does not count) */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, const char *method)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = child_or_reply(req, s, parent, name, &len);
    if (!path)
        return;
    pthread_mutex_lock(&s->names);
    fuse_ino_t open = open_node(s, parent, name);
    if (open) {
        err = hide(s, parent, open, path, len);
    } else {
        gil_enter();
        Py_XDECREF(call_path(s, method, path, len, NULL, &err));
        gil_leave();
        if (!err) {
            pthread_rwlock_wrlock(&s->table.lock);
            table_detach(&s->table, table_find(&s->table, parent, name, strlen(name)));
            pthread_rwlock_unlock(&s->table.lock);
        }
    }
    pthread_mutex_unlock(&s->names);
    free(path);
    fuse_reply_err(req, err);
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_name(req, parent, name, "unlink");
}

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_name(req, parent, name, "rmdir");
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    Session *s = fuse_req_userdata(req);
    if (flags) { /* RENAME_NOREPLACE, RENAME_EXCHANGE: not over copy + delete */
        fuse_reply_err(req, EINVAL);
        return;
    }
    int err = 0;
    size_t old_len, new_len;
    char *old = child_path(s, parent, name, &old_len, &err);
    char *new = old ? child_path(s, newparent, newname, &new_len, &err) : NULL;
    if (!new) {
        free(old);
        fuse_reply_err(req, err);
        return;
    }
    pthread_mutex_lock(&s->names);
    fuse_ino_t target = open_node(s, newparent, newname);
    if (target) /* an open file renamed over: hidden first, as an unlink */
        err = hide(s, newparent, target, new, new_len);
    if (!err) {
        gil_enter();
        PyObject *o = py_fspath(s, old, old_len);
        PyObject *n = o ? py_fspath(s, new, new_len) : NULL;
        PyObject *r = n ? call_ops(s, "rename", "(OO)", o, n) : NULL;
        err = answer_errno(r);
        Py_XDECREF(r);
        Py_XDECREF(n);
        Py_XDECREF(o);
        gil_leave();
    }
    if (!err) {
        pthread_rwlock_wrlock(&s->table.lock);
        fuse_ino_t source = table_find(&s->table, parent, name, strlen(name));
        if (source)
            err = -table_move(&s->table, source, newparent, newname, strlen(newname));
        else
            table_detach(&s->table, table_find(&s->table, newparent, newname, strlen(newname)));
        pthread_rwlock_unlock(&s->table.lock);
    }
    pthread_mutex_unlock(&s->names);
    free(old);
    free(new);
    fuse_reply_err(req, err);
}

/* ops.<method>(path) of `ino`, answering only an errno */
static void path_call(fuse_req_t req, fuse_ino_t ino, const char *method)
{
    Session *s = fuse_req_userdata(req);
    int err = 0;
    size_t len;
    char *path = path_or_reply(req, s, ino, &len);
    if (!path)
        return;
    gil_enter();
    Py_XDECREF(call_path(s, method, path, len, NULL, &err));
    gil_leave();
    free(path);
    fuse_reply_err(req, err);
}

static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
    (void)name;
    (void)value;
    (void)size;
    (void)flags;
    path_call(req, ino, "setxattr");
}

static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    (void)name;
    path_call(req, ino, "removexattr");
}

static void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                         struct fuse_file_info *fi)
{
    (void)mode;
    (void)offset;
    (void)length;
    (void)fi;
    path_call(req, ino, "fallocate");
}

static const struct fuse_lowlevel_ops ll_ops = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .open = ll_open,
    .read = ll_read,
    .release = ll_release,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .releasedir = ll_releasedir,
    .statfs = ll_statfs,
    .access = ll_access,
    .setattr = ll_setattr,
    .readlink = ll_readlink,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_rmdir,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .create = ll_create,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
    .fallocate = ll_fallocate,
    /* getxattr, listxattr, and flush on a read-only mount: left out, libfuse
     * answers ENOSYS once and the kernel stops asking (the two xattr probes
     * `ls -l` makes per file never come here) */
};


/* -- the Python type ------------------------------------------------------ */

static int Session_init(Session *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"ops", "mountpoint", "options", "timeout", "attr_ttl",
                             "max_threads", "writable", NULL};
    PyObject *ops;
    const char *mountpoint, *options;
    double timeout, attr_ttl;
    unsigned int max_threads;
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OssddI|p", kwlist, &ops, &mountpoint, &options,
                                     &timeout, &attr_ttl, &max_threads, &writable))
        return -1;
    if (self->se) {
        PyErr_SetString(PyExc_RuntimeError, "the session is already set up");
        return -1;
    }
    if (max_threads < 1 || max_threads > 1024 || timeout < 0 || attr_ttl < 0) {
        PyErr_SetString(PyExc_ValueError, "max_threads 1-1024, timeouts >= 0");
        return -1;
    }
    if (table_init(&self->table) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->opens_fd < 0) {
        self->opens_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (self->opens_fd < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        pthread_mutex_init(&self->opens_lock, NULL);
    }
    Py_INCREF(ops);
    self->ops = ops;
    self->timeout = timeout;
    /* rw_mount: every lookup and getattr asks Python (writes change sizes and
     * names behind the table) */
    self->attr_ttl_ns = writable ? 0 : attr_ttl >= 9.0e9 ? NEVER : (int64_t)(attr_ttl * 1e9);
    self->max_threads = max_threads;
    self->writable = writable;
    pthread_mutex_init(&self->names, NULL);

    char *argv[] = {"datamount", "-o", (char *)options, NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(3, argv);
    struct fuse_lowlevel_ops table = ll_ops; /* (libfuse keeps a copy) */
    if (writable) { /* and what comes with writes: FLUSH at every close(2) */
        table.write = ll_write;
        table.flush = ll_flush;
        table.fsync = ll_fsync;
    }
    self->se = fuse_session_new(&fargs, &table, sizeof(table), self);
    fuse_opt_free_args(&fargs);
    if (!self->se) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse refused the mount options");
        return -1;
    }
    if (fuse_session_mount(self->se, mountpoint) != 0) {
        fuse_session_destroy(self->se);
        self->se = NULL;
        PyErr_Format(PyExc_RuntimeError, "libfuse could not mount %s", mountpoint);
        return -1;
    }
    self->mounted = 1;
    return 0;
}

static PyObject *Session_loop(Session *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->se || !self->mounted) {
        PyErr_SetString(PyExc_RuntimeError, "not mounted");
        return NULL;
    }
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg)
        return PyErr_NoMemory();
    fuse_loop_cfg_set_max_threads(cfg, self->max_threads);
    fuse_loop_cfg_set_idle_threads(cfg, self->max_threads); /* workers kept for the mount's life */
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    int status;
    self->loop_thread = pthread_self();
    __atomic_store_n(&self->looping, 1, __ATOMIC_RELEASE);
    Py_BEGIN_ALLOW_THREADS
    status = fuse_session_loop_mt(self->se, cfg);
    Py_END_ALLOW_THREADS
    __atomic_store_n(&self->looping, 0, __ATOMIC_RELEASE);
    fuse_loop_cfg_destroy(cfg);
    fuse_session_unmount(self->se);
    self->mounted = 0;
    return PyLong_FromLong(status);
}

static PyObject *Session_exit(Session *self, PyObject *Py_UNUSED(ignored))
{
    /* end the loop from outside a request: flag the session, then interrupt
     * the loop thread's wait with a signal (SIGUSR1, which Python handles) */
    if (self->se) {
        fuse_session_exit(self->se);
        if (__atomic_load_n(&self->looping, __ATOMIC_ACQUIRE))
            pthread_kill(self->loop_thread, SIGUSR1);
    }
    if (self->opens_fd >= 0) { /* take_opens answers None from now on */
        pthread_mutex_lock(&self->opens_lock);
        self->opens_closed = 1;
        pthread_mutex_unlock(&self->opens_lock);
        uint64_t one = 1;
        if (write(self->opens_fd, &one, sizeof(one)) < 0) { /* (an eventfd does not fail here) */
        }
    }
    Py_RETURN_NONE;
}

/* lock held (either way): the node of a path ('/a/b'), 0 when the table has none */
static fuse_ino_t table_walk(struct table *t, const char *path, size_t len)
{
    fuse_ino_t ino = t->nodes ? FUSE_ROOT_ID : 0;
    for (size_t at = 0; ino && at < len;) {
        while (at < len && path[at] == '/')
            at++;
        size_t end = at;
        while (end < len && path[end] != '/')
            end++;
        if (end > at)
            ino = table_find(t, ino, path + at, end - at);
        at = end;
    }
    return ino;
}

static PyObject *Session_cached(Session *self, PyObject *args)
{
    /* the file-ahead prefetch put a one-block file's block in the disk tier:
     * its next open is native (and reported to take_opens) when the table
     * holds that file with fresh attributes of the same size */
    char *path;
    Py_ssize_t len;
    PyObject *desc;
    if (!PyArg_ParseTuple(args, "y#O", &path, &len, &desc))
        return NULL;
    if (self->writable)
        Py_RETURN_FALSE;
    struct blocks *b = blocks_from(desc);
    if (!b || b->count != 1) {
        blocks_free(b);
        Py_RETURN_FALSE;
    }
    int taken = 0;
    pthread_rwlock_wrlock(&self->table.lock);
    fuse_ino_t ino = table_walk(&self->table, path, (size_t)len);
    struct node *n = ino ? self->table.nodes[ino] : NULL;
    if (n && S_ISREG(n->mode) && node_fresh(n) && n->size == b->size && !n->desc) {
        n->desc = b;
        n->ahead = 1;
        taken = 1;
        self->native_prefetched++; /* (the table's write lock held) */
    }
    pthread_rwlock_unlock(&self->table.lock);
    if (!taken)
        blocks_free(b);
    return PyBool_FromLong(taken);
}

static PyObject *Session_take_opens(Session *self, PyObject *arg)
{
    /* the paths (bytes) natively opened since the last call, oldest first,
     * waiting up to `arg` seconds for one (GIL released); [] on timeout,
     * None once exit() was called */
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->opens_fd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "not set up");
        return NULL;
    }
    int ms = timeout <= 0 ? 0 : timeout > 3600 ? 3600000 : (int)(timeout * 1000);
    size_t n = 0;
    int closed;
    char **paths = NULL;
    size_t *lens = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->opens_lock);
    if (self->opens_closed || self->n_opens) /* no wait: answer now */
        ms = 0;
    pthread_mutex_unlock(&self->opens_lock);
    struct pollfd pfd = {.fd = self->opens_fd, .events = POLLIN};
    if (poll(&pfd, 1, ms) > 0) {
        uint64_t count;
        if (read(self->opens_fd, &count, sizeof(count)) < 0) { /* (EAGAIN: taken already) */
        }
    }
    fuse_ino_t inos[OPENS_MAX];
    pthread_mutex_lock(&self->opens_lock);
    closed = self->opens_closed;
    n = self->n_opens;
    memcpy(inos, self->opens, n * sizeof(*inos));
    self->n_opens = 0;
    pthread_mutex_unlock(&self->opens_lock);
    if (n) {
        paths = calloc(n, sizeof(*paths));
        lens = calloc(n, sizeof(*lens));
        if (!paths || !lens) /* out of memory: these opens are lost (only look-ahead) */
            n = 0;
    }
    pthread_rwlock_rdlock(&self->table.lock);
    for (size_t i = 0; i < n; i++) {
        int err = 0;
        paths[i] = table_path(&self->table, inos[i], &lens[i], &err);
    }
    pthread_rwlock_unlock(&self->table.lock);
    Py_END_ALLOW_THREADS
    PyObject *out = closed && n == 0 ? Py_NewRef(Py_None) : PyList_New(0);
    for (size_t i = 0; i < n; i++) {
        if (out && out != Py_None && paths[i]) {
            PyObject *p = PyBytes_FromStringAndSize(paths[i], (Py_ssize_t)lens[i]);
            if (!p || PyList_Append(out, p) < 0)
                Py_CLEAR(out);
            Py_XDECREF(p);
        }
        free(paths[i]);
    }
    free(paths);
    free(lens);
    return out;
}

static PyObject *Session_forget(Session *self, PyObject *arg)
{
    /* the version of `path` changed in storage: drop its attributes and
     * cached blocks, so its next lookup and open ask Python */
    char *path;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &path, &len) < 0)
        return NULL;
    pthread_rwlock_wrlock(&self->table.lock);
    fuse_ino_t ino = table_walk(&self->table, path, (size_t)len);
    if (ino) {
        struct node *n = self->table.nodes[ino];
        n->has_attr = 0;
        n->kernel_has = 0;
        blocks_free(n->desc);
        n->desc = NULL;
    }
    pthread_rwlock_unlock(&self->table.lock);
    Py_RETURN_NONE;
}

static PyObject *Session_counters(Session *self, PyObject *Py_UNUSED(ignored))
{
    pthread_rwlock_rdlock(&self->table.lock);
    unsigned long long nodes = self->table.count;
    unsigned long long prefetched = self->native_prefetched;
    pthread_rwlock_unlock(&self->table.lock);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsK}", "native_opens",
        (unsigned long long)__atomic_load_n(&self->native_opens, __ATOMIC_RELAXED),
        "native_lookups",
        (unsigned long long)__atomic_load_n(&self->native_lookups, __ATOMIC_RELAXED),
        "native_getattrs",
        (unsigned long long)__atomic_load_n(&self->native_getattrs, __ATOMIC_RELAXED),
        "native_reads",
        (unsigned long long)__atomic_load_n(&self->native_reads, __ATOMIC_RELAXED),
        "native_read_bytes",
        (unsigned long long)__atomic_load_n(&self->native_read_bytes, __ATOMIC_RELAXED),
        "python_calls",
        (unsigned long long)__atomic_load_n(&self->python_calls, __ATOMIC_RELAXED),
        "native_prefetched", (unsigned long long)prefetched, "inodes", nodes);
}

static void Session_dealloc(Session *self)
{
    if (self->se) {
        if (self->mounted)
            fuse_session_unmount(self->se);
        fuse_session_destroy(self->se);
        self->se = NULL;
    }
    table_free(&self->table);
    if (self->opens_fd >= 0) {
        close(self->opens_fd);
        pthread_mutex_destroy(&self->opens_lock);
    }
    Py_XDECREF(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Session_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Session *self = (Session *)PyType_GenericNew(type, args, kwds);
    if (self)
        self->opens_fd = -1;
    return (PyObject *)self;
}

static PyMethodDef Session_methods[] = {
    {"loop", (PyCFunction)Session_loop, METH_NOARGS,
     "Serve until unmounted or exit() is called (the GIL released); libfuse's status."},
    {"exit", (PyCFunction)Session_exit, METH_NOARGS,
     "End the loop from any thread (it returns once its workers stopped)."},
    {"forget", (PyCFunction)Session_forget, METH_O,
     "Drop what the table knows of a path (bytes): its version changed in storage."},
    {"cached", (PyCFunction)Session_cached, METH_VARARGS,
     "cached(path, blocks): the file-ahead prefetch put a one-block file on disk; "
     "True when its next open is native."},
    {"take_opens", (PyCFunction)Session_take_opens, METH_O,
     "take_opens(timeout): the paths of prefetched files opened natively since the last "
     "call (waits up to timeout s, GIL released); None once exit() was called."},
    {"counters", (PyCFunction)Session_counters, METH_NOARGS,
     "What the native side answered without Python, the calls into Python, the inodes."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datamount.fs._lowlevel.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A FUSE session on libfuse3's low-level API, mounted at creation.",
    .tp_new = Session_new,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "datamount.fs._lowlevel",
    "libfuse3's low-level loop outside the GIL (see the C source's header).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lowlevel(void)
{
    if (PyType_Ready(&SessionType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_IO", MAX_IO);
    PyModule_AddIntConstant(m, "SET_ATTR_MODE", FUSE_SET_ATTR_MODE);
    PyModule_AddIntConstant(m, "SET_ATTR_UID", FUSE_SET_ATTR_UID);
    PyModule_AddIntConstant(m, "SET_ATTR_GID", FUSE_SET_ATTR_GID);
    PyModule_AddIntConstant(m, "SET_ATTR_SIZE", FUSE_SET_ATTR_SIZE);
    PyModule_AddIntConstant(m, "SET_ATTR_TIMES", FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME |
                                                     FUSE_SET_ATTR_ATIME_NOW |
                                                     FUSE_SET_ATTR_MTIME_NOW);
    return m;
}
