# fsdp.py: FSDP2's gradient reduce-scatter and parameter all-gather through gcoll.
"""gcoll.torch.fsdp_compress: compressed sharded training on torch 2's FSDP2.

FSDP2 (torch.distributed.fsdp.fully_shard) reduce-scatters each FSDP module's gradients
as one flat buffer: world_size equal blocks, block r the concatenation of every
parameter's r-th (padded) chunk, so block r is rank r's shard. gcoll's compressed
reduce-scatter splits a tensor in the same balanced rank order (gcoll_shard_range), so
the buffer goes to gcoll_compressed_reduce_scatter as it is, through FSDP2's own
extension point (FSDPModule.set_custom_reduce_scatter). Error feedback is per FSDP module
(one gcoll.TensorState over its whole flat gradient, keyed by the module's name): the
residual is what this rank did not send of every shard (Seide et al., Interspeech 2014;
Karimireddy et al., ICML 2019).

allgather= quantizes the parameters' all-gather as ZeRO++'s qwZ does (Wang et al., "ZeRO++",
ICLR 2024): each rank encodes its fp32 shard afresh every step with a stateless gcoll
codec ("bf16", "fp16", later "mxfp8:format=e4m3"), the messages are all-gathered and every
rank decodes all of them, its own included, so every rank computes with the same
parameters; the fp32 shards the optimizer updates are untouched, so no feedback is
needed. It goes through FSDPModule.set_custom_all_gather. FSDP2 gathers a module's
parameters again in backward (reshard_after_forward); when every rank's message equals the
one it sent last (agreed with a one-word allreduce), the last messages received are decoded
again instead of gathered (allgather_reuse=True, the default).

The collectives run on a gcoll communicator of their own (as the DDP hook's), called in
FSDP2's order, which on CPU is program order and the same on every rank.
"""

import ctypes
import os

import torch
import torch.distributed as dist

from . import _lib
from ._lib import GcollError, lib
from .comm import Comm
from .compress import Adapt, Compressor, TensorState, adapt_rules, check_spec
from ._hook import DEFAULT_SPEC, default_root, resolve_specs, with_warmup
from ._policy import expand as expand_policy, module_info

try:  # torch 2.6+: FSDP2 and its communication extension points
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError as _e:  # pragma: no cover - an older torch
    FSDPModule = None
    AllGather = ReduceScatter = object
    _fsdp_error = str(_e)

STATE_DICT_FORMAT = "gcoll-fsdp-state"
STATE_DICT_VERSION = 1


def _param_group(module):
    """The FSDPParamGroup of an FSDP module (None when it holds no parameters of its
    own, e.g. a root whose parameters all live in sharded children)."""
    groups = module._get_fsdp_state()._fsdp_param_groups
    if len(groups) > 1:
        raise ValueError("fsdp_compress: an FSDP module with %d parameter groups "
                         "(shard_placement_fn with several meshes) is not supported" % len(groups))
    return groups[0] if groups else None


def _flat_count(group):
    """Elements of the group's reduce-scatter input: every parameter padded to a multiple
    of world_size along dim 0, as FSDP2's foreach_reduce lays it out."""
    return sum(fp.padded_sharded_param_size.numel() for fp in group.fsdp_params) * \
        group.mesh_info.shard_mesh_size


class _Module:
    """One FSDP module's compression: its name, flat size, spec and TensorState (None
    for "none": reduced dense), its adaptation controller."""

    __slots__ = ("name", "count", "spec", "comp", "ts", "ctl", "calls", "ag_sent", "ag_recv")

    def __init__(self, name, count, spec, comp):
        self.name, self.count, self.spec, self.comp = name, count, spec, comp
        self.ts = TensorState(comp, count) if comp is not None else None
        self.ctl = None
        self.calls = 0
        self.ag_sent = self.ag_recv = None  # the last all-gather's messages (reuse)


