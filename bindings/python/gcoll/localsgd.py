# gcoll/localsgd.py: local SGD with compressed deltas (gcoll_localsgd_*) for PyTorch or NumPy.
"""Local SGD with compressed model deltas and error feedback (Qsparse-local-SGD, Basu et
al. 2019) over gcoll's compressed allreduce; see docs/local-sgd.md.

    import gcoll
    from gcoll.localsgd import LocalSGD
    comm = gcoll.Comm()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    lsgd = LocalSGD(model.parameters(), comm, local_steps=4,
                    compressor="topk:density=0.01", warmup_steps=200)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()
        lsgd.step()                      # every 4th call: average the compressed deltas
    lsgd.sync()                          # the same model on every rank, for evaluation
    torch.save(lsgd.state_dict(), "lsgd.pt")

Parameters must be contiguous float32 CPU tensors (or numpy arrays), equal on every rank
when the object is created (broadcast them first); they are updated in place. Momentum
buffers stay with the optimizer: momentum="local" (default) leaves them alone, "reset"
zeroes and "average" averages (dense allreduce) every buffer found in optimizer.state at
each sync, which needs optimizer=.
"""

import ctypes

from . import _lib
from ._buffers import as_buf
from ._lib import lib

_MOMENTUM = {"local": 0, "reset": 1, "average": 2}


class _Config(ctypes.Structure):
    _fields_ = [("local_steps", ctypes.c_int), ("warmup_steps", ctypes.c_int),
                ("compressor", ctypes.c_char_p), ("momentum", ctypes.c_int)]


class _Info(ctypes.Structure):
    _fields_ = [("steps", ctypes.c_uint64), ("syncs", ctypes.c_uint64),
                ("period", ctypes.c_int), ("since_sync", ctypes.c_int),
                ("ntensors", ctypes.c_int)]


_p, _st = ctypes.c_void_p, ctypes.c_int
for _name, _res, _args in [
        ("gcoll_localsgd_create", _st, [_p, ctypes.POINTER(_Config), ctypes.POINTER(_p)]),
        ("gcoll_localsgd_add_tensor", _st, [_p, _p, _p, ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_int)]),
        ("gcoll_localsgd_step", _st, [_p, ctypes.POINTER(ctypes.c_int)]),
        ("gcoll_localsgd_istep", _st, [_p, ctypes.POINTER(ctypes.c_int)]),
        ("gcoll_localsgd_wait", _st, [_p]),
        ("gcoll_localsgd_sync", _st, [_p]),
        ("gcoll_localsgd_info", _st, [_p, ctypes.POINTER(_Info)]),
        ("gcoll_localsgd_get_tensor", _st, [_p, ctypes.c_int, _p, _p]),
        ("gcoll_localsgd_set_tensor", _st, [_p, ctypes.c_int, _p, _p]),
        ("gcoll_localsgd_set_counters", _st, [_p, ctypes.c_uint64, ctypes.c_uint64,
                                              ctypes.c_int]),
        ("gcoll_localsgd_destroy", None, [_p])]:
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def _empty_like(x):
    if hasattr(x, "detach"):  # torch
        return x.detach().clone()
    return x.copy()


