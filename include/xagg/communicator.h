// libxagg: all-reduce of tensors through an XAgg aggregator.
//
//   xagg::CommunicatorConfig config;
//   config.aggregators = {"198.18.0.1", "198.18.0.2"};
//   config.job_id = 7; config.rank = r; config.world_size = 4;
//   config.max_elements = grad.size();
//   xagg::Communicator comm(config);          // joins the job, waits for all ranks
//   comm.allreduce(grad.data(), grad.size(), xagg::ReduceOp::Average);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xagg/errors.h"

namespace xagg {

// Max and Min go through the aggregator's MAX (Min as the MAX of the bitwise
// complement, which reverses int32 order exactly): exact for int32, within
// half a quantization step for float32 (docs/protocol.md section 5).
enum class ReduceOp { Sum, Average, Max, Min };

struct CommunicatorConfig {
  // The job's aggregators, "IPv4" or "IPv4:port", in the same order on every
  // rank: the job's chunks are spread over them, interleaved so that every
  // all-reduce uses all of them (docs/protocol.md section 6). 1 to 64.
  std::vector<std::string> aggregators;
  // Relative share of the chunks each aggregator holds, 1..1000 each (e.g.
  // proportional to its link rate); empty: equal shares.
  std::vector<uint32_t> aggregator_weights;
  uint16_t control_port = 9988;    // their TCP control endpoint, where an entry names none
  uint32_t job_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;         // 1 .. 64; two-level: 1 .. 4096
  // A two-level job (docs/design.md, "Hierarchy"): ranks r with the same
  // r / ranks_per_leaf (1..64) form a leaf, and `aggregators` lists one leaf
  // aggregator per leaf, in leaf order; each leaf aggregator adds its ranks'
  // shares and is a member of root_aggregator's job ("IPv4" or "IPv4:port"),
  // where the leaves' sums add up. Empty: a job on `aggregators` alone.
  std::string root_aggregator;
  uint32_t ranks_per_leaf = 0;
  // Largest tensor all-reduced in this job; the aggregator holds this many
  // elements for the job. All-reduces whose chunks fit side by side run at
  // once, so size it for a whole training step's gradient (see begin_step).
  uint64_t max_elements = 0;
  // The three timeouts are at most 24 hours. A join or an all-reduce still
  // waiting after a quarter of its timeout (1 s to 30 s) logs a warning naming
  // the ranks it waits for, and again at that interval.
  std::chrono::milliseconds join_timeout{30000};       // until every rank has joined
  std::chrono::milliseconds operation_timeout{60000};  // one all-reduce, start to end
  // How long an operation's last chunk, its exponent chunks, a redone chunk
  // and a repeated resend of an overtaken chunk wait for a result; other
  // chunks wait a timeout learned from send-to-result times, from
  // max(this, 50 ms) to 8 times that (docs/protocol.md section 4).
  std::chrono::milliseconds retransmit_interval{10};
  // Chunks sent but not yet answered (1536: 12 MiB), at most 65536, counted
  // in chunks of the largest size (2048 elements): a job with smaller chunks
  // (a smaller MTU) keeps the same bytes in flight in proportionally more.
  uint32_t window_chunks = 1536;
  // The largest IP packet this rank may send to the aggregators, 1280 to
  // 65535; 0: the smallest path MTU to them that the kernel knows. The job's
  // packets fit the smallest over all ranks and aggregators (docs/protocol.md
  // section 1): jumbo frames (8252 and up) give the largest, 2048 elements.
  uint32_t mtu = 0;
  // How long an aggregator may leave the rank's heartbeats (a ping every
  // fifth of this time) unanswered before it is dead, where TCP does not
  // account for the silence; one that closes its control connection is dead
  // at once. TCP accounts for it while the aggregator's kernel still
  // acknowledges the pings: a lossy path delays answers by TCP's
  // retransmission timeouts while both ends are alive. Silent for this long,
  // with TCP silent too, a cut link is found after it (twice it on a path that
  // lost packets lately); an aggregator whose kernel acknowledges but whose
  // process does not answer after twice it (four times it on a lossy path:
  // docs/reliability.md section 10). A job on several aggregators then moves
  // the dead one's chunks to the survivors and redoes what it has no result
  // for (docs/reliability.md, "Failover"); with none left, every all-reduce
  // fails naming it. 50 ms to 60 s.
  std::chrono::milliseconds aggregator_dead_after{500};
  // Bits of one element on the wire, the job's, the same on every rank: 32, or
  // 16 for half the bytes each way (docs/protocol.md section 11: 16-bit lanes
  // under the block exponents, twice the elements per packet; float32
  // all-reduces then keep a per-element bound of about 2^-13 of their block's
  // largest magnitude instead of 2^-29). It is the default width of float32
  // all-reduces and sets the packets' size; each all-reduce may choose the
  // other width (allreduce's wire_bits). int32 always goes as 32 bits.
  uint32_t wire_bits = 32;
  // The cluster secret, when the aggregators require one to join (their
  // --secret-file; docs/security.md): proven, never sent. Empty: none.
  std::string cluster_secret;
};

// Completion handle of an asynchronous all-reduce.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool completed() const = 0;
  // Blocks until done; rethrows the operation's error.
  virtual void wait() = 0;
};

