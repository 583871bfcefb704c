#pragma once
// How a multi-tensor agent or screen source touches one of its operands (listed by its operands(f), kernels/agents.hpp),
// for executors that check launches; the kernels never call operands().
// Why: docs/design-notes.md#kernels-operands

namespace towerpipe {
namespace detail {

enum class operand_access { read, write, read_write };

}  // namespace detail
}  // namespace towerpipe
