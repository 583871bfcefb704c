// The buffers of reduce::sharded across processes with GPU towers (plan/exchange_plan.hpp,
// wiring/exchange_buffers.hpp): every table the reducer builds over them keeps the kernels' vector
// I/O aligned, the blocks the transports move start aligned, and the gather fills the padded space.
#include <towerpipe/wiring/exchange_buffers.hpp>
#include <towerpipe/plan/exchange_plan.hpp>
#include <towerpipe/wiring/owner_wiring.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

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

// Gradient buckets across processes (reduce/sharded/host_towers.hpp): exchanged one bucket at a time,
// every element of every row arrives where the owner reads it, as the whole exchange delivers it; and
// each bucket's pieces start aligned and together tile the whole blocks. The exchange is emulated here
// by copying each pair's piece, as process_group::all_to_all moves it.
TEST_CASE("an exchange cut into gradient buckets delivers every row where the owner reads it, bucket by bucket",
          "[multi_tensor][sharded][buckets]") {
  const variable_set variables{{"embed", {300, 250}}, {"w1", {64, 33}}, {"b1", {64}}, {"w2", {10, 64}}, {"b2", {10}}};
  const std::size_t count = variables.count();
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 2048);
  // Buckets not in variable order, one of them split by every slice boundary (embed), one empty nowhere.
  const std::vector<std::size_t> bucket_of{1, 0, 2, 0, 2};
  const auto code = [](int process, std::size_t row, std::size_t v, std::size_t i) {
    return static_cast<float>(((process * 7 + static_cast<int>(row)) * 10 + static_cast<int>(v)) * 100000 + static_cast<int>(i));
  };
  for (int processes = 1; processes <= 3; ++processes) {
    for (std::size_t contributions : {std::size_t(1), std::size_t(3)}) {
      INFO(processes << " processes, " << contributions << " contributions each");
      std::vector<exchange_plan> plans;
      std::vector<std::vector<float>> send, received;
      for (int p = 0; p < processes; ++p) {
        plans.emplace_back(table, count, processes, p, contributions, max_process_rows, bucket_of);
        REQUIRE(plans.back().buckets() == 3);
        send.emplace_back(plans.back().send_elements(), -1.0f);
        received.emplace_back(plans.back().receive_elements(), -1.0f);
      }
      for (int p = 0; p < processes; ++p) {  // process p's rows for each owner
        for (int owner = 0; owner < processes; ++owner) {
          const std::vector<float*> rows = plans[static_cast<std::size_t>(p)].send_row_pointers(owner, send[static_cast<std::size_t>(p)].data());
          for (const element_range& range : plans[0].slice(owner).ranges) {
            for (std::size_t k = 0; k < contributions; ++k)
              for (std::size_t i = range.begin; i < range.end; ++i) rows[k * count + range.variable][i] = code(p, k, range.variable, i);
          }
        }
      }
      for (std::size_t bucket = 0; bucket < 3; ++bucket) {
        for (int p = 0; p < processes; ++p) {
          const auto sent = plans[static_cast<std::size_t>(p)].send_blocks(sizeof(float), bucket);
          for (int owner = 0; owner < processes; ++owner) {
            const auto arriving = plans[static_cast<std::size_t>(owner)].receive_blocks(sizeof(float), bucket);
            const std::size_t to = static_cast<std::size_t>(owner), from = static_cast<std::size_t>(p);
            REQUIRE(sent.bytes[to] == arriving.bytes[from]);
            CHECK(sent.offsets[to] % 256 == 0);
            CHECK(arriving.offsets[from] % 256 == 0);
            std::memcpy(reinterpret_cast<char*>(received[to].data()) + arriving.offsets[from],
                        reinterpret_cast<const char*>(send[from].data()) + sent.offsets[to], sent.bytes[to]);
          }
        }
      }
      for (int p = 0; p < processes; ++p) {  // the buckets' pieces tile the whole blocks, in bucket order
        const exchange_plan& plan = plans[static_cast<std::size_t>(p)];
        const auto whole = plan.send_blocks(sizeof(float));
        for (int owner = 0; owner < processes; ++owner) {
          std::size_t at = whole.offsets[static_cast<std::size_t>(owner)];
          for (std::size_t bucket = 0; bucket < 3; ++bucket) {
            const auto piece = plan.send_blocks(sizeof(float), bucket);
            CHECK(piece.offsets[static_cast<std::size_t>(owner)] == at);
            at += piece.bytes[static_cast<std::size_t>(owner)];
          }
          CHECK(at == whole.offsets[static_cast<std::size_t>(owner)] + whole.bytes[static_cast<std::size_t>(owner)]);
        }
      }
      for (int owner = 0; owner < processes; ++owner) {  // what each owner reads, row by global row
        const exchange_plan& plan = plans[static_cast<std::size_t>(owner)];
        const std::vector<float*> rows = plan.received_row_pointers(received[static_cast<std::size_t>(owner)].data());
        for (const element_range& range : plan.mine().ranges) {
          for (int p = 0; p < processes; ++p) {
            for (std::size_t k = 0; k < contributions; ++k) {
              const std::size_t row = static_cast<std::size_t>(p) * contributions + k;
              for (std::size_t i = range.begin; i < range.end; ++i) {
                INFO("owner " << owner << ", from " << p << ", row " << k << ", variable " << range.variable << ", element " << i);
                REQUIRE(rows[row * count + range.variable][i] == code(p, k, range.variable, i));
              }
            }
          }
        }
      }
    }
  }
}
