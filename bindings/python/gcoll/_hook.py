# _hook.py: gcoll's DDP communication hook and its state (imported by gcoll.torch).
"""The DDP hook. With the model known (model=, as gcoll.torch.register passes it) every
parameter has its own compressor spec, chosen as the C bucketer chooses it (explicit
spec, else GCOLL_LAYER_POLICY's first matching rule, else the default spec: spec=, else
GCOLL_COMPRESSOR, else topk:density=0.01), and its own gcoll.TensorState, keyed by its
name: k = density x the parameter's size is picked in each parameter (the bucketer's
GCOLL_LAYER_SELECT), the state follows the parameter through DDP's bucket rebuild and
into a restored job, and float16/bfloat16 gradients are compressed from a float32 copy.
Parameters whose spec is "none" are reduced dense, consecutive ones of a bucket in one
allreduce. accumulate_steps (GCOLL_ACCUMULATE_STEPS) sums gradients locally and
communicates every Nth step; warmup (steps) gives sparsifiers whose spec sets no
warmup_steps the bucketer's warm-up. Without a model the hook keeps one state per DDP
bucket index and one spec."""

import ctypes
import os
import queue
import threading
import warnings

import torch
import torch.distributed as dist

from . import _lib
from ._policy import expand as expand_policy, module_info
from .comm import Comm
from .compress import Adapt, Compressor, TensorState, adapt_rules, check_spec

DEFAULT_SPEC = "topk:density=0.01"
STATE_DICT_FORMAT = "gcoll-hook-state"
STATE_DICT_VERSION = 2
_SPARSIFIERS = ("topk", "randomk", "dgc")


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


def with_warmup(spec, steps):
    """spec with warmup_steps=steps added when it is a sparsifier (topk, randomk, dgc)
    whose spec gives no warmup_steps and no fixed k, as gcoll_bucketer_config_t's
    warmup_steps does; otherwise spec unchanged."""
    if not steps:
        return spec
    main, plus, rest = spec.partition("+")
    codec, colon, params = main.partition(":")
    keys = {kv.split("=", 1)[0].strip() for kv in params.split(",") if kv}
    if codec.strip() not in _SPARSIFIERS or "warmup_steps" in keys or "k" in keys:
        return spec
    params = params.strip()
    main = codec + ":" + (params + "," if params else "") + "warmup_steps=%d" % steps
    return main + plus + rest


def _dense(spec):
    """Whether spec is the identity codec ("none", which canonicalises to "none:ef=1"):
    such parameters take the dense allreduce, not a compressed one."""
    return spec.partition("+")[0].partition(":")[0].strip() == "none"


def _env_int(name, default, lo, hi):
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise ValueError("%s=%r: expected an integer in %d..%d" % (name, text, lo, hi))
    return v


def resolve_specs(comm, names_sizes, default_spec, policy):
    """[spec] for the (name, count) pairs in backward order, as the C bucketer assigns
    them (gcoll_bucketer_tensor_spec: the layer policy's first matching rule, first and
    last being the model's first and last layers in forward order, else default_spec).
    A bad policy raises ValueError with gcoll's message."""
    cfg = _lib.BucketerConfig(0, _lib.AVG, policy.encode(), default_spec.encode(), 1, 0)
    h = ctypes.c_void_p()
    st = _lib.lib.gcoll_bucketer_create(comm._live(), ctypes.byref(cfg), ctypes.byref(h))
    if st != _lib.OK:
        raise ValueError("gcoll hook: layer policy %r: %s" % (
            policy, _lib.lib.gcoll_comm_last_error(comm._live()).decode(errors="replace")))
    try:
        dummy = ctypes.c_float(0)  # never read: the bucketer only answers spec queries here
        ids = []
        for name, count in names_sizes:
            i = ctypes.c_int(-1)
            _lib.check(_lib.lib.gcoll_bucketer_add_tensor(h, name.encode(), ctypes.byref(dummy),
                                                          count, _lib.FLOAT32, None,
                                                          ctypes.byref(i)),
                       "gcoll_bucketer_add_tensor", comm._live())
            ids.append(i.value)
        return [_lib.lib.gcoll_bucketer_tensor_spec(h, i).decode() for i in ids]
    finally:
        _lib.lib.gcoll_bucketer_destroy(h)


