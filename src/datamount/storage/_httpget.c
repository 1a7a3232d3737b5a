/* datamount.storage._httpget: one ranged GET on a connection the Python side
 * opened, with the GIL released from the request's first byte sent to the
 * body's last byte read (storage/nativeget.py is its Python face).
 *
 * get_into(sslobj, fd, request, offset, buffers, timeout) sends `request` (a
 * complete head, no body) on the connection, reads the answer's head, and
 * when it is a 200 or 206 whose body starts at `offset` and fits the buffers,
 * reads the body into them in order. It returns (code, status, n, keep, head),
 * status being the answer's (0 when there is none):
 *
 * - code BODY: n body bytes are in the buffers; head is None.
 * - code HEAD: any other answer; head is its head block (status line and
 *   header lines). A body of up to DRAIN_MAX bytes with a length was read
 *   and dropped, so the connection may stay; n is 0.
 * - a negative code: nothing usable; n is the bytes of the body still
 *   missing for BROKEN_BODY, the errno for SYSTEM, 0 otherwise; head is a
 *   message for TLS and BAD_HEAD. The connection is not to be used again.
 *   NOT_TLS_OBJECT is the one failure before anything was sent.
 *
 * keep is 1 when the connection may carry the next request: HTTP/1.1, no
 * "Connection: close", and the whole answer read.
 *
 * Over TLS the connection's own OpenSSL object (the ssl module's SSL*) is
 * read and written, as the ssl module itself does with the GIL released
 * around SSL_read and SSL_write; the object is found in the _ssl._SSLSocket
 * (`sock._sslobj`) by the layout CPython has had since 3.7 (its first two
 * fields), and used only if it is that type and SSL_get_fd gives the
 * socket's own descriptor. The Python face checks once that this module and
 * the ssl module run the same OpenSSL.
 *
 * Timeouts are per wait, as the socket's own (a stall timeout): a
 * non-blocking descriptor waits in poll() for at most `timeout` seconds each
 * time it has nothing to give; a negative timeout waits without end.
 *
 * Safety: the buffers and the request are held (PyObject_GetBuffer) from
 * before the GIL is released until after it is taken again; every length is
 * checked before a byte moves; no Python object is touched without the GIL.
 * The one connection is used by one thread: the pool lends it to one request.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>

#define HEAD_MAX (64 * 1024) /* a longer head is refused (http.client: 65,536 a line) */
#define DRAIN_MAX (1 << 20)  /* error bodies up to this are read to keep the connection */
#define MAX_BUFFERS 64

enum {
    BODY = 0,
    HEAD = 1,
    TIMEOUT = -1,
    CLOSED = -2,      /* the peer closed before the head ended */
    SYSTEM = -3,      /* an errno from send, recv or poll */
    TLS = -4,         /* an OpenSSL error */
    BAD_HEAD = -5,    /* not an HTTP/1.x answer, or a head too long */
    BROKEN_BODY = -6, /* the body ended before its length */
    NOT_TLS_OBJECT = -7,
};

/* The first fields of CPython's PySSLSocket (Modules/_ssl.c), the same from
 * 3.7 to 3.13: PyObject_HEAD, the weakref to the socket, the SSL*. */
typedef struct {
    PyObject_HEAD
    PyObject *socket;
    SSL *ssl;
} SSLSocketHead;

typedef struct {
    SSL *ssl; /* NULL: plain TCP */
    int fd;
    int timeout_ms; /* -1: no end */
    int err;        /* errno of a SYSTEM failure */
    char message[160];
} Conn;

static int wait_for(Conn *c, short events)
{
    struct pollfd p = {.fd = c->fd, .events = events};
    for (;;) {
        int r = poll(&p, 1, c->timeout_ms);
        if (r > 0)
            return 0;
        if (r == 0)
            return TIMEOUT;
        if (errno != EINTR) {
            c->err = errno;
            return SYSTEM;
        }
    }
}

