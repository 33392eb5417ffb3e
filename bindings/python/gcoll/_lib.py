# _lib.py: finds libgcoll.so, declares the C prototypes, and turns statuses into GcollError.
"""Loading of the C library and the error type of the binding.

The library is looked up, in order, at $GCOLL_LIBRARY, in the .libs directory of the build
tree the process runs from (the current directory or $top_builddir), in the .libs of an
in-tree build next to this package, in the directory pip's build found it in
(gcoll/_libpath.py, written by `pip install ./bindings/python`), and finally by
ctypes.util.find_library("gcoll") (an installed libgcoll.so.0).
"""

import ctypes
import ctypes.util
import os

# gcoll_status_t
OK = 0
INPROGRESS = 1
STATUS_NAMES = {
    0: "GCOLL_OK",
    1: "GCOLL_INPROGRESS",
    -1: "GCOLL_ERR_INVALID",
    -2: "GCOLL_ERR_NOMEM",
    -3: "GCOLL_ERR_TRANSPORT",
    -4: "GCOLL_ERR_TIMEOUT",
    -5: "GCOLL_ERR_PEER",
    -6: "GCOLL_ERR_MISMATCH",
    -7: "GCOLL_ERR_UNSUPPORTED",
    -8: "GCOLL_ERR_ABORTED",
    -9: "GCOLL_ERR_INTERNAL",
}

# gcoll_dtype_t and gcoll_op_t, in the order of gcoll.h
FLOAT32, FLOAT16, BFLOAT16, FLOAT64, INT32, INT64 = range(6)
BOOL, INT8, UINT8, INT16, UINT32, UINT64, FLOAT8_E4M3, FLOAT8_E5M2 = range(6, 14)
SUM, AVG, MIN, MAX, PROD, BAND, BOR, BXOR = range(8)
OPS = {"sum": SUM, "avg": AVG, "min": MIN, "max": MAX, "prod": PROD, "band": BAND, "bor": BOR,
       "bxor": BXOR}


class GcollError(RuntimeError):
    """A gcoll call failed. status is the gcoll_status_t value, status_name its name
    ("GCOLL_ERR_TIMEOUT"), and message the detail (gcoll_comm_last_error() when the call
    had a communicator, else the thread's gcoll_last_error())."""

    def __init__(self, what, status, message=""):
        self.what = what
        self.status = status
        self.status_name = STATUS_NAMES.get(status, "GCOLL_STATUS_%d" % status)
        self.message = message
        if self.status_name in message:
            text = message  # gcoll's own message already names the call and the status
        else:
            text = "%s failed: %s" % (what, self.status_name) + (": " + message if message else "")
        super().__init__(text)