class _Param:
    """One parameter's compression: name, count, spec (as resolved), the compressor and
    TensorState (None for "none"), the local accumulation (float32, accumulate_steps > 1)."""

    __slots__ = ("name", "count", "spec", "comp", "ts", "acc", "ctl")

    def __init__(self, name, count, spec, comp, accumulate):
        self.name, self.count, self.spec, self.comp = name, count, spec, comp
        self.ctl = None  # its adaptation controller (GCOLL_ADAPT), if any
        self.ts = TensorState(comp, count) if comp is not None else None
        self.acc = torch.zeros(count, dtype=torch.float32) if accumulate > 1 else None


class _Record:
    """Without a model: the state of one DDP bucket index (key ("#bucket", index)), its
    size, and the step it last ran at."""

    __slots__ = ("key", "sizes", "ts", "index", "used")

    def __init__(self, key, sizes, ts, index, used):
        self.key, self.sizes, self.ts, self.index, self.used = key, sizes, ts, index, used


class GcollHookState:
    """State of gcoll's DDP hook: the gcoll communicator, the compressors, and the
    compression state kept across steps (per parameter with model=, per DDP bucket
    without).

    spec: the default compressor ("topk:density=0.01", "dgc:density=0.01,momentum=0.9",
    "fp16", "none", ... as GCOLL_COMPRESSOR); None takes GCOLL_COMPRESSOR, else
    topk:density=0.01. policy: a GCOLL_LAYER_POLICY ("*bias*=none;size<16384=none;*=topk:
    density=0.001"); None takes GCOLL_LAYER_POLICY. accumulate_steps: communicate every
    N steps, summing gradients locally in between (None: GCOLL_ACCUMULATE_STEPS, else 1);
    the hook returns zeros on the other steps and sets .reduced. warmup: steps of warm-up
    for sparsifiers whose spec sets no warmup_steps (0: none). policy, accumulation and
    warm-up need model=. comm: a gcoll.Comm to use; by default one is created from the
    process group's rank and size and root (see default_root()). op: "avg" (as DDP) or
    "sum". nonfinite: "raise" (default) or "propagate" (docs/python.md). close() (or the
    interpreter's exit) releases everything.
    """

    def __init__(self, spec=None, comm=None, root=None, op="avg", process_group=None,
                 model=None, nonfinite="raise", policy=None, accumulate_steps=None, warmup=0,
                 adapt=None):
        if op not in ("avg", "sum"):
            raise ValueError("GcollHookState: op must be 'avg' or 'sum', got %r" % (op,))
        if nonfinite not in ("raise", "propagate"):
            raise ValueError("GcollHookState: nonfinite must be 'raise' or 'propagate', got %r"
                             % (nonfinite,))
        if adapt is None:
            adapt = os.environ.get("GCOLL_ADAPT", "off") or "off"
        adapt_rules(adapt)  # ValueError for an unknown rule
        if spec is None:
            spec = os.environ.get("GCOLL_COMPRESSOR") or DEFAULT_SPEC
        if policy is None:
            policy = os.environ.get("GCOLL_LAYER_POLICY", "")
        if accumulate_steps is None:
            accumulate_steps = _env_int("GCOLL_ACCUMULATE_STEPS", 1, 1, 1000000)
        if not isinstance(accumulate_steps, int) or accumulate_steps < 1:
            raise ValueError("GcollHookState: accumulate_steps must be an int >= 1, got %r"
                             % (accumulate_steps,))
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError("GcollHookState: warmup must be an int >= 0, got %r" % (warmup,))
        if model is None and adapt != "off":
            raise ValueError("GcollHookState: adaptation (GCOLL_ADAPT=%s) needs model= "
                             "(one controller per parameter)" % adapt)
        if model is None and (policy or accumulate_steps > 1 or warmup):
            raise ValueError("GcollHookState: a layer policy, accumulate_steps and warmup "
                             "need model= (parameter names); GCOLL_LAYER_POLICY=%r, "
                             "accumulate_steps=%d, warmup=%d" % (policy, accumulate_steps,
                                                                 warmup))
        self.compressor = Compressor(with_warmup(spec, warmup))
        self.policy, self.accumulate_steps, self.warmup = policy, accumulate_steps, warmup
        self.adapt = adapt
        self.op = op
        self.nonfinite = nonfinite
        self.process_group = process_group
        self._own_comm = comm is None
        self.comm = None
        if comm is None:
            if not dist.is_initialized():
                raise RuntimeError("GcollHookState: call torch.distributed.init_process_group "
                                   "first, or pass comm=gcoll.Comm(...)")
            comm = Comm(size=dist.get_world_size(process_group),
                        rank=dist.get_rank(process_group),
                        root=root if root is not None else default_root())
        self.comm = comm
        self._names = None
        self._params = {}   # name -> _Param (with a model)
        self._records = {}  # ("#bucket", index) -> _Record (without)
        self._comps = {}
        self.step = 0  # DDP steps (backward passes) the hook has seen
        self.reduced = True  # whether the last step's gradients were reduced
        self.buckets_launched = 0
        self.nonfinite_steps = 0  # buckets that held NaN/Inf somewhere (propagate mode)
        self._pending = queue.Queue()
        self._thread = None
        self._warned_buckets = False  # the per-bucket residuals warning, said once
        if model is not None:
            try:
                self.attach(model)
            except Exception:
                self.close()
                raise

    @property
    def spec(self):
        """The default spec (canonical, with the warm-up)."""
        return self.compressor.spec

    @property
    def specs(self):
        """{parameter name: the spec it is compressed with} (with model=)."""
        return {n: p.spec for n, p in self._params.items()}

    @property
    def states(self):
        """{parameter name: TensorState} with model= (parameters reduced dense have none);
        without, {DDP bucket index: TensorState} of the last step's buckets."""
        if self._names is not None:
            return {n: p.ts for n, p in self._params.items() if p.ts is not None}
        return {r.index: r.ts for r in self._records.values() if r.used == self.step}

    def attach(self, model):
        """Names the parameters of model (a module or a DDP model) and picks each one's
        spec (the layer policy over the names in backward order, as the C bucketer)."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        backward = list(reversed(named))
        # type: rules, "seed" and the embedding default, resolved by module class here
        # (a default spec of "none", canonically "none:ef=1", gets no embedding default)
        policy = expand_policy(self.policy, [n for n, _p in named], module_info(model),
                               "none" if _dense(self.spec) else self.spec)
        specs = resolve_specs(self.comm, [(n, p.numel()) for n, p in backward], self.spec,
                              policy)
        params = {}
        for (name, p), spec in zip(backward, specs):
            comp = None
            if not _dense(spec):
                spec = with_warmup(spec, self.warmup)
                check_spec(spec)
                comp = self._comps.get(spec) or self._comps.setdefault(spec, Compressor(spec))
            params[name] = _Param(name, p.numel(), comp.spec if comp else "none", comp,
                                  self.accumulate_steps)
        self._close_states()
        self._params = params
        self._names = {id(p): n for n, p in named}
        if self.adapt != "off":
            self._attach_controllers()

    def _attach_controllers(self):
        """One controller per compressed parameter whose codec has a density (top-k,
        random-k, DGC) or a bit width (qsgd, q8) to choose, as the bucketer has one per
        bucket; every rank attaches alike, so every rank decides alike. With the budget
        rule the density controllers share one budget (gcoll_adapt_join), as the bucketer's
        buckets do."""
        budget = adapt_rules(self.adapt) & adapt_rules("budget")
        first = None
        for p in self._params.values():
            head = p.spec.split("+")[0].split(":")[0]
            if p.ts is None or head not in ("topk", "randomk", "dgc", "qsgd", "q8"):
                continue
            ctl = Adapt(self.comm, self.adapt)
            try:
                ctl.attach(p.ts)
                if budget and head not in ("qsgd", "q8"):
                    if first is None:
                        first = ctl
                    else:
                        ctl.join(first)
            except Exception:
                ctl.close()
                raise
            p.ctl = ctl

    def adapt_stats(self):
        """{parameter name: what its controller measured and decided} (Adapt.stats()),
        for the parameters GCOLL_ADAPT drives; read between steps."""
        self._flush()
        return {n: p.ctl.stats() for n, p in self._params.items() if p.ctl is not None}

    def counters(self):
        """gcoll's counters of this state's communicator (bytes_sent, ...)."""
        return self.comm.counters()

    # -- one step -------------------------------------------------------------------------
    def _new_step(self):
        self.step += 1
        self.reduced = self.step % self.accumulate_steps == 0

    def _layout(self, bucket, count):
        """[(_Param, offset)] of a bucket's parameters."""
        out, off = [], 0
        for p in bucket.parameters():
            name = self._names.get(id(p))
            if name is None or name not in self._params:
                raise RuntimeError("gcoll hook: a DDP bucket holds a parameter that is not in "
                                   "the model given to GcollHookState (model=)")
            rec = self._params[name]
            out.append((rec, off))
            off += rec.count
        if off != count:
            raise RuntimeError("gcoll hook: DDP bucket %d has %d elements, its parameters %d "
                               "(an unexpected bucket layout)" % (bucket.index(), count, off))
        return out

    def _bucket_record(self, index, count):
        key = ("#bucket", index)
        rec = self._records.get(key)
        if rec is None or rec.sizes != (count,):
            if rec is not None:
                rec.ts.close()
            rec = self._records[key] = _Record(key, (count,), TensorState(self.compressor, count),
                                               index, self.step)
        rec.used = self.step
        return rec

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
        """What a restored hook needs to continue bit-identically: with model=, for every
        parameter its name, size, spec, TensorState (gcoll_state_save: step, residual, DGC
        velocity, server residual) and local accumulation; without, the same per DDP bucket
        of the last step. Plus the hook's counters, spec, rank and world size. Call
        between steps (after optimizer.step()). Each rank saves its own: the residuals are
        per rank."""
        self._flush()
        if self.adapt != "off":
            raise ValueError("GcollHookState.state_dict: the adaptation controllers' state "
                             "(GCOLL_ADAPT=%s) is not saved, so a restored run would not "
                             "continue bit-identically; checkpoint with GCOLL_ADAPT=off"
                             % self.adapt)
        sd = {"format": STATE_DICT_FORMAT, "version": STATE_DICT_VERSION,
              "spec": self.spec, "policy": self.policy,
              "accumulate_steps": self.accumulate_steps, "warmup": self.warmup,
              "op": self.op, "nonfinite": self.nonfinite,
              "rank": self.comm.rank, "world_size": self.comm.size,
              "keyed_by": "bucket" if self._names is None else "parameter",
              "step": self.step, "buckets_launched": self.buckets_launched,
              "nonfinite_steps": self.nonfinite_steps}
        if self._names is not None:
            sd["params"] = [{"name": p.name, "count": p.count, "spec": p.spec,
                             "state": p.ts.save() if p.ts is not None else None,
                             "acc": p.acc.numpy().tobytes() if p.acc is not None else None}
                            for p in self._params.values()]
        else:
            sd["buckets"] = [{"index": r.index, "count": r.sizes[0], "step": r.ts.step,
                              "state": r.ts.save()}
                             for r in sorted(self._records.values(), key=lambda r: r.index)
                             if r.used == self.step]
        return sd

    def _check_compatible(self, sd):
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
        for key, what in (("spec", "compressor"), ("policy", "layer policy"),
                          ("accumulate_steps", "accumulate_steps"), ("warmup", "warmup")):
            if sd[key] != getattr(self, key):
                raise ValueError("GcollHookState.load_state_dict: saved with %s %r, this hook "
                                 "has %r" % (what, sd[key], getattr(self, key)))
        want = "bucket" if self._names is None else "parameter"
        if sd["keyed_by"] != want:
            raise ValueError("GcollHookState.load_state_dict: the states were keyed by %s, "
                             "this hook keys by %s (pass model= as the saving job did)"
                             % (sd["keyed_by"], want))

    def load_state_dict(self, sd):
        """Restores state_dict()'s output, saved by the same rank of a job of the same
        world size with the same spec, policy, accumulation and warm-up. A different world
        size is refused (ValueError): each rank's residual is what that rank did not send,
        and with another number of ranks there is no rank to give it to. Nothing changes
        when it raises."""
        if self.adapt != "off":
            raise ValueError("GcollHookState.load_state_dict: not with adaptation "
                             "(GCOLL_ADAPT=%s): its controllers' state is not saved" % self.adapt)
        self._check_compatible(sd)
        if self._names is not None:
            self._load_params(sd["params"])
        else:
            self._load_buckets(sd["buckets"], sd["step"])
        self.step = sd["step"]
        self.reduced = self.step % self.accumulate_steps == 0
        self.buckets_launched = sd["buckets_launched"]
        self.nonfinite_steps = sd["nonfinite_steps"]

    def _load_params(self, saved):
        byname = {e["name"]: e for e in saved}
        if set(byname) != set(self._params):
            raise ValueError("GcollHookState.load_state_dict: saved for parameters %s, this "
                             "model has %s" % (sorted(set(byname) - set(self._params))[:3] or "-",
                                               sorted(set(self._params) - set(byname))[:3] or "-"))
        for name, p in self._params.items():
            e = byname[name]
            if e["count"] != p.count or e["spec"] != p.spec:
                raise ValueError("GcollHookState.load_state_dict: parameter %s saved with %d "
                                 "elements and spec %r, here %d and %r"
                                 % (name, e["count"], e["spec"], p.count, p.spec))
        self._flush()
        fresh = {}
        try:  # into new states first, so that a damaged blob leaves the hook unchanged
            for name, p in self._params.items():
                e = byname[name]
                q = _Param(name, p.count, p.spec, p.comp, self.accumulate_steps)
                fresh[name] = q
                if q.ts is not None:
                    q.ts.load(e["state"])
                if q.acc is not None:
                    acc = torch.frombuffer(bytearray(e["acc"]), dtype=torch.float32)
                    if acc.numel() != q.count:
                        raise ValueError("GcollHookState.load_state_dict: parameter %s's "
                                         "accumulation has %d elements, not %d"
                                         % (name, acc.numel(), q.count))
                    q.acc.copy_(acc)
        except Exception:
            for q in fresh.values():
                if q.ts is not None:
                    q.ts.close()
            raise
        self._close_states()
        self._params = fresh

    def _load_buckets(self, saved, step):
        records = {}
        try:
            for b in saved:
                key = ("#bucket", b["index"])
                ts = TensorState(self.compressor, b["count"])
                records[key] = _Record(key, (b["count"],), ts, b["index"], step)
                ts.load(b["state"])
        except Exception:
            for r in records.values():
                r.ts.close()
            raise
        self._flush()
        self._close_states()
        self._records = records

    def _close_states(self):
        for p in self._params.values():
            if p.ctl is not None:
                p.ctl.close()
                p.ctl = None
            if p.ts is not None:
                p.ts.close()
        for r in self._records.values():
            r.ts.close()
        self._params, self._records = {}, {}

    def close(self):
        """Waits for the buckets in flight, frees the states and, if this state created
        it, the communicator."""
        if self._thread is not None:
            self._pending.put(None)
            self._thread.join()
            self._thread = None
        self._close_states()
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None

    # DDP pickles hook states only for its own checkpointing helpers; ours holds C handles.
    def __getstate__(self):
        raise TypeError("GcollHookState holds a live communicator and cannot be pickled; "
                        "save state_dict() instead")