static int tls_failure(Conn *c, int ret, int *again_events)
{
    int e = SSL_get_error(c->ssl, ret);
    if (e == SSL_ERROR_WANT_READ) {
        *again_events = POLLIN;
        return 0;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        *again_events = POLLOUT;
        return 0;
    }
    if (e == SSL_ERROR_ZERO_RETURN)
        return CLOSED;
    if (e == SSL_ERROR_SYSCALL) {
        int saved = errno;
        ERR_clear_error();
        if (saved == 0)
            return CLOSED; /* an EOF without close_notify */
        c->err = saved;
        return SYSTEM;
    }
    unsigned long code = ERR_peek_last_error();
    if (ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return CLOSED;
    }
    ERR_error_string_n(code, c->message, sizeof(c->message));
    ERR_clear_error();
    return TLS;
}

/* After a plain send or recv failed with errno: 0 to try again (an EINTR, or
 * the descriptor became ready for `events`), else the failure. */
static int plain_again(Conn *c, short events)
{
    if (errno == EINTR)
        return 0;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        c->err = errno;
        return SYSTEM;
    }
    return wait_for(c, events);
}

/* Send all of `data`. */
static int send_all(Conn *c, const char *data, size_t len)
{
    while (len > 0) {
        size_t chunk = len > INT_MAX ? INT_MAX : len;
        if (c->ssl) {
            ERR_clear_error();
            int n = SSL_write(c->ssl, data, (int)chunk);
            if (n > 0) {
                data += n;
                len -= (size_t)n;
                continue;
            }
            int events = 0, r = tls_failure(c, n, &events);
            if (r)
                return r;
            if ((r = wait_for(c, events)))
                return r;
        } else {
            ssize_t n = send(c->fd, data, chunk, MSG_NOSIGNAL);
            if (n >= 0) {
                data += n;
                len -= (size_t)n;
                continue;
            }
            int r = plain_again(c, POLLOUT);
            if (r)
                return r;
        }
    }
    return 0;
}

/* Read at most `len` (> 0) bytes; *got is how many (0 only at a clean end). */
static int read_some(Conn *c, char *into, size_t len, size_t *got)
{
    size_t chunk = len > INT_MAX ? INT_MAX : len;
    for (;;) {
        if (c->ssl) {
            ERR_clear_error();
            int n = SSL_read(c->ssl, into, (int)chunk);
            if (n > 0) {
                *got = (size_t)n;
                return 0;
            }
            int events = 0, r = tls_failure(c, n, &events);
            if (r == CLOSED) {
                *got = 0;
                return 0;
            }
            if (r)
                return r;
            if ((r = wait_for(c, events)))
                return r;
        } else {
            ssize_t n = recv(c->fd, into, chunk, 0);
            if (n >= 0) {
                *got = (size_t)n;
                return 0;
            }
            int r = plain_again(c, POLLIN);
            if (r)
                return r;
        }
    }
}

/* The answer's head, as parsed for the body's framing. */
typedef struct {
    int status;
    int http11;
    int close;      /* Connection: close */
    int chunked;    /* a Transfer-Encoding other than identity */
    long long length; /* Content-Length; -1: none or not a number */
    long long range_first, range_last; /* Content-Range; -1: none */
} Head;

static int name_is(const char *line, size_t name_len, const char *name)
{
    return strlen(name) == name_len && strncasecmp(line, name, name_len) == 0;
}

static long long parse_number(const char *s, const char *end, const char **stop)
{
    long long v = 0;
    const char *p = s;
    while (p < end && *p >= '0' && *p <= '9' && v < (LLONG_MAX - 9) / 10)
        v = v * 10 + (*p++ - '0');
    *stop = p;
    return p == s || (p < end && *p >= '0' && *p <= '9') ? -1 : v;
}

static int has_token(const char *s, const char *end, const char *token)
{
    size_t t = strlen(token);
    for (const char *p = s; p + t <= end; p++)
        if (strncasecmp(p, token, t) == 0 && (p == s || p[-1] == ' ' || p[-1] == ',') &&
            (p + t == end || p[t] == ' ' || p[t] == ','))
            return 1;
    return 0;
}