class _CompressedReduceScatter(ReduceScatter):
    """FSDP2 ReduceScatter of one module through gcoll_compressed_reduce_scatter."""

    def __init__(self, owner, mod):
        self._owner, self._mod = owner, mod

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return self._owner._reduce_scatter(self._mod, output_tensor, input_tensor, group, op)


class _QuantizedAllGather(AllGather):
    """FSDP2 AllGather of one module whose shards travel encoded with a stateless gcoll
    codec (qwZ)."""

    def __init__(self, owner, mod):
        self._owner, self._mod = owner, mod

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return self._owner._all_gather(self._mod, output_tensor, input_tensor)


def _gcoll_op(op):
    if op == dist.ReduceOp.AVG:
        return "avg"
    if op == dist.ReduceOp.SUM:
        return "sum"
    raise ValueError("fsdp_compress: FSDP2 asked for reduce-scatter op %r; gcoll's compressed "
                     "reduce-scatter does SUM and AVG (leave set_gradient_divide_factor and "
                     "the reduce dtype at their defaults)" % (op,))


class FsdpCompressState:
    """What fsdp_compress returns: the gcoll communicator, each FSDP module's compressor
    and TensorState (keyed by the module's name under the module given), the all-gather
    codec. state_dict()/load_state_dict() carry the residuals across a checkpoint."""

    def __init__(self, module, spec=None, allgather=None, comm=None, root=None, policy=None,
                 warmup=0, adapt=None, allgather_reuse=True):
        if FSDPModule is None:
            raise RuntimeError("fsdp_compress needs torch's FSDP2 (torch >= 2.6): %s"
                               % _fsdp_error)
        if spec is None:
            spec = os.environ.get("GCOLL_COMPRESSOR") or DEFAULT_SPEC
        if policy is None:
            policy = os.environ.get("GCOLL_LAYER_POLICY", "")
        if adapt is None:
            adapt = os.environ.get("GCOLL_ADAPT", "off") or "off"
        adapt_rules(adapt)  # ValueError for an unknown rule
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError("fsdp_compress: warmup must be an int >= 0, got %r" % (warmup,))
        check_spec(with_warmup(spec, warmup))  # ValueError naming the typo
        if not isinstance(allgather_reuse, bool):
            raise ValueError("fsdp_compress: allgather_reuse must be True or False, got %r"
                             % (allgather_reuse,))
        self.allgather_reuse = allgather_reuse
        self.ag_comp = None
        if allgather is not None:
            check_spec(allgather)
            comp = Compressor(allgather)
            if comp.needs_state or comp.is_sparse:
                raise ValueError("fsdp_compress: allgather=%r: the all-gather codec must be a "
                                 "stateless dense quantizer (bf16, fp16, mxfp8...), as the "
                                 "parameters are encoded afresh each step" % allgather)
            self.ag_comp = comp
        mods = [(n, m) for n, m in module.named_modules() if isinstance(m, FSDPModule)]
        if not mods:
            raise ValueError("fsdp_compress: no module under %s has FSDP2 state; call "
                             "torch.distributed.fsdp.fully_shard on its layers and on it "
                             "first" % type(module).__name__)
        groups = [(n, m, _param_group(m)) for n, m in mods]
        groups = [(n, m, g) for n, m, g in groups if g is not None]
        self.spec, self.policy, self.warmup, self.adapt = spec, policy, warmup, adapt
        self.allgather = self.ag_comp.spec if self.ag_comp is not None else None
        self._own_comm = comm is None
        self.comm = None
        if comm is None:
            if not dist.is_initialized():
                raise RuntimeError("fsdp_compress: call torch.distributed.init_process_group "
                                   "first, or pass comm=gcoll.Comm(...)")
            comm = Comm(size=dist.get_world_size(), rank=dist.get_rank(),
                        root=root if root is not None else default_root())
        self.comm = comm
        self.modules = {}
        self._comps = {}
        try:
            for (name, m, g) in groups:
                if g.mesh_info.shard_mesh_size != comm.size:
                    raise ValueError("fsdp_compress: module %r is sharded over %d ranks, the "
                                     "gcoll communicator has %d (HSDP and sub-meshes are not "
                                     "supported)" % (name, g.mesh_info.shard_mesh_size, comm.size))
            # layer policy by module name, in backward order (the last module first)
            # (the root module's name is "", which a policy's patterns see as "root")
            counts = [(n or "root", _flat_count(g)) for n, _m, g in groups]
            # type: rules, "seed" and the embedding default by the FSDP module's class. A
            # unit made of an Embedding or EmbeddingBag holds its weight alone, sharded by
            # whole rows (dim 0, padded to whole rows), so its flat reduce-scatter buffer
            # is rows of embedding_dim values and goes row-sparse; an embedding inside a
            # larger unit shares the buffer with other parameters and is not matched.
            policy_c = expand_policy(policy, [c[0] for c in counts],
                                     module_info(module, by_module=True), spec)
            specs = resolve_specs(comm, list(reversed(counts)), spec, policy_c)[::-1]
            for (name, m, g), (_n, count), s in zip(groups, counts, specs):
                comp = None
                if s != "none":
                    s = with_warmup(s, warmup)
                    comp = self._comps.get(s) or self._comps.setdefault(s, Compressor(s))
                mod = _Module(name, count, comp.spec if comp else "none", comp)
                self.modules[name] = mod
                m.set_custom_reduce_scatter(_CompressedReduceScatter(self, mod))
                if self.ag_comp is not None:
                    m.set_custom_all_gather(_QuantizedAllGather(self, mod))
            if adapt != "off":
                for mod in self.modules.values():
                    head = mod.spec.split("+")[0].split(":")[0]
                    if mod.ts is not None and head in ("topk", "randomk", "dgc", "qsgd", "q8"):
                        mod.ctl = Adapt(comm, adapt)
                        mod.ctl.attach(mod.ts)
        except Exception:
            self.close()
            raise
        self.trace = None  # a list to record (name, input, output) of each call (tests)
        self.bytes_allgather = 0
        self.allgather_reused = 0  # all-gathers answered from the last messages

    # -- the collectives ----------------------------------------------------------------
    def _reduce_scatter(self, mod, out, inp, group, op):
        gop = _gcoll_op(op)
        if inp.numel() != mod.count or out.numel() * self.comm.size != mod.count:
            raise RuntimeError("fsdp_compress: module %r's reduce-scatter has %d -> %d "
                               "elements, expected %d -> %d (parameters changed after "
                               "fsdp_compress?)" % (mod.name, inp.numel(), out.numel(),
                                                    mod.count, mod.count // self.comm.size))
        x = inp if inp.dtype == torch.float32 else inp.float()
        y = out if out.dtype == torch.float32 else torch.empty(out.numel(), dtype=torch.float32)
        if mod.ts is None:
            dist.reduce_scatter_single(y, x.contiguous(), op=op, group=group)
        else:
            self.comm.compressed_reduce_scatter(mod.ts, x.contiguous(), y, op=gop)
        if y is not out:
            out.copy_(y)
        mod.calls += 1
        if self.trace is not None:
            self.trace.append((mod.name, inp.detach().clone(), out.detach().clone()))
        return None

    def _all_gather(self, mod, out, inp):
        n, size = inp.numel(), self.comm.size
        if inp.dtype != torch.float32:
            raise RuntimeError("fsdp_compress: allgather=%r quantizes float32 parameters, the "
                               "all-gather holds %s" % (self.allgather, inp.dtype))
        cap = self.ag_comp.bound(n)
        words = (cap + 3) // 4 + 1  # a length word, then the message padded to 4 bytes
        # encoded straight into the send buffer, decoded straight from the receive buffer:
        # no copies of the messages in between; zeroed, so that equal messages are equal
        # buffers
        send = torch.zeros(words, dtype=torch.int32)
        x = inp.detach().contiguous()  # inp is a view of out: encoded before the gather
        got = ctypes.c_size_t(0)
        st = lib.gcoll_encode(self.ag_comp._live(), None, x.data_ptr(), n,
                              send.data_ptr() + 4, cap, ctypes.byref(got))
        if st != _lib.OK:
            raise GcollError("gcoll_encode", st, "fsdp_compress: allgather=%r: %s (NaN/Inf in "
                             "a parameter shard?)" % (self.allgather, _lib.status_string(st)))
        send[0] = got.value
        recv = None
        if self.allgather_reuse and mod.ag_sent is not None and mod.ag_sent.numel() == words:
            # FSDP2 all-gathers a module's parameters again in backward (reshard after
            # forward) and they have not changed since forward: when every rank's message
            # is the one it sent last, the last receive buffer is what this all-gather
            # would receive. The ranks agree with a one-word MIN (a rank's shard can stay
            # unchanged alone, e.g. with a zero gradient and no momentum). This keeps the
            # quantized parameters between the two gathers, as ZeRO++'s hpZ keeps a
            # quantized secondary copy (Wang et al., ICLR 2024), at ~1 byte a parameter
            # for mxfp8, 2 for bf16; allgather_reuse=False turns it off.
            flag = torch.tensor([1 if torch.equal(send, mod.ag_sent) else 0], dtype=torch.int32)
            self.comm.allreduce(flag, op="min")
            if int(flag[0]) == 1:
                recv = mod.ag_recv
                self.allgather_reused += 1
        if recv is None:
            recv = torch.empty(words * size, dtype=torch.int32)
            self.comm.allgather(send, recv)
            self.bytes_allgather += words * 4 * (size - 1)
            if self.allgather_reuse:
                mod.ag_sent, mod.ag_recv = send, recv
        view = out.view(size, n)
        base = recv.data_ptr()
        for r in range(size):
            ln = int(recv[r * words])
            if not 0 < ln <= cap:
                raise RuntimeError("fsdp_compress: rank %d's all-gather message is %d bytes, "
                                   "at most %d expected" % (r, ln, cap))
            # decoded in place from recv (the decoder checks every bound against ln)
            st = lib.gcoll_decode(self.ag_comp._live(), base + (r * words + 1) * 4, ln,
                                  view[r].data_ptr(), n, 0)
            if st != _lib.OK:
                raise GcollError("gcoll_decode", st, "fsdp_compress: rank %d's all-gather "
                                 "message is malformed" % r)
        return None

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self):
        """Each FSDP module's TensorState (residual, DGC velocity, step) by name, with the
        specs, rank and world size. Each rank saves its own (the residuals are per rank).
        Refused under GCOLL_ADAPT, whose controllers' state is not saved."""
        if self.adapt != "off":
            raise ValueError("fsdp_compress state_dict: the adaptation controllers' state "
                             "(GCOLL_ADAPT=%s) is not saved, so a restored run would not "
                             "continue bit-identically; checkpoint with GCOLL_ADAPT=off"
                             % self.adapt)
        return {"format": STATE_DICT_FORMAT, "version": STATE_DICT_VERSION,
                "spec": self.spec, "policy": self.policy, "warmup": self.warmup,
                "allgather": self.allgather, "rank": self.comm.rank,
                "world_size": self.comm.size,
                "modules": [{"name": m.name, "count": m.count, "spec": m.spec, "calls": m.calls,
                             "state": m.ts.save() if m.ts is not None else None}
                            for m in self.modules.values()]}

    def load_state_dict(self, sd):
        """Restores state_dict()'s output, saved by the same rank of a job with the same
        world size, specs and modules; anything else is a ValueError and changes nothing."""
        if self.adapt != "off":
            raise ValueError("fsdp_compress load_state_dict: not with adaptation "
                             "(GCOLL_ADAPT=%s): its controllers' state is not saved" % self.adapt)
        if not isinstance(sd, dict) or sd.get("format") != STATE_DICT_FORMAT:
            raise ValueError("fsdp_compress load_state_dict: not a gcoll FSDP state_dict")
        if sd.get("version") != STATE_DICT_VERSION:
            raise ValueError("fsdp_compress load_state_dict: version %r, this gcoll reads %d"
                             % (sd.get("version"), STATE_DICT_VERSION))
        if sd["world_size"] != self.comm.size:
            raise ValueError("fsdp_compress load_state_dict: saved by a job of %d ranks, this "
                             "one has %d; the error-feedback residuals are per rank and per "
                             "shard and cannot move to another world size (start with a "
                             "fresh fsdp_compress state instead)" % (sd["world_size"],
                                                                     self.comm.size))
        if sd["rank"] != self.comm.rank:
            raise ValueError("fsdp_compress load_state_dict: rank %d's state loaded on rank %d"
                             % (sd["rank"], self.comm.rank))
        for key in ("spec", "policy", "warmup", "allgather"):
            if sd[key] != getattr(self, key):
                raise ValueError("fsdp_compress load_state_dict: saved with %s %r, this state "
                                 "has %r" % (key, sd[key], getattr(self, key)))
        byname = {e["name"]: e for e in sd["modules"]}
        if set(byname) != set(self.modules):
            raise ValueError("fsdp_compress load_state_dict: saved for FSDP modules %s, this "
                             "model has %s" % (sorted(byname), sorted(self.modules)))
        for name, m in self.modules.items():
            e = byname[name]
            if e["count"] != m.count or e["spec"] != m.spec:
                raise ValueError("fsdp_compress load_state_dict: module %r saved with %d "
                                 "elements and spec %r, here %d and %r"
                                 % (name, e["count"], e["spec"], m.count, m.spec))
        fresh = {}
        try:  # into new states first, so that a damaged blob changes nothing
            for name, m in self.modules.items():
                if m.ts is not None:
                    ts = TensorState(m.comp, m.count)
                    fresh[name] = ts
                    ts.load(byname[name]["state"])
        except Exception:
            for ts in fresh.values():
                ts.close()
            raise
        for name, m in self.modules.items():
            if m.ts is not None:
                m.ts.close()
                m.ts = fresh[name]
            m.calls = byname[name]["calls"]

    def counters(self):
        """gcoll's counters of this state's communicator (bytes_sent, ...)."""
        return self.comm.counters()

    def close(self):
        """Frees the states and, if this state created it, the communicator. The FSDP
        modules keep the custom collectives: do not train them after close()."""
        for m in getattr(self, "modules", {}).values():
            if m.ctl is not None:
                m.ctl.close()
                m.ctl = None
            if m.ts is not None:
                m.ts.close()
                m.ts = None
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None

    def __getstate__(self):
        raise TypeError("FsdpCompressState holds a live communicator and cannot be pickled; "
                        "save state_dict() instead")


def fsdp_compress(module, spec=None, allgather=None, **kw):
    """Routes the gradient reduce-scatter of every FSDP2 module under module (fully_shard
    already applied) through gcoll's compressed reduce-scatter with spec (None:
    GCOLL_COMPRESSOR, else topk:density=0.01; GCOLL_LAYER_POLICY by module name), with
    error feedback per module shard; with allgather= (a stateless codec: "bf16", "fp16",
    "mxfp8:format=e4m3" once gcoll has it) the parameters' all-gather travels quantized.
    kw: comm (a gcoll.Comm), root, policy, warmup, adapt, allgather_reuse (default True:
    keep each module's last all-gather messages, ~1 byte a parameter with mxfp8, and reuse
    them when no rank's parameters changed, as in backward). Returns an FsdpCompressState."""
    return FsdpCompressState(module, spec=spec, allgather=allgather, **kw)
