# comm.py: the communicator and its collectives on NumPy arrays and torch CPU tensors.
"""gcoll.Comm wraps gcoll_comm_t. Blocking calls release the GIL while they run (ctypes
does), nonblocking ones return a Request that keeps its arrays alive until it completes."""

import contextlib
import ctypes
import threading
import weakref

from . import _lib
from ._buffers import DTYPE_NAMES, as_buf, as_index_buf
from ._lib import FLOAT32, lib


def _op(op):
    if isinstance(op, str):
        try:
            return _lib.OPS[op.lower()]
        except KeyError:
            raise ValueError("unknown op %r (sum, avg, min, max, prod, band, bor, bxor)"
                             % op) from None
    if op in _lib.OPS.values():
        return op
    raise ValueError("unknown op %r (sum, avg, min, max, prod, band, bor, bxor)" % (op,))


def _same(what, a, b, bname):
    if a.count != b.count:
        raise ValueError("%s: %s has %d elements, the input %d" % (what, bname, b.count, a.count))
    if a.dtype != b.dtype:
        raise TypeError("%s: %s is %s, the input %s" % (what, bname, DTYPE_NAMES[b.dtype],
                                                         DTYPE_NAMES[a.dtype]))


class Request:
    """A nonblocking collective in flight. wait() returns its result (the output array, or
    None for a barrier) or raises GcollError; test() says whether it has completed. The
    arrays it uses must not be touched until then. A Request may be waited on from another
    thread than the one that started it (the torch hook does)."""

    def __init__(self, comm, handle, what, result, keep):
        self._comm = comm
        self._h = handle
        self._what = what
        self._result = result
        self._keep = keep
        self._status = None
        self._lock = threading.Lock()

    def test(self):
        """True once the operation has completed (successfully or not). Never blocks."""
        with self._lock:
            if self._h is None:
                return True
            done = ctypes.c_int(0)
            _lib.check(lib.gcoll_test(self._h, ctypes.byref(done)), "gcoll_test")
            return bool(done.value)

    @property
    def done(self):
        return self.test()

    def _finish(self):
        with self._lock:
            if self._h is not None:
                h, self._h = self._h, None
                self._status = lib.gcoll_wait(h)
                self._keep = None
                self._comm._requests.discard(self)
        return self._status

    def wait(self):
        """Blocks until the operation completes; returns its result or raises GcollError."""
        st = self._finish()
        _lib.check(st, self._what, self._comm._ptr)
        return self._result

    def __del__(self):
        # The C side reads and writes the arrays until the request completes.
        if getattr(self, "_h", None) is not None:
            self._finish()


