// The XDP engine: the data plane runs in the kernel; this only forwards the
// registry's calls to the Dataplane loader.
#include "engine.h"

namespace xagg::control {
namespace {

class XdpEngine final : public Engine {
 public:
  explicit XdpEngine(std::unique_ptr<dataplane::Dataplane> dataplane) : dataplane_(std::move(dataplane)) {}

  std::optional<uint32_t> next_free_slot() const override { return dataplane_->next_free_slot(); }
  uint32_t add_job(const dataplane::JobSpec& job) override { return dataplane_->add_job(job); }
  void add_worker(uint32_t job_id, const dataplane::WorkerSpec& worker) override {
    dataplane_->add_worker(job_id, worker);
  }
  void remove_job(uint32_t job_id) override { dataplane_->remove_job(job_id); }
  dataplane::CounterSnapshot counters() const override { return dataplane_->counters(); }
  dataplane::CellState cell_state(uint32_t job_id, uint32_t chunk, uint32_t iteration) const override {
    return dataplane_->cell_state(job_id, chunk, iteration);
  }
  std::optional<dataplane::ProgramRunStats> program_run_stats() const override {
    return dataplane_->program_run_stats();
  }

 private:
  std::unique_ptr<dataplane::Dataplane> dataplane_;
};

}  // namespace

std::unique_ptr<Engine> make_xdp_engine(const std::string& interface, dataplane::AttachMode mode,
                                        const dataplane::LoadOptions& load) {
  auto dataplane = dataplane::Dataplane::load(load);
  dataplane->attach(interface, mode);
  return std::make_unique<XdpEngine>(std::move(dataplane));
}

}  // namespace xagg::control