/* Parse head[0:len] (up to, not including, the blank line). */
static int parse_head(const char *head, size_t len, Head *h)
{
    const char *end = head + len, *eol = memchr(head, '\n', len);
    if (!eol)
        eol = end;
    /* "HTTP/1.x SSS reason" */
    if (eol - head < 12 || memcmp(head, "HTTP/1.", 7) != 0 || head[8] != ' ')
        return BAD_HEAD;
    h->http11 = head[7] == '1';
    const char *p = head + 9;
    if (!(p[0] >= '1' && p[0] <= '9' && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' &&
          p[2] <= '9') ||
        (p + 3 < eol && p[3] != ' ' && p[3] != '\r'))
        return BAD_HEAD;
    h->status = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
    h->close = !h->http11;
    h->chunked = 0;
    h->length = -1;
    h->range_first = h->range_last = -1;
    for (const char *line = eol + 1; line < end; line = eol + 1) {
        eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            eol = end;
        const char *stop = eol > line && eol[-1] == '\r' ? eol - 1 : eol;
        const char *colon = memchr(line, ':', (size_t)(stop - line));
        if (!colon || line[0] == ' ' || line[0] == '\t')
            continue; /* no name, or a folded line: nothing this parse reads */
        size_t name_len = (size_t)(colon - line);
        const char *v = colon + 1, *v_end = stop;
        while (v < v_end && (*v == ' ' || *v == '\t'))
            v++;
        while (v_end > v && (v_end[-1] == ' ' || v_end[-1] == '\t'))
            v_end--;
        const char *after;
        if (name_is(line, name_len, "content-length")) {
            long long n = parse_number(v, v_end, &after);
            if (h->length == -1) /* the first value wins, as in email.message */
                h->length = after == v_end ? n : -2;
        } else if (name_is(line, name_len, "transfer-encoding")) {
            if (!((size_t)(v_end - v) == 8 && strncasecmp(v, "identity", 8) == 0))
                h->chunked = 1;
        } else if (name_is(line, name_len, "connection")) {
            if (has_token(v, v_end, "close"))
                h->close = 1;
            else if (!h->http11 && has_token(v, v_end, "keep-alive"))
                h->close = 0;
        } else if (name_is(line, name_len, "content-range") && h->range_first == -1) {
            if (v_end - v > 6 && strncasecmp(v, "bytes ", 6) == 0) {
                long long first = parse_number(v + 6, v_end, &after);
                if (first >= 0 && after < v_end && *after == '-') {
                    const char *last_at = after + 1;
                    long long last = parse_number(last_at, v_end, &after);
                    /* last = first - 1: an empty range (Azurite's answer past the end) */
                    if (last >= first - 1 && after < v_end && *after == '/') {
                        h->range_first = first;
                        h->range_last = last;
                    }
                }
            }
        }
    }
    return 0;
}

typedef struct {
    char *mem;
    size_t len;
} Piece;

/* Copy `n` bytes from src into the pieces from *at (piece index, offset). */
static void fill(Piece *pieces, size_t count, size_t *index, size_t *at, const char *src, size_t n)
{
    while (n > 0 && *index < count) {
        size_t room = pieces[*index].len - *at, take = n < room ? n : room;
        memcpy(pieces[*index].mem + *at, src, take);
        src += take;
        n -= take;
        *at += take;
        if (*at == pieces[*index].len) {
            (*index)++;
            *at = 0;
        }
    }
}

typedef struct {
    int code;
    int status;
    long long n;
    int keep;
    char *head; /* malloc'd head block, for HEAD */
    size_t head_len;
} Answer;

