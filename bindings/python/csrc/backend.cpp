// backend.cpp: the torch.distributed backend "gcoll", a c10d::Backend over gcoll.h (torch >= 2.4).
//
// Every collective is issued with gcoll's nonblocking call from the caller's thread (in the
// caller's order, which torch keeps the same on every rank) and returns a Work at once. One
// completion thread per backend waits for gcoll's requests in the order they were issued
// (gcoll runs them in that order) and copies staged results out; it never runs user code.
// A caller that waits for a Work (Work.wait() without a timeout, as a blocking
// dist.all_reduce does) before the completion thread took its request waits for the
// request itself and completes the Work in its own thread: one thread hand-off fewer.
// Otherwise the Work and its Future are completed by a small pool of notifier threads, because
// completing a Future runs its callbacks in the completing thread, and a callback may issue
// a collective and wait for it (torch's PowerSGD hook does): run on the completion thread,
// that wait would wait for itself. A notifier blocked in a callback gets a fresh one beside
// it. gcoll's own progress thread does the communication, so several collectives can be in
// flight while the caller computes.
#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gcoll.h"
#include "rendezvous.h"
#include "wire.h"

namespace gcoll_torch
{

namespace py = pybind11;

// ---- Work -----------------------------------------------------------------------------

class WorkGcoll : public c10d::Work
{
  public:
    // source: a recv's sender, or -1; source_cell: where a recv from any source learns it
    // (written by gcoll before the request completes).
    WorkGcoll(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int source = -1,
              std::shared_ptr<int> source_cell = nullptr)
        : c10d::Work(rank, type), outputs_(std::move(outputs)), source_(source),
          source_cell_(std::move(source_cell)), future_(c10::make_intrusive<c10::ivalue::Future>(
                                                    c10::ListType::create(c10::TensorType::get())))
    {
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    // complete() marks the Future before the Work: a caller woken by the Future finds the
    // Work completed too.
    bool isCompleted() override { return future_->completed() || c10d::Work::isCompleted(); }
    // Handing the Future out is what lets callbacks onto it: from then on the Work is
    // completed by a notifier (complete_inline refuses).
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
    {
        std::lock_guard<std::mutex> g(future_mutex_);
        future_out_ = true;
        return future_;
    }
    // A Work queued in a coalescing batch completes once the batch has run: waiting for it
    // inside the batch (a blocking call under torch's _coalescing_manager) first runs what
    // the batch holds so far (run_batch), instead of waiting for ever.
    bool wait(std::chrono::milliseconds timeout) override
    {
        std::function<void()> run;
        std::function<bool()> claim;
        {
            std::lock_guard<std::mutex> g(batch_mutex_);
            run = run_batch_;
            claim = claim_;
        }
        if (run)
            run();
        // with a timeout of its own the wait stays c10d's (gcoll_wait knows only the
        // group's timeout)
        if (claim && timeout == std::chrono::milliseconds(0) && !claim()) {
            // The completion thread took it: poll a while (as gcoll_wait does, 50 us)
            // before sleeping, since a small operation ends sooner than a wake-up of this
            // thread would reach it (a 4 B all_reduce took about 8 or about 20 us by which
            // thread had taken it).
            auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
            while (!isCompleted() && std::chrono::steady_clock::now() < end)
                std::this_thread::yield();
        }
        return c10d::Work::wait(timeout);
    }
    // claim: waits for the request in this thread and completes the Work, unless the
    // completion thread took it first (set by the backend for a Work outside a batch).
    void set_claim(std::function<bool()> f)
    {
        std::lock_guard<std::mutex> g(batch_mutex_);
        claim_ = std::move(f);
    }
    void set_run_batch(std::function<void()> f)
    {
        std::lock_guard<std::mutex> g(batch_mutex_);
        run_batch_ = std::move(f);
    }

    // The sender of a recv (torch asks a recv's Work for it; a recv from any source's once
    // it completed).
    int sourceRank() const override
    {
        if (source_cell_) {
            TORCH_CHECK(*source_cell_ >= 0, "gcoll backend: sourceRank() of a recv from any "
                                            "source that has not matched a message (wait() "
                                            "first; a failed recv has no sender)");
            return *source_cell_;
        }
        TORCH_CHECK(source_ >= 0, "gcoll backend: sourceRank() is a recv's; this Work is not one");
        return source_;
    }

    // Called once, by a notifier thread (or on a failure to issue). The Future first, as
    // Gloo does: a Work::wait() that returns finds the Future done and its callbacks run.
    void complete(std::exception_ptr err)
    {
        if (err)
            future_->setError(err);
        else
            future_->markCompleted(c10::IValue(outputs_));
        finish(err);
    }

    // Completes the Work in the calling thread (the completion thread) when its Future was
    // never handed out, so that no callback can run there; true if done. A getFuture()
    // racing with it waits on the mutex and returns the completed Future, whose then()
    // runs in its own caller. One thread hand-off fewer where nothing asked for the
    // Future.
    bool complete_inline(std::exception_ptr err)
    {
        std::lock_guard<std::mutex> g(future_mutex_);
        if (future_out_)
            return false;
        complete(err);
        return true;
    }

  private:
    std::vector<at::Tensor> outputs_;
    int source_;
    std::shared_ptr<int> source_cell_;
    std::mutex batch_mutex_;
    std::function<void()> run_batch_;
    std::function<bool()> claim_;
    std::mutex future_mutex_;
    bool future_out_ = false; // getFuture() was called
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- notifiers: the threads that complete Works and run their Futures' callbacks ------

class Notifiers
{
  public:
    void push(std::function<void()> job)
    {
        std::unique_lock<std::mutex> g(m_);
        jobs_.push_back(std::move(job));
        // Every notifier is busy (e.g. blocked in a callback that waits on a collective):
        // one more, so that the job this callback may wait for does not wait behind it.
        if (idle_ == 0)
            threads_.emplace_back([this] { loop(); });
        g.unlock();
        cv_.notify_one();
    }

    // Runs every queued job, then joins the threads. Not from a notifier thread.
    void stop()
    {
        std::vector<std::thread> ts;
        {
            std::lock_guard<std::mutex> g(m_);
            stop_ = true;
            ts.swap(threads_);
        }
        cv_.notify_all();
        for (std::thread &t : ts)
            t.join();
    }

  private:
    void loop()
    {
        std::unique_lock<std::mutex> g(m_);
        for (;;) {
            idle_++;
            cv_.wait(g, [this] { return stop_ || !jobs_.empty(); });
            idle_--;
            if (jobs_.empty())
                return; // stop_ and drained
            std::function<void()> job = std::move(jobs_.front());
            jobs_.pop_front();
            g.unlock();
            job();
            g.lock();
        }
    }

    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    int idle_ = 0;
    bool stop_ = false;
};

// ---- the backend ----------------------------------------------------------------------

class BackendGcoll : public c10d::Backend
{
  public:
    BackendGcoll(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                 std::chrono::milliseconds timeout)
        : c10d::Backend(rank, size), timeout_(timeout)
    {
        TORCH_CHECK(store, "gcoll backend: no Store");
        comm_ = join_through_store(*store, rank, size, timeout);
        init();
        completer_ = std::thread([this] { complete_loop(); });
    }

    ~BackendGcoll() override
    {
        without_gil([this] { close(false); });
    }

    const std::string getBackendName() const override { return "gcoll"; }

    c10::intrusive_ptr<Options> getBackendOptions() override
    {
        return c10::make_intrusive<Options>("gcoll", timeout_);
    }

    // split_group: the members of each new group join a communicator of their own through
    // the Store torch gives for it (so ranks outside every new group take no part).
    bool supportsSplitting() const override { return true; }
    c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &store,
                                            const std::vector<int> &ranks,
                                            const c10::intrusive_ptr<Options> &opts) override
    {
        auto it = std::find(ranks.begin(), ranks.end(), rank_);
        if (it == ranks.end())
            return nullptr;
        auto t = opts ? opts->timeout : timeout_;
        return c10::make_intrusive<BackendGcoll>(store, (int)(it - ranks.begin()),
                                                 (int)ranks.size(), t);
    }

    void abort() override
    {
        if (comm_)
            gcoll_comm_abort(comm_);
        without_gil([this] { close(true); });
    }
    void shutdown() override
    {
        without_gil([this] { close(false); });
    }

    // Sequence numbers, as Gloo's: the collectives issued on this group so far, the same
    // on every rank that issued the same ones (point-to-point does not count). torch's
    // ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares them across ranks
    // before each collective.
    void setSequenceNumberForGroup() override { seq_.store(0); }
    uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

    std::string transport() const { return comm_ ? gcoll_comm_transport(comm_) : ""; }
    std::string last_error() const { return comm_ ? gcoll_comm_last_error(comm_) : ""; }
    py::dict counters() const
    {
        gcoll_counters_t c = {};
        if (comm_)
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

#include "ops.inc"
#include "rooted.inc"

  private:
    // Python drops the last reference, and may call shutdown, with the GIL held; the
    // notifiers may need it (a Future's Python callback), and the destroy handshake waits
    // for the peers: neither may wait holding the GIL.
    template <class F> static void without_gil(F f)
    {
        if (Py_IsInitialized() && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            f();
        } else {
            f();
        }
    }

    // Waits for what was issued, completes it, and releases the communicator. Idempotent.
    void close(bool aborted)
    {
        std::lock_guard<std::mutex> c(close_mutex_);
        if (closed_)
            return;
        {
            std::lock_guard<std::mutex> g(issue_mutex_);
            if (group_) { // a batch started and never ended: run it, its Works complete
                if (aborted)
                    gcoll_comm_abort(comm_);
                run_batch(false);
            }
            std::lock_guard<std::mutex> q(qmutex_);
            stop_ = true;
        }
        qcond_.notify_one();
        completer_.join(); // every issued request is waited for first (bounded by the timeout)
        while (claimers_.load() > 0) // callers waiting for their own requests (same bound)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        notifiers_.stop();
        gcoll_comm_t *comm = comm_;
        {
            std::lock_guard<std::mutex> g(issue_mutex_);
            comm_ = nullptr;
        }
        if (aborted)
            gcoll_comm_abort(comm);
        gcoll_comm_destroy(comm);
        closed_ = true;
    }

    struct Group;
    struct Pending {
        c10::intrusive_ptr<WorkGcoll> work;
        gcoll_request_t *req; // nullptr: the marker that closes a group
        std::function<void()> after;
        const char *what;
        std::shared_ptr<Group> group;     // the coalesced batch it belongs to, if any
        gcoll_status_t status = GCOLL_OK; // the marker's: what gcoll_group_end returned
        // outside a batch: set by whichever of the completion thread and a waiting caller
        // takes the request first (only one may gcoll_wait for it)
        std::shared_ptr<std::atomic<bool>> taken = nullptr;
    };
    // A batch between startCoalescing and endCoalescing: its operations are queued for the
    // completion thread only once gcoll_group_end has run them; error is the first failure
    // among them (set and read by the completion thread alone). A wait inside the batch
    // runs the group so far and opens another for the rest (run_batch_for_wait).
    struct Group {
        std::vector<Pending> pending;     // issued since the gcoll group was opened
        std::vector<at::Tensor> outputs;  // of the whole batch
        std::exception_ptr error;         // completion thread only
        std::thread::id thread;           // that called startCoalescing
        bool open = true;                 // a gcoll group is open (under issue_mutex_)
        gcoll_status_t status = GCOLL_OK; // the first failed gcoll_group_start/end
    };

    // Runs the open batch's gcoll group (under the issue lock) and queues its operations
    // for the completion thread; then opens a new group for the rest of the batch (reopen),
    // or queues the marker that closes the batch and returns its Work.
    c10::intrusive_ptr<WorkGcoll> run_batch(bool reopen)
    {
        std::shared_ptr<Group> grp = group_;
        gcoll_status_t st = grp->open ? gcoll_group_end(comm_) : grp->status;
        grp->open = false;
        if (grp->status == GCOLL_OK)
            grp->status = st;
        {
            std::lock_guard<std::mutex> q(qmutex_);
            for (Pending &p : grp->pending) {
                p.work->set_run_batch(nullptr);
                queue_.push_back(std::move(p));
            }
            grp->pending.clear();
        }
        c10::intrusive_ptr<WorkGcoll> work;
        if (reopen) {
            st = gcoll_group_start(comm_);
            grp->open = st == GCOLL_OK;
            if (grp->status == GCOLL_OK)
                grp->status = st;
        } else {
            group_.reset();
            work = c10::make_intrusive<WorkGcoll>(rank_, c10d::OpType::COALESCED, grp->outputs);
            std::lock_guard<std::mutex> q(qmutex_);
            queue_.push_back(
                Pending{work, nullptr, [] {}, "coalesced operations", grp, grp->status});
        }
        qcond_.notify_one();
        return work;
    }

    // A Work of the open batch is waited for: the batch so far runs first (from the thread
    // that started it: gcoll's group belongs to that thread).
    void run_batch_for_wait()
    {
        without_gil([this] {
            std::lock_guard<std::mutex> g(issue_mutex_);
            if (!group_)
                return;
            TORCH_CHECK(std::this_thread::get_id() == group_->thread,
                        "gcoll backend: wait() on an operation of a coalescing batch another "
                        "thread started: it runs when that thread ends the batch");
            run_batch(true);
        });
    }

    // Starts one gcoll call (start) under the issue lock and queues it for the completion
    // thread, which runs after (copies staged results out) once it is done.
    c10::intrusive_ptr<c10d::Work>
    issue(c10d::OpType type, const char *what, std::vector<at::Tensor> outputs,
          const std::function<gcoll_status_t(gcoll_comm_t *, gcoll_request_t **)> &start,
          std::function<void()> after, int source = -1, std::shared_ptr<int> source_cell = nullptr)
    {
        auto work =
            c10::make_intrusive<WorkGcoll>(rank_, type, outputs, source, std::move(source_cell));
        // One issuer at a time: gcoll's calls must come in the same order on every rank,
        // and torch may call from several threads (DDP's autograd hooks, the user's,
        // Future callbacks on the notifiers).
        std::lock_guard<std::mutex> g(issue_mutex_);
        TORCH_CHECK(comm_ && !stop_, "gcoll backend: ", what,
                    ": the process group was shut down or aborted");
        gcoll_request_t *req = nullptr;
        gcoll_status_t st = start(comm_, &req);
        TORCH_CHECK(st == GCOLL_OK, "gcoll backend: ", what, " failed: ", error_text(st));
        if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
            type != c10d::OpType::RECVANYSOURCE)
            seq_.fetch_add(1);
        if (group_) { // coalescing: waited for once the group has run
            work->set_run_batch([this] { run_batch_for_wait(); });
            group_->pending.push_back(Pending{work, req, std::move(after), what, group_});
            group_->outputs.insert(group_->outputs.end(), outputs.begin(), outputs.end());
            return work;
        }
        auto taken = std::make_shared<std::atomic<bool>>(false);
        auto shared_after = std::make_shared<std::function<void()>>(std::move(after));
        WorkGcoll *w = work.get(); // the claim lives in the Work: no reference cycle
        work->set_claim([this, w, req, shared_after, what, taken] {
            if (taken->load()) // done or being done elsewhere (always so after close())
                return false;
            claimers_++; // close() waits for them before it destroys the communicator
            bool mine = !taken->exchange(true);
            std::exception_ptr err;
            if (mine) {
                err = finish_request(req, *shared_after, what, nullptr);
                *shared_after = nullptr; // its staging buffers: not kept as long as the Work
            }
            claimers_--;
            if (mine) // the Future's callbacks, if any, outside the count (they may close)
                w->complete(err);
            return mine;
        });
        {
            std::lock_guard<std::mutex> q(qmutex_);
            Pending p{work, req,
                      [shared_after] {
                          (*shared_after)();
                          *shared_after = nullptr;
                      },
                      what, nullptr};
            p.taken = taken;
            queue_.push_back(std::move(p));
        }
        qcond_.notify_one();
        return work;
    }

    // Waits for req (nullptr: a batch's closing marker, whose status is st) and runs after;
    // returns the operation's error, if any (grp: the batch, whose first error it keeps).
    std::exception_ptr finish_request(gcoll_request_t *req, const std::function<void()> &after,
                                      const char *what, const std::shared_ptr<Group> &grp,
                                      gcoll_status_t st = GCOLL_OK)
    {
        if (req)
            st = gcoll_wait(req); // bounded by the group's timeout
        std::exception_ptr err;
        if (!req && grp && grp->error) {
            err = grp->error; // a batch fails with its first failed operation
        } else if (st != GCOLL_OK) {
            std::string m = std::string("gcoll backend: ") + what + " failed: " + error_text(st);
            if (st == GCOLL_ERR_TIMEOUT)
                m += " (the process group's timeout, init_process_group(timeout=) or "
                     "new_group(timeout=), passed without progress)";
            err = std::make_exception_ptr(std::runtime_error(m));
        } else {
            try {
                after();
            } catch (...) {
                err = std::current_exception();
            }
        }
        if (err && grp && !grp->error)
            grp->error = err;
        return err;
    }

    std::string error_text(gcoll_status_t st) const
    {
        std::string m = comm_ ? gcoll_comm_last_error(comm_) : "";
        std::string s = gcoll_status_string(st);
        return m.empty() ? s : s + ": " + m;
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
            if (p.taken) {
                // A caller that waits right after the call (a blocking torch call) takes
                // it in its own thread: leave it that while, yielding the CPU (which, one
                // rank per CPU, it shares with this thread), rather than take it and make
                // the caller sleep until this thread wakes it.
                auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
                while (!p.taken->load() && std::chrono::steady_clock::now() < end)
                    std::this_thread::yield();
                if (p.taken->exchange(true))
                    continue; // its caller waits for it (WorkGcoll::wait)
            }
            std::exception_ptr err = finish_request(p.req, p.after, p.what, p.group, p.status);
            auto work = p.work;
            if (!work->complete_inline(err))
                notifiers_.push([work, err] { work->complete(err); });
        }
    }