class Communicator {
 public:
  // Joins the job and returns once every rank has joined. Throws ConfigError
  // or CommError/TimeoutError.
  explicit Communicator(CommunicatorConfig config);
  ~Communicator();  // leaves the job
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // In-place all-reduce; every rank calls with the same count, op, width and
  // order. float32 goes through block fixed-point quantization (error bound in
  // docs/protocol.md) on wire_bits 32 or 16 (0: the communicator's); int32 SUM
  // is exact modulo 2^32 (it wraps), and int32 AVERAGE divides that wrapped
  // sum by world_size, truncating toward zero, so it is exact only when the
  // sum fits in int32. Sizes: up to max_allreduce_elements(wire_bits): a
  // 16-bit all-reduce on a 32-bit communicator sends packets of half the
  // bytes, as many as a 32-bit one; a two-level job needs a 16-bit
  // communicator for it.
  void allreduce(float* data, size_t count, ReduceOp op = ReduceOp::Sum, uint32_t wire_bits = 0);
  void allreduce(int32_t* data, size_t count, ReduceOp op = ReduceOp::Sum);

  // Run by a progress thread, several at once when the job's chunks allow
  // (docs/design.md); Works complete in call order. data must stay valid,
  // and untouched by the caller, until the Work completes. An all-reduce whose
  // buffer overlaps that of one still running waits until that one ends, so
  // overlapping all-reduces run one after another.
  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op = ReduceOp::Sum,
                                        uint32_t wire_bits = 0);
  std::shared_ptr<Work> allreduce_async(int32_t* data, size_t count, ReduceOp op = ReduceOp::Sum);

  // Reduce-scatter: shards[r] is this rank's `count` elements for rank r
  // (world_size() of them); `output` receives the reduction over all ranks of
  // their shards[rank()]. Each shard is an all-reduce of its own (same bounds
  // and ops as above) whose values the aggregator sends to that shard's owner
  // alone; the other ranks get each chunk's header, so a rank receives about
  // 1/world_size of the bytes of an all-reduce of everything (docs/protocol.md
  // section 10). The shards are copied before this returns; `output` must stay
  // valid until the Work completes. count: as for allreduce.
  std::shared_ptr<Work> reduce_scatter_async(const std::vector<const float*>& shards, float* output, size_t count,
                                             ReduceOp op = ReduceOp::Sum, uint32_t wire_bits = 0);
  std::shared_ptr<Work> reduce_scatter_async(const std::vector<const int32_t*>& shards, int32_t* output,
                                             size_t count, ReduceOp op = ReduceOp::Sum);

  // Marks the start of a training step: the all-reduces queued after it are
  // placed from the start of the job's chunks again, so that the buckets of
  // one step (up to max_elements in all, at most 32 buckets) never wait for
  // one another, only for the same buckets of the previous step. Since each
  // bucket then lands on the same chunks every step, a float32 bucket's values
  // go out with exponents predicted from its previous step instead of waiting
  // for the ranks to agree (xagg/quantize.h). Without it, placement wraps
  // around where it must. Every rank calls it at the same point of its
  // sequence of all-reduces.
  void begin_step();

  // Throws the CommError that fails the job's operations from now on, if there
  // is one (a rank disconnected, no aggregator left, an operation failed): for
  // callers that wait on something else, such as the ranks' own side channel.
  void throw_if_failed() const;

  uint32_t rank() const;
  uint32_t world_size() const;
  // The job's MTU and the elements per chunk (packet) it gives, agreed at join.
  uint32_t mtu() const;
  uint32_t chunk_elements() const;
  uint32_t wire_bits() const;  // the job's, as configured, agreed with every rank at join
  // The largest float32 all-reduce (or reduce-scatter shard) of this width
  // (0: the communicator's): max_elements at the communicator's own width;
  // about half of it as 32 bits on a 16-bit communicator (int32 too: its
  // packets hold half the elements); as 16 bits on a 32-bit one, a little
  // less than max_elements (the block exponents take about 1/30 of its chunks).
  uint64_t max_allreduce_elements(uint32_t wire_bits = 0) const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace xagg