def _launch_params(state, buf, layout, out):
    """Starts the reductions of one bucket by parameter: each compressed parameter its own
    icompressed_allreduce (float32; fp16/bf16 through a float32 copy), each run of
    consecutive dense ones one iallreduce. Returns (requests, copies back into out)."""
    reqs, back = [], []
    acc = state.accumulate_steps > 1
    i = 0
    while i < len(layout):
        rec, off = layout[i]
        if rec.comp is None:
            j = i
            while j + 1 < len(layout) and layout[j + 1][0].comp is None:
                j += 1
            end = layout[j][1] + layout[j][0].count
            x = buf[off:end]
            if acc:
                x = x.float() + torch.cat([layout[q][0].acc for q in range(i, j + 1)])
                for q in range(i, j + 1):
                    layout[q][0].acc.zero_()
                y = torch.empty_like(x)
                back.append((off, end, y))
            else:
                y = out[off:end]
            reqs.append(state.comm.iallreduce(x, y, op=state.op))
            i = j + 1
            continue
        end = off + rec.count
        x = buf[off:end]
        if x.dtype != torch.float32 or acc:
            x = x.float()
            if acc:
                x += rec.acc
                rec.acc.zero_()
        if out.dtype == torch.float32:
            y = out[off:end]
        else:
            y = torch.empty(rec.count, dtype=torch.float32)
            back.append((off, end, y))
        reqs.append(state.comm.icompressed_allreduce(rec.ts, x, y, op=state.op))
        i += 1
    return reqs, back