def _candidates():
    env = os.environ.get("GCOLL_LIBRARY")
    if env:
        # An explicit choice is never second-guessed: a wrong path is an error.
        return [env], True
    names = []
    for top in (os.getcwd(), os.environ.get("top_builddir")):
        if top:
            names.append(os.path.join(top, ".libs", "libgcoll.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    names.append(os.path.normpath(os.path.join(here, "..", "..", "..", ".libs", "libgcoll.so")))
    try:
        from . import _libpath  # written by the pip build only
        names.append(os.path.join(_libpath.LIBDIR, "libgcoll.so.0"))
    except ImportError:
        pass
    return names, False


def _load():
    names, explicit = _candidates()
    tried = []
    for path in names:
        if explicit or os.path.exists(path):
            try:
                return ctypes.CDLL(path), path
            except OSError as e:
                if explicit:
                    raise ImportError("gcoll: cannot load GCOLL_LIBRARY=%s: %s" % (path, e))
                tried.append("%s (%s)" % (path, e))
        else:
            tried.append(path + " (absent)")
    found = ctypes.util.find_library("gcoll")
    if found:
        try:
            return ctypes.CDLL(found), found
        except OSError as e:
            tried.append("%s (%s)" % (found, e))
    else:
        tried.append("find_library('gcoll') (not found)")
    raise ImportError("gcoll: libgcoll.so not found; set GCOLL_LIBRARY to its path. Tried: "
                      + "; ".join(tried))


lib, path = _load()

_st = ctypes.c_int
_p = ctypes.c_void_p
_sz = ctypes.c_size_t
_pp = ctypes.POINTER(ctypes.c_void_p)
_psz = ctypes.POINTER(ctypes.c_size_t)


class Counters(ctypes.Structure):
    """gcoll_counters_t: cumulative since the communicator was created."""

    _fields_ = [
        ("ops", ctypes.c_uint64),
        ("bytes_raw", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_received", ctypes.c_uint64),
        ("ns_compress", ctypes.c_uint64),
        ("ns_wire", ctypes.c_uint64),
        ("ns_total", ctypes.c_uint64),
    ]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}

    def __repr__(self):
        return "Counters(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class AdaptStats(ctypes.Structure):
    """gcoll_adapt_stats_t."""

    _fields_ = [("steps", ctypes.c_long), ("noise_scale", ctypes.c_double),
                ("grad_sq", ctypes.c_double), ("noise_sq", ctypes.c_double),
                ("noise_share", ctypes.c_double), ("stage", ctypes.c_double),
                ("phase_boost", ctypes.c_double), ("bandwidth", ctypes.c_double),
                ("density", ctypes.c_double), ("bits", ctypes.c_uint)]


class BucketerConfig(ctypes.Structure):
    """gcoll_bucketer_config_t."""

    _fields_ = [
        ("bucket_bytes", ctypes.c_size_t),
        ("op", ctypes.c_int),
        ("policy", ctypes.c_char_p),
        ("default_spec", ctypes.c_char_p),
        ("accumulate_steps", ctypes.c_int),
        ("warmup_steps", ctypes.c_uint64),
    ]


_PROTOS = {
    "gcoll_version": (ctypes.c_char_p, []),
    "gcoll_status_string": (ctypes.c_char_p, [_st]),
    "gcoll_transports_built": (ctypes.c_char_p, []),
    "gcoll_comm_init": (_st, [_pp]),
    "gcoll_comm_init_rank": (_st, [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, _pp]),
    "gcoll_comm_destroy": (_st, [_p]),
    "gcoll_comm_abort": (_st, [_p]),
    "gcoll_comm_rank": (ctypes.c_int, [_p]),
    "gcoll_comm_size": (ctypes.c_int, [_p]),
    "gcoll_comm_last_error": (ctypes.c_char_p, [_p]),
    "gcoll_last_error": (ctypes.c_char_p, []),
    "gcoll_comm_transport": (ctypes.c_char_p, [_p]),
    "gcoll_comm_counters": (_st, [_p, ctypes.POINTER(Counters)]),
    "gcoll_allreduce": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_iallreduce": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_broadcast": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_ibroadcast": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_barrier": (_st, [_p]),
    "gcoll_ibarrier": (_st, [_p, _pp]),
    "gcoll_allgather": (_st, [_p, _p, _p, _sz, ctypes.c_int]),
    "gcoll_reduce": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "gcoll_ireduce": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_gather": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_igather": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_scatter": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_iscatter": (_st, [_p, _p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_send": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_recv": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int]),
    "gcoll_isend": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_irecv": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.c_int, _pp]),
    "gcoll_recv_any": (_st, [_p, _p, _sz, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "gcoll_group_start": (_st, [_p]),
    "gcoll_group_end": (_st, [_p]),
    "gcoll_wait": (_st, [_p]),
    "gcoll_test": (_st, [_p, ctypes.POINTER(ctypes.c_int)]),
    "gcoll_sparse_allreduce": (_st, [_p, _p, _p, _sz, _sz, _p, ctypes.c_int]),
    "gcoll_isparse_allreduce": (_st, [_p, _p, _p, _sz, _sz, _p, ctypes.c_int, _pp]),
    "gcoll_compressed_allreduce": (_st, [_p, _p, _p, _p, _sz, ctypes.c_int]),
    "gcoll_icompressed_allreduce": (_st, [_p, _p, _p, _p, _sz, ctypes.c_int, _pp]),
    "gcoll_compressed_reduce_scatter": (_st, [_p, _p, _p, _p, _sz, ctypes.c_int]),
    "gcoll_shard_range": (None, [_p, _sz, _psz, _psz]),
    "gcoll_compressor_create": (_st, [ctypes.c_char_p, _pp]),
    "gcoll_compressor_check": (_st, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
    "gcoll_compressor_destroy": (None, [_p]),
    "gcoll_compressor_spec": (ctypes.c_char_p, [_p]),
    "gcoll_compressor_bound": (_sz, [_p, _sz]),
    "gcoll_compressor_flags": (ctypes.c_uint, [_p]),
    "gcoll_state_create": (_st, [_p, _sz, _pp]),
    "gcoll_state_destroy": (None, [_p]),
    "gcoll_state_residual": (ctypes.POINTER(ctypes.c_float), [_p]),
    "gcoll_state_step": (ctypes.c_uint64, [_p]),
    "gcoll_state_advance": (None, [_p]),
    "gcoll_state_save": (_st, [_p, _p, _sz, _psz]),
    "gcoll_state_load": (_st, [_p, _p, _sz]),
    "gcoll_encode": (_st, [_p, _p, _p, _sz, _p, _sz, _psz]),
    "gcoll_encode_chunk": (_st, [_p, _p, _sz, _p, _sz, _p, _sz, _psz]),
    "gcoll_decode": (_st, [_p, _p, _sz, _p, _sz, ctypes.c_int]),
    "gcoll_decode_info": (_st, [_p, _sz, _psz, _psz]),
    "gcoll_decode_pairs": (_st, [_p, _p, _sz, _sz, _p, _p, _sz, _psz]),
    "gcoll_bucketer_create": (_st, [_p, ctypes.POINTER(BucketerConfig), _pp]),
    "gcoll_bucketer_add_tensor": (_st, [_p, ctypes.c_char_p, _p, _sz, ctypes.c_int,
                                        ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
    "gcoll_bucketer_tensor_spec": (ctypes.c_char_p, [_p, ctypes.c_int]),
    "gcoll_bucketer_destroy": (None, [_p]),
    "gcoll_adapt_parse": (_st, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint)]),
    "gcoll_adapt_create": (_st, [_p, ctypes.c_char_p, _pp]),
    "gcoll_adapt_attach": (_st, [_p, _p]),
    "gcoll_adapt_join": (_st, [_p, _p]),
    "gcoll_adapt_stats": (_st, [_p, ctypes.POINTER(AdaptStats)]),
    "gcoll_adapt_destroy": (None, [_p]),
}

for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def status_string(status):
    """gcoll_status_string(): "GCOLL_ERR_TIMEOUT: timed out"."""
    return lib.gcoll_status_string(status).decode()


def version():
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return lib.gcoll_version().decode()


def transports_built():
    """Transports compiled into the library, e.g. ["tcp", "ucx"]."""
    return [t for t in lib.gcoll_transports_built().decode().split(",") if t]


def check(status, what, comm_ptr=None, message=None):
    """Raises GcollError unless status is GCOLL_OK (or GCOLL_INPROGRESS)."""
    if status in (OK, INPROGRESS):
        return
    if message is None:
        message = ""
        if comm_ptr:
            message = lib.gcoll_comm_last_error(comm_ptr).decode(errors="replace")
        if not message:  # this thread's last error: a failed init or spec, say
            message = lib.gcoll_last_error().decode(errors="replace")
        if not message:
            message = status_string(status)
    raise GcollError(what, status, message)
