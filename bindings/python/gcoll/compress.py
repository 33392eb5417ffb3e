# compress.py: compressor specs and per-tensor states (the codec layer, no network).
"""gcoll.Compressor wraps a compressor spec ("topk:density=0.01", "sign", "dgc:...");
gcoll.TensorState holds one tensor's error-feedback residual and step. encode() returns
the message as bytes; decode() writes into an array (numpy when none is given)."""

import ctypes

from . import _lib
from ._buffers import _is_numpy, as_buf
from ._lib import FLOAT32, GcollError, lib

CODEC_SPARSE = 0x1
CODEC_RANDOMK = 0x2
CODEC_QUANTIZED = 0x4
CODEC_STOCHASTIC = 0x8
CODEC_LOSSLESS = 0x10
CODEC_NEEDS_STATE = 0x20


def check_spec(spec):
    """Raises ValueError naming the bad part of spec; returns None when it parses."""
    err = ctypes.create_string_buffer(512)
    st = lib.gcoll_compressor_check(spec.encode(), err, len(err))
    if st != _lib.OK:
        msg = err.value.decode(errors="replace")
        raise ValueError(msg or "compressor spec %r: %s" % (spec, _lib.status_string(st)))


def _msg(msg):
    """(pointer argument, length, keep-alive) of an encoded message: bytes, bytearray,
    memoryview or a numpy uint8 array, without copying."""
    if isinstance(msg, bytes):
        return msg, len(msg), msg
    if _is_numpy(msg):
        if msg.dtype.name != "uint8" or not msg.flags.c_contiguous:
            raise TypeError("message: a numpy array must be contiguous uint8")
        return msg.ctypes.data, msg.size, msg
    if isinstance(msg, (bytearray, memoryview)):
        mv = memoryview(msg).cast("B")
        if mv.readonly:
            b = bytes(mv)
            return b, len(b), b
        arr = (ctypes.c_char * len(mv)).from_buffer(mv)
        return ctypes.addressof(arr), len(mv), (arr, mv)
    raise TypeError("message: expected bytes, bytearray, memoryview or a numpy uint8 array, "
                    "got %s" % type(msg).__name__)