def comm_hook(state, bucket):
    """DDP communication hook: register with model.register_comm_hook(state, comm_hook).
    Returns a torch.futures.Future holding the bucket's reduced (averaged) gradient; on
    the steps an accumulation (accumulate_steps > 1) does not communicate, zeros."""
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
        # (so AMP's scaler skips the step everywhere); no residual, velocity or
        # accumulation is touched.
        state.nonfinite_steps += 1
        reqs = [state.comm.iallreduce(buf, torch.empty_like(buf), op=state.op)]
        state.buckets_launched += 1
        state._complete_later(reqs, lambda res: res[0], fut)
        return fut
    if state._names is not None:
        layout = state._layout(bucket, buf.numel())
        if not state.reduced:  # accumulate locally; nothing travels this step
            for rec, off in layout:
                rec.acc += buf[off:off + rec.count]
            fut.set_result(torch.zeros_like(buf))
            return fut
        out = torch.empty_like(buf)
        reqs, back = _launch_params(state, buf, layout, out)

        def finish(_results):
            for o, e, y in back:
                out[o:e] = y
            return out

        state.buckets_launched += 1
        state._complete_later(reqs, finish, fut)
        return fut
    # without a model: one state per DDP bucket index, float32 buckets compressed
    if not state._warned_buckets:
        state._warned_buckets = True
        warnings.warn(
            "gcoll hook: this GcollHookState was made without model=, so its compression "
            "residuals are kept per DDP bucket; DDP rebuilds its buckets after the first "
            "step and a restored job may bucket differently, so a checkpoint made with it "
            "will not continue bit for bit (pass model= or use gcoll.torch.register(model))",
            UserWarning, stacklevel=2)
    if buf.dtype != torch.float32:
        reqs = [state.comm.iallreduce(buf, torch.empty_like(buf), op=state.op)]
    else:
        rec = state._bucket_record(bucket.index(), buf.numel())
        reqs = [state.comm.icompressed_allreduce(rec.ts, buf, torch.empty_like(buf),
                                                 op=state.op)]
    state.buckets_launched += 1
    state._complete_later(reqs, lambda res: res[0], fut)
    return fut


def register(model, spec=None, **kwargs):
    """Creates a GcollHookState(spec, model=model, **kwargs), registers comm_hook on the
    DDP model and returns the state."""
    kwargs.setdefault("model", model)
    state = GcollHookState(spec, **kwargs)
    model.register_comm_hook(state, comm_hook)
    return state
