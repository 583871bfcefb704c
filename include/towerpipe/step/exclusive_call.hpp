#pragma once
// A pipeline is used by one thread at a time: each changing call holds it busy for its duration, and a
// second changing call meanwhile — from another thread, or from inside a tower function — is refused.

#include <atomic>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace detail {

class exclusive_call {
 public:
  exclusive_call(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    if (busy_.exchange(true))
      fail("pipeline::", what, " called while another call on this pipeline runs (from another thread, ",
           "or from inside a tower function); a pipeline is used by one thread at a time");
  }
  ~exclusive_call() { busy_.store(false); }
  exclusive_call(const exclusive_call&) = delete;
  exclusive_call& operator=(const exclusive_call&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace detail
}  // namespace towerpipe
