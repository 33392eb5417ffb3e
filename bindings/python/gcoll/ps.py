# gcoll/ps.py: the bounded-staleness parameter server (gcoll_ps_*) for PyTorch or NumPy.
"""Asynchronous SGD with SSP's staleness bound over gcoll's in-job sharded parameter
server; see docs/local-sgd.md.

    from gcoll.ps import ParameterServer
    ps = ParameterServer(model.parameters(), comm, staleness=2, lr=0.05,
                         compressor="topk:density=0.1")
    ps.start()                     # no other gcoll call on comm until finish()
    for x, y in loader:
        ps.pull()                  # the params hold the model (SSP may wait here)
        loss_fn(model(x), y).backward()
        ps.push([p.grad for p in model.parameters()])
        model.zero_grad()
    ps.finish()                    # the final model in every rank's params
    print(ps.stats())

Parameters and gradients must be contiguous float32 CPU tensors (or numpy arrays), the
parameters equal on every rank at creation.
"""

import ctypes

from . import _lib
from ._buffers import as_buf
from ._lib import lib


class _Config(ctypes.Structure):
    _fields_ = [("staleness", ctypes.c_int), ("lr", ctypes.c_float),
                ("compressor", ctypes.c_char_p), ("weighting", ctypes.c_int),
                ("pull_compressor", ctypes.c_char_p), ("dc_lambda", ctypes.c_float),
                ("prefetch", ctypes.c_int)]


class _Stats(ctypes.Structure):
    _fields_ = [("clock", ctypes.c_uint64), ("max_gap", ctypes.c_uint64),
                ("applied", ctypes.c_uint64), ("mean_staleness", ctypes.c_double),
                ("hist", ctypes.c_uint64 * 9), ("wait_s", ctypes.c_double)]


_p, _st = ctypes.c_void_p, ctypes.c_int
for _name, _res, _args in [
        ("gcoll_ps_create", _st, [_p, ctypes.POINTER(_Config), ctypes.POINTER(_p)]),
        ("gcoll_ps_add_tensor", _st, [_p, _p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]),
        ("gcoll_ps_start", _st, [_p]),
        ("gcoll_ps_pull", _st, [_p]),
        ("gcoll_ps_push", _st, [_p, ctypes.POINTER(_p)]),
        ("gcoll_ps_finish", _st, [_p]),
        ("gcoll_ps_stats", _st, [_p, ctypes.POINTER(_Stats)]),
        ("gcoll_ps_destroy", None, [_p])]:
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

_WEIGHTING = {"inverse": 0, "none": 1}


def _data(x):
    return x.data if hasattr(x, "detach") else x


class ParameterServer:
    """gcoll_ps over params. staleness: SSP's S (0: synchronous); lr: the owners' step;
    compressor: codec of the pushes; weighting: "inverse" (1/(1+tau)) or "none";
    pull_compressor: codec of the pull answers ("none": the dense shard); dc_lambda: DC-ASGD's
    delay compensation (0: off); prefetch: pull installs the model asked for at the previous
    pull and asks for the next at once, so it travels while the worker computes (one clock
    staler, within staleness)."""

    def __init__(self, params, comm, staleness=0, lr=0.01, compressor="none",
                 weighting="inverse", pull_compressor="none", dc_lambda=0.0, prefetch=False):
        if weighting not in _WEIGHTING:
            raise ValueError("weighting must be 'inverse' or 'none', got %r" % weighting)
        self._comm = comm
        self._params = [p for p in params]
        self._bufs = [as_buf(_data(p), "ParameterServer parameter", writable=True,
                             dtypes={_lib.FLOAT32}) for p in self._params]
        cfg = _Config(int(staleness), float(lr), compressor.encode(), _WEIGHTING[weighting],
                      pull_compressor.encode(), float(dc_lambda), 1 if prefetch else 0)
        h = ctypes.c_void_p()
        _lib.check(lib.gcoll_ps_create(comm._live(), ctypes.byref(cfg), ctypes.byref(h)),
                   "gcoll_ps_create", comm._live())
        self._h = h
        for b in self._bufs:
            _lib.check(lib.gcoll_ps_add_tensor(self._h, b.ptr, b.count, None),
                       "gcoll_ps_add_tensor", comm._live())

    def _live(self):
        if self._h is None:
            raise ValueError("ParameterServer is closed")
        return self._h

    def _call(self, what, fn, *args):
        _lib.check(fn(self._live(), *args), what, self._comm._live())

    def start(self):
        self._call("gcoll_ps_start", lib.gcoll_ps_start)

    def pull(self):
        self._call("gcoll_ps_pull", lib.gcoll_ps_pull)

    def push(self, grads):
        grads = list(grads)
        if len(grads) != len(self._bufs):
            raise ValueError("push: %d gradients for %d parameters" % (len(grads), len(self._bufs)))
        bufs = [as_buf(_data(g), "push gradient", dtypes={_lib.FLOAT32}) for g in grads]
        for g, b in zip(bufs, self._bufs):
            if g.count != b.count:
                raise ValueError("push: a gradient of %d elements for a parameter of %d"
                                 % (g.count, b.count))
        arr = (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])
        self._call("gcoll_ps_push", lib.gcoll_ps_push, arr)

    def finish(self):
        self._call("gcoll_ps_finish", lib.gcoll_ps_finish)

    def stats(self):
        s = _Stats()
        _lib.check(lib.gcoll_ps_stats(self._live(), ctypes.byref(s)), "gcoll_ps_stats")
        return {"clock": s.clock, "max_gap": s.max_gap, "applied": s.applied,
                "mean_staleness": s.mean_staleness, "hist": list(s.hist), "wait_s": s.wait_s}

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            lib.gcoll_ps_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