/* The exchange, without the GIL. `scratch` holds HEAD_MAX bytes. */
static void run(Conn *c, const char *request, size_t request_len, long long offset, Piece *pieces,
                size_t count, char *scratch, Answer *a)
{
    a->code = send_all(c, request, request_len);
    if (a->code)
        return;
    size_t have = 0, head_len = 0;
    char *blank = NULL;
    while (!blank) {
        if (have == HEAD_MAX) {
            snprintf(c->message, sizeof(c->message), "an answer head over %d bytes", HEAD_MAX);
            a->code = BAD_HEAD;
            return;
        }
        size_t got = 0;
        a->code = read_some(c, scratch + have, HEAD_MAX - have, &got);
        if (a->code)
            return;
        if (got == 0) {
            a->code = CLOSED;
            return;
        }
        size_t from = have > 3 ? have - 3 : 0;
        have += got;
        for (size_t i = from; i + 1 < have; i++) {
            if (scratch[i] == '\n' && (scratch[i + 1] == '\n' ||
                                       (i + 2 < have && scratch[i + 1] == '\r' &&
                                        scratch[i + 2] == '\n'))) {
                blank = scratch + i + 1;
                head_len = i + 1;
                break;
            }
        }
    }
    size_t body_at = head_len + (blank[0] == '\r' ? 2 : 1);
    Head h;
    if (parse_head(scratch, head_len, &h)) {
        snprintf(c->message, sizeof(c->message), "not an HTTP/1.x answer");
        a->code = BAD_HEAD;
        return;
    }
    size_t capacity = 0;
    for (size_t i = 0; i < count; i++)
        capacity += pieces[i].len;
    long long n = -1;
    if (!h.chunked && h.status == 206 && h.range_first == offset &&
        h.range_last - h.range_first < (long long)capacity &&
        (h.length < 0 || h.length == h.range_last - h.range_first + 1) && h.length != -2)
        n = h.range_last - h.range_first + 1;
    else if (!h.chunked && h.status == 200 && offset == 0 && h.length >= 0 &&
             h.length <= (long long)capacity)
        n = h.length;
    size_t extra = have - body_at;
    if (n < 0) { /* HEAD: the head for Python, a short body read and dropped */
        a->code = HEAD;
        a->status = h.status;
        a->head = malloc(head_len);
        if (!a->head) {
            c->err = ENOMEM;
            a->code = SYSTEM;
            return;
        }
        memcpy(a->head, scratch, head_len);
        a->head_len = head_len;
        a->keep = 0;
        int bodyless = h.status == 204 || h.status == 304 || h.status < 200;
        long long left = bodyless ? 0 : h.length;
        if (h.chunked || left < 0 || left > DRAIN_MAX || (long long)extra > left)
            return;
        left -= (long long)extra;
        while (left > 0) {
            size_t got = 0;
            int r = read_some(c, scratch, left < HEAD_MAX ? (size_t)left : HEAD_MAX, &got);
            if (r || got == 0)
                return;
            left -= (long long)got;
        }
        a->keep = !h.close;
        return;
    }
    if ((long long)extra > n) { /* more than the body: not an answer to reuse */
        extra = (size_t)n;
        h.close = 1;
    }
    size_t index = 0, at = 0;
    fill(pieces, count, &index, &at, scratch + body_at, extra);
    long long left = n - (long long)extra;
    while (left > 0) {
        while (pieces[index].len == at) { /* an empty buffer: nothing to read into */
            index++;
            at = 0;
        }
        size_t room = pieces[index].len - at, want = (long long)room < left ? room : (size_t)left;
        size_t got = 0;
        int r = read_some(c, pieces[index].mem + at, want, &got);
        if (r) {
            a->code = r;
            return;
        }
        if (got == 0) {
            a->code = BROKEN_BODY;
            a->n = left;
            return;
        }
        at += got;
        left -= (long long)got;
        if (at == pieces[index].len) {
            index++;
            at = 0;
        }
    }
    a->code = BODY;
    a->status = h.status;
    a->n = n;
    a->keep = !h.close;
}

