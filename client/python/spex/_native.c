/* spex._native: the few operations the Python client needs on the shared segments that plain
 * Python cannot do safely: atomic loads, stores and read-modify-writes on 32/64-bit words of a
 * writable buffer (an mmap of a daemon segment), and futex wait/wake on a 32-bit word. The
 * words are std::atomic<uint32_t>/<uint64_t> on the daemon side (proto/contract/layout.h);
 * GCC's __atomic builtins on the same addresses interoperate with them.
 * Blocking calls release the GIL. Every offset is checked against the buffer's bounds and
 * its natural alignment, so a bad offset is a ValueError, never a stray write. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Returns a pointer to `width` bytes at `offset` of `view`, or NULL with ValueError set. */
static void* word_at(Py_buffer* view, long long offset, size_t width) {
  if (offset < 0 || (unsigned long long)offset + width > (unsigned long long)view->len) {
    PyErr_Format(PyExc_ValueError, "offset %lld (+%zu bytes) is outside the %zd-byte buffer", offset, width,
                 view->len);
    return NULL;
  }
  char* p = (char*)view->buf + offset;
  if (((uintptr_t)p) % width != 0) {
    PyErr_Format(PyExc_ValueError, "offset %lld is not %zu-byte aligned", offset, width);
    return NULL;
  }
  return p;
}

static long futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  struct timespec ts;
  ts.tv_sec = timeout_ns / 1000000000;
  ts.tv_nsec = timeout_ns % 1000000000;
  return syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static long futex_wake(uint32_t* word, int count) {
  return syscall(SYS_futex, word, FUTEX_WAKE, count, NULL, NULL, 0);
}

PyDoc_STRVAR(load32_doc, "load32(buf, offset) -> int\n\nAtomic (acquire) load of the uint32 at offset.");
static PyObject* py_load32(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off;
  if (!PyArg_ParseTuple(args, "w*L", &view, &off)) return NULL;
  uint32_t* p = word_at(&view, off, 4);
  PyObject* r = p ? PyLong_FromUnsignedLong(__atomic_load_n(p, __ATOMIC_ACQUIRE)) : NULL;
  PyBuffer_Release(&view);
  return r;
}

