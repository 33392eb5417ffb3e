# gcoll/__init__.py: Python binding of gcoll (ctypes over libgcoll.so); see docs/python.md.
"""gcoll: compression-aware collectives for distributed training.

    import gcoll, numpy as np
    with gcoll.Comm() as comm:                       # rank, size, root from the environment
        x = np.ones(1000, dtype=np.float32)
        comm.allreduce(x, op="avg")                  # in place, no copy
        st = gcoll.TensorState(gcoll.Compressor("topk:density=0.01"), x.size)
        out = comm.compressed_allreduce(st, x, np.empty_like(x), op="avg")
        print(comm.counters().bytes_sent)

Arrays are numpy.ndarray or torch CPU tensors, contiguous, passed by pointer. Failures
raise gcoll.GcollError (status, status_name, message). The PyTorch DDP communication hook
is in gcoll.torch (imported separately: it needs torch).
"""

import os as _os

# A build outside the source tree compiles the torch backend into its own
# bindings/python/gcoll: make that directory part of the package (found as _lib finds the
# library: the build tree the process runs from, or $top_builddir).
for _top in (_os.getcwd(), _os.environ.get("top_builddir")):
    _d = _os.path.join(_top, "bindings", "python", "gcoll") if _top else None
    if _d and _os.path.isdir(_d) and _os.path.realpath(_d) not in map(_os.path.realpath, __path__):
        __path__.append(_d)

from ._lib import (AVG, BFLOAT16, FLOAT16, FLOAT32, FLOAT64, INT32, INT64, MAX, MIN, PROD,
                   STATUS_NAMES, SUM, Counters, GcollError, status_string, transports_built,
                   version)
from ._lib import path as library_path
from .comm import Comm, Request
from .compress import (CODEC_LOSSLESS, CODEC_NEEDS_STATE, CODEC_QUANTIZED, CODEC_RANDOMK,
                       CODEC_SPARSE, CODEC_STOCHASTIC, Adapt, Compressor, TensorState,
                       adapt_rules, check_spec)

__version__ = version()

__all__ = [
    "Comm", "Request", "Compressor", "TensorState", "Adapt", "adapt_rules", "GcollError", "Counters", "check_spec",
    "version", "status_string", "transports_built", "library_path", "STATUS_NAMES",
    "SUM", "AVG", "MIN", "MAX", "PROD",
    "FLOAT32", "FLOAT16", "BFLOAT16", "FLOAT64", "INT32", "INT64",
    "CODEC_SPARSE", "CODEC_RANDOMK", "CODEC_QUANTIZED", "CODEC_STOCHASTIC", "CODEC_LOSSLESS",
    "CODEC_NEEDS_STATE",
]