static PyObject *httpget_get_into(PyObject *Py_UNUSED(module), PyObject *const *args,
                                  Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "get_into(sslobj, fd, request, offset, buffers, timeout)");
        return NULL;
    }
    Conn c = {.ssl = NULL, .err = 0, .message = ""};
    c.fd = PyLong_AsLong(args[1]);
    if (c.fd == -1 && PyErr_Occurred())
        return NULL;
    long long offset = PyLong_AsLongLong(args[3]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    double timeout = PyFloat_AsDouble(args[5]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (c.fd < 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "fd and offset must not be negative");
        return NULL;
    }
    c.timeout_ms = timeout < 0 ? -1 : timeout * 1000.0 >= INT_MAX ? INT_MAX
                                                                   : (int)(timeout * 1000.0 + 0.999);
    if (args[0] != Py_None) {
        PyObject *o = args[0];
        if (strcmp(Py_TYPE(o)->tp_name, "_ssl._SSLSocket") != 0 ||
            Py_TYPE(o)->tp_basicsize < (Py_ssize_t)sizeof(SSLSocketHead))
            return Py_BuildValue("(iiiiO)", NOT_TLS_OBJECT, 0, 0, 0, Py_None);
        c.ssl = ((SSLSocketHead *)o)->ssl;
        if (!c.ssl || SSL_get_fd(c.ssl) != c.fd)
            return Py_BuildValue("(iiiiO)", NOT_TLS_OBJECT, 0, 0, 0, Py_None);
    }
    PyObject *seq = PySequence_Fast(args[4], "buffers must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count < 1 || count > MAX_BUFFERS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "1 to %d buffers", MAX_BUFFERS);
        return NULL;
    }
    Py_buffer request;
    if (PyObject_GetBuffer(args[2], &request, PyBUF_SIMPLE) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_buffer views[MAX_BUFFERS];
    Piece pieces[MAX_BUFFERS];
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        pieces[held].mem = views[held].buf;
        pieces[held].len = (size_t)views[held].len;
    }
    char *scratch = PyMem_RawMalloc(HEAD_MAX);
    if (!scratch) {
        PyErr_NoMemory();
        goto out;
    }
    Answer a = {.code = 0, .status = 0, .n = 0, .keep = 0, .head = NULL, .head_len = 0};
    Py_BEGIN_ALLOW_THREADS
    run(&c, request.buf, (size_t)request.len, offset, pieces, (size_t)count, scratch, &a);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    if (a.code == HEAD) {
        result = Py_BuildValue("(iiiiy#)", HEAD, a.status, 0, a.keep, a.head,
                               (Py_ssize_t)a.head_len);
        free(a.head);
    } else if (a.code == BODY || a.code == BROKEN_BODY) {
        result = Py_BuildValue("(iiLiO)", a.code, a.status, a.n, a.keep, Py_None);
    } else if (a.code == SYSTEM) {
        result = Py_BuildValue("(iiiiO)", a.code, 0, c.err, 0, Py_None);
    } else if (a.code == TLS || a.code == BAD_HEAD) {
        result = Py_BuildValue("(iiiis)", a.code, 0, 0, 0, c.message);
    } else {
        result = Py_BuildValue("(iiiiO)", a.code, 0, 0, 0, Py_None);
    }
out:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&request);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef httpget_methods[] = {
    {"get_into", (PyCFunction)(void (*)(void))httpget_get_into, METH_FASTCALL,
     "get_into(sslobj, fd, request, offset, buffers, timeout) -> (code, status, n, keep, head)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef httpget_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "datamount.storage._httpget",
    .m_doc = "One ranged GET without the GIL (storage/nativeget.py).",
    .m_size = -1,
    .m_methods = httpget_methods,
};

PyMODINIT_FUNC PyInit__httpget(void)
{
    PyObject *module = PyModule_Create(&httpget_module);
    if (!module)
        return NULL;
    if (PyModule_AddIntConstant(module, "BODY", BODY) < 0 ||
        PyModule_AddIntConstant(module, "HEAD", HEAD) < 0 ||
        PyModule_AddIntConstant(module, "TIMEOUT", TIMEOUT) < 0 ||
        PyModule_AddIntConstant(module, "CLOSED", CLOSED) < 0 ||
        PyModule_AddIntConstant(module, "SYSTEM", SYSTEM) < 0 ||
        PyModule_AddIntConstant(module, "TLS", TLS) < 0 ||
        PyModule_AddIntConstant(module, "BAD_HEAD", BAD_HEAD) < 0 ||
        PyModule_AddIntConstant(module, "BROKEN_BODY", BROKEN_BODY) < 0 ||
        PyModule_AddIntConstant(module, "NOT_TLS_OBJECT", NOT_TLS_OBJECT) < 0 ||
        PyModule_AddIntConstant(module, "DRAIN_MAX", DRAIN_MAX) < 0 ||
        PyModule_AddIntConstant(module, "HEAD_MAX", HEAD_MAX) < 0 ||
        PyModule_AddObject(module, "OPENSSL_VERSION_NUMBER",
                           PyLong_FromUnsignedLong(OpenSSL_version_num())) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
