# gcoll/torch.py: a PyTorch DDP communication hook running each bucket through gcoll.
"""DistributedDataParallel communication hook over gcoll's compressed allreduce.

    import gcoll.torch as gt
    model = DDP(net)                                   # gloo process group, as usual
    state = gt.GcollHookState("topk:density=0.01")     # joins gcoll beside the process group
    model.register_comm_hook(state, gt.comm_hook)

DDP hands the hook one flattened gradient bucket at a time, as backward produces them.
The hook starts gcoll_icompressed_allreduce on it (averaging over ranks, error feedback
kept per bucket across steps) and returns a torch.futures.Future at once; a helper thread
completes the future when gcoll's request finishes, so the reduction runs on gcoll's
progress thread while backward goes on. Buckets that are not float32 take gcoll's dense
allreduce.

gcoll has its own communicator: rank and size are the process group's, the rendezvous
address is root=, else GCOLL_ROOT, else MASTER_ADDR with MASTER_PORT + 1.
"""

import os
import queue
import threading

import torch
import torch.distributed as dist

from . import _lib
from .comm import Comm
from .compress import Compressor, TensorState

# ---- the torch.distributed backend "gcoll" ------------------------------------------
# The C++ extension is built by configure when it finds libtorch; without it the backend
# is still registered, so that init_process_group("gcoll") says why it cannot run.
try:
    from . import _torch_backend
except ImportError as _e:  # not built, or built against another torch
    _torch_backend = None
    _backend_error = str(_e)


def _create_backend(store, rank, size, timeout):
    """torch.distributed's creator of the "gcoll" backend (register_backend's func)."""
    if _torch_backend is None:
        raise RuntimeError("gcoll backend: the C++ extension gcoll._torch_backend is not "
                           "available (%s); build it with ./configure (which needs "
                           "libtorch-dev, pybind11-dev) and make" % _backend_error)
    return _torch_backend.ProcessGroupGcoll(store, rank, size, timeout)


def backend_available():
    """Whether the "gcoll" torch.distributed backend can be created here."""
    return _torch_backend is not None


if "GCOLL" not in dist.Backend._plugins:
    dist.Backend.register_backend("gcoll", _create_backend)


def default_root():
    """gcoll's rendezvous address for a job launched for torch.distributed: GCOLL_ROOT if
    set, else MASTER_ADDR:(MASTER_PORT + 1)."""
    root = os.environ.get("GCOLL_ROOT")
    if root:
        return root
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return "%s:%d" % (addr, int(port) + 1)
    raise ValueError("gcoll.torch: no rendezvous address: pass root='host:port', or set "
                     "GCOLL_ROOT, or MASTER_ADDR and MASTER_PORT (gcoll then uses "
                     "MASTER_PORT + 1)")


class GcollHookState:
    """State of gcoll's DDP hook: the gcoll communicator, the compressor, and one
    gcoll.TensorState per DDP bucket (keyed by bucket index, kept across steps; remade if
    the bucket's size changes, as when DDP rebuilds its buckets after the first step).

    spec: the compressor ("topk:density=0.01", "dgc:density=0.01,momentum=0.9", "sign",
    "none", ... as GCOLL_COMPRESSOR). comm: a gcoll.Comm to use; by default one is created
    from the process group's rank and size and root (see default_root()). op: "avg" (as
    DDP) or "sum". close() (or the interpreter's exit) releases everything.
    """

    def __init__(self, spec="topk:density=0.01", comm=None, root=None, op="avg",
                 process_group=None):
        if op not in ("avg", "sum"):
            raise ValueError("GcollHookState: op must be 'avg' or 'sum', got %r" % (op,))
        self.compressor = Compressor(spec)
        self.op = op
        self._own_comm = comm is None
        if comm is None:
            if not dist.is_initialized():
                raise RuntimeError("GcollHookState: call torch.distributed.init_process_group "
                                   "first, or pass comm=gcoll.Comm(...)")
            comm = Comm(size=dist.get_world_size(process_group),
                        rank=dist.get_rank(process_group),
                        root=root if root is not None else default_root())
        self.comm = comm
        self.states = {}
        self.buckets_launched = 0
        self._pending = queue.Queue()
        self._thread = None

    @property
    def spec(self):
        return self.compressor.spec

    def bucket_state(self, index, count):
        """The TensorState of DDP bucket index, made (again) for count elements."""
        st = self.states.get(index)
        if st is None or st.count != count:
            if st is not None:
                st.close()
            st = self.states[index] = TensorState(self.compressor, count)
        return st

    def counters(self):
        """gcoll's counters of this state's communicator (bytes_sent, ...)."""
        return self.comm.counters()

    # A helper thread waits for the requests in the order they were started (gcoll runs
    # them in that order) and completes their futures; it sleeps inside gcoll_wait.
    def _complete_later(self, req, fut):
        if self._thread is None:
            self._thread = threading.Thread(target=self._completer, name="gcoll-hook",
                                            daemon=True)
            self._thread.start()
        self._pending.put((req, fut))

    def _completer(self):
        while True:
            item = self._pending.get()
            if item is None:
                return
            req, fut = item
            try:
                result = req.wait()
            except Exception as e:  # GcollError, delivered to DDP through the future
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def close(self):
        """Waits for the buckets in flight, frees the states and, if this state created
        it, the communicator."""
        if self._thread is not None:
            self._pending.put(None)
            self._thread.join()
            self._thread = None
        for st in self.states.values():
            st.close()
        self.states.clear()
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None

    # DDP pickles hook states only for its own checkpointing helpers; ours holds C handles.
    def __getstate__(self):
        raise TypeError("GcollHookState holds a live communicator and cannot be pickled")


def comm_hook(state, bucket):
    """DDP communication hook: register with model.register_comm_hook(state, comm_hook).
    Returns a torch.futures.Future holding the bucket's reduced (averaged) gradient."""
    buf = bucket.buffer()
    fut = torch.futures.Future()
    if buf.dtype == torch.float32:
        ts = state.bucket_state(bucket.index(), buf.numel())
        req = state.comm.icompressed_allreduce(ts, buf, torch.empty_like(buf), op=state.op)
    else:
        req = state.comm.iallreduce(buf, torch.empty_like(buf), op=state.op)
    state.buckets_launched += 1
    state._complete_later(req, fut)
    return fut


def register(model, spec="topk:density=0.01", **kwargs):
    """Creates a GcollHookState(spec, **kwargs), registers comm_hook on the DDP model and
    returns the state."""
    state = GcollHookState(spec, **kwargs)
    model.register_comm_hook(state, comm_hook)
    return state


GcollError = _lib.GcollError
__all__ = ["GcollHookState", "comm_hook", "register", "default_root", "GcollError",
           "backend_available"]
