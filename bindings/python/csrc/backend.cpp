// backend.cpp: the torch.distributed backend "gcoll", a c10d::ProcessGroup over gcoll.h.
//
// Every collective is issued with gcoll's nonblocking call from the caller's thread (in
// the caller's order, which torch keeps the same on every rank) and returns a Work at
// once; one completion thread per process group waits for the requests in the order they
// were issued (gcoll runs them in that order), copies staged results out and completes
// the Work and its Future. gcoll's own progress thread does the communication, so several
// collectives can be in flight while the caller computes.
#include <torch/extension.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gcoll.h"

namespace gcoll_torch
{

namespace py = pybind11;

// ---- tensors and ops ------------------------------------------------------------------

static gcoll_dtype_t to_gcoll_dtype(const at::Tensor &t, const char *what)
{
    switch (t.scalar_type()) {
    case at::kFloat:
        return GCOLL_FLOAT32;
    case at::kDouble:
        return GCOLL_FLOAT64;
    case at::kHalf:
        return GCOLL_FLOAT16;
    case at::kBFloat16:
        return GCOLL_BFLOAT16;
    case at::kInt:
        return GCOLL_INT32;
    case at::kLong:
        return GCOLL_INT64;
    default:
        break;
    }
    TORCH_CHECK(false, "gcoll backend: ", what, ": dtype ", t.scalar_type(),
                " is not supported (float32, float64, float16, bfloat16, int32, int64)");
}

// A CPU dense tensor of a dtype gcoll knows; returns its dtype.
static gcoll_dtype_t check_tensor(const at::Tensor &t, const char *what)
{
    TORCH_CHECK(t.defined(), "gcoll backend: ", what, ": undefined tensor");
    TORCH_CHECK(t.device().is_cpu(), "gcoll backend: ", what, ": the tensor is on ", t.device(),
                "; gcoll takes CPU tensors");
    TORCH_CHECK(t.layout() == at::kStrided, "gcoll backend: ", what,
                ": sparse tensors are not supported");
    return to_gcoll_dtype(t, what);
}

static const at::Tensor &single(const std::vector<at::Tensor> &ts, const char *what)
{
    TORCH_CHECK(ts.size() == 1, "gcoll backend: ", what, " takes exactly one tensor per call, got ",
                ts.size());
    return ts[0];
}

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
    default:
        break;
    }
    TORCH_CHECK(false, "gcoll backend: ", what, ": reduce op ", static_cast<int>(op.op_),
                " is not supported (SUM, AVG, MIN, MAX, PRODUCT; not the bitwise ops or "
                "PREMUL_SUM)");
}

// The tensor gcoll reads and writes: t itself when contiguous, else a contiguous copy that
// the completion copies back (so in-place semantics hold for strided tensors too).
struct Staged {
    at::Tensor user, buf;
    explicit Staged(const at::Tensor &t) : user(t), buf(t.is_contiguous() ? t : t.contiguous()) {}
    void copy_back() const
    {
        if (!buf.is_same(user))
            user.copy_(buf);
    }
};

// ---- Work -----------------------------------------------------------------------------

class WorkGcoll : public c10d::Work
{
  public:
    WorkGcoll(c10d::OpType type, std::vector<at::Tensor> outputs)
        : c10d::Work(-1, type), outputs_(std::move(outputs)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

    // Called once, by the completion thread (or on a failure to issue).
    void complete(std::exception_ptr err)
    {
        // The Future first: a Work::wait() that returns must find the Future done too.
        if (err)
            future_->setError(err);
        else
            future_->markCompleted(c10::IValue(outputs_));
        finish(err);
    }

  private:
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- rendezvous through torch's Store ---------------------------------------------------

// The local address this host uses to reach host:port (a UDP connect sends nothing), so
// that the group's rank 0 publishes an address its peers can route to, whichever host it is.
static std::string local_ip_toward(const char *host, const char *port)
{
    std::string ip;
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (!host || !*host || getaddrinfo(host, port && *port ? port : "9", &hints, &res) != 0)
        return ip;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me = {};
    socklen_t len = sizeof(me);
    char buf[INET_ADDRSTRLEN];
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)))
        ip = buf;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return ip;
}

