#pragma once
// How a multi-tensor agent or a screen source touches one of its operands. Agents list their operands
// with `template <class F> void operands(F&& f) const` (kernels/agents.hpp): an executor that checks
// launches (the simulated devices: exec/simulated/) turns the list into the byte ranges a launch reads
// and writes, for its race detector, and checks every access the agent actually makes against it
// (kernels/access_hook.hpp). The kernels never call operands(): it costs the device nothing.

namespace towerpipe {
namespace detail {

enum class operand_access { read, write, read_write };

}  // namespace detail
}  // namespace towerpipe
