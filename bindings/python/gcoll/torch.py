# gcoll/torch.py: the torch.distributed backend "gcoll" and a DDP hook over gcoll.
"""PyTorch over gcoll: a torch.distributed backend and a DDP communication hook.

    import gcoll.torch as gt                           # registers the backend "gcoll"
    dist.init_process_group("gcoll", rank=r, world_size=n)   # MASTER_ADDR/MASTER_PORT
    model = DDP(net)                                   # DDP on gcoll alone, or:
    state = gt.register(model, "topk:density=0.01")    # its buckets compressed by gcoll
    torch.save(state.state_dict(), path)               # residuals survive checkpoints

The backend is the C++ extension gcoll._torch_backend (bindings/python/csrc/backend.cpp),
built by configure when it finds libtorch; importing this module registers it either way
(init_process_group then says why it cannot run).

DDP hands the hook one flattened gradient bucket at a time, as backward produces them.
The hook starts gcoll_icompressed_allreduce on it (averaging over ranks, error feedback
kept per set of parameters across steps) and returns a torch.futures.Future at once; a
helper thread completes the future when gcoll's request finishes, so the reduction runs
on gcoll's progress thread while backward goes on. Buckets that are not float32 take
gcoll's dense allreduce. A NaN/Inf on any rank raises on every rank or reaches every
rank's result (nonfinite=), agreed through the process group.

The hook's gcoll communicator is its own: rank and size are the process group's, the
rendezvous address is root=, else GCOLL_ROOT, else MASTER_ADDR with MASTER_PORT + 1.
"""

import os
import queue
import threading

import torch
import torch.distributed as dist

from . import _lib
from .comm import Comm
from .compress import Compressor, TensorState
from .localsgd import LocalSGD  # re-exported: gcoll.torch.LocalSGD (docs/local-sgd.md)
from .ps import ParameterServer  # re-exported: gcoll.torch.ParameterServer

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


class NonFiniteError(RuntimeError):
    """A DDP bucket held NaN or Inf on some rank and the hook runs with nonfinite="raise".
    Raised on every rank, before anything was sent; no state changed. ranks lists the
    ranks whose bucket was not finite."""

    def __init__(self, message, ranks):
        super().__init__(message)
        self.ranks = ranks


def _finite(buf):
    """Whether buf holds no NaN/Inf. A sum is a streaming read (5 ms for 25 MB here;
    torch.isfinite(buf).all() takes 60 ms) and is non-finite whenever buf holds a NaN or
    an Inf; a finite buf whose sum overflows takes the exact test (fp16/bf16 are summed
    in fp32, which their largest values cannot overflow below 10^33 elements)."""
    s = buf.sum() if buf.dtype in (torch.float32, torch.float64) else buf.sum(dtype=torch.float32)
    return bool(torch.isfinite(s)) or bool(torch.isfinite(buf).all())


STATE_DICT_FORMAT = "gcoll-hook-state"
STATE_DICT_VERSION = 1


class _Record:
    """The compression state of one set of parameters reduced together: key (their names
    in bucket order, or ("#bucket", index) without a model), sizes (their element counts),
    index (the DDP bucket index it last ran as), used (the hook step it last ran at)."""

    __slots__ = ("key", "sizes", "ts", "index", "used")

    def __init__(self, key, sizes, ts, index, used):
        self.key, self.sizes, self.ts, self.index, self.used = key, sizes, ts, index, used


