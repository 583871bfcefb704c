#pragma once
// Host memory space: aligned allocations owned by a unique_ptr. A memory space provides
// allocate<T>(count, alignment) returning an owning pointer; layouts allocate through it, so a device
// memory space can take its place without touching the layouts.

#include <cstddef>
#include <memory>
#include <new>

namespace towerpipe {

struct host_memory {
  struct aligned_delete {
    std::size_t alignment;
    template <class T>
    void operator()(T* pointer) const {
      ::operator delete[](static_cast<void*>(pointer), std::align_val_t(alignment));
    }
  };

  template <class T>
  using owner = std::unique_ptr<T[], aligned_delete>;

  // count value-initialised elements (zeros for arithmetic T) aligned to `alignment` bytes.
  template <class T>
  owner<T> allocate(std::size_t count, std::size_t alignment) const {
    void* raw = ::operator new[](count * sizeof(T), std::align_val_t(alignment));
    T* first = static_cast<T*>(raw);
    for (std::size_t i = 0; i < count; ++i) new (first + i) T();
    return owner<T>(first, aligned_delete{alignment});
  }
};

}  // namespace towerpipe