class Comm:
    """A gcoll communicator.

    Comm() joins from the environment (GCOLL_RANK/GCOLL_SIZE or the MPI, Slurm or PMI
    variables, GCOLL_ROOT); Comm(size=, rank=, root="host:port") joins explicitly (root
    None reads GCOLL_ROOT). Collective over every rank: blocks until all have joined or
    GCOLL_TIMEOUT_MS passes. Use one thread at a time per communicator, and issue the
    collectives in the same order on every rank. close() (or a with block) leaves.
    """

    def __init__(self, size=None, rank=None, root=None):
        self._ptr = None
        self._group_keep = {}  # thread id -> what the calls of its open group() use
        self._requests = weakref.WeakSet()
        h = ctypes.c_void_p()
        if size is None and rank is None:
            if root is not None:
                raise ValueError("Comm: root given without size and rank")
            st = lib.gcoll_comm_init(ctypes.byref(h))
            what = "gcoll_comm_init"
        else:
            if size is None or rank is None:
                raise ValueError("Comm: give both size and rank, or neither")
            if not (0 <= rank < size):
                raise ValueError("Comm: rank %d out of range for size %d" % (rank, size))
            st = lib.gcoll_comm_init_rank(int(size), int(rank),
                                          root.encode() if root is not None else None,
                                          ctypes.byref(h))
            what = "gcoll_comm_init_rank"
        # Without a communicator the reason is this thread's gcoll_last_error().
        _lib.check(st, what)
        self._ptr = h.value

    @classmethod
    def from_env(cls):
        return cls()

    # -- identity and state ------------------------------------------------------------
    def _live(self):
        if not self._ptr:
            raise ValueError("gcoll communicator is closed")
        return self._ptr

    @property
    def rank(self):
        return lib.gcoll_comm_rank(self._live())

    @property
    def size(self):
        return lib.gcoll_comm_size(self._live())

    @property
    def transport(self):
        return lib.gcoll_comm_transport(self._live()).decode()

    @property
    def last_error(self):
        """gcoll_comm_last_error(): the detailed message of the first failure, "" if none."""
        return lib.gcoll_comm_last_error(self._live()).decode(errors="replace")

    def counters(self):
        """A gcoll.Counters: ops, bytes_raw, bytes_sent, bytes_received, ns_compress,
        ns_wire, ns_total, cumulative since init."""
        c = _lib.Counters()
        _lib.check(lib.gcoll_comm_counters(self._live(), ctypes.byref(c)),
                   "gcoll_comm_counters", self._ptr)
        return c

    def abort(self):
        """Breaks the communicator: running and queued operations fail, peers are told.
        May be called from any thread. close() is still needed."""
        lib.gcoll_comm_abort(self._live())

    def close(self):
        """Waits for the operations in flight, then destroys the communicator. Returns
        gcoll_comm_destroy's status (0, or the first error of a queued operation) rather
        than raising: the error was already raised by the call that failed, and a with
        block must not hide it. Idempotent."""
        if not self._ptr:
            return _lib.OK
        for req in list(self._requests):
            req._finish()
        ptr, self._ptr = self._ptr, None
        return lib.gcoll_comm_destroy(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None):
            self.close()

    def __repr__(self):
        if not self._ptr:
            return "<gcoll.Comm closed>"
        return "<gcoll.Comm rank %d of %d over %s>" % (self.rank, self.size, self.transport)

    # -- plumbing ----------------------------------------------------------------------
    def _run(self, what, fn, args, blocking, result, keep):
        ptr = self._live()
        if blocking:
            _lib.check(fn(ptr, *args), what, ptr)
            group = self._group_keep.get(threading.get_ident())
            if group is not None:  # queued, not run: the arrays must outlive the group
                group.append((args, keep, result))
            return result
        h = ctypes.c_void_p()
        _lib.check(fn(ptr, *args, ctypes.byref(h)), what, ptr)
        req = Request(self, h.value, what, result, keep)
        self._requests.add(req)
        group = self._group_keep.get(threading.get_ident())
        if group is not None:
            group.append((args, keep, result))
        return req

    # -- dense collectives -------------------------------------------------------------
    def _allreduce(self, blocking, send, recv, op):
        what = "gcoll_allreduce"
        s = as_buf(send, what + " sendbuf", writable=recv is None)
        r = s if recv is None else as_buf(recv, what + " recvbuf", writable=True)
        _same(what, s, r, "recvbuf")
        fn = lib.gcoll_allreduce if blocking else lib.gcoll_iallreduce
        return self._run(what, fn, (s.ptr, r.ptr, s.count, s.dtype, _op(op)), blocking,
                         r.obj, (s.obj, r.obj))

    def allreduce(self, send, recv=None, op="sum"):
        """recv = op over ranks of send (in place when recv is None); returns recv. op is
        "sum", "avg", "min", "max" or "prod". Any gcoll dtype. Blocks."""
        return self._allreduce(True, send, recv, op)

    def iallreduce(self, send, recv=None, op="sum"):
        """Nonblocking allreduce: returns a Request whose wait() gives recv."""
        return self._allreduce(False, send, recv, op)

    def _check_root(self, root):
        if not (0 <= root < self.size):
            raise ValueError("broadcast: root %d out of range for size %d" % (root, self.size))

    def broadcast(self, buf, root=0):
        """Copies root's buf to every rank's buf; returns buf. Blocks."""
        self._check_root(root)
        b = as_buf(buf, "gcoll_broadcast buf", writable=True)
        return self._run("gcoll_broadcast", lib.gcoll_broadcast, (b.ptr, b.count, b.dtype, root),
                         True, b.obj, None)

    def ibroadcast(self, buf, root=0):
        self._check_root(root)
        b = as_buf(buf, "gcoll_ibroadcast buf", writable=True)
        return self._run("gcoll_broadcast", lib.gcoll_ibroadcast, (b.ptr, b.count, b.dtype, root),
                         False, b.obj, (b.obj,))

    def barrier(self):
        """Returns once every rank has entered the barrier."""
        self._run("gcoll_barrier", lib.gcoll_barrier, (), True, None, None)

    def ibarrier(self):
        return self._run("gcoll_barrier", lib.gcoll_ibarrier, (), False, None, ())

    def allgather(self, send, recv):
        """recv (size * len(send) elements) receives every rank's send in rank order."""
        what = "gcoll_allgather"
        s = as_buf(send, what + " sendbuf")
        r = as_buf(recv, what + " recvbuf", writable=True)
        if r.count != s.count * self.size or r.dtype != s.dtype:
            raise ValueError("%s: recvbuf must hold size * %d = %d elements of %s" % (
                what, s.count, s.count * self.size, DTYPE_NAMES[s.dtype]))
        return self._run(what, lib.gcoll_allgather, (s.ptr, r.ptr, s.count, s.dtype), True,
                         r.obj, None)

    # -- rooted collectives ------------------------------------------------------------
    def _root_ok(self, what, root):
        if not (0 <= root < self.size):
            raise ValueError("%s: root %d out of range for size %d" % (what, root, self.size))

    def _reduce(self, blocking, send, recv, op, root):
        what = "gcoll_reduce"
        self._root_ok(what, root)
        s = as_buf(send, what + " sendbuf", writable=recv is None and self.rank == root)
        if self.rank == root:
            r = s if recv is None else as_buf(recv, what + " recvbuf", writable=True)
            _same(what, s, r, "recvbuf")
        else:
            r = None if recv is None else as_buf(recv, what + " recvbuf", writable=True)
        rptr, robj = (r.ptr, r.obj) if r is not None else (None, None)
        fn = lib.gcoll_reduce if blocking else lib.gcoll_ireduce
        return self._run(what, fn, (s.ptr, rptr, s.count, s.dtype, _op(op), root), blocking,
                         robj, (s.obj, robj))

    def reduce(self, send, recv=None, op="sum", root=0):
        """root's recv = op over ranks of send (in place at root when recv is None);
        returns recv at root, None elsewhere (other ranks may pass recv=None). Blocks."""
        return self._reduce(True, send, recv, op, root)

    def ireduce(self, send, recv=None, op="sum", root=0):
        """Nonblocking reduce: a Request whose wait() gives recv (None off the root)."""
        return self._reduce(False, send, recv, op, root)

    def _gather(self, blocking, send, recv, root):
        what = "gcoll_gather"
        self._root_ok(what, root)
        s = as_buf(send, what + " sendbuf")
        r = None
        if self.rank == root or recv is not None:
            r = as_buf(recv, what + " recvbuf", writable=True)
            if r.count != s.count * self.size or r.dtype != s.dtype:
                raise ValueError("%s: recvbuf must hold size * %d = %d elements of %s" % (
                    what, s.count, s.count * self.size, DTYPE_NAMES[s.dtype]))
        rptr, robj = (r.ptr, r.obj) if r is not None else (None, None)
        fn = lib.gcoll_gather if blocking else lib.gcoll_igather
        return self._run(what, fn, (s.ptr, rptr, s.count, s.dtype, root), blocking, robj,
                         (s.obj, robj))

    def gather(self, send, recv=None, root=0):
        """root's recv (size * len(send) elements) receives every rank's send in rank
        order; returns recv at root. Other ranks may pass recv=None. Blocks."""
        return self._gather(True, send, recv, root)

    def igather(self, send, recv=None, root=0):
        return self._gather(False, send, recv, root)

    def _scatter(self, blocking, send, recv, root):
        what = "gcoll_scatter"
        self._root_ok(what, root)
        r = as_buf(recv, what + " recvbuf", writable=True)
        s = None
        if self.rank == root or send is not None:
            s = as_buf(send, what + " sendbuf")
            if s.count != r.count * self.size or s.dtype != r.dtype:
                raise ValueError("%s: sendbuf must hold size * %d = %d elements of %s" % (
                    what, r.count, r.count * self.size, DTYPE_NAMES[r.dtype]))
        sptr, sobj = (s.ptr, s.obj) if s is not None else (None, None)
        fn = lib.gcoll_scatter if blocking else lib.gcoll_iscatter
        return self._run(what, fn, (sptr, r.ptr, r.count, r.dtype, root), blocking, r.obj,
                         (sobj, r.obj))

    def scatter(self, send, recv, root=0):
        """Block i of root's send (size * len(recv) elements, rank order) lands in rank i's
        recv; returns recv. Other ranks may pass send=None. Blocks."""
        return self._scatter(True, send, recv, root)

    def iscatter(self, send, recv, root=0):
        return self._scatter(False, send, recv, root)

    # -- point-to-point and groups -----------------------------------------------------
    def _p2p(self, what, fn, blocking, buf, peer, recv):
        if not (0 <= peer < self.size):
            raise ValueError("%s: peer %d out of range for size %d" % (what, peer, self.size))
        b = as_buf(buf, what + " buf", writable=recv)
        return self._run(what, fn, (b.ptr, b.count, b.dtype, peer), blocking,
                         b.obj if recv else None, (b.obj,))

    def send(self, buf, peer):
        """Sends buf to rank peer; the n-th send to a peer meets its n-th recv from this
        rank (gcoll.h, "Point-to-point"). Blocks until buf may be reused."""
        return self._p2p("gcoll_send", lib.gcoll_send, True, buf, peer, False)

    def recv(self, buf, peer):
        """Receives from rank peer into buf (the sender's count and dtype); returns buf."""
        return self._p2p("gcoll_recv", lib.gcoll_recv, True, buf, peer, True)

    def recv_any(self, buf):
        """Receives into buf from whichever rank's next message came first (gcoll_recv_any:
        each pair's order is kept); returns that rank. Not inside comm.group()."""
        what = "gcoll_recv_any"
        b = as_buf(buf, what + " buf", writable=True)
        src = ctypes.c_int(-1)
        self._run(what, lib.gcoll_recv_any, (b.ptr, b.count, b.dtype, ctypes.byref(src)), True,
                  None, (b.obj,))
        return src.value

    def isend(self, buf, peer):
        """Nonblocking send: a Request; buf must stay unchanged until it completes."""
        return self._p2p("gcoll_isend", lib.gcoll_isend, False, buf, peer, False)

    def irecv(self, buf, peer):
        """Nonblocking receive: a Request whose wait() gives buf."""
        return self._p2p("gcoll_irecv", lib.gcoll_irecv, False, buf, peer, True)

    @contextlib.contextmanager
    def group(self):
        """with comm.group(): ... runs the calls made inside (from this thread) together
        when the block ends, as gcoll_group_start/end: sends and receives posted at once,
        small allreduces fused. Calls inside return at once (blocking ones too); their
        arrays hold the results once the block has ended."""
        ptr = self._live()
        tid = threading.get_ident()
        _lib.check(lib.gcoll_group_start(ptr), "gcoll_group_start", ptr)
        outer = tid in self._group_keep
        if not outer:
            self._group_keep[tid] = []
        try:
            yield self
        finally:
            try:
                _lib.check(lib.gcoll_group_end(ptr), "gcoll_group_end", ptr)
            finally:
                if not outer:  # the group ran (or failed): its arrays may go
                    del self._group_keep[tid]

    # -- sparse and compressed ---------------------------------------------------------
    def _sparse(self, blocking, idx, val, out, op):
        what = "gcoll_sparse_allreduce"
        i = as_index_buf(idx, what + " idx")
        v = as_buf(val, what + " val", dtypes={FLOAT32})
        o = as_buf(out, what + " out", writable=True, dtypes={FLOAT32})
        if i.count != v.count:
            raise ValueError("%s: %d indices but %d values" % (what, i.count, v.count))
        fn = lib.gcoll_sparse_allreduce if blocking else lib.gcoll_isparse_allreduce
        # The C call copies the pairs at once; out is kept for a nonblocking call.
        return self._run(what, fn, (i.ptr, v.ptr, i.count, o.count, o.ptr, _op(op)), blocking,
                         o.obj, (i.obj, v.obj, o.obj))

    def sparse_allreduce(self, idx, val, out, op="sum"):
        """out (float32, its length is the dense size) = sum ("sum") or average ("avg") over
        ranks of each rank's (idx[i], val[i]) pairs; repeated indices add. idx: uint32 or
        int32, val: float32. Returns out. Blocks."""
        return self._sparse(True, idx, val, out, op)

    def isparse_allreduce(self, idx, val, out, op="sum"):
        return self._sparse(False, idx, val, out, op)

    def _compressed(self, blocking, state, grad, out, op):
        what = "gcoll_compressed_allreduce"
        from .compress import TensorState

        if not isinstance(state, TensorState):
            raise TypeError("%s: state must be a gcoll.TensorState, got %s"
                            % (what, type(state).__name__))
        g = as_buf(grad, what + " grad", writable=out is None, dtypes={FLOAT32})
        o = g if out is None else as_buf(out, what + " out", writable=True, dtypes={FLOAT32})
        _same(what, g, o, "out")
        if g.count != state.count:
            raise ValueError("%s: grad has %d elements, the state %d" % (what, g.count,
                                                                          state.count))
        fn = lib.gcoll_compressed_allreduce if blocking else lib.gcoll_icompressed_allreduce
        return self._run(what, fn, (state._live(), g.ptr, o.ptr, g.count, _op(op)), blocking,
                         o.obj, (g.obj, o.obj, state))

    def compressed_allreduce(self, state, grad, out=None, op="sum"):
        """out = sum or average over ranks of grad passed through state's compressor with
        error feedback (in place when out is None); state's step advances. float32 only.
        Every rank passes a state of the same spec, size and step. Returns out. Blocks."""
        return self._compressed(True, state, grad, out, op)

    def icompressed_allreduce(self, state, grad, out=None, op="sum"):
        """Nonblocking compressed allreduce: a Request whose wait() gives out. state, grad
        and out must not be used until it completes."""
        return self._compressed(False, state, grad, out, op)


    def shard_range(self, count):
        """(offset, len) of this rank's shard of a count-element tensor, as
        gcoll_shard_range gives it (a balanced split, rank order)."""
        off, n = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.gcoll_shard_range(self._live(), int(count), ctypes.byref(off), ctypes.byref(n))
        return off.value, n.value

    def compressed_reduce_scatter(self, state, grad, shard, op="sum"):
        """shard = this rank's part (shard_range(len(grad))) of the sum or average over
        ranks of grad passed through state's compressor with error feedback (the residual
        covers all of grad: what this rank did not send); state's step advances. float32
        only; every rank passes a state of the same spec, size and step. Returns shard.
        Blocks (gcoll_compressed_reduce_scatter)."""
        what = "gcoll_compressed_reduce_scatter"
        from .compress import TensorState

        if not isinstance(state, TensorState):
            raise TypeError("%s: state must be a gcoll.TensorState, got %s"
                            % (what, type(state).__name__))
        g = as_buf(grad, what + " grad", dtypes={FLOAT32})
        o = as_buf(shard, what + " shard", writable=True, dtypes={FLOAT32})
        if g.count != state.count:
            raise ValueError("%s: grad has %d elements, the state %d" % (what, g.count,
                                                                          state.count))
        want = self.shard_range(g.count)[1]
        if o.count != want:
            raise ValueError("%s: shard has %d elements, this rank's shard of %d is %d"
                             % (what, o.count, g.count, want))
        return self._run(what, lib.gcoll_compressed_reduce_scatter,
                         (state._live(), g.ptr, o.ptr, g.count, _op(op)), True, o.obj, None)
