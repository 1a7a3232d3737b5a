/* datamount.storage._httpget: one ranged GET on a connection the Python side
 * opened, with the GIL released from the request's first byte sent to the
 * body's last byte read (storage/nativeget.py is its Python face).
 *
 * get_into(sslobj, fd, request, offset, length, buffers, timeout) sends
 * `request` (a complete head, no body) on the connection, reads the answer's
 * head, and when it is a 200 or 206 of at most `length` bytes from `offset`,
 * reads the body into the buffers in order. It returns (code, status, n,
 * keep, head), status being the answer's (0 when there is none):
 *
 * - code BODY: the body has n bytes; the first min(n, the buffers' length)
 *   are in the buffers, head is None. A longer body (a span read a buffer at
 *   a time) is read on with read_body; head is then the body's bytes read
 *   past the buffers with the answer's head (at most HEAD_MAX), or None.
 * - code HEAD: any other answer; head is its head block (status line and
 *   header lines). A body of up to DRAIN_MAX bytes with a length was read
 *   and dropped, so the connection may stay; n is 0.
 * - a negative code: nothing usable; n is the bytes of the body still
 *   missing for BROKEN_BODY, the errno for SYSTEM, 0 otherwise; head is a
 *   message for TLS and BAD_HEAD. The connection is not to be used again.
 *   NOT_TLS_OBJECT is the one failure before anything was sent.
 *
 * keep is 1 when the connection may carry the next request once the whole
 * body is read: HTTP/1.1, no "Connection: close".
 *
 * read_body(sslobj, fd, buffers, count, timeout) reads the next `count`
 * bytes of a body into the buffers: (BODY, 0, count, 0, None) or a failure.
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

/* Read `left` bytes into the pieces from piece `index`, byte `at` on (they
 * have room for them); 0, or the failure (BROKEN_BODY: *missing bytes). */
static int read_exactly(Conn *c, Piece *pieces, size_t count, size_t index, size_t at,
                        long long left, long long *missing)
{
    while (left > 0) {
        while (index < count && pieces[index].len == at) { /* an empty buffer */
            index++;
            at = 0;
        }
        if (index == count)
            return BAD_HEAD; /* no room: not reached, the callers check */
        size_t room = pieces[index].len - at, want = (long long)room < left ? room : (size_t)left;
        size_t got = 0;
        int r = read_some(c, pieces[index].mem + at, want, &got);
        if (r)
            return r;
        if (got == 0) {
            *missing = left;
            return BROKEN_BODY;
        }
        at += got;
        left -= (long long)got;
    }
    return 0;
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
static void run(Conn *c, const char *request, size_t request_len, long long offset,
                long long length, Piece *pieces, size_t count, char *scratch, Answer *a)
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
        h.range_last - h.range_first < length &&
        (h.length < 0 || h.length == h.range_last - h.range_first + 1) && h.length != -2)
        n = h.range_last - h.range_first + 1;
    else if (!h.chunked && h.status == 200 && offset == 0 && h.length >= 0 && h.length <= length)
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
    /* the body's first bytes: into the pieces, and what does not fit in them
     * (a span longer than the buffers) back to the caller */
    size_t into = extra < capacity ? extra : capacity, spill = extra - into;
    size_t index = 0, at = 0;
    fill(pieces, count, &index, &at, scratch + body_at, into);
    if (spill) {
        a->head = malloc(spill);
        if (!a->head) {
            c->err = ENOMEM;
            a->code = SYSTEM;
            return;
        }
        memcpy(a->head, scratch + body_at + into, spill);
        a->head_len = spill;
    }
    long long want = n < (long long)capacity ? n : (long long)capacity;
    a->code = read_exactly(c, pieces, count, index, at, want - (long long)into, &a->n);
    if (a->code)
        return;
    a->code = BODY;
    a->status = h.status;
    a->n = n;
    a->keep = !h.close;
}

/* The connection of a call: 1, or 0 when `sslobj` is not the socket's own
 * TLS object (NOT_TLS_OBJECT), or -1 with an exception set. */
static int conn_from(PyObject *sslobj, PyObject *fd, PyObject *timeout_obj, Conn *c)
{
    c->ssl = NULL;
    c->err = 0;
    c->message[0] = '\0';
    c->fd = PyLong_AsLong(fd);
    if (c->fd == -1 && PyErr_Occurred())
        return -1;
    double timeout = PyFloat_AsDouble(timeout_obj);
    if (timeout == -1.0 && PyErr_Occurred())
        return -1;
    if (c->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "fd must not be negative");
        return -1;
    }
    c->timeout_ms = timeout < 0                     ? -1
                    : timeout * 1000.0 >= INT_MAX ? INT_MAX
                                                  : (int)(timeout * 1000.0 + 0.999);
    if (sslobj == Py_None)
        return 1;
    if (strcmp(Py_TYPE(sslobj)->tp_name, "_ssl._SSLSocket") != 0 ||
        Py_TYPE(sslobj)->tp_basicsize < (Py_ssize_t)sizeof(SSLSocketHead))
        return 0;
    c->ssl = ((SSLSocketHead *)sslobj)->ssl;
    return c->ssl && SSL_get_fd(c->ssl) == c->fd;
}

/* The caller's buffers, held (PyObject_GetBuffer) until `release_all`. */
typedef struct {
    PyObject *seq;
    Py_ssize_t held;
    Py_buffer views[MAX_BUFFERS];
    Piece pieces[MAX_BUFFERS];
    size_t capacity;
} Held;

