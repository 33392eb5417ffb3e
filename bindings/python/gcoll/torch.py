# gcoll/torch.py: the torch.distributed backend "gcoll" and a DDP hook over gcoll.
"""PyTorch over gcoll: a torch.distributed backend and a DDP communication hook.

    import gcoll.torch as gt                           # registers the backend "gcoll"
    dist.init_process_group("gcoll", rank=r, world_size=n)   # MASTER_ADDR/MASTER_PORT
    model = DDP(net)                                   # DDP on gcoll alone, or:
    state = gt.register(model, "topk:density=0.01")    # its buckets compressed by gcoll
    torch.save(state.state_dict(), path)               # residuals survive checkpoints

The backend is the C++ extension gcoll._torch_backend (bindings/python/csrc/backend.cpp),
a c10d::Backend built by configure (or pip) against torch >= 2.4. Importing this module
registers it for the CPU device either way (init_process_group then says why it cannot run):
dist.init_process_group("gcoll") or "cpu:gcoll,cuda:nccl", with env://, tcp:// or file://.

DDP hands the hook one flattened gradient bucket at a time, as backward produces them.
The hook (gcoll/_hook.py) starts gcoll's reductions of it and returns a
torch.futures.Future at once; a helper thread completes the future when gcoll's requests
finish, so the reduction runs on gcoll's progress thread while backward goes on. With the
model known, every parameter has its own spec (GCOLL_LAYER_POLICY over GCOLL_COMPRESSOR,
as the C bucketer picks them) and its own error-feedback state, keyed by name, so the
states survive DDP's bucket rebuild and checkpoints; float16/bfloat16 gradients are
compressed from a float32 copy; accumulation and warm-up as the bucketer's. A NaN/Inf on
any rank raises on every rank or reaches every rank's result (nonfinite=), agreed
through the process group.

The hook's gcoll communicator is its own: rank and size are the process group's, the
rendezvous address is root=, else GCOLL_ROOT, else MASTER_ADDR with MASTER_PORT + 1.
"""

import sys as _sys

import torch.distributed as dist

from . import _lib
from ._hook import (GcollHookState, NonFiniteError, comm_hook, default_root, register,
                    resolve_specs, with_warmup)
from .fsdp import FsdpCompressState, fsdp_compress  # FSDP2 (docs/python.md)
from .zero import Zero2HookState, register_zero2, zero2_hook  # ZeRO-2 (docs/python.md)
from .localsgd import LocalSGD  # re-exported: gcoll.torch.LocalSGD (docs/local-sgd.md)
from .ps import ParameterServer  # re-exported: gcoll.torch.ParameterServer

# ---- the torch.distributed backend "gcoll" ------------------------------------------
# The C++ extension is built by configure when it finds torch >= 2.4; without it the
# backend is still registered, so that init_process_group("gcoll") says why it cannot run.
try:
    from . import _torch_backend
except ImportError as _e:  # not built, or built against another torch
    _torch_backend = None
    _backend_error = str(_e)


def _create_backend(store, rank, size, timeout):
    """torch.distributed's creator of the "gcoll" backend (register_backend's func)."""
    if _torch_backend is None:
        raise RuntimeError("gcoll backend: the C++ extension gcoll._torch_backend is not "
                           "available (%s); build it against this torch (>= 2.4) with "
                           "./configure TORCH_PYTHON=%s && make, or pip install "
                           "./bindings/python" % (_backend_error, _sys.executable))
    return _torch_backend.BackendGcoll(store, rank, size, timeout)


def backend_available():
    """Whether the "gcoll" torch.distributed backend can be created here."""
    return _torch_backend is not None


if "GCOLL" not in dist.Backend._plugins:
    dist.Backend.register_backend("gcoll", _create_backend, devices=["cpu"])


GcollError = _lib.GcollError
__all__ = ["fsdp_compress", "FsdpCompressState", "register_zero2", "Zero2HookState",
           "zero2_hook", "LocalSGD", "ParameterServer", "GcollHookState", "NonFiniteError", "comm_hook",
           "register", "default_root", "resolve_specs", "with_warmup", "GcollError",
           "backend_available"]
