# zero.py: ZeRO-2 for ZeroRedundancyOptimizer users, a DDP hook over gcoll's compressed
# reduce-scatter.
"""gcoll.torch.register_zero2(model, optimizer, spec=None, **kw): ZeRO stage 2 (Rajbhandari
et al., "ZeRO", SC 2020) with compressed gradients. torch's ZeroRedundancyOptimizer gives
each parameter to one rank (its optimizer state, ZeRO-1); plain DDP still all-reduces
every gradient to every rank. With this hook each DDP bucket is laid out as size equal
blocks, block r holding the gradients of the bucket's parameters rank r owns (zero
padded), and goes through gcoll_compressed_reduce_scatter: rank r receives only its block,
the average of the ranks' compressed gradients of its own parameters, and the hook's
result holds those (the other parameters' gradients are zero: the optimizer does not step
them; ZeroRedundancyOptimizer.step then broadcasts every parameter from its owner).
Error feedback is one gcoll.TensorState per bucket layout (its parameters' names), so it
survives DDP's bucket rebuild only where a bucket keeps its parameters."""

import os

import torch

from .comm import Comm
from .compress import Compressor, TensorState, check_spec
from ._hook import DEFAULT_SPEC, default_root, with_warmup


class Zero2HookState:
    """State of the ZeRO-2 hook: the gcoll communicator, the compressor, one TensorState
    per bucket layout, the optimizer's ownership of the parameters."""

    def __init__(self, model, optimizer, spec=None, comm=None, root=None, warmup=0):
        owner = getattr(optimizer, "_param_to_rank", None)
        if owner is None or not hasattr(optimizer, "consolidate_state_dict"):
            raise TypeError("register_zero2: optimizer must be a torch.distributed.optim."
                            "ZeroRedundancyOptimizer, got %s" % type(optimizer).__name__)
        if spec is None:
            spec = os.environ.get("GCOLL_COMPRESSOR") or DEFAULT_SPEC
        check_spec(with_warmup(spec, warmup))
        self.compressor = Compressor(with_warmup(spec, warmup))
        self._owner = dict(owner)  # parameter -> rank
        self._names = {p: n for n, p in model.named_parameters()}
        self._own_comm = comm is None
        if comm is None:
            import torch.distributed as dist

            comm = Comm(size=dist.get_world_size(), rank=dist.get_rank(),
                        root=root if root is not None else default_root())
        self.comm = comm
        self._states = {}  # tuple of parameter names -> TensorState
        self.step = 0
        self.trace = None  # a list to record (step, layout, input, shard) of each call (tests)

    @property
    def spec(self):
        return self.compressor.spec

    def _layout(self, bucket):
        """[(name, owner, offset in the bucket, offset in the owner's block, numel)] and
        the block size."""
        fill = [0] * self.comm.size
        out, off = [], 0
        for p in bucket.parameters():
            r = self._owner.get(p)
            if r is None:
                raise RuntimeError("register_zero2: a DDP bucket holds a parameter the "
                                   "ZeroRedundancyOptimizer does not own")
            n = p.numel()
            out.append((self._names.get(p, "?"), r, off, fill[r], n))
            fill[r] += n
            off += n
        return out, max(max(fill), 1)

    def reduce(self, bucket):
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise TypeError("register_zero2: float32 gradients only, the bucket is %s"
                            % buf.dtype)
        if bucket.index() == 0:
            self.step += 1
        layout, block = self._layout(bucket)
        size, rank = self.comm.size, self.comm.rank
        x = torch.zeros(size * block, dtype=torch.float32)
        for _name, r, off, boff, n in layout:
            x[r * block + boff:r * block + boff + n] = buf[off:off + n]
        key = tuple(e[0] for e in layout)
        ts = self._states.get(key)
        if ts is None:
            ts = self._states[key] = TensorState(self.compressor, x.numel())
        y = torch.empty(block, dtype=torch.float32)
        self.comm.compressed_reduce_scatter(ts, x, y, op="avg")
        out = torch.zeros_like(buf)
        for _name, r, off, boff, n in layout:
            if r == rank:
                out[off:off + n] = y[boff:boff + n]
        if self.trace is not None:
            self.trace.append((self.step, layout, block, x, y.clone()))
        return out

    def close(self):
        for ts in self._states.values():
            ts.close()
        self._states = {}
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None


def zero2_hook(state, bucket):
    """The DDP communication hook of register_zero2 (blocking: the future is complete
    when it returns)."""
    fut = torch.futures.Future()
    fut.set_result(state.reduce(bucket))
    return fut


def register_zero2(model, optimizer, spec=None, **kw):
    """Registers the ZeRO-2 hook on the DDP model whose parameters optimizer (a
    ZeroRedundancyOptimizer) partitions; spec as GCOLL_COMPRESSOR; kw: comm, root, warmup.
    Returns the Zero2HookState."""
    state = Zero2HookState(model, optimizer, spec, **kw)
    model.register_comm_hook(state, zero2_hook)
    return state
