/* datamount.read._buffers: the block buffers and copies of the read path
 * (read/copy.py is its Python face).
 *
 * - empty(size): a writable memoryview of `size` uninitialised bytes (malloc
 *   without a memset); from GIL_FREE_MIN bytes the memory starts on a page, so
 *   an O_DIRECT write takes it without a copy into an aligned buffer.
 * - copy_into(dst, src): dst[:] = src for two contiguous buffers of one
 *   length; from GIL_FREE_MIN bytes the memcpy runs without the GIL.
 * - address(buffer): where a contiguous buffer's bytes start.
 * - write_file(folder, direct, pieces, root_fd, name): a new file of the
 *   pieces, whole under its final name or not at all, in one call without
 *   the GIL: an unnamed O_TMPFILE file in `folder` (O_DIRECT when `direct`),
 *   written by pwritev from offset 0, linked as `name` under `root_fd`. 0, or
 *   the errno of the first step that failed (nothing left behind); the caller
 *   then takes its own path, which knows every fallback
 *   (read/cache/blockfile.py).
 *
 * Why not numpy: it did the same for a tenth of a second of imports in every
 * mount daemon and a larger cost per call (docs/design/ro_mount.md, "Fetch
 * buffers").
 *
 * Safety: a copy's memcpy runs on buffers this call holds (PyObject_GetBuffer)
 * until it has the GIL again, so neither can be freed or resized meanwhile; no
 * Python object is touched without the GIL. Lengths are checked before any
 * byte moves.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096
#define GIL_FREE_MIN (64 * 1024)
#define MAX_PIECES 8

typedef struct {
    PyObject_HEAD
    void *raw; /* what malloc gave */
    char *mem; /* the bytes: raw, or its first page boundary */
    Py_ssize_t size;
} Buffer;

static int Buffer_getbuffer(Buffer *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->mem, self->size, 0, flags);
}

static void Buffer_dealloc(Buffer *self)
{
    free(self->raw);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs Buffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)Buffer_getbuffer,
};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datamount.read._buffers.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Uninitialised bytes, freed with the last view of them.",
};

static PyObject *buffers_empty(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "size must not be negative");
        return NULL;
    }
    /* Plain malloc with a page to spare, aligned by hand, not posix_memalign:
     * glibc raises its mmap threshold when a large malloc'd chunk is freed, so
     * after the first block buffers come from the heap, reused as they are;
     * with posix_memalign every 2 MiB buffer was a fresh mmap (9 us, and a
     * page fault per 4 KiB at its first fill). */
    int aligned = size >= GIL_FREE_MIN;
    void *raw = malloc((size_t)size + (aligned ? PAGE : 1));
    if (!raw)
        return PyErr_NoMemory();
    Buffer *buffer = PyObject_New(Buffer, &BufferType);
    if (!buffer) {
        free(raw);
        return NULL;
    }
    uintptr_t at = (uintptr_t)raw;
    buffer->raw = raw;
    buffer->mem = aligned ? (char *)((at + PAGE - 1) & ~(uintptr_t)(PAGE - 1)) : raw;
    buffer->size = size;
    PyObject *view = PyMemoryView_FromObject((PyObject *)buffer);
    Py_DECREF(buffer); /* the view keeps it */
    return view;
}

static PyObject *buffers_copy_into(PyObject *Py_UNUSED(module), PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_into(dst, src) takes 2 arguments");
        return NULL;
    }
    Py_buffer dst, src;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "copy_into: %zd bytes into %zd", src.len, dst.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len >= GIL_FREE_MIN) {
        Py_BEGIN_ALLOW_THREADS
        memmove(dst.buf, src.buf, (size_t)dst.len);
        Py_END_ALLOW_THREADS
    } else if (dst.len) {
        memmove(dst.buf, src.buf, (size_t)dst.len);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *buffers_address(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uintptr_t at = (uintptr_t)view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromSize_t((size_t)at);
}

/* Without the GIL: write, from offset 0, every piece; 0 or an errno. */
static int write_pieces(int fd, struct iovec *iov, int count)
{
    off_t offset = 0;
    while (count > 0) {
        ssize_t n = pwritev(fd, iov, count, offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return EIO;
        offset += n;
        while (count > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

static int write_file(const char *folder, int direct, struct iovec *iov, int count, int root_fd,
                      const char *name)
{
    int fd = open(folder, O_WRONLY | O_TMPFILE | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
    if (fd < 0)
        return errno;
    int err = write_pieces(fd, iov, count);
    if (!err) {
        char proc[64];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, proc, root_fd, name, AT_SYMLINK_FOLLOW) < 0)
            err = errno;
    }
    close(fd); /* an unnamed file not linked goes with it */
    return err;
}

static PyObject *buffers_write_file(PyObject *Py_UNUSED(module), PyObject *const *args,
                                    Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "write_file(folder, direct, pieces, root_fd, name)");
        return NULL;
    }
    const char *folder = PyUnicode_AsUTF8(args[0]);
    if (!folder)
        return NULL;
    int direct = PyObject_IsTrue(args[1]);
    if (direct < 0)
        return NULL;
    int root_fd = PyLong_AsLong(args[3]);
    if (root_fd == -1 && PyErr_Occurred())
        return NULL;
    const char *name = PyUnicode_AsUTF8(args[4]);
    if (!name)
        return NULL;
    PyObject *seq = PySequence_Fast(args[2], "pieces must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > MAX_PIECES) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "write_file: at most %d pieces", MAX_PIECES);
        return NULL;
    }
    Py_buffer views[MAX_PIECES];
    struct iovec iov[MAX_PIECES];
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        iov[held].iov_base = views[held].buf;
        iov[held].iov_len = (size_t)views[held].len;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = write_file(folder, direct, iov, (int)count, root_fd, name);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(err);
out:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef buffers_methods[] = {
    {"empty", buffers_empty, METH_O,
     "A writable memoryview of `size` uninitialised bytes (page-aligned from 64 KiB)."},
    {"copy_into", (PyCFunction)(void (*)(void))buffers_copy_into, METH_FASTCALL,
     "dst[:] = src (equal lengths); without the GIL from 64 KiB."},
    {"address", buffers_address, METH_O, "Where a contiguous buffer's bytes start."},
    {"write_file", (PyCFunction)(void (*)(void))buffers_write_file, METH_FASTCALL,
     "A new file of the pieces under its final name, or an errno; without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef buffers_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "datamount.read._buffers",
    .m_doc = "Block buffers and GIL-free copies of the read path (read/copy.py).",
    .m_size = -1,
    .m_methods = buffers_methods,
};

PyMODINIT_FUNC PyInit__buffers(void)
{
    if (PyType_Ready(&BufferType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&buffers_module);
    if (!module)
        return NULL;
    if (PyModule_AddIntConstant(module, "GIL_FREE_MIN", GIL_FREE_MIN) < 0 ||
        PyModule_AddIntConstant(module, "PAGE", PAGE) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