class GcollHookState:
    """State of gcoll's DDP hook: the gcoll communicator, the compressor, and one
    gcoll.TensorState per set of parameters DDP reduces together (a bucket), kept across
    steps.

    spec: the compressor ("topk:density=0.01", "dgc:density=0.01,momentum=0.9", "sign",
    "none", ... as GCOLL_COMPRESSOR). comm: a gcoll.Comm to use; by default one is created
    from the process group's rank and size and root (see default_root()). op: "avg" (as
    DDP) or "sum". model: the module (or DDP model) whose parameters DDP reduces; with it
    the states are keyed by the parameters' names, so they follow the parameters through
    DDP's bucket rebuild and into a restored job (register() passes it). nonfinite:
    "raise" (default) or "propagate", what a NaN/Inf gradient on any rank does (see
    docs/python.md). close() (or the interpreter's exit) releases everything.
    """

    def __init__(self, spec="topk:density=0.01", comm=None, root=None, op="avg",
                 process_group=None, model=None, nonfinite="raise"):
        if op not in ("avg", "sum"):
            raise ValueError("GcollHookState: op must be 'avg' or 'sum', got %r" % (op,))
        if nonfinite not in ("raise", "propagate"):
            raise ValueError("GcollHookState: nonfinite must be 'raise' or 'propagate', got %r"
                             % (nonfinite,))
        self.compressor = Compressor(spec)
        self.op = op
        self.nonfinite = nonfinite
        self.process_group = process_group
        self._own_comm = comm is None
        if comm is None:
            if not dist.is_initialized():
                raise RuntimeError("GcollHookState: call torch.distributed.init_process_group "
                                   "first, or pass comm=gcoll.Comm(...)")
            comm = Comm(size=dist.get_world_size(process_group),
                        rank=dist.get_rank(process_group),
                        root=root if root is not None else default_root())
        self.comm = comm
        self._names = None
        if model is not None:
            self.attach(model)
        self._records = {}
        self.step = 0  # DDP steps (backward passes) the hook has seen
        self.buckets_launched = 0
        self.nonfinite_steps = 0  # buckets that held NaN/Inf somewhere (propagate mode)
        self._pending = queue.Queue()
        self._thread = None

    @property
    def spec(self):
        return self.compressor.spec

    @property
    def states(self):
        """{DDP bucket index: TensorState} of the current bucket layout."""
        return {r.index: r.ts for r in self._live()}

    def attach(self, model):
        """Names the parameters of model (a module or a DDP model), so that the states
        are keyed by parameter names rather than by bucket index."""
        self._names = {id(p): n for n, p in model.named_parameters()}

    def counters(self):
        """gcoll's counters of this state's communicator (bytes_sent, ...)."""
        return self.comm.counters()

    # -- which state a bucket uses ------------------------------------------------------
    def _key(self, bucket, count):
        if self._names is None:
            return ("#bucket", bucket.index()), (count,)
        params = bucket.parameters()
        try:
            key = tuple(self._names[id(p)] for p in params)
        except KeyError:
            raise RuntimeError("gcoll hook: a DDP bucket holds a parameter that is not in the "
                               "model given to GcollHookState (model=)") from None
        sizes = tuple(p.numel() for p in params)
        if sum(sizes) != count:  # not the flat layout the split below assumes
            return ("#bucket", bucket.index()), (count,)
        return key, sizes

    def _plan(self, key, sizes, index):
        """[(record, positions)] for a bucket: its own record (positions None), or the
        records of smaller sets that make it up exactly (after a restore, DDP's first step
        has one bucket of every parameter, the saved states the rebuilt buckets), with
        the (offset, count) of each of their parameters in this bucket. Else a new state."""
        rec = self._records.get(key)
        if rec is not None and rec.sizes == sizes:
            return [(rec, None)]
        if key and key[0] != "#bucket":
            where, off = {}, 0
            for name, n in zip(key, sizes):
                where[name] = (off, n)
                off += n
            parts, covered = [], set()
            for r in sorted(self._records.values(), key=lambda r: r.index):
                if r.key[0] == "#bucket" or not set(r.key) <= where.keys() or covered & set(r.key):
                    continue
                if any(where[n][1] != c for n, c in zip(r.key, r.sizes)):
                    continue
                parts.append((r, [where[n] for n in r.key]))
                covered |= set(r.key)
            if covered == set(key) and len(parts) > 1:
                return parts
        if rec is not None:
            rec.ts.close()
        rec = self._records[key] = _Record(key, sizes, TensorState(self.compressor, sum(sizes)),
                                           index, self.step)
        return [(rec, None)]

    def _live(self):
        """The records not superseded: a record is stale once a record used later shares
        a parameter with it (DDP regrouped the parameters, as after its first step). A
        step the hook skipped (non-finite gradients) uses no record and drops none."""
        recs = sorted(self._records.values(), key=lambda r: -r.used)
        live, seen = [], set()
        for r in recs:
            names = set(r.key) if r.key[0] != "#bucket" else {r.key}
            if not names & seen:
                live.append(r)
            seen |= names
        return live

    def _new_step(self):
        live = {id(r) for r in self._live()}
        for k in [k for k, r in self._records.items() if id(r) not in live]:
            self._records.pop(k).ts.close()
        self.step += 1

    # -- non-finite gradients -----------------------------------------------------------
    def _nonfinite_ranks(self, buf):
        """Ranks whose bucket holds NaN/Inf, agreed by every rank (one small allreduce on
        the process group, which runs beside gcoll's data queue; without a process group,
        on gcoll's communicator, behind the buckets in flight)."""
        size, rank = self.comm.size, self.comm.rank
        flags = torch.zeros(size, dtype=torch.int32)
        flags[rank] = 0 if _finite(buf) else 1
        if dist.is_initialized():
            dist.all_reduce(flags, group=self.process_group)
        else:
            self.comm.allreduce(flags)
        return [q for q in range(size) if flags[q]]

    # A helper thread waits for the requests in the order they were started (gcoll runs
    # them in that order) and completes their futures; it sleeps inside gcoll_wait.
    def _complete_later(self, reqs, finish, fut):
        if self._thread is None:
            self._thread = threading.Thread(target=self._completer, name="gcoll-hook",
                                            daemon=True)
            self._thread.start()
        self._pending.put((reqs, finish, fut))

    def _completer(self):
        while True:
            item = self._pending.get()
            if item is None:
                return
            reqs, finish, fut = item
            try:
                results = [r.wait() for r in reqs]
                result = finish(results)
            except Exception as e:  # GcollError, delivered to DDP through the future
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def _flush(self):
        """Waits until every bucket started so far has completed."""
        if self._thread is not None:
            done = threading.Event()
            self._pending.put(([], lambda _: done.set(), torch.futures.Future()))
            done.wait()

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self):
        """What a restored hook needs to continue bit-identically: for every bucket of the
        last step its parameters (names, sizes), DDP index and its TensorState saved by
        gcoll_state_save (step, residual, DGC velocity, server residual), plus the hook's
        counters, spec, rank and world size. Call between steps (after optimizer.step()),
        after DDP's second step (its first has a bucket layout it then rebuilds). Each rank
        saves its own: the residuals are per rank."""
        self._flush()
        buckets = []
        for r in sorted(self._live(), key=lambda r: r.index):
            buckets.append({"key": list(r.key), "sizes": list(r.sizes), "index": r.index,
                            "step": r.ts.step, "state": r.ts.save()})
        return {"format": STATE_DICT_FORMAT, "version": STATE_DICT_VERSION,
                "spec": self.spec, "op": self.op, "nonfinite": self.nonfinite,
                "rank": self.comm.rank, "world_size": self.comm.size,
                "keyed_by": "bucket" if self._names is None else "parameter",
                "step": self.step, "buckets_launched": self.buckets_launched,
                "nonfinite_steps": self.nonfinite_steps, "buckets": buckets}

    def load_state_dict(self, sd):
        """Restores state_dict()'s output, saved by the same rank of a job of the same
        world size with the same spec. A different world size is refused (ValueError):
        each rank's residual is what that rank did not send, and with another number of
        ranks there is no rank to give it to. Nothing changes when it raises."""
        if not isinstance(sd, dict) or sd.get("format") != STATE_DICT_FORMAT:
            raise ValueError("GcollHookState.load_state_dict: not a gcoll hook state_dict")
        if sd.get("version") != STATE_DICT_VERSION:
            raise ValueError("GcollHookState.load_state_dict: version %r, this gcoll reads %d"
                             % (sd.get("version"), STATE_DICT_VERSION))
        if sd["world_size"] != self.comm.size:
            raise ValueError("GcollHookState.load_state_dict: saved by a job of %d ranks, this "
                             "one has %d; error-feedback residuals and DGC velocities are "
                             "per rank and cannot be moved to another world size (start with "
                             "a fresh GcollHookState instead)" % (sd["world_size"], self.comm.size))
        if sd["rank"] != self.comm.rank:
            raise ValueError("GcollHookState.load_state_dict: this is rank %d's state, loaded "
                             "on rank %d (each rank loads its own)" % (sd["rank"], self.comm.rank))
        if sd["spec"] != self.spec:
            raise ValueError("GcollHookState.load_state_dict: saved with compressor %r, this "
                             "hook has %r" % (sd["spec"], self.spec))
        want = "bucket" if self._names is None else "parameter"
        if sd["keyed_by"] != want:
            raise ValueError("GcollHookState.load_state_dict: the states were keyed by %s, "
                             "this hook keys by %s (pass model= as the saving job did)"
                             % (sd["keyed_by"], want))
        records = {}
        try:
            for b in sd["buckets"]:
                key, sizes = tuple(b["key"]), tuple(b["sizes"])
                ts = TensorState(self.compressor, sum(sizes))
                records[key] = _Record(key, sizes, ts, b["index"], sd["step"])
                ts.load(b["state"])
        except Exception:
            for r in records.values():
                r.ts.close()
            raise
        self._flush()
        for r in self._records.values():
            r.ts.close()
        self._records = records
        self.step = sd["step"]
        self.buckets_launched = sd["buckets_launched"]
        self.nonfinite_steps = sd["nonfinite_steps"]

    def close(self):
        """Waits for the buckets in flight, frees the states and, if this state created
        it, the communicator."""
        if self._thread is not None:
            self._pending.put(None)
            self._thread.join()
            self._thread = None
        for r in self._records.values():
            r.ts.close()
        self._records.clear()
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None

    # DDP pickles hook states only for its own checkpointing helpers; ours holds C handles.
    def __getstate__(self):
        raise TypeError("GcollHookState holds a live communicator and cannot be pickled; "
                        "save state_dict() instead")