class LocalSGD:
    """gcoll_localsgd over params (an iterable of tensors, e.g. model.parameters()).

    local_steps: H, sync every H-th step(); warmup_steps: steps that sync every step first
    (PyTorch's PostLocalSGD); compressor: codec spec of the delta; momentum: "local",
    "reset" or "average" (the latter two act on optimizer.state[p]["momentum_buffer"])."""

    def __init__(self, params, comm, local_steps=1, compressor="none", warmup_steps=0,
                 momentum="local", optimizer=None):
        if momentum not in _MOMENTUM:
            raise ValueError("momentum must be one of %s, got %r" % (sorted(_MOMENTUM), momentum))
        if momentum != "local" and optimizer is None:
            raise ValueError("momentum=%r needs optimizer= (its buffers live there)" % momentum)
        self._comm = comm
        self._params = [p for p in params]
        self._bufs = [as_buf(p.data if hasattr(p, "data") and hasattr(p, "detach") else p,
                             "LocalSGD parameter", writable=True, dtypes={_lib.FLOAT32})
                      for p in self._params]
        self._momentum = momentum
        self._optimizer = optimizer
        self.config = {"local_steps": int(local_steps), "warmup_steps": int(warmup_steps),
                       "compressor": compressor, "momentum": momentum}
        # the C object handles the delta; momentum stays here, with the optimizer
        cfg = _Config(int(local_steps), int(warmup_steps), compressor.encode(), 0)
        h = ctypes.c_void_p()
        _lib.check(lib.gcoll_localsgd_create(comm._live(), ctypes.byref(cfg), ctypes.byref(h)),
                   "gcoll_localsgd_create", comm._live())
        self._h = h
        for b in self._bufs:
            _lib.check(lib.gcoll_localsgd_add_tensor(self._h, b.ptr, None, b.count, None),
                       "gcoll_localsgd_add_tensor", comm._live())

    def _live(self):
        if self._h is None:
            raise ValueError("LocalSGD is closed")
        return self._h

    def _after_sync(self):
        if self._momentum == "local":
            return
        for p in self._params:
            st = self._optimizer.state.get(p, {})
            buf = st.get("momentum_buffer")
            if buf is None:
                continue
            if self._momentum == "reset":
                buf.zero_()
            else:
                self._comm.allreduce(buf, op="avg")

    def step(self):
        """Call after each optimizer step; returns True when this call synchronised."""
        synced = ctypes.c_int(0)
        _lib.check(lib.gcoll_localsgd_step(self._live(), ctypes.byref(synced)),
                   "gcoll_localsgd_step", self._comm._live())
        if synced.value:
            self._after_sync()
        return bool(synced.value)

    def sync(self):
        """Synchronises now (before evaluating or saving). Collective."""
        _lib.check(lib.gcoll_localsgd_sync(self._live()), "gcoll_localsgd_sync",
                   self._comm._live())
        self._after_sync()

    def info(self):
        i = _Info()
        _lib.check(lib.gcoll_localsgd_info(self._live(), ctypes.byref(i)), "gcoll_localsgd_info")
        return {"steps": i.steps, "syncs": i.syncs, "period": i.period,
                "since_sync": i.since_sync}

    def state_dict(self):
        """The synced model, the residuals and the counters (the optimizer's state is the
        optimizer's own state_dict)."""
        synced, residual = [], []
        for i, p in enumerate(self._params):
            s, r = _empty_like(p.data if hasattr(p, "detach") else p), \
                _empty_like(p.data if hasattr(p, "detach") else p)
            bs, br = as_buf(s, "synced", writable=True), as_buf(r, "residual", writable=True)
            _lib.check(lib.gcoll_localsgd_get_tensor(self._live(), i, bs.ptr, br.ptr),
                       "gcoll_localsgd_get_tensor")
            synced.append(s)
            residual.append(r)
        return {"config": dict(self.config), "info": self.info(), "synced": synced,
                "residual": residual}

    def load_state_dict(self, sd):
        """Restores what state_dict() returned, on an object with the same parameters."""
        if len(sd["synced"]) != len(self._params) or len(sd["residual"]) != len(self._params):
            raise ValueError("state_dict holds %d tensors, this LocalSGD %d"
                             % (len(sd["synced"]), len(self._params)))
        for i, (s, r) in enumerate(zip(sd["synced"], sd["residual"])):
            bs, br = as_buf(s, "synced", dtypes={_lib.FLOAT32}), \
                as_buf(r, "residual", dtypes={_lib.FLOAT32})
            if bs.count != self._bufs[i].count or br.count != self._bufs[i].count:
                raise ValueError("state_dict tensor %d has the wrong size" % i)
            _lib.check(lib.gcoll_localsgd_set_tensor(self._live(), i, bs.ptr, br.ptr),
                       "gcoll_localsgd_set_tensor", self._comm._live())
        inf = sd["info"]
        _lib.check(lib.gcoll_localsgd_set_counters(self._live(), inf["steps"], inf["syncs"],
                                                   inf["since_sync"]),
                   "gcoll_localsgd_set_counters", self._comm._live())

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            lib.gcoll_localsgd_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