// Where rank 0 listens: routed toward MASTER_ADDR (env://), else toward GCOLL_ROOT's host,
// else this host's name, else loopback (one-host jobs with a file:// store).
static std::string root_host()
{
    std::string ip = local_ip_toward(getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
    if (ip.empty() && getenv("GCOLL_ROOT")) {
        std::string r = getenv("GCOLL_ROOT");
        size_t colon = r.rfind(':');
        if (colon != std::string::npos)
            ip = local_ip_toward(r.substr(0, colon).c_str(), r.substr(colon + 1).c_str());
    }
    if (ip.empty()) {
        char name[256];
        if (gethostname(name, sizeof(name)) == 0) {
            name[sizeof(name) - 1] = 0;
            ip = local_ip_toward(name, nullptr);
        }
    }
    return ip.empty() ? "127.0.0.1" : ip;
}

// A port free on ip now; gcoll binds it right after (SO_REUSEADDR), a short race window.
static int free_port(const std::string &ip)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "gcoll backend: socket(): ", strerror(errno));
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    int port = -1;
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 &&
        bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    int err = errno;
    close(fd);
    TORCH_CHECK(port > 0, "gcoll backend: no free port on ", ip, ": ", strerror(err));
    return port;
}

static std::string random_key()
{
    unsigned char b[16];
    FILE *f = fopen("/dev/urandom", "rb");
    TORCH_CHECK(f && fread(b, 1, sizeof(b), f) == sizeof(b),
                "gcoll backend: cannot read /dev/urandom for the job key");
    fclose(f);
    char hex[2 * sizeof(b) + 1];
    for (size_t i = 0; i < sizeof(b); i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    return hex;
}

static void store_set(c10d::Store &s, const std::string &k, const std::string &v)
{
    s.set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

static std::string store_get(c10d::Store &s, const std::string &k)
{
    std::vector<uint8_t> v = s.get(k); // blocks until rank 0 has set it (store timeout)
    return std::string(v.begin(), v.end());
}

// gcoll reads the job key from GCOLL_JOB_KEY at init only; the key from the Store is put
// there for the call and the old value restored (serialized: the environment is global).
static std::mutex env_mutex;

static gcoll_comm_t *join(int size, int rank, const std::string &root, const std::string *key)
{
    std::lock_guard<std::mutex> g(env_mutex);
    const char *old = getenv("GCOLL_JOB_KEY");
    std::string saved = old ? old : "";
    if (key)
        setenv("GCOLL_JOB_KEY", key->c_str(), 1);
    gcoll_comm_t *comm = nullptr;
    gcoll_status_t st = gcoll_comm_init_rank(size, rank, root.c_str(), &comm);
    if (key) {
        if (old)
            setenv("GCOLL_JOB_KEY", saved.c_str(), 1);
        else
            unsetenv("GCOLL_JOB_KEY");
    }
    TORCH_CHECK(st == GCOLL_OK, "gcoll backend: gcoll_comm_init_rank(size ", size, ", rank ", rank,
                ", root ", root, ") failed: ", gcoll_status_string(st),
                " (details in gcoll's log on stderr)");
    return comm;
}

// ---- the process group ------------------------------------------------------------------

class ProcessGroupGcoll : public c10d::ProcessGroup
{
  public:
    ProcessGroupGcoll(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size)
        : c10d::ProcessGroup(rank, size)
    {
        TORCH_CHECK(store, "gcoll backend: no Store");
        // Rank 0 picks the rendezvous address and the job key and publishes them; a key
        // set in the environment (GCOLL_JOB_KEY, on every rank) is kept and never published.
        std::string root, key;
        bool env_key = getenv("GCOLL_JOB_KEY") && *getenv("GCOLL_JOB_KEY");
        if (rank == 0) {
            std::string ip = root_host();
            root = ip + ":" + std::to_string(free_port(ip));
            key = env_key ? "" : random_key();
            store_set(*store, "gcoll/key", env_key ? "env" : "store:" + key);
            store_set(*store, "gcoll/root", root);
        } else {
            std::string k = store_get(*store, "gcoll/key");
            if (k == "env") {
                TORCH_CHECK(env_key, "gcoll backend: rank 0 uses GCOLL_JOB_KEY from its "
                                     "environment but this rank has none: set it on every rank");
            } else {
                TORCH_CHECK(k.compare(0, 6, "store:") == 0, "gcoll backend: bad key record");
                key = k.substr(6);
            }
            root = store_get(*store, "gcoll/root");
        }
        comm_ = join(size, rank, root, key.empty() ? nullptr : &key);
        init();
        completer_ = std::thread([this] { complete_loop(); });
    }

    ~ProcessGroupGcoll() override
    {
        // Python drops the last reference with the GIL held; the completion thread may
        // need it (a Future's Python callback or value), and the destroy handshake waits
        // for the peers: neither may wait holding the GIL.
        if (Py_IsInitialized() && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            shutdown();
        } else {
            shutdown();
        }
    }

    const std::string getBackendName() const override { return "gcoll"; }

    std::string transport() const { return gcoll_comm_transport(comm_); }
    std::string last_error() const { return gcoll_comm_last_error(comm_); }
    py::dict counters() const
    {
        gcoll_counters_t c;
        gcoll_comm_counters(comm_, &c);
        py::dict d;
        d["ops"] = c.ops;
        d["bytes_raw"] = c.bytes_raw;
        d["bytes_sent"] = c.bytes_sent;
        d["bytes_received"] = c.bytes_received;
        d["ns_compress"] = c.ns_compress;
        d["ns_wire"] = c.ns_wire;
        d["ns_total"] = c.ns_total;
        return d;
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        const char *what = "all_reduce";
        const at::Tensor &t = single(tensors, what);
        gcoll_dtype_t dt = check_tensor(t, what);
        gcoll_op_t op = to_gcoll_op(opts.reduceOp, what);
        auto s = std::make_shared<Staged>(t);
        void *p = s->buf.data_ptr();
        size_t n = s->buf.numel();
        return issue(
            c10d::OpType::ALLREDUCE, what, {t},
            [=](gcoll_request_t **r) { return gcoll_iallreduce(comm_, p, p, n, dt, op, r); },
            [s] { s->copy_back(); });
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        const char *what = "broadcast";
        const at::Tensor &t = single(tensors, what);
        gcoll_dtype_t dt = check_tensor(t, what);
        TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "gcoll backend: broadcast: root ",
                    opts.rootRank, " out of range for ", size_, " ranks");
        int root = static_cast<int>(opts.rootRank);
        auto s = std::make_shared<Staged>(t);
        void *p = s->buf.data_ptr();
        size_t n = s->buf.numel();
        return issue(
            c10d::OpType::BROADCAST, what, {t},
            [=](gcoll_request_t **r) { return gcoll_ibroadcast(comm_, p, n, dt, root, r); },
            [s] { s->copy_back(); });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &) override
    {
        const char *what = "all_gather";
        const at::Tensor &in = single(inputs, what);
        gcoll_dtype_t dt = check_tensor(in, what);
        TORCH_CHECK(outputs.size() == 1, "gcoll backend: all_gather takes one output list, got ",
                    outputs.size());
        std::vector<at::Tensor> outs = outputs[0];
        TORCH_CHECK((int)outs.size() == size_, "gcoll backend: all_gather: the output list has ",
                    outs.size(), " tensors for ", size_, " ranks");
        for (const at::Tensor &o : outs) {
            check_tensor(o, what);
            TORCH_CHECK(o.scalar_type() == in.scalar_type() && o.numel() == in.numel(),
                        "gcoll backend: all_gather: every output must have the input's dtype and "
                        "size (",
                        in.numel(), " elements of ", in.scalar_type(), ")");
        }
        at::Tensor src = in.contiguous();
        at::Tensor flat = at::empty({(int64_t)size_ * in.numel()}, in.options());
        void *sp = src.data_ptr(), *rp = flat.data_ptr();
        size_t n = in.numel();
        return issue(
            c10d::OpType::ALLGATHER, what, outs,
            [=](gcoll_request_t **r) { return gcoll_iallgather(comm_, sp, rp, n, dt, r); },
            [src, flat, outs, n] {
                for (size_t i = 0; i < outs.size(); i++)
                    outs[i].copy_(flat.narrow(0, i * n, n).view(outs[i].sizes()));
            });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &) override
    {
        const char *what = "all_gather_into_tensor";
        gcoll_dtype_t dt = check_tensor(input, what);
        check_tensor(output, what);
        TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                        output.numel() == (int64_t)size_ * input.numel(),
                    "gcoll backend: ", what, ": the output must hold ", size_, " x ", input.numel(),
                    " elements of ", input.scalar_type());
        at::Tensor src = input.contiguous();
        auto s = std::make_shared<Staged>(output);
        void *sp = src.data_ptr(), *rp = s->buf.data_ptr();
        size_t n = input.numel();
        return issue(
            c10d::OpType::_ALLGATHER_BASE, what, {output},
            [=](gcoll_request_t **r) { return gcoll_iallgather(comm_, sp, rp, n, dt, r); },
            [s, src] { s->copy_back(); });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        const char *what = "reduce_scatter";
        const at::Tensor &out = single(outputs, what);
        gcoll_dtype_t dt = check_tensor(out, what);
        gcoll_op_t op = to_gcoll_op(opts.reduceOp, what);
        TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == size_,
                    "gcoll backend: reduce_scatter takes one input list of ", size_, " tensors");
        for (const at::Tensor &i : inputs[0]) {
            check_tensor(i, what);
            TORCH_CHECK(i.scalar_type() == out.scalar_type() && i.numel() == out.numel(),
                        "gcoll backend: reduce_scatter: every input must have the output's dtype "
                        "and size (",
                        out.numel(), " elements of ", out.scalar_type(), ")");
        }
        std::vector<at::Tensor> flat_in;
        for (const at::Tensor &i : inputs[0])
            flat_in.push_back(i.reshape({-1}));
        at::Tensor src = at::cat(flat_in);
        auto s = std::make_shared<Staged>(out);
        void *sp = src.data_ptr(), *rp = s->buf.data_ptr();
        size_t n = out.numel();
        return issue(
            c10d::OpType::REDUCE_SCATTER, what, {out},
            [=](gcoll_request_t **r) { return gcoll_ireduce_scatter(comm_, sp, rp, n, dt, op, r); },
            [s, src] { s->copy_back(); });
    }

    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override
    {
        const char *what = "reduce_scatter_tensor";
        gcoll_dtype_t dt = check_tensor(output, what);
        check_tensor(input, what);
        gcoll_op_t op = to_gcoll_op(opts.reduceOp, what);
        TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                        input.numel() == (int64_t)size_ * output.numel(),
                    "gcoll backend: ", what, ": the input must hold ", size_, " x ", output.numel(),
                    " elements of ", output.scalar_type());
        at::Tensor src = input.contiguous();
        if (src.is_same(output) || src.data_ptr() == output.data_ptr())
            src = src.clone();
        auto s = std::make_shared<Staged>(output);
        void *sp = src.data_ptr(), *rp = s->buf.data_ptr();
        size_t n = output.numel();
        return issue(
            c10d::OpType::_REDUCE_SCATTER_BASE, what, {output},
            [=](gcoll_request_t **r) { return gcoll_ireduce_scatter(comm_, sp, rp, n, dt, op, r); },
            [s, src] { s->copy_back(); });
    }

    // all_to_all_single: dim 0 split evenly (no split sizes) or by the split sizes given.
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &out_splits,
                                                 std::vector<int64_t> &in_splits,
                                                 const c10d::AllToAllOptions &) override
    {
        const char *what = "all_to_all_single";
        gcoll_dtype_t dt = check_tensor(input, what);
        check_tensor(output, what);
        TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gcoll backend: ", what,
                    ": input and output dtypes differ");
        std::vector<size_t> sc, sd, rc, rd;
        split_counts(input, in_splits, "input", sc, sd);
        split_counts(output, out_splits, "output", rc, rd);
        at::Tensor src = input.contiguous();
        if (src.data_ptr() == output.data_ptr())
            src = src.clone(); // gcoll's all-to-all is never in place
        auto s = std::make_shared<Staged>(output);
        void *sp = src.data_ptr(), *rp = s->buf.data_ptr();
        return issue(
            c10d::OpType::ALLTOALL_BASE, what, {output},
            [=](gcoll_request_t **r) {
                return gcoll_ialltoallv(comm_, sp, sc.data(), sd.data(), rp, rc.data(), rd.data(),
                                        dt, r);
            },
            [s, src] { s->copy_back(); });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &) override
    {
        const char *what = "all_to_all";
        TORCH_CHECK((int)outputs.size() == size_ && (int)inputs.size() == size_,
                    "gcoll backend: all_to_all takes ", size_, " input and ", size_,
                    " output tensors, got ", inputs.size(), " and ", outputs.size());
        gcoll_dtype_t dt = check_tensor(inputs[0], what);
        std::vector<size_t> sc, sd, rc, rd;
        std::vector<at::Tensor> flat_in;
        size_t off = 0;
        for (const at::Tensor &i : inputs) {
            check_tensor(i, what);
            TORCH_CHECK(i.scalar_type() == inputs[0].scalar_type(), "gcoll backend: ", what,
                        ": the tensors' dtypes differ");
            sc.push_back(i.numel());
            sd.push_back(off);
            off += i.numel();
            flat_in.push_back(i.reshape({-1}));
        }
        off = 0;
        for (const at::Tensor &o : outputs) {
            check_tensor(o, what);
            TORCH_CHECK(o.scalar_type() == inputs[0].scalar_type(), "gcoll backend: ", what,
                        ": the tensors' dtypes differ");
            rc.push_back(o.numel());
            rd.push_back(off);
            off += o.numel();
        }
        at::Tensor src = at::cat(flat_in);
        at::Tensor flat = at::empty({(int64_t)off}, inputs[0].options());
        void *sp = src.data_ptr(), *rp = flat.data_ptr();
        std::vector<at::Tensor> outs = outputs;
        return issue(
            c10d::OpType::ALLTOALL, what, outs,
            [=](gcoll_request_t **r) {
                return gcoll_ialltoallv(comm_, sp, sc.data(), sd.data(), rp, rc.data(), rd.data(),
                                        dt, r);
            },
            [src, flat, outs, rc, rd] {
                for (size_t i = 0; i < outs.size(); i++)
                    outs[i].copy_(flat.narrow(0, rd[i], rc[i]).view(outs[i].sizes()));
            });
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override
    {
        return issue(
            c10d::OpType::BARRIER, "barrier", {},
            [=](gcoll_request_t **r) { return gcoll_ibarrier(comm_, r); }, [] {});
    }

    // What gcoll has no collective for is refused by name, with what to use instead.
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &,
                                          const c10d::ReduceOptions &) override
    {
        unsupported("reduce", "all_reduce");
    }
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &,
                                          std::vector<at::Tensor> &,
                                          const c10d::GatherOptions &) override
    {
        unsupported("gather", "all_gather");
    }
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &,
                                           std::vector<std::vector<at::Tensor>> &,
                                           const c10d::ScatterOptions &) override
    {
        unsupported("scatter", "broadcast or all_to_all");
    }
    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &, const c10d::AllreduceCoalescedOptions &) override
    {
        unsupported("all_reduce_coalesced", "all_reduce on a flattened tensor");
    }
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &,
                                                       std::vector<at::Tensor> &,
                                                       const c10d::AllgatherOptions &) override
    {
        unsupported("all_gather_coalesced", "all_gather on a flattened tensor");
    }
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &, int, int) override
    {
        unsupported("send", "a collective (gcoll has no point-to-point API)");
    }
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &, int, int) override
    {
        unsupported("recv", "a collective (gcoll has no point-to-point API)");
    }
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &, int) override
    {
        unsupported("recv from any source", "a collective (gcoll has no point-to-point API)");
    }

  private:
    void shutdown()
    {
        {
            std::lock_guard<std::mutex> g(qmutex_);
            stop_ = true;
        }
        qcond_.notify_one();
        completer_.join(); // every issued request is waited for first
        gcoll_comm_destroy(comm_);
    }

    [[noreturn]] void unsupported(const char *what, const char *instead) const
    {
        TORCH_CHECK(false, "gcoll backend: ", what, " is not supported (use ", instead,
                    "); supported: all_reduce (SUM, AVG, MIN, MAX, PRODUCT), broadcast, "
                    "all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
                    "all_to_all, all_to_all_single, barrier");
    }

    void split_counts(const at::Tensor &t, const std::vector<int64_t> &splits, const char *which,
                      std::vector<size_t> &counts, std::vector<size_t> &displs) const
    {
        int64_t rows = t.dim() ? t.size(0) : t.numel();
        int64_t row = rows ? t.numel() / rows : 0;
        std::vector<int64_t> s = splits;
        if (s.empty()) {
            TORCH_CHECK(rows % size_ == 0, "gcoll backend: all_to_all_single: the ", which,
                        "'s first dimension (", rows, ") does not split evenly over ", size_,
                        " ranks; give split sizes");
            s.assign(size_, rows / size_);
        }
        TORCH_CHECK((int)s.size() == size_, "gcoll backend: all_to_all_single: ", s.size(), " ",
                    which, " split sizes for ", size_, " ranks");
        int64_t sum = 0;
        for (int64_t v : s) {
            TORCH_CHECK(v >= 0, "gcoll backend: all_to_all_single: negative split size");
            counts.push_back((size_t)(v * row));
            displs.push_back((size_t)(sum * row));
            sum += v;
        }
        TORCH_CHECK(sum == rows, "gcoll backend: all_to_all_single: the ", which,
                    " split sizes add up to ", sum, ", the first dimension is ", rows);
    }

    struct Pending {
        c10::intrusive_ptr<WorkGcoll> work;
        gcoll_request_t *req;
        std::function<void()> after;
        const char *what;
    };

    c10::intrusive_ptr<c10d::Work>
    issue(c10d::OpType type, const char *what, std::vector<at::Tensor> outputs,
          const std::function<gcoll_status_t(gcoll_request_t **)> &start,
          std::function<void()> after)
    {
        auto work = c10::make_intrusive<WorkGcoll>(type, std::move(outputs));
        // One issuer at a time: gcoll's calls must come in the same order on every rank,
        // and torch may call from several threads (DDP's autograd hooks, the user's).
        std::lock_guard<std::mutex> g(issue_mutex_);
        gcoll_request_t *req = nullptr;
        gcoll_status_t st = start(&req);
        TORCH_CHECK(st == GCOLL_OK, "gcoll backend: ", what, " failed: ", error_text(st));
        {
            std::lock_guard<std::mutex> q(qmutex_);
            queue_.push_back(Pending{work, req, std::move(after), what});
        }
        qcond_.notify_one();
        return work;
    }

    std::string error_text(gcoll_status_t st) const
    {
        std::string m = gcoll_comm_last_error(comm_);
        return m.empty() ? std::string(gcoll_status_string(st)) : m;
    }

    void complete_loop()
    {
        for (;;) {
            Pending p;
            {
                std::unique_lock<std::mutex> q(qmutex_);
                qcond_.wait(q, [this] { return stop_ || !queue_.empty(); });
                if (queue_.empty())
                    return; // stop_ and drained
                p = std::move(queue_.front());
                queue_.pop_front();
            }
            gcoll_status_t st = gcoll_wait(p.req);
            std::exception_ptr err;
            if (st != GCOLL_OK) {
                err = std::make_exception_ptr(std::runtime_error(
                    std::string("gcoll backend: ") + p.what + " failed: " + error_text(st)));
            } else {
                try {
                    p.after();
                } catch (...) {
                    err = std::current_exception();
                }
            }
            p.work->complete(err);
        }
    }

    gcoll_comm_t *comm_ = nullptr;
    std::mutex issue_mutex_;
    std::mutex qmutex_;
    std::condition_variable qcond_;
    std::deque<Pending> queue_;
    bool stop_ = false;
    std::thread completer_;
};

} // namespace gcoll_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    namespace py = pybind11;
    using gcoll_torch::ProcessGroupGcoll;
    m.doc() = "gcoll's torch.distributed backend (registered as \"gcoll\" by gcoll.torch)";
    py::class_<ProcessGroupGcoll, c10::intrusive_ptr<ProcessGroupGcoll>>(
        m, "ProcessGroupGcoll", py::module::import("torch.distributed").attr("ProcessGroup"))
        .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                         const std::chrono::duration<float> &) {
                 return c10::make_intrusive<ProcessGroupGcoll>(store, rank, size);
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>(),
             "Joins gcoll: rank 0 publishes the rendezvous address and a job key in store.")
        .def_property_readonly("transport", &ProcessGroupGcoll::transport)
        .def_property_readonly("last_error", &ProcessGroupGcoll::last_error)
        .def("counters", &ProcessGroupGcoll::counters);
}
