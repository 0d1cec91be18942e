// A fixed set of threads running posted tasks in FIFO order. The ingest service decodes and
// commits agent messages here instead of on gRPC's callback threads (which must not block)
// or on a thread per connection (which would cost a thread per agent). Each stream has at
// most one message in the pool at a time (it reads the next one only after the task ran), so
// the queue is bounded by the number of connected agents and one agent's messages stay in
// order.
#ifndef STRATA_SERVER_INGEST_WORKER_POOL_H_
#define STRATA_SERVER_INGEST_WORKER_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace strata::server::ingest {

class WorkerPool {
 public:
  explicit WorkerPool(size_t threads);
  // Runs the tasks already posted, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Post(std::function<void()> task);
  // Tasks waiting for a thread (a gauge for /metrics).
  size_t queued() const;
  size_t threads() const { return threads_.size(); }

 private:
  void Run();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_WORKER_POOL_H_
