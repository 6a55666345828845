// `xagg worker`: a verifying all-reduce (or reduce-scatter) worker. Every rank
// derives its values from (seed, rank, iteration, index), so each worker can
// compute the exact float64 reference for all ranks locally and check every
// element it gets back. A reduce-scatter's output is rank r's shard of the
// all-reduce of the same input: elements [r S, (r + 1) S), S = elements / N.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>
#include <xagg/communicator.h>

#include "admission.h"
#include "backend.h"
#include "baselines/switch/switch_client.h"
#include "commands.h"
#include "netns.h"
#include "xagg/quantize.h"
#include "wire.h"

namespace xagg::tools {
namespace {

struct WorkerOptions {
  std::string backend = "xagg";
  std::vector<std::string> aggregators{"198.18.0.1"};
  std::vector<uint32_t> aggregator_weights;
  uint16_t control_port = 0;  // 0: the backend's default
  uint32_t job = 1;
  uint32_t rank = 0;
  uint32_t world_size = 2;
  uint64_t elements = 1024;
  uint32_t iterations = 1;
  std::string dtype = "float32";
  std::string op = "sum";
  std::string collective = "allreduce";  // or reduce-scatter (xagg only)
  uint64_t seed = 1;
  std::string magnitudes = "stable";
  uint32_t start_delay_ms = 0;
  std::string rendezvous;     // gloo only
  std::string local_address;  // gloo only
  std::string netns;
  std::string secret_file;  // xagg: the cluster secret, when the aggregators require one
  uint32_t mtu = 0;         // xagg: CommunicatorConfig::mtu
  uint32_t aggregator_dead_after_ms = 500;  // xagg: CommunicatorConfig::aggregator_dead_after
  std::string root_aggregator;  // xagg: a two-level job's root (CommunicatorConfig::root_aggregator)
  uint32_t ranks_per_leaf = 0;
  uint32_t wire_bits = 32;  // BackendConfig::wire_bits: xagg's 16-bit wire, gloo's float16
  bool json = false;
};

// The generator gives each block of this many elements its own magnitude.
constexpr size_t kScaleBlock = wire::kChunkElems;

// The switch baselines quantize with one exponent per packet.
static_assert(std::ranges::all_of(baselines::switchml::kSwitchVariants,
                                  [](const auto& switch_variant) {
                                    return kScaleBlock % switch_variant.pool.packet_elems == 0;
                                  }),
              "a generator block holds whole switch blocks");

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Values are a deterministic function of (seed, rank, iteration, index), so
// every rank can regenerate any rank's values for the reference. The
// per-(rank, iteration) key and the per-chunk scale are computed once: the
// generator runs over every element of every rank in each iteration.
uint64_t stream_key(uint64_t seed, uint32_t rank, uint32_t iteration) {
  return splitmix64(seed ^ (uint64_t{rank} << 32 | iteration));
}

uint64_t element_hash(uint64_t key, uint64_t index) { return splitmix64(key ^ index); }

// Gloo with --wire-bits 16 all-reduces float16, whose largest finite value is 65504.
bool float16_elements(const WorkerOptions& options) { return options.backend == "gloo" && options.wire_bits == 16; }

// The exponents of the chunks' magnitudes (a value is below 2^exponent):
// float32 from -20 to 20; float16 such that the sum over the ranks stays
// below 2^15, down to where many values are float16 subnormals (below 2^-14).
struct ExponentRange {
  int lowest, highest;
};
ExponentRange exponent_range(const WorkerOptions& options) {
  if (!float16_elements(options)) return {-20, 20};
  const int highest = 15 - static_cast<int>(std::bit_width(options.world_size - 1));  // 15 - ceil(log2 N)
  return {highest - 24, highest};
}

// Magnitudes that differ per chunk, so every chunk gets its own quantization
// exponent. Stable magnitudes persist from iteration to iteration up to a
// factor of 2, as a layer's gradients do; random ones are drawn anew each
// iteration, so that XAgg's predicted exponents fail and every chunk is redone
// (xagg/quantize.h).
double chunk_scale(const WorkerOptions& options, uint32_t iteration, uint64_t chunk) {
  const uint64_t seed = options.seed;
  const auto [lowest, highest] = exponent_range(options);
  const auto span = static_cast<uint64_t>(highest - lowest);
  const uint64_t this_iteration = splitmix64(seed ^ (uint64_t{iteration} << 40) ^ chunk);
  const uint64_t offset = options.magnitudes == "stable" ? splitmix64(seed ^ chunk) % span + this_iteration % 2
                                                         : this_iteration % (span + 1);
  return std::ldexp(1.0, lowest + static_cast<int>(offset));
}

// 53 random bits: small values keep full float precision below the chunk's quantization step.
float float_value(uint64_t key, double scale, uint64_t index) {
  double unit = static_cast<double>(element_hash(key, index) >> 11) * 0x1p-53;
  return static_cast<float>((2.0 * unit - 1.0) * scale);
}

// |value| < 2^24: a sum over 64 ranks stays far from int32 overflow.
int32_t int_value(uint64_t key, uint64_t index) {
  return static_cast<int32_t>(element_hash(key, index) % (1u << 25)) - (1 << 24);
}

std::vector<uint64_t> rank_keys(const WorkerOptions& options, uint32_t iteration) {
  std::vector<uint64_t> keys(options.world_size);
  for (uint32_t r = 0; r < options.world_size; ++r) keys[r] = stream_key(options.seed, r, iteration);
  return keys;
}

struct Check {
  double max_abs_error = 0;
  double max_error_ratio = 0;  // error / allowed error
  uint64_t wrong = 0;
};

// quantum: the elements that share one quantization exponent in XAgg (its
// job's chunk), for the other systems kScaleBlock. result[j] is element first + j
// of the all-reduce, counted from its operation's start (a reduce-scatter's shard).
Check verify_floats(const WorkerOptions& options, uint32_t iteration, const std::vector<float>& result,
                    size_t quantum, uint64_t first = 0) {
  const uint32_t ranks = options.world_size;
  const bool average = options.op == "average";
  Check check;
  const std::vector<uint64_t> keys = rank_keys(options, iteration);
  std::vector<double> reference(quantum), magnitude(quantum);
  const auto switch_pool = baselines::switchml::switch_pool_shape(options.backend);
  // The switch's quantization blocks; for the others only each chunk's maximum matters.
  const size_t block = switch_pool ? switch_pool->packet_elems : quantum;
  std::vector<float> block_max(quantum / block);  // over all ranks' inputs
  for (uint64_t begin = 0; begin < result.size(); begin += quantum) {
    uint64_t end = std::min<uint64_t>(begin + quantum, result.size());
    std::ranges::fill(block_max, 0.0f);
    for (uint64_t i = begin; i < end; ++i) {
      double sum = 0, sum_abs = 0;
      float& largest = block_max[(i - begin) / block];
      const double scale = chunk_scale(options, iteration, (first + i) / kScaleBlock);
      for (uint32_t r = 0; r < ranks; ++r) {
        float value = float_value(keys[r], scale, first + i);
        largest = std::max(largest, std::abs(value));
        sum += value;
        sum_abs += std::abs(value);
      }
      reference[i - begin] = average ? sum / ranks : sum;
      magnitude[i - begin] = average ? sum_abs / ranks : sum_abs;
    }
    const float chunk_max = std::ranges::max(block_max);
    int exponent = 0;
    std::frexp(chunk_max, &exponent);  // chunk_max < 2^exponent
    // The exponent used may be a prediction, up to kMaxExponentExcess above the common one.
    const int used_exponent = exponent + quant::kMaxExponentExcess;
    double quantization = (options.wire_bits == 16
                               ? quant::narrow_error_bound(used_exponent, ranks, options.ranks_per_leaf)
                               : quant::error_bound(used_exponent, ranks)) /
                          (average ? ranks : 1);
    for (uint64_t i = begin; i < end; ++i) {
      double expected = reference[i - begin];
      // XAgg: its quantization bound. The switch: the same bound for its block's exponent, the
      // MAX over the ranks' local exponents (switch_client.cpp), which is the exponent of the
      // block's largest input. Float-summing baselines: the bound of N-1 float32 additions,
      // (N-1) * 2^-24 * sum |x_r|. Float16 (gloo --wire-bits 16): N roundings of
      // u = 2^-11 (each input, divided by N first for an average, and each of the N-1
      // partial sums), plus 2^-25 for each input among the subnormals (sums of
      // subnormals are exact): gamma_(N+1) * sum |x_r| + 2 N 2^-25, with room for
      // second-order terms and the average's float32 division.
      double system_error = 0;
      if (options.backend == "xagg") {
        system_error = quantization;
      } else if (switch_pool) {
        const float largest = block_max[(i - begin) / block];
        system_error = quant::error_bound(quant::chunk_exponent({&largest, 1}), ranks) / (average ? ranks : 1);
      } else if (float16_elements(options)) {
        const double roundings = (ranks + 1) * 0x1p-11;
        system_error = roundings / (1 - roundings) * magnitude[i - begin] + 2 * ranks * 0x1p-25;
      } else {
        system_error = (ranks - 1) * 0x1p-24 * magnitude[i - begin];
      }
      double allowed = system_error + std::abs(expected) * 0x1p-23;  // plus float32 rounding of the result
      double error = std::abs(double(result[i]) - expected);
      check.max_abs_error = std::max(check.max_abs_error, error);
      check.max_error_ratio = std::max(check.max_error_ratio, allowed > 0 ? error / allowed : (error > 0 ? INFINITY : 0));
      if (!(error <= allowed)) ++check.wrong;
    }
  }
  return check;
}

Check verify_ints(const WorkerOptions& options, uint32_t iteration, const std::vector<int32_t>& result,
                  uint64_t first = 0) {
  Check check;
  const std::vector<uint64_t> keys = rank_keys(options, iteration);
  for (uint64_t i = 0; i < result.size(); ++i) {
    int64_t sum = 0;
    for (uint32_t r = 0; r < options.world_size; ++r) sum += int_value(keys[r], first + i);
    int64_t expected = options.op == "average" ? sum / options.world_size : sum;  // truncates toward zero
    double error = std::abs(double(result[i] - expected));
    check.max_abs_error = std::max(check.max_abs_error, error);
    if (error != 0) {
      check.max_error_ratio = INFINITY;
      ++check.wrong;
    }
  }
  return check;
}

// float32 goes through any backend; int32 and reduce-scatter only through XAgg's Communicator.
template <typename Reducer, typename T>
Check run_iteration(Reducer& reducer, const WorkerOptions& options, uint32_t iteration, std::vector<T>& data,
                    double& seconds) {
  const uint64_t key = stream_key(options.seed, options.rank, iteration);
  for (uint64_t i = 0; i < data.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      data[i] = float_value(key, chunk_scale(options, iteration, i / kScaleBlock), i);
    else
      data[i] = int_value(key, i);
  }
  ReduceOp op = options.op == "average" ? ReduceOp::Average : ReduceOp::Sum;
  // One iteration is a training step: every iteration's all-reduces land on the same chunks.
  reducer.begin_step();
  // Ranks verify at different speeds; a one-element all-reduce lines them up
  // so that the time below measures the all-reduce, not a peer's verification.
  T line_up{};
  reducer.allreduce(&line_up, 1, ReduceOp::Sum);
  std::vector<T> shard;  // a reduce-scatter's output
  const uint64_t shard_elements = data.size() / options.world_size;
  auto start = std::chrono::steady_clock::now();
  if constexpr (std::is_same_v<Reducer, Communicator>) {
    if (options.collective == "reduce-scatter") {
      shard.resize(shard_elements);
      std::vector<const T*> shards;
      for (uint32_t r = 0; r < options.world_size; ++r) shards.push_back(data.data() + r * shard_elements);
      reducer.reduce_scatter_async(shards, shard.data(), shard_elements, op)->wait();
    }
  }
  if (options.collective != "reduce-scatter") reducer.allreduce(data.data(), data.size(), op);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<T>& result = shard.empty() ? data : shard;
  const uint64_t first = shard.empty() ? 0 : options.rank * shard_elements;
  if constexpr (std::is_same_v<T, float>)
    return verify_floats(options, iteration, result,
                         reducer.chunk_elements() ? reducer.chunk_elements() : kScaleBlock, first);
  else
    return verify_ints(options, iteration, result, first);
}

backends::BackendConfig backend_config(const WorkerOptions& options) {
  backends::BackendConfig config;
  config.name = options.backend;
  config.servers = options.aggregators;
  config.server_weights = options.aggregator_weights;
  config.port = options.control_port;
  config.job_id = options.job;
  config.rank = options.rank;
  config.world_size = options.world_size;
  config.max_elements = options.elements;
  config.rendezvous = options.rendezvous;
  config.local_address = options.local_address;
  config.mtu = options.mtu;
  config.aggregator_dead_after = std::chrono::milliseconds(options.aggregator_dead_after_ms);
  config.root_server = options.root_aggregator;
  config.ranks_per_leaf = options.ranks_per_leaf;
  config.wire_bits = options.wire_bits;
  if (!options.secret_file.empty()) config.cluster_secret = read_secret_file(options.secret_file);
  return config;
}

std::unique_ptr<backends::Backend> make_float_reducer(const WorkerOptions& options) {
  return backends::make_backend(backend_config(options));
}

std::unique_ptr<Communicator> make_communicator(const WorkerOptions& options) {
  return std::make_unique<Communicator>(backends::communicator_config(backend_config(options)));
}

template <typename T, typename Reducer>
uint64_t run_iterations(Reducer& reducer, const WorkerOptions& options) {
  std::vector<T> data(options.elements);
  uint64_t total_wrong = 0;
  for (uint32_t iteration = 0; iteration < options.iterations; ++iteration) {
    double seconds = 0;
    Check check = run_iteration(reducer, options, iteration, data, seconds);
    total_wrong += check.wrong;
    double algbw = double(options.elements * sizeof(T)) / seconds;  // bytes per second
    if (options.json) {
      nlohmann::json line{{"rank", options.rank},           {"iteration", iteration},
                          {"elements", options.elements},   {"dtype", options.dtype}, {"wire_bits", options.wire_bits},
                          {"op", options.op},               {"seconds", seconds},
                          {"algbw_bytes_per_s", algbw},     {"max_abs_error", check.max_abs_error},
                          {"max_error_ratio", check.max_error_ratio}, {"wrong", check.wrong}};
      fmt::print("{}\n", line.dump());
    } else {
      fmt::print("rank {} iteration {:>3}: {:9.3f} ms  {:8.3f} GB/s  max |err| {:.3e}  err/bound {:.3f}  wrong {}\n",
                 options.rank, iteration, seconds * 1e3, algbw / 1e9, check.max_abs_error, check.max_error_ratio,
                 check.wrong);
    }
    std::fflush(stdout);
  }
  return total_wrong;
}

template <typename T>
uint64_t run_worker(const WorkerOptions& options) {
  if constexpr (std::is_same_v<T, float>)
    if (options.collective == "allreduce") return run_iterations<T>(*make_float_reducer(options), options);
  return run_iterations<T>(*make_communicator(options), options);
}

}  // namespace

void add_worker_command(CLI::App& app) {
  auto options = std::make_shared<WorkerOptions>();
  auto* worker = app.add_subcommand("worker", "Run verifying all-reduce iterations against an aggregator");
  worker->add_option("--backend", options->backend, "All-reduce system (int32: xagg only)")
      ->check(CLI::IsMember(backends::backend_names()))
      ->capture_default_str();
  worker->add_option("--aggregator", options->aggregators,
                     "The job's aggregators (or parameter servers), IPv4[:port], comma-separated, in the same order "
                     "on every rank")
      ->delimiter(',')
      ->capture_default_str();
  worker->add_option("--aggregator-weights", options->aggregator_weights,
                     "Relative share of the job each aggregator holds, comma-separated (default: equal)")
      ->delimiter(',');
  worker->add_option("--root-aggregator", options->root_aggregator,
                     "xagg, a two-level job: the root aggregator, IPv4[:port]; --aggregator then lists one leaf "
                     "aggregator per --ranks-per-leaf consecutive ranks");
  worker->add_option("--ranks-per-leaf", options->ranks_per_leaf, "xagg, a two-level job: ranks per leaf, 1..64");
  worker->add_option("--mtu", options->mtu,
                     "xagg: the largest IP packet to send, 1280..65535 (default: the path MTU to the aggregators)");
  worker
      ->add_option("--wire-bits", options->wire_bits,
                   "Bits per element on the wire, 32 or 16 (half the bytes; float32 only): xagg's 16-bit wire "
                   "(docs/protocol.md section 11) or gloo's float16 all-reduce (its values then within float16's "
                   "range)")
      ->check(CLI::IsMember({32, 16}))
      ->capture_default_str();
  worker
      ->add_option("--aggregator-dead-after-ms", options->aggregator_dead_after_ms,
                   "xagg: an aggregator that leaves heartbeats unanswered this long, beyond what TCP's loss repair "
                   "accounts for, is dead and its chunks fail over (up to 4x this on a lossy path; "
                   "docs/reliability.md section 10), 50..60000")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  worker->add_option("--control-port", options->control_port, "Its control / service TCP port (0: the backend's default)")
      ->capture_default_str();
  worker->add_option("--job", options->job, "Job id")->required();
  worker->add_option("--rank", options->rank, "This worker's rank")->required();
  worker->add_option("--world-size", options->world_size, "Number of ranks (two-level xagg jobs: up to 4096)")
      ->required()
      ->check(CLI::Range(1, 4096));
  worker->add_option("--elements", options->elements, "Elements per all-reduce")->required()->check(CLI::PositiveNumber);
  worker->add_option("--iterations", options->iterations, "All-reduces, each with new values")->capture_default_str();
  worker->add_option("--dtype", options->dtype)->check(CLI::IsMember({"float32", "int32"}))->capture_default_str();
  worker->add_option("--op", options->op)->check(CLI::IsMember({"sum", "average"}))->capture_default_str();
  worker->add_option("--collective", options->collective,
                     "xagg: allreduce, or reduce-scatter (rank r gets shard r of --elements, which the world size "
                     "must divide)")
      ->check(CLI::IsMember({"allreduce", "reduce-scatter"}))
      ->capture_default_str();
  worker->add_option("--seed", options->seed, "Seed of the generated values")->capture_default_str();
  worker->add_option("--magnitudes", options->magnitudes, "float32: a chunk's magnitude from one iteration to the next")
      ->check(CLI::IsMember({"stable", "random"}))
      ->capture_default_str();
  worker->add_option("--start-delay-ms", options->start_delay_ms, "Wait before joining")->capture_default_str();
  worker->add_option("--rendezvous", options->rendezvous, "gloo: a directory every rank can reach (file store)");
  worker->add_option("--local-address", options->local_address, "gloo: this rank's IPv4 address to listen on");
  worker->add_option("--netns", options->netns, "Run inside this network namespace");
  worker->add_option("--secret-file", options->secret_file,
                     "xagg: file holding the cluster secret the aggregators require (docs/security.md)")
      ->envname("XAGG_SECRET_FILE");
  worker->add_flag("--json", options->json, "One JSON object per iteration");
  worker->callback([options] {
    if (options->rank >= options->world_size) throw CLI::ValidationError("--rank", "must be below --world-size");
    if (!options->root_aggregator.empty() && options->backend != "xagg")
      throw CLI::ValidationError("--root-aggregator", "two-level jobs are the xagg backend's");
    if (options->dtype == "int32" && options->backend != "xagg")
      throw CLI::ValidationError("--dtype", "int32 is supported by the xagg backend only");
    if (!backends::supports_wire_bits(options->backend, options->wire_bits) ||
        (options->wire_bits != 32 && options->dtype != "float32"))
      throw CLI::ValidationError("--wire-bits",
                                 "16 is for float32 through the xagg backend (its 16-bit wire) or "
                                 "gloo (float16); int32 needs all 32 bits");
    if (options->collective == "reduce-scatter" &&
        (options->backend != "xagg" || options->elements % options->world_size != 0))
      throw CLI::ValidationError("--collective", "reduce-scatter is the xagg backend's, of --elements that "
                                                 "--world-size divides");
    if (!options->netns.empty()) enter_netns(options->netns);  // before any thread starts
    std::this_thread::sleep_for(std::chrono::milliseconds(options->start_delay_ms));
    uint64_t wrong = options->dtype == "float32" ? run_worker<float>(*options) : run_worker<int32_t>(*options);
    if (wrong > 0) throw std::runtime_error(fmt::format("rank {}: {} wrong elements", options->rank, wrong));
  });
}

}  // namespace xagg::tools