static void release_all(Held *h)
{
    for (Py_ssize_t i = 0; i < h->held; i++)
        PyBuffer_Release(&h->views[i]);
    Py_XDECREF(h->seq);
}

static int hold_all(PyObject *buffers, Held *h)
{
    h->held = 0;
    h->capacity = 0;
    h->seq = PySequence_Fast(buffers, "buffers must be a sequence");
    if (!h->seq)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(h->seq);
    if (count < 1 || count > MAX_BUFFERS) {
        PyErr_Format(PyExc_ValueError, "1 to %d buffers", MAX_BUFFERS);
        release_all(h);
        return -1;
    }
    for (; h->held < count; h->held++) {
        Py_buffer *v = &h->views[h->held];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(h->seq, h->held), v,
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            release_all(h);
            return -1;
        }
        h->pieces[h->held].mem = v->buf;
        h->pieces[h->held].len = (size_t)v->len;
        h->capacity += (size_t)v->len;
    }
    return 0;
}

/* (code, status, n, keep, head or spill or message), as the module's doc says */
static PyObject *answer_tuple(const Answer *a, const Conn *c)
{
    switch (a->code) {
    case HEAD:
        return Py_BuildValue("(iiiiy#)", HEAD, a->status, 0, a->keep, a->head,
                             (Py_ssize_t)a->head_len);
    case BODY:
        if (a->head_len)
            return Py_BuildValue("(iiLiy#)", BODY, a->status, a->n, a->keep, a->head,
                                 (Py_ssize_t)a->head_len);
        return Py_BuildValue("(iiLiO)", BODY, a->status, a->n, a->keep, Py_None);
    case BROKEN_BODY:
        return Py_BuildValue("(iiLiO)", a->code, a->status, a->n, 0, Py_None);
    case SYSTEM:
        return Py_BuildValue("(iiiiO)", a->code, 0, c->err, 0, Py_None);
    case TLS:
    case BAD_HEAD:
        return Py_BuildValue("(iiiis)", a->code, 0, 0, 0, c->message);
    default:
        return Py_BuildValue("(iiiiO)", a->code, 0, 0, 0, Py_None);
    }
}

static PyObject *httpget_get_into(PyObject *Py_UNUSED(module), PyObject *const *args,
                                  Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "get_into(sslobj, fd, request, offset, length, buffers, timeout)");
        return NULL;
    }
    Conn c;
    int usable = conn_from(args[0], args[1], args[6], &c);
    if (usable < 0)
        return NULL;
    long long offset = PyLong_AsLongLong(args[3]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    long long length = PyLong_AsLongLong(args[4]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    if (offset < 0 || length < 1) {
        PyErr_SetString(PyExc_ValueError, "offset must not be negative, length positive");
        return NULL;
    }
    if (!usable)
        return Py_BuildValue("(iiiiO)", NOT_TLS_OBJECT, 0, 0, 0, Py_None);
    Held h;
    if (hold_all(args[5], &h) < 0)
        return NULL;
    Py_buffer request;
    if (PyObject_GetBuffer(args[2], &request, PyBUF_SIMPLE) < 0) {
        release_all(&h);
        return NULL;
    }
    PyObject *result = NULL;
    char *scratch = PyMem_RawMalloc(HEAD_MAX);
    if (!scratch) {
        PyErr_NoMemory();
    } else {
        Answer a = {.code = 0, .status = 0, .n = 0, .keep = 0, .head = NULL, .head_len = 0};
        Py_BEGIN_ALLOW_THREADS
        run(&c, request.buf, (size_t)request.len, offset, length, h.pieces, (size_t)h.held,
            scratch, &a);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(scratch);
        result = answer_tuple(&a, &c);
        free(a.head);
    }
    PyBuffer_Release(&request);
    release_all(&h);
    return result;
}

static PyObject *httpget_read_body(PyObject *Py_UNUSED(module), PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "read_body(sslobj, fd, buffers, count, timeout)");
        return NULL;
    }
    Conn c;
    int usable = conn_from(args[0], args[1], args[4], &c);
    if (usable < 0)
        return NULL;
    long long count = PyLong_AsLongLong(args[3]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (!usable)
        return Py_BuildValue("(iiiiO)", NOT_TLS_OBJECT, 0, 0, 0, Py_None);
    Held h;
    if (hold_all(args[2], &h) < 0)
        return NULL;
    if (count < 0 || (unsigned long long)count > h.capacity) {
        release_all(&h);
        PyErr_SetString(PyExc_ValueError, "count must be within the buffers");
        return NULL;
    }
    Answer a = {.code = 0, .status = 0, .n = 0, .keep = 0, .head = NULL, .head_len = 0};
    Py_BEGIN_ALLOW_THREADS
    a.code = read_exactly(&c, h.pieces, (size_t)h.held, 0, 0, count, &a.n);
    Py_END_ALLOW_THREADS
    if (a.code == 0) {
        a.code = BODY;
        a.n = count;
    }
    release_all(&h);
    return answer_tuple(&a, &c);
}

static PyMethodDef httpget_methods[] = {
    {"get_into", (PyCFunction)(void (*)(void))httpget_get_into, METH_FASTCALL,
     "get_into(sslobj, fd, request, offset, length, buffers, timeout) -> "
     "(code, status, n, keep, head)"},
    {"read_body", (PyCFunction)(void (*)(void))httpget_read_body, METH_FASTCALL,
     "read_body(sslobj, fd, buffers, count, timeout) -> (code, 0, n, 0, message)"},
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