PyDoc_STRVAR(store32_doc, "store32(buf, offset, value)\n\nAtomic (sequentially consistent) store of a uint32.");
static PyObject* py_store32(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off;
  unsigned long long v;
  if (!PyArg_ParseTuple(args, "w*LK", &view, &off, &v)) return NULL;
  uint32_t* p = word_at(&view, off, 4);
  if (p) __atomic_store_n(p, (uint32_t)v, __ATOMIC_SEQ_CST);
  PyBuffer_Release(&view);
  if (!p) return NULL;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(add32_doc,
             "add32(buf, offset, delta) -> int\n\nAtomic fetch-and-add on a uint32 (delta may be negative, "
             "wraps modulo 2**32); returns the previous value.");
static PyObject* py_add32(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off, delta;
  if (!PyArg_ParseTuple(args, "w*LL", &view, &off, &delta)) return NULL;
  uint32_t* p = word_at(&view, off, 4);
  PyObject* r = p ? PyLong_FromUnsignedLong(__atomic_fetch_add(p, (uint32_t)delta, __ATOMIC_SEQ_CST)) : NULL;
  PyBuffer_Release(&view);
  return r;
}

PyDoc_STRVAR(load64_doc, "load64(buf, offset) -> int\n\nAtomic (acquire) load of the uint64 at offset.");
static PyObject* py_load64(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off;
  if (!PyArg_ParseTuple(args, "w*L", &view, &off)) return NULL;
  uint64_t* p = word_at(&view, off, 8);
  PyObject* r = p ? PyLong_FromUnsignedLongLong(__atomic_load_n(p, __ATOMIC_ACQUIRE)) : NULL;
  PyBuffer_Release(&view);
  return r;
}

PyDoc_STRVAR(store64_doc, "store64(buf, offset, value)\n\nAtomic (sequentially consistent) store of a uint64.");
static PyObject* py_store64(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off;
  unsigned long long v;
  if (!PyArg_ParseTuple(args, "w*LK", &view, &off, &v)) return NULL;
  uint64_t* p = word_at(&view, off, 8);
  if (p) __atomic_store_n(p, (uint64_t)v, __ATOMIC_SEQ_CST);
  PyBuffer_Release(&view);
  if (!p) return NULL;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(futex_wake_doc, "futex_wake(buf, offset, count=INT_MAX) -> int\n\nWakes sleepers on the uint32 at offset.");
static PyObject* py_futex_wake(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long off;
  int count = INT_MAX;
  if (!PyArg_ParseTuple(args, "w*L|i", &view, &off, &count)) return NULL;
  uint32_t* p = word_at(&view, off, 4);
  long rc = p ? futex_wake(p, count) : 0;
  PyBuffer_Release(&view);
  if (!p) return NULL;
  return PyLong_FromLong(rc < 0 ? 0 : rc);
}

PyDoc_STRVAR(ring_doc,
             "ring(bell, ring_offset, sleeping_offset)\n\nThe trainer's doorbell ring: atomically increments "
             "the ring word and FUTEX_WAKEs it when the engine's sleeping flag is set.");
static PyObject* py_ring(PyObject* self, PyObject* args) {
  Py_buffer view;
  long long ring_off, sleeping_off;
  if (!PyArg_ParseTuple(args, "w*LL", &view, &ring_off, &sleeping_off)) return NULL;
  uint32_t* ring = word_at(&view, ring_off, 4);
  uint32_t* sleeping = ring ? word_at(&view, sleeping_off, 4) : NULL;
  if (sleeping) {
    __atomic_fetch_add(ring, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(sleeping, __ATOMIC_SEQ_CST)) futex_wake(ring, INT_MAX);
  }
  PyBuffer_Release(&view);
  if (!sleeping) return NULL;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(wait_equal32_doc,
             "wait_equal32(buf, offset, want, waiters_offset, stop_buf, stop_offset, spin_ns, timeout_ns) -> int\n\n"
             "Waits until the uint32 at offset equals want: spins up to spin_ns, then increments the waiters\n"
             "counter, sleeps on the word with FUTEX_WAIT (re-checking at least every 100 ms) and decrements\n"
             "the counter again. Stops early when the uint32 at stop_offset of stop_buf becomes non-zero.\n"
             "Returns 0 when the word equals want, 1 when timeout_ns passed, 2 when the stop flag was set.\n"
             "The GIL is released while waiting.");
static PyObject* py_wait_equal32(PyObject* self, PyObject* args) {
  Py_buffer view, stop_view;
  long long off, waiters_off, stop_off, spin_ns, timeout_ns;
  unsigned long long want_in;
  if (!PyArg_ParseTuple(args, "w*LKLw*LLL", &view, &off, &want_in, &waiters_off, &stop_view, &stop_off, &spin_ns,
                        &timeout_ns)) {
    return NULL;
  }
  uint32_t* word = word_at(&view, off, 4);
  uint32_t* waiters = word ? word_at(&view, waiters_off, 4) : NULL;
  uint32_t* stop = waiters ? word_at(&stop_view, stop_off, 4) : NULL;
  if (!stop) {
    PyBuffer_Release(&view);
    PyBuffer_Release(&stop_view);
    return NULL;
  }
  const uint32_t want = (uint32_t)want_in;
  int result = 1;
  Py_BEGIN_ALLOW_THREADS;
  const uint64_t start = monotonic_ns();
  const uint64_t spin_until = start + (uint64_t)(spin_ns > 0 ? spin_ns : 0);
  const uint64_t limit = start + (uint64_t)(timeout_ns > 0 ? timeout_ns : 0);
  int done = 0;
  while (monotonic_ns() < spin_until) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == want) {
      result = 0;
      done = 1;
      break;
    }
    cpu_relax();
  }
  if (!done) {
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    for (;;) {
      const uint32_t cur = __atomic_load_n(word, __ATOMIC_SEQ_CST);
      if (cur == want) {
        result = 0;
        break;
      }
      if (__atomic_load_n(stop, __ATOMIC_SEQ_CST) != 0) {
        result = 2;
        break;
      }
      const uint64_t now = monotonic_ns();
      if (now >= limit) {
        result = 1;
        break;
      }
      int64_t slice = (int64_t)(limit - now);
      if (slice > 100000000) slice = 100000000;
      futex_wait(word, cur, slice);
    }
    __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
  }
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&view);
  PyBuffer_Release(&stop_view);
  return PyLong_FromLong(result);
}

PyDoc_STRVAR(monotonic_ns_doc, "monotonic_ns() -> int\n\nCLOCK_MONOTONIC in nanoseconds (the daemon's clock).");
static PyObject* py_monotonic_ns(PyObject* self, PyObject* unused) {
  return PyLong_FromUnsignedLongLong(monotonic_ns());
}

static PyMethodDef methods[] = {
    {"load32", py_load32, METH_VARARGS, load32_doc},
    {"store32", py_store32, METH_VARARGS, store32_doc},
    {"add32", py_add32, METH_VARARGS, add32_doc},
    {"load64", py_load64, METH_VARARGS, load64_doc},
    {"store64", py_store64, METH_VARARGS, store64_doc},
    {"futex_wake", py_futex_wake, METH_VARARGS, futex_wake_doc},
    {"ring", py_ring, METH_VARARGS, ring_doc},
    {"wait_equal32", py_wait_equal32, METH_VARARGS, wait_equal32_doc},
    {"monotonic_ns", py_monotonic_ns, METH_NOARGS, monotonic_ns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "spex._native",
    "Atomics and futex wait/wake on spexd's shared segments (see proto/contract/layout.h).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