def comm_hook(state, bucket):
    """DDP communication hook: register with model.register_comm_hook(state, comm_hook).
    Returns a torch.futures.Future holding the bucket's reduced (averaged) gradient."""
    buf = bucket.buffer()
    if bucket.index() == 0:
        state._new_step()
    fut = torch.futures.Future()
    bad = state._nonfinite_ranks(buf)
    if bad:
        if state.nonfinite == "raise":
            raise NonFiniteError(
                "gcoll hook: NaN or infinite values in DDP bucket %d on rank(s) %s; nothing "
                "was sent and no state changed (nonfinite='raise'; with a loss scaler use "
                "nonfinite='propagate')" % (bucket.index(), ", ".join(map(str, bad))), bad)
        # propagate: a dense reduction of the raw bucket carries the NaN/Inf to every rank
        # (so AMP's scaler skips the step everywhere); no residual or velocity is touched.
        state.nonfinite_steps += 1
        reqs = [state.comm.iallreduce(buf, torch.empty_like(buf), op=state.op)]
        state.buckets_launched += 1
        state._complete_later(reqs, lambda res: res[0], fut)
        return fut
    if buf.dtype != torch.float32:
        reqs = [state.comm.iallreduce(buf, torch.empty_like(buf), op=state.op)]
        state._complete_later(reqs, lambda res: res[0], fut)
        state.buckets_launched += 1
        return fut
    key, sizes = state._key(bucket, buf.numel())
    plan = state._plan(key, sizes, bucket.index())
    out = torch.empty_like(buf)
    reqs, places = [], []
    for rec, pos in plan:
        rec.used, rec.index = state.step, rec.index if pos is not None else bucket.index()
        if pos is None:
            reqs.append(state.comm.icompressed_allreduce(rec.ts, buf, out, op=state.op))
        else:
            part = torch.cat([buf[o:o + n] for o, n in pos])
            reqs.append(state.comm.icompressed_allreduce(rec.ts, part, torch.empty_like(part),
                                                         op=state.op))
        places.append(pos)

    def finish(results):
        for res, pos in zip(results, places):
            if pos is not None:
                at = 0
                for o, n in pos:
                    out[o:o + n] = res[at:at + n]
                    at += n
        return out

    state.buckets_launched += len(reqs)
    state._complete_later(reqs, finish, fut)
    return fut


def register(model, spec="topk:density=0.01", **kwargs):
    """Creates a GcollHookState(spec, model=model, **kwargs), registers comm_hook on the
    DDP model and returns the state."""
    kwargs.setdefault("model", model)
    state = GcollHookState(spec, **kwargs)
    model.register_comm_hook(state, comm_hook)
    return state


GcollError = _lib.GcollError
__all__ = ["LocalSGD", "ParameterServer", "GcollHookState", "NonFiniteError", "comm_hook", "register", "default_root",
           "GcollError", "backend_available"]
