// wire.h: how a torch tensor becomes the buffer a gcoll call reads and writes (included
// once, by backend.cpp). Reductions need a dtype gcoll reduces; data movement (broadcast,
// gathers, all-to-all) only moves bytes, so any dtype travels, as 32-bit words.
#pragma once

#include <torch/extension.h>

#include <string>

#include "gcoll.h"

namespace gcoll_torch
{

// What gcoll reduces; nullopt-like false for the rest.
static bool reducible_dtype(at::ScalarType s, gcoll_dtype_t *dt)
{
    switch (s) {
    case at::kFloat:
        *dt = GCOLL_FLOAT32;
        return true;
    case at::kDouble:
        *dt = GCOLL_FLOAT64;
        return true;
    case at::kHalf:
        *dt = GCOLL_FLOAT16;
        return true;
    case at::kBFloat16:
        *dt = GCOLL_BFLOAT16;
        return true;
    case at::kInt:
        *dt = GCOLL_INT32;
        return true;
    case at::kLong:
        *dt = GCOLL_INT64;
        return true;
    case at::kBool:
        *dt = GCOLL_BOOL;
        return true;
    case at::kChar:
        *dt = GCOLL_INT8;
        return true;
    case at::kByte:
        *dt = GCOLL_UINT8;
        return true;
    case at::kShort:
        *dt = GCOLL_INT16;
        return true;
    case at::kUInt32:
        *dt = GCOLL_UINT32;
        return true;
    case at::kUInt64:
        *dt = GCOLL_UINT64;
        return true;
    case at::kFloat8_e4m3fn:
        *dt = GCOLL_FLOAT8_E4M3;
        return true;
    case at::kFloat8_e5m2:
        *dt = GCOLL_FLOAT8_E5M2;
        return true;
    default:
        return false;
    }
}

static const char *const REDUCIBLE =
    "float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2, bool, int8, uint8, int16, "
    "int32, uint32, int64, uint64 and complex64/complex128 (as their real view) with SUM or AVG";

static gcoll_op_t to_gcoll_op(const c10d::ReduceOp &op, const char *what)
{
    switch (op.op_) {
    case c10d::ReduceOp::SUM:
        return GCOLL_SUM;
    case c10d::ReduceOp::AVG:
        return GCOLL_AVG;
    case c10d::ReduceOp::MIN:
        return GCOLL_MIN;
    case c10d::ReduceOp::MAX:
        return GCOLL_MAX;
    case c10d::ReduceOp::PRODUCT:
        return GCOLL_PROD;
    case c10d::ReduceOp::BAND:
        return GCOLL_BAND;
    case c10d::ReduceOp::BOR:
        return GCOLL_BOR;
    case c10d::ReduceOp::BXOR:
        return GCOLL_BXOR;
    default:
        break;
    }
    TORCH_CHECK(
        false, "gcoll backend: ", what, ": reduce op ", static_cast<int>(op.op_),
        " is not supported (SUM, AVG, MIN, MAX, PRODUCT, BAND, BOR, BXOR; PREMUL_SUM: scale the "
        "tensor first and use SUM)");
}

static void check_cpu(const at::Tensor &t, const char *what)
{
    TORCH_CHECK(t.defined(), "gcoll backend: ", what, ": undefined tensor");
    TORCH_CHECK(t.device().is_cpu(), "gcoll backend: ", what, ": the tensor is on ", t.device(),
                "; gcoll takes CPU tensors (register another backend for ", t.device().type(),
                ", e.g. \"cpu:gcoll,cuda:nccl\")");
    TORCH_CHECK(t.layout() == at::kStrided, "gcoll backend: ", what,
                ": sparse tensors are not supported (use to_dense())");
}

static at::Tensor bytes_of(const at::Tensor &contig)
{
    return contig.reshape({-1}).view(at::kByte);
}

// The buffer gcoll reads and writes for one user tensor. buf aliases the user's memory
// when it can; otherwise it is a copy that copy_back() writes into the user's tensor (so
// in-place semantics hold for strided tensors and padded byte buffers too).
struct Wire {
    at::Tensor user;    // the caller's tensor
    at::Tensor buf;     // contiguous; what gcoll gets
    gcoll_dtype_t dt;   // of buf's elements
    size_t count = 0;   // elements of dt in buf
    size_t nbytes = 0;  // bytes of the caller's data (buf may have up to 3 more)
    bool alias = false; // buf is the caller's memory
    void *ptr() const { return buf.data_ptr(); }
    void copy_back() const
    {
        if (!alias)
            user.copy_(
                bytes_of(buf).narrow(0, 0, nbytes).view(user.scalar_type()).view(user.sizes()));
    }
};

// A tensor for a reduction: a dtype gcoll reduces (complex through its real view, which
// only SUM and AVG are right for, as torch says).
static Wire wire_reduce(const at::Tensor &t, gcoll_op_t op, const char *what)
{
    check_cpu(t, what);
    Wire w;
    w.user = t;
    at::Tensor c = t.is_contiguous() ? t : t.contiguous();
    w.alias = c.is_same(t);
    if (c.is_complex()) {
        TORCH_CHECK(op == GCOLL_SUM || op == GCOLL_AVG, "gcoll backend: ", what,
                    ": complex tensors reduce with SUM or AVG only (as torch's own backends)");
        c = at::view_as_real(c);
    }
    TORCH_CHECK(reducible_dtype(c.scalar_type(), &w.dt), "gcoll backend: ", what, ": dtype ",
                t.scalar_type(), " cannot be reduced by gcoll yet (its C API reduces ", REDUCIBLE,
                "); cast it (e.g. t.int()) or use a gloo group for it");
    w.buf = c.reshape({-1});
    w.count = c.numel();
    w.nbytes = t.numel() * t.element_size();
    return w;
}

// A tensor for data movement: bytes, as 32-bit words. When its size is not a multiple of
// 4 bytes (or it is strided), a zero-padded copy is what travels.
static Wire wire_move(const at::Tensor &t, const char *what)
{
    check_cpu(t, what);
    Wire w;
    w.user = t;
    w.dt = GCOLL_INT32;
    w.nbytes = t.numel() * t.element_size();
    size_t words = (w.nbytes + 3) / 4;
    if (t.is_contiguous() && w.nbytes % 4 == 0 &&
        (t.storage_offset() * t.element_size()) % 4 == 0) {
        w.buf = bytes_of(t).view(at::kInt);
        w.alias = true;
    } else {
        w.buf = at::zeros({(int64_t)words}, t.options().dtype(at::kInt));
        if (w.nbytes)
            bytes_of(w.buf).narrow(0, 0, w.nbytes).copy_(bytes_of(t.contiguous()));
    }
    w.count = words;
    return w;
}

// A tensor as its bytes (GCOLL_UINT8), for the calls that only move data (point-to-point,
// gather, scatter): the tensor itself when it is contiguous, else a contiguous copy that
// copy_back() writes into it.
static Wire wire_bytes(const at::Tensor &t, const char *what)
{
    check_cpu(t, what);
    Wire w;
    w.user = t;
    at::Tensor c = t.contiguous();
    w.alias = c.is_same(t);
    w.buf = bytes_of(c);
    w.dt = GCOLL_UINT8;
    w.nbytes = t.numel() * t.element_size();
    w.count = w.nbytes;
    return w;
}

// The i-th block of bpb bytes of a flat byte buffer, as a tensor shaped like like.
static at::Tensor block_as(const at::Tensor &flat_bytes, size_t off, const at::Tensor &like)
{
    size_t n = like.numel() * like.element_size();
    return flat_bytes.narrow(0, off, n).view(like.scalar_type()).view(like.sizes());
}

} // namespace gcoll_torch
