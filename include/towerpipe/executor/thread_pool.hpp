#pragma once
// A persistent pool of CPU threads: run(tasks, fn) calls fn(task) for every task in [0, tasks) on the
// pool's threads and the calling thread, and returns when all are done. Threads are created once, at
// construction, never per step. Which thread runs which task is left to timing, so results must not
// depend on it; an exception thrown by a task is kept per task and handed back, never lost.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace detail {

class thread_pool {
 public:
  // threads counts the caller: a pool of 1 runs everything on the calling thread. If the system refuses
  // a thread (a resource limit), the threads already started are stopped and joined before the
  // towerpipe::error leaves: unwinding past waiting workers would hang or terminate.
  explicit thread_pool(std::size_t threads) {
    try {
      workers_.reserve(threads > 0 ? threads - 1 : 0);
      for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::exception& e) {
      const std::size_t started = workers_.size() + 1;
      stop_and_join();
      fail("cannot start ", threads, " host threads (", started, " started): ", e.what(),
           "; lower pipeline_options::host_threads");
    }
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  ~thread_pool() { stop_and_join(); }

  std::size_t threads() const { return workers_.size() + 1; }

  // Returns one exception_ptr per task, null where the task succeeded.
  std::vector<std::exception_ptr> run(std::size_t tasks, const std::function<void(std::size_t)>& fn) {
    std::vector<std::exception_ptr> failures(tasks);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      failures_ = &failures;
      tasks_ = tasks;
      next_task_ = 0;
      busy_workers_ = workers_.size();
      ++generation_;
    }
    wake_workers_.notify_all();
    take_tasks();
    std::unique_lock<std::mutex> lock(mutex_);
    workers_done_.wait(lock, [this] { return busy_workers_ == 0; });
    job_ = nullptr;
    return failures;
  }

 private:
  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_workers_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  // The job's members are read without the lock: run() sets them before waking the workers and changes
  // them again only after every worker has left this job.
  void take_tasks() {
    for (std::size_t task = next_task_.fetch_add(1); task < tasks_; task = next_task_.fetch_add(1)) {
      try {
        (*job_)(task);
      } catch (...) {
        (*failures_)[task] = std::current_exception();
      }
    }
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (std::size_t seen_generation = 0;;) {
      wake_workers_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      lock.unlock();
      take_tasks();
      lock.lock();
      --busy_workers_;
      workers_done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_workers_, workers_done_;
  bool stopping_ = false;
  std::size_t generation_ = 0;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::vector<std::exception_ptr>* failures_ = nullptr;
  std::size_t tasks_ = 0;
  std::size_t busy_workers_ = 0;
  std::atomic<std::size_t> next_task_{0};
};

// Rethrows the first of run()'s failures, if any.
inline void rethrow_first(const std::vector<std::exception_ptr>& failures) {
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace detail
}  // namespace towerpipe
