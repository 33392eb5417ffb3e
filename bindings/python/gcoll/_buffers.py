# _buffers.py: NumPy arrays and torch CPU tensors as (pointer, count, dtype), never copied.
"""The binding hands gcoll the memory of the caller's array itself, so an array must be
contiguous, on the CPU and of a dtype gcoll knows; anything else is a TypeError (wrong
kind or dtype) or a ValueError (right kind, unusable layout), never a silent copy."""

import sys

from . import _lib

_NUMPY_DTYPES = {
    "float32": _lib.FLOAT32,
    "float16": _lib.FLOAT16,
    "float64": _lib.FLOAT64,
    "int32": _lib.INT32,
    "int64": _lib.INT64,
    "bool": _lib.BOOL,
    "int8": _lib.INT8,
    "uint8": _lib.UINT8,
    "int16": _lib.INT16,
    "uint32": _lib.UINT32,
    "uint64": _lib.UINT64,
}
_TORCH_DTYPES = {
    "torch.float32": _lib.FLOAT32,
    "torch.float16": _lib.FLOAT16,
    "torch.bfloat16": _lib.BFLOAT16,
    "torch.float64": _lib.FLOAT64,
    "torch.int32": _lib.INT32,
    "torch.int64": _lib.INT64,
    "torch.bool": _lib.BOOL,
    "torch.int8": _lib.INT8,
    "torch.uint8": _lib.UINT8,
    "torch.int16": _lib.INT16,
    "torch.uint32": _lib.UINT32,
    "torch.uint64": _lib.UINT64,
    "torch.float8_e4m3fn": _lib.FLOAT8_E4M3,
    "torch.float8_e5m2": _lib.FLOAT8_E5M2,
}
DTYPE_NAMES = {
    _lib.FLOAT32: "float32",
    _lib.FLOAT16: "float16",
    _lib.BFLOAT16: "bfloat16",
    _lib.FLOAT64: "float64",
    _lib.INT32: "int32",
    _lib.INT64: "int64",
    _lib.BOOL: "bool",
    _lib.INT8: "int8",
    _lib.UINT8: "uint8",
    _lib.INT16: "int16",
    _lib.UINT32: "uint32",
    _lib.UINT64: "uint64",
    _lib.FLOAT8_E4M3: "float8_e4m3",
    _lib.FLOAT8_E5M2: "float8_e5m2",
}


class Buf:
    """A borrowed view of an array: ptr, count (elements), dtype (gcoll_dtype_t), and
    obj, the array itself, kept so the memory outlives a nonblocking call."""

    __slots__ = ("obj", "ptr", "count", "dtype")

    def __init__(self, obj, ptr, count, dtype):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def as_buf(x, what, writable=False, dtypes=None):
    """Borrows x (a numpy.ndarray or a torch CPU tensor). dtypes, if given, is the set of
    gcoll dtypes allowed (e.g. {FLOAT32} for the compressed collectives)."""
    if _is_numpy(x):
        dtype = _NUMPY_DTYPES.get(x.dtype.name)
        if dtype is None:
            raise TypeError("%s: numpy dtype %s is not supported (%s)"
                            % (what, x.dtype, ", ".join(_NUMPY_DTYPES)))
        if not x.flags.c_contiguous:
            raise ValueError("%s: the array must be C-contiguous (use numpy.ascontiguousarray)"
                             % what)
        if writable and not x.flags.writeable:
            raise ValueError("%s: the array is read-only" % what)
        ptr, count = x.ctypes.data, x.size
    elif _is_torch(x):
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise TypeError("%s: torch dtype %s is not supported (%s)"
                            % (what, x.dtype, ", ".join(_TORCH_DTYPES)))
        if x.device.type != "cpu":
            raise ValueError("%s: the tensor is on %s; gcoll takes CPU tensors" % (what, x.device))
        if x.is_sparse or not x.is_contiguous():
            raise ValueError("%s: the tensor must be dense and contiguous (use .contiguous())"
                             % what)
        if writable and x.requires_grad and x.is_leaf:
            raise ValueError("%s: cannot write into a leaf tensor that requires grad "
                             "(pass .detach() or a gradient)" % what)
        ptr, count = x.data_ptr(), x.numel()
    else:
        raise TypeError("%s: expected a numpy.ndarray or a torch CPU tensor, got %s"
                        % (what, type(x).__name__))
    if dtypes is not None and dtype not in dtypes:
        raise TypeError("%s: dtype %s not supported here (only %s)" % (
            what, DTYPE_NAMES[dtype], ", ".join(DTYPE_NAMES[d] for d in sorted(dtypes))))
    return Buf(x, ptr, count, dtype)


def as_index_buf(x, what):
    """Borrows an index vector for the sparse allreduce: numpy uint32 or int32, or torch
    int32 (torch has no uint32); gcoll reads it as uint32."""
    if _is_numpy(x) and x.dtype.name in ("uint32", "int32"):
        if not x.flags.c_contiguous:
            raise ValueError("%s: the index array must be C-contiguous" % what)
        return Buf(x, x.ctypes.data, x.size, _lib.INT32)
    if _is_torch(x) and str(x.dtype) == "torch.int32":
        return as_buf(x, what)
    if _is_numpy(x) or _is_torch(x):
        raise TypeError("%s: indices must be uint32 or int32 (got %s; convert with "
                        ".astype(numpy.uint32) or .to(torch.int32))" % (what, x.dtype))
    raise TypeError("%s: expected a numpy.ndarray or a torch CPU tensor, got %s"
                    % (what, type(x).__name__))