    std::chrono::milliseconds timeout_;
    gcoll_comm_t *comm_ = nullptr;
    std::atomic<uint64_t> seq_{0};
    std::atomic<int> claimers_{0}; // callers inside WorkGcoll::wait's claim
    std::mutex issue_mutex_;
    std::mutex qmutex_;
    std::condition_variable qcond_;
    std::deque<Pending> queue_;
    std::shared_ptr<Group> group_; // the open batch (startCoalescing), under issue_mutex_
    bool stop_ = false;
    std::thread completer_;
    Notifiers notifiers_;
    std::mutex close_mutex_;
    bool closed_ = false;
};

} // namespace gcoll_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    namespace py = pybind11;
    using gcoll_torch::BackendGcoll;
    m.doc() = "gcoll's torch.distributed backend (registered as \"gcoll\" by gcoll.torch)";
    py::class_<BackendGcoll, c10::intrusive_ptr<BackendGcoll>>(
        m, "BackendGcoll", py::module::import("torch._C._distributed_c10d").attr("Backend"))
        .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                         const std::chrono::duration<float> &timeout) {
                 return c10::make_intrusive<BackendGcoll>(
                     store, rank, size,
                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>(),
             "Joins gcoll: rank 0 publishes the rendezvous address and a job key in store.")
        .def_property_readonly("transport", &BackendGcoll::transport)
        .def_property_readonly("last_error", &BackendGcoll::last_error)
        .def("counters", &BackendGcoll::counters);
}
