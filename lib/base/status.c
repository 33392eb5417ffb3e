/* status.c: names for status codes, dtypes and ops; dtype sizes; the version string. */
#include "gcoll.h"

#define STR_(x) #x
#define STR(x) STR_(x)

const char *gcoll_version(void)
{
    return STR(GCOLL_VERSION_MAJOR) "." STR(GCOLL_VERSION_MINOR) "." STR(GCOLL_VERSION_PATCH);
}

const char *gcoll_status_string(gcoll_status_t status)
{
    /* clang-format off */
    switch (status) {
    case GCOLL_OK: return "GCOLL_OK: success";
    case GCOLL_INPROGRESS: return "GCOLL_INPROGRESS: operation in progress";
    case GCOLL_ERR_INVALID: return "GCOLL_ERR_INVALID: invalid argument or malformed input";
    case GCOLL_ERR_NOMEM: return "GCOLL_ERR_NOMEM: out of memory";
    case GCOLL_ERR_TRANSPORT: return "GCOLL_ERR_TRANSPORT: transport failure";
    case GCOLL_ERR_TIMEOUT: return "GCOLL_ERR_TIMEOUT: timed out";
    case GCOLL_ERR_PEER: return "GCOLL_ERR_PEER: peer failed or disconnected";
    case GCOLL_ERR_MISMATCH: return "GCOLL_ERR_MISMATCH: ranks disagree";
    case GCOLL_ERR_UNSUPPORTED: return "GCOLL_ERR_UNSUPPORTED: not supported";
    case GCOLL_ERR_ABORTED: return "GCOLL_ERR_ABORTED: communicator aborted";
    case GCOLL_ERR_INTERNAL: return "GCOLL_ERR_INTERNAL: internal error";
    }
    /* clang-format on */
    return "GCOLL_ERR_UNKNOWN: unknown status";
}

size_t gcoll_dtype_size(gcoll_dtype_t dtype)
{
    /* clang-format off */
    switch (dtype) {
    case GCOLL_FLOAT32: return 4;
    case GCOLL_FLOAT16: return 2;
    case GCOLL_BFLOAT16: return 2;
    case GCOLL_FLOAT64: return 8;
    case GCOLL_INT32: return 4;
    case GCOLL_INT64: return 8;
    case GCOLL_BOOL: return 1;
    case GCOLL_INT8: return 1;
    case GCOLL_UINT8: return 1;
    case GCOLL_INT16: return 2;
    case GCOLL_UINT32: return 4;
    case GCOLL_UINT64: return 8;
    case GCOLL_FLOAT8_E4M3: return 1;
    case GCOLL_FLOAT8_E5M2: return 1;
    }
    /* clang-format on */
    return 0;
}

const char *gcoll_dtype_name(gcoll_dtype_t dtype)
{
    /* clang-format off */
    switch (dtype) {
    case GCOLL_FLOAT32: return "float32";
    case GCOLL_FLOAT16: return "float16";
    case GCOLL_BFLOAT16: return "bfloat16";
    case GCOLL_FLOAT64: return "float64";
    case GCOLL_INT32: return "int32";
    case GCOLL_INT64: return "int64";
    case GCOLL_BOOL: return "bool";
    case GCOLL_INT8: return "int8";
    case GCOLL_UINT8: return "uint8";
    case GCOLL_INT16: return "int16";
    case GCOLL_UINT32: return "uint32";
    case GCOLL_UINT64: return "uint64";
    case GCOLL_FLOAT8_E4M3: return "float8_e4m3";
    case GCOLL_FLOAT8_E5M2: return "float8_e5m2";
    }
    /* clang-format on */
    return "?";
}

const char *gcoll_op_name(gcoll_op_t op)
{
    /* clang-format off */
    switch (op) {
    case GCOLL_SUM: return "sum";
    case GCOLL_AVG: return "avg";
    case GCOLL_MIN: return "min";
    case GCOLL_MAX: return "max";
    case GCOLL_PROD: return "prod";
    case GCOLL_BAND: return "band";
    case GCOLL_BOR: return "bor";
    case GCOLL_BXOR: return "bxor";
    }
    /* clang-format on */
    return "?";
}
