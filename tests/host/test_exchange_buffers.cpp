// The buffers of reduce::sharded across processes with GPU towers (programs/exchange_plan.hpp,
// programs/exchange_buffers.hpp): every table the reducer builds over them keeps the kernels' vector
// I/O aligned, the blocks the transports move start aligned, and the gather fills the padded space.
#include <towerpipe/programs/exchange_buffers.hpp>
#include <towerpipe/programs/exchange_plan.hpp>
#include <towerpipe/programs/owner_wiring.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include "unbacked_memory.hpp"

using namespace towerpipe;
using namespace towerpipe::detail;
using towerpipe_tests::for_each_test_model;
using towerpipe_tests::unbacked_memory;

TEST_CASE("reduce::sharded's exchange buffers keep vector I/O aligned for the test models, the MLP and ResNet-50 with 1-4 "
          "processes",
          "[multi_tensor][sharded][alignment]") {
  for_each_test_model([](const variable_set& variables, const std::vector<tensor_chunk>& table, std::size_t vector_bytes) {
    const std::size_t count = variables.count();
    for (int processes = 1; processes <= 4; ++processes) {
      for (std::size_t contributions = 1; contributions <= 3; ++contributions) {
        for (int rank = 0; rank < processes; ++rank) {
          INFO(processes << " processes, rank " << rank << ", " << contributions << " contributions each");
          const exchange_plan plan(table, count, processes, rank, contributions);
          const exchange_buffers<float, unbacked_memory> buffers(plan, variables, unbacked_memory{});
          const slice_owner<float, unbacked_memory> owner(plan.mine(), table, count, 2, owner_keeps{true, true}, unbacked_memory{});
          for (int owner_rank = 0; owner_rank < processes; ++owner_rank)
            check_vector_aligned(buffers.send_rows[static_cast<std::size_t>(owner_rank)], count, plan.slice(owner_rank).chunk_list(table),
                                 vector_bytes, "send");
          const std::vector<tensor_chunk> mine = plan.mine().chunk_list(table);
          check_vector_aligned(buffers.received_rows, count, mine, vector_bytes, "received");
          check_vector_aligned(owner.master(), count, mine, vector_bytes, "master");
          check_vector_aligned(buffers.gathered_flat, count, table, vector_bytes, "gathered");
          // The blocks the transports move start aligned too, and the gather fills the padded space.
          for (const auto& blocks :
               {plan.send_blocks(sizeof(float)), plan.receive_blocks(sizeof(float)), plan.gather_blocks(sizeof(float))}) {
            for (std::size_t offset : blocks.offsets) CHECK(offset % 256 == 0);
          }
          CHECK(plan.total() == padded_flat_starts(variables).back());
        }
      }
    }
  });
}

TEST_CASE("a power of two of towers sends one partial per process, any other number one row per tower", "[multi_tensor][sharded]") {
  CHECK(contributions_per_process(1) == 1);
  CHECK(contributions_per_process(2) == 1);
  CHECK(contributions_per_process(3) == 3);
  CHECK(contributions_per_process(4) == 1);
  CHECK(contributions_per_process(6) == 6);
  CHECK(contributions_per_process(8) == 1);
}

TEST_CASE("exchange_plan takes at most 1024 rows per owner by default (GPU towers), any int count when told (host towers)",
          "[multi_tensor][sharded]") {
  const variable_set variables{{"w", {4096}}};
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 2048);
  CHECK_THROWS_WITH(exchange_plan(table, 1, 2, 0, 600),
                    "towerpipe: reduce::sharded sums at most 1024 contributions per element; 2 processes send 600 each (use a "
                    "power-of-two number of towers per process: one each)");
  CHECK_NOTHROW(exchange_plan(table, 1, 2, 0, 512));
  const exchange_plan host(table, 1, 2, 1, 600, max_host_process_rows);
  CHECK(host.rows() == 1200);
  CHECK(host.mine().stored_elements == 2048);  // the second of two equal halves
  CHECK(host.receive_elements() == 1200 * 2048);
}
