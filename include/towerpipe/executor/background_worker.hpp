#pragma once
// One CPU thread that runs posted tasks in order, beside the thread pool: the overlapped reduction
// (pipeline/step_parts.hpp) reduces buckets on it while the pool's threads run the towers. The
// thread starts with the first task, not before, so that a pipeline whose towers mark nothing never
// has it. A task's exception is kept and handed back by drain(), never lost; the tasks after it are
// dropped until then.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace detail {

class background_worker {
 public:
  background_worker() = default;
  background_worker(const background_worker&) = delete;
  background_worker& operator=(const background_worker&) = delete;
  ~background_worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // From any thread.
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) {
        try {
          thread_ = std::thread([this] { work(); });
        } catch (const std::exception& e) {
          fail("cannot start the thread that reduces gradient buckets during the towers' backward pass: ", e.what(),
               "; pipeline_options::overlap_reduction = false reduces after the towers instead");
        }
      }
      tasks_.push_back(std::move(task));
    }
    wake_.notify_all();
  }

  // Waits until every task posted so far has run; rethrows the first exception one of them threw since
  // the last drain(). Returns the seconds the thread spent running tasks since then.
  double drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return tasks_.empty() && !running_; });
    const double busy = busy_seconds_;
    busy_seconds_ = 0;
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    return busy;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      const bool dropped = failure_ != nullptr;  // after a failure the rest are dropped: drain() reports it
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      std::exception_ptr failure;
      try {
        if (!dropped) task();
      } catch (...) {
        failure = std::current_exception();
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      running_ = false;
      busy_seconds_ += seconds;
      if (failure && !failure_) failure_ = failure;
      if (tasks_.empty()) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, stopping_ = false;
  double busy_seconds_ = 0;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace detail
}  // namespace towerpipe