class Compressor:
    """An immutable compressor, shareable by threads. spec is canonical (every parameter
    spelled out), flags the GCOLL_CODEC_* bits."""

    def __init__(self, spec):
        if not isinstance(spec, str):
            raise TypeError("Compressor: spec must be a str, got %s" % type(spec).__name__)
        self._ptr = None
        check_spec(spec)
        h = ctypes.c_void_p()
        _lib.check(lib.gcoll_compressor_create(spec.encode(), ctypes.byref(h)),
                   "gcoll_compressor_create")
        self._ptr = h.value

    def _live(self):
        if not self._ptr:
            raise ValueError("gcoll compressor is closed")
        return self._ptr

    @property
    def spec(self):
        return lib.gcoll_compressor_spec(self._live()).decode()

    @property
    def flags(self):
        return lib.gcoll_compressor_flags(self._live())

    is_sparse = property(lambda self: bool(self.flags & CODEC_SPARSE))
    is_lossless = property(lambda self: bool(self.flags & CODEC_LOSSLESS))
    needs_state = property(lambda self: bool(self.flags & CODEC_NEEDS_STATE))

    def bound(self, count):
        """Worst-case encoded size in bytes of count elements (0 past 2^32 - 1)."""
        return lib.gcoll_compressor_bound(self._live(), count)

    def state(self, count):
        """A new TensorState of this compressor for a tensor of count elements."""
        return TensorState(self, count)

    def _encode(self, state, x, offset):
        what = "gcoll_encode" if offset is None else "gcoll_encode_chunk"
        b = as_buf(x, what + " input", dtypes={FLOAT32})
        if state is not None:
            if not isinstance(state, TensorState):
                raise TypeError("%s: state must be a gcoll.TensorState" % what)
            if state.compressor is not self:
                raise ValueError("%s: the state belongs to another Compressor" % what)
        cap = self.bound(b.count)
        if cap == 0:
            raise ValueError("%s: %d elements are too many (indices are 32-bit)" % (what, b.count))
        out = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t(0)
        sp = state._live() if state is not None else None
        if offset is None:
            st = lib.gcoll_encode(self._live(), sp, b.ptr, b.count, out, cap, ctypes.byref(n))
        else:
            st = lib.gcoll_encode_chunk(self._live(), sp, offset, b.ptr, b.count, out, cap,
                                        ctypes.byref(n))
        if st != _lib.OK:
            raise GcollError(what, st, "%s (NaN/Inf input, or a count the state does not "
                             "have; gcoll's log has details)" % _lib.status_string(st))
        return out.raw[:n.value]

    def encode(self, x, state=None):
        """Encodes x (float32) and returns the message as bytes. With a state, applies its
        error feedback (and DGC) and advances its step; dgc requires one."""
        return self._encode(state, x, None)

    def encode_chunk(self, state, offset, x):
        """Encodes x as elements [offset, offset + len(x)) of state's tensor; the step does
        not advance (call state.advance() after a step's last chunk)."""
        return self._encode(state, x, int(offset))

    def decode_info(self, msg):
        """(count, nnz) of a well-formed message: elements and values it carries."""
        p, n, _keep = _msg(msg)
        count, nnz = ctypes.c_size_t(0), ctypes.c_size_t(0)
        st = lib.gcoll_decode_info(p, n, ctypes.byref(count), ctypes.byref(nnz))
        if st != _lib.OK:
            raise GcollError("gcoll_decode_info", st, "malformed message")
        return count.value, nnz.value

    def decode(self, msg, out=None, accumulate=False):
        """Decodes msg into out (float32; overwritten, or added to with accumulate=True) and
        returns out. Without out, a new numpy array of the message's size."""
        p, n, keep = _msg(msg)
        if out is None:
            import numpy

            out = numpy.zeros(self.decode_info(msg)[0], dtype=numpy.float32)
        o = as_buf(out, "gcoll_decode out", writable=True, dtypes={FLOAT32})
        st = lib.gcoll_decode(self._live(), p, n, o.ptr, o.count, 1 if accumulate else 0)
        del keep
        if st != _lib.OK:
            raise GcollError("gcoll_decode", st, "malformed message or wrong size (out has "
                             "%d elements)" % o.count)
        return out

    def decode_pairs(self, msg, count=None):
        """(idx uint32, val float32) numpy arrays of the message's pairs, ascending index."""
        import numpy

        p, n, keep = _msg(msg)
        mcount, nnz = self.decode_info(msg)
        count = mcount if count is None else count
        idx = numpy.empty(nnz, dtype=numpy.uint32)
        val = numpy.empty(nnz, dtype=numpy.float32)
        got = ctypes.c_size_t(0)
        st = lib.gcoll_decode_pairs(self._live(), p, n, count, idx.ctypes.data, val.ctypes.data,
                                    nnz, ctypes.byref(got))
        del keep
        if st != _lib.OK:
            raise GcollError("gcoll_decode_pairs", st, "malformed message or wrong count")
        return idx[:got.value], val[:got.value]

    def close(self):
        """Destroys the compressor. Close its TensorStates first: they become unusable."""
        if self._ptr:
            ptr, self._ptr = self._ptr, None
            lib.gcoll_compressor_destroy(ptr)

    def __del__(self):
        if getattr(self, "_ptr", None):
            self.close()

    def __repr__(self):
        return "gcoll.Compressor(%r)" % (self.spec if self._ptr else "<closed>")


class TensorState:
    """One tensor's compression state: error-feedback residual, DGC buffers, step.
    Used by one thread at a time, and not at all while a collective on it is running."""

    def __init__(self, compressor, count):
        if isinstance(compressor, str):
            compressor = Compressor(compressor)
        if not isinstance(compressor, Compressor):
            raise TypeError("TensorState: expected a gcoll.Compressor or a spec string")
        if not isinstance(count, int) or count < 0:
            raise ValueError("TensorState: count must be a non-negative int, got %r" % (count,))
        self._ptr = None
        self.compressor = compressor
        self.count = count
        h = ctypes.c_void_p()
        _lib.check(lib.gcoll_state_create(compressor._live(), count, ctypes.byref(h)),
                   "gcoll_state_create")
        self._ptr = h.value

    def _live(self):
        if not self._ptr:
            raise ValueError("gcoll tensor state is closed")
        self.compressor._live()
        return self._ptr

    @property
    def step(self):
        """Encodes (or compressed collectives) done with this state so far."""
        return lib.gcoll_state_step(self._live())

    def advance(self):
        lib.gcoll_state_advance(self._live())

    def residual(self):
        """A numpy copy of the error-feedback residual (DGC: the accumulation), or None if
        the state keeps no feedback."""
        import numpy

        r = lib.gcoll_state_residual(self._live())
        if not r or self.count == 0:
            return None if not r else numpy.zeros(0, dtype=numpy.float32)
        return numpy.ctypeslib.as_array(r, shape=(self.count,)).copy()

    def save(self):
        """gcoll_state_save(): everything that decides this state's next encodes (step,
        residual, DGC velocity, reused threshold, server residual) and its compressor's
        spec, as bytes for a checkpoint."""
        n = ctypes.c_size_t(0)
        _lib.check(lib.gcoll_state_save(self._live(), None, 0, ctypes.byref(n)),
                   "gcoll_state_save")
        buf = ctypes.create_string_buffer(n.value)
        _lib.check(lib.gcoll_state_save(self._live(), buf, n.value, ctypes.byref(n)),
                   "gcoll_state_save")
        return buf.raw[:n.value]

    def load(self, data):
        """gcoll_state_load(): restores what save() returned into this state (same spec
        and count), so that it continues bit for bit. GcollError (GCOLL_ERR_MISMATCH,
        GCOLL_ERR_INVALID) leaves the state as it was."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("TensorState.load: expected bytes, got %s" % type(data).__name__)
        data = bytes(data)
        st = lib.gcoll_state_load(self._live(), data, len(data))
        if st != _lib.OK:
            raise GcollError("gcoll_state_load", st, "the saved state does not fit this one "
                             "(spec %s, %d elements; gcoll's log says what differs)"
                             % (self.compressor.spec, self.count))

    def close(self):
        if self._ptr:
            ptr, self._ptr = self._ptr, None
            lib.gcoll_state_destroy(ptr)

    def __del__(self):
        if getattr(self, "_ptr", None):
            self.close()

    def __repr__(self):
        return "gcoll.TensorState(%r, count=%d)" % (self.compressor.spec, self.count)


class Adapt:
    """gcoll_adapt_create(): a controller that chooses, every call, the density (top-k,
    random-k, DGC) or bit width (qsgd, q8) of one TensorState's codec from GCOLL_ADAPT's
    rules ("bandwidth", "snr", "stage", "phase", combined with '+'), identically on every
    rank (docs/adaptation.md). rules None reads GCOLL_ADAPT. attach(state) once, then run
    comm.compressed_allreduce on that state as usual; stats() reads what it decided.
    With "budget", join(other) puts controllers under one budget split over their
    tensors. close() before the state is closed."""

    def __init__(self, comm, rules=None):
        self._ptr = None
        self.comm = comm
        h = ctypes.c_void_p()
        _lib.check(lib.gcoll_adapt_create(comm._live(), None if rules is None else
                                          rules.encode(), ctypes.byref(h)),
                   "gcoll_adapt_create")
        self._ptr = h.value
        self.state = None

    def attach(self, state):
        """Drives state's codec from the next compressed allreduce on it (every rank alike).
        GcollError (GCOLL_ERR_INVALID) for a codec with nothing to adapt."""
        if not self._ptr:
            raise ValueError("gcoll adaptation controller is closed")
        _lib.check(lib.gcoll_adapt_attach(self._ptr, state._live()), "gcoll_adapt_attach")
        self.state = state

    def join(self, other):
        """gcoll_adapt_join(): shares other's budget (the "budget" rule over several
        tensors): after each call, this controller's density is its share of the members'
        total k, split by their gradients' energies. Both attached to density codecs, both
        with "budget", before the first call; every rank alike. GcollError otherwise."""
        if not self._ptr or not other._ptr:
            raise ValueError("gcoll adaptation controller is closed")
        _lib.check(lib.gcoll_adapt_join(self._ptr, other._ptr), "gcoll_adapt_join")

    def stats(self):
        """{steps, noise_scale, grad_sq, noise_sq, noise_share, stage, phase_boost,
        bandwidth, density, bits}: gcoll_adapt_stats_t, the same on every rank."""
        if not self._ptr:
            raise ValueError("gcoll adaptation controller is closed")
        st = _lib.AdaptStats()
        _lib.check(lib.gcoll_adapt_stats(self._ptr, ctypes.byref(st)), "gcoll_adapt_stats")
        return {name: getattr(st, name) for name, _ in _lib.AdaptStats._fields_}

    def close(self):
        if self._ptr:
            ptr, self._ptr = self._ptr, None
            lib.gcoll_adapt_destroy(ptr)

    def __del__(self):
        if getattr(self, "_ptr", None):
            self.close()


def adapt_rules(rules):
    """The GCOLL_ADAPT_* mask of a rule string ("off" is 0); ValueError when unknown."""
    m = ctypes.c_uint(0)
    if lib.gcoll_adapt_parse(rules.encode(), ctypes.byref(m)) != _lib.OK:
        raise ValueError("GCOLL_ADAPT=%r: not a combination of bandwidth, phase, snr, stage "
                         "and budget joined by '+' (or off, both)" % (rules,))
    return m.value
