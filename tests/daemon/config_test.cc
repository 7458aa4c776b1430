// LoadConfig turns spexd's flags into typed values and names the flag of every bad one; the
// enumerated flags refuse a misspelt value at parsing, naming the flag and the accepted values.
#include "daemon/config.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "daemon/flags.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every test starts from the defaults and leaves them as they were.
class ConfigTest : public ::testing::Test {
 private:
  absl::FlagSaver saver_;
};

TEST_F(ConfigTest, DefaultsAreValid) {
  absl::StatusOr<DaemonConfig> c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.local_trainers, 1);
  EXPECT_EQ(c->engine.compressor, "dense");
  EXPECT_EQ(c->engine.dense_fallback, DenseFallback::kAuto);
  EXPECT_EQ(c->engine.merger, MergerPolicy::kNone);
  EXPECT_EQ(c->engine.nonfinite, NonfinitePolicy::kPropagate);
  EXPECT_EQ(c->engine.index_encoding, IndexEncoding::kDelta);
  EXPECT_EQ(c->device, DeviceChoice::kAuto);
  EXPECT_EQ(c->log_level, LogLevel::kInfo);
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->spin_us, -1);
  // Passive waits for collectives of 1 MiB and more, inside MPI below (MpiWaitPolicy).
  EXPECT_EQ(c->mpi_wait_max_sleep_us, 1000);
  EXPECT_EQ(c->mpi_passive_wait_min_bytes, 1 << 20);
  EXPECT_EQ(c->mpi_sleep_beside_compute, DaemonConfig::Toggle::kOff);
  EXPECT_FALSE(c->job.empty());        // DefaultJob() when --job is not given
  EXPECT_TRUE(c->engine.job.empty());  // and then not enforced on trainers
}

TEST_F(ConfigTest, GoodFlagsGiveTypedValues) {
  absl::SetFlag(&FLAGS_socket, "/tmp/x/node{rank}.sock");
  absl::SetFlag(&FLAGS_socket_mode, "660");
  absl::SetFlag(&FLAGS_job, "j7");
  absl::SetFlag(&FLAGS_local_trainers, 3);
  absl::SetFlag(&FLAGS_compressor, "topk");
  absl::SetFlag(&FLAGS_density, 0.05);
  absl::SetFlag(&FLAGS_register_timeout, absl::Seconds(7));
  absl::SetFlag(&FLAGS_shutdown_grace, absl::Milliseconds(1500));
  absl::SetFlag(&FLAGS_spin_us, 20);
  absl::SetFlag(&FLAGS_mpi_wait_max_sleep_us, int64_t{800});
  absl::SetFlag(&FLAGS_mpi_passive_wait_min_bytes, int64_t{0});
  absl::SetFlag(&FLAGS_mpi_sleep_beside_compute, "on");
  absl::SetFlag(&FLAGS_threads, 4);
  absl::SetFlag(&FLAGS_device, DeviceChoice::kCpu);
  absl::SetFlag(&FLAGS_error_feedback, false);
  absl::SetFlag(&FLAGS_min_sparse_elements, int64_t{100});
  absl::SetFlag(&FLAGS_dense_fallback, DenseFallback::kOff);
  absl::SetFlag(&FLAGS_probe_steps, 5);
  absl::SetFlag(&FLAGS_nonfinite, NonfinitePolicy::kError);
  absl::SetFlag(&FLAGS_fp16_values, true);
  absl::SetFlag(&FLAGS_wire_index_encoding, IndexEncoding::kU32);
  absl::SetFlag(&FLAGS_residual_norm_every, 0);
  absl::SetFlag(&FLAGS_log_level, LogLevel::kWarning);

  absl::StatusOr<DaemonConfig> c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->socket, "/tmp/x/node{rank}.sock");
  EXPECT_EQ(c->socket_mode, 0660u);
  EXPECT_EQ(c->job, "j7");
  EXPECT_EQ(c->shutdown_grace, absl::Milliseconds(1500));
  EXPECT_EQ(c->spin_us, 20);
  EXPECT_EQ(c->mpi_wait_max_sleep_us, 800);
  EXPECT_EQ(c->mpi_passive_wait_min_bytes, 0);
  EXPECT_EQ(c->mpi_sleep_beside_compute, DaemonConfig::Toggle::kOn);
  EXPECT_EQ(c->threads, 4);
  EXPECT_EQ(c->device, DeviceChoice::kCpu);
  EXPECT_EQ(c->log_level, LogLevel::kWarning);
  const EngineOptions& e = c->engine;
  EXPECT_EQ(e.job, "j7");
  EXPECT_EQ(e.local_trainers, 3);
  EXPECT_EQ(e.compressor, "topk");
  EXPECT_DOUBLE_EQ(e.density, 0.05);
  EXPECT_EQ(e.register_wait, absl::Seconds(7));
  EXPECT_FALSE(e.error_feedback);
  EXPECT_EQ(e.min_sparse_elements, 100u);
  EXPECT_EQ(e.dense_fallback, DenseFallback::kOff);
  EXPECT_EQ(e.probe_steps, 5);
  EXPECT_EQ(e.nonfinite, NonfinitePolicy::kError);
  EXPECT_TRUE(e.fp16_values);
  EXPECT_EQ(e.index_encoding, IndexEncoding::kU32);
  EXPECT_EQ(e.residual_norm_every, 0);
  EXPECT_FALSE(e.shm_tag.empty());
}

// One bad value per checked flag: LoadConfig fails naming the flag and what it accepts.
TEST_F(ConfigTest, EveryBadValueNamesItsFlag) {
  const struct {
    void (*set)();
    const char* says;
  } kCases[] = {
      {[] { absl::SetFlag(&FLAGS_local_trainers, 0); }, "--local_trainers must be in 1.."},
      {[] { absl::SetFlag(&FLAGS_compressor, "zip"); }, "--compressor"},
      {[] { absl::SetFlag(&FLAGS_density, 1.5); }, "--density"},
      {[] { absl::SetFlag(&FLAGS_register_timeout, absl::ZeroDuration()); },
       "--register_timeout must be a positive duration"},
      {[] { absl::SetFlag(&FLAGS_shutdown_grace, absl::Seconds(-1)); },
       "--shutdown_grace must be a positive duration"},
      {[] { absl::SetFlag(&FLAGS_spin_us, -2); }, "--spin_us must be >= 0, or -1"},
      {[] { absl::SetFlag(&FLAGS_mpi_wait_max_sleep_us, int64_t{-1}); },
       "--mpi_wait_max_sleep_us must be in [0, 1000000]"},
      {[] { absl::SetFlag(&FLAGS_mpi_wait_max_sleep_us, int64_t{1000001}); },
       "--mpi_wait_max_sleep_us must be in [0, 1000000]"},
      {[] { absl::SetFlag(&FLAGS_mpi_passive_wait_min_bytes, int64_t{-1}); },
       "--mpi_passive_wait_min_bytes must be >= 0"},
      {[] { absl::SetFlag(&FLAGS_mpi_sleep_beside_compute, "yes"); },
       "--mpi_sleep_beside_compute must be auto, on or off, got 'yes'"},
      {[] {
         absl::SetFlag(&FLAGS_mpi_sleep_beside_compute, "on");
         absl::SetFlag(&FLAGS_mpi_wait_max_sleep_us, int64_t{0});
       },
       "--mpi_sleep_beside_compute=on needs --mpi_wait_max_sleep_us > 0"},
      {[] { absl::SetFlag(&FLAGS_threads, -1); }, "--threads must be >= 0"},
      {[] { absl::SetFlag(&FLAGS_min_sparse_elements, int64_t{-1}); },
       "--min_sparse_elements must be >= 0"},
      {[] { absl::SetFlag(&FLAGS_probe_steps, 0); }, "--probe_steps must be >= 1"},
      {[] { absl::SetFlag(&FLAGS_residual_norm_every, -1); }, "--residual_norm_every must be >= 0"},
      {[] { absl::SetFlag(&FLAGS_socket_mode, "0800"); }, "--socket_mode must be octal"},
      {[] { absl::SetFlag(&FLAGS_socket_mode, "01777"); }, "at most 0777"},
      {[] { absl::SetFlag(&FLAGS_socket_mode, "rw"); }, "got 'rw'"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kFixed);
         absl::SetFlag(&FLAGS_fixed_cycle_ms, -1);
       },
       "--fixed_cycle_ms must be >= 0"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kRgmerge);
         absl::SetFlag(&FLAGS_merge_window, 0);
       },
       "--merge_window must be in [1, 64]"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kOmgs);
         absl::SetFlag(&FLAGS_omgs_threshold_elements, 0);
       },
       "--omgs_threshold_elements must be >= 1"},
      {[] { absl::SetFlag(&FLAGS_omgs_mode, "adaptive"); },
       "--omgs_mode must be threshold, count or mgs, got 'adaptive'"},
      {[] { absl::SetFlag(&FLAGS_omgs_select, "aside"); }, "--omgs_select must be ahead or behind"},
      {[] { absl::SetFlag(&FLAGS_rgmerge_plan, "guess"); },
       "--rgmerge_plan must be ready or model"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kRgmerge);
         absl::SetFlag(&FLAGS_rgmerge_select, "behind");
       },
       "--rgmerge_select=behind needs --rgmerge_plan=model"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kRgmerge);
         absl::SetFlag(&FLAGS_rgmerge_plan, "model");
         absl::SetFlag(&FLAGS_rgmerge_slack_us, int64_t{-5});
       },
       "--rgmerge_slack_us must be >= 0"},
      {[] { absl::SetFlag(&FLAGS_rgmerge_linger, "always"); },
       "--rgmerge_linger must be off or auto, got 'always'"},
      {[] { absl::SetFlag(&FLAGS_rgmerge_bind, "soon"); },
       "--rgmerge_bind must be early or late, got 'soon'"},
      {[] {
         absl::SetFlag(&FLAGS_merger, MergerPolicy::kRgmerge);
         absl::SetFlag(&FLAGS_rgmerge_linger, "auto");
         absl::SetFlag(&FLAGS_rgmerge_linger_max_us, int64_t{-1});
       },
       "--rgmerge_linger_max_us must be in [0, 1000000]"},
  };
  for (const auto& c : kCases) {
    absl::FlagSaver restore;
    c.set();
    absl::StatusOr<DaemonConfig> config = LoadConfig();
    ASSERT_FALSE(config.ok()) << c.says;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_TRUE(Has(std::string(config.status().message()), c.says));
  }
}

TEST_F(ConfigTest, MergePlanFlags) {
  absl::SetFlag(&FLAGS_merger, MergerPolicy::kOmgs);
  absl::SetFlag(&FLAGS_omgs_mode, "mgs");
  absl::SetFlag(&FLAGS_omgs_select, "ahead");
  absl::SetFlag(&FLAGS_probe_steps, 4);
  absl::StatusOr<DaemonConfig> c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.merge.omgs_mode, OmgsMode::kMgs);
  EXPECT_FALSE(c->engine.merge.omgs_select_behind);
  EXPECT_EQ(c->engine.merge.plan_step, 2u * 4 + 16);  // 0: 2 * --probe_steps + 16
  absl::SetFlag(&FLAGS_merger, MergerPolicy::kRgmerge);
  absl::SetFlag(&FLAGS_rgmerge_plan, "model");
  absl::SetFlag(&FLAGS_rgmerge_select, "behind");
  absl::SetFlag(&FLAGS_merge_plan_step, uint64_t{9});
  absl::SetFlag(&FLAGS_merge_alpha_us, int64_t{250});
  absl::SetFlag(&FLAGS_omgs_mode, "threshold");
  absl::SetFlag(&FLAGS_omgs_count, uint64_t{3});  // still selects count mode
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->engine.merge.rgmerge_model);
  EXPECT_TRUE(c->engine.merge.rgmerge_select_behind);
  EXPECT_TRUE(c->engine.merge.omgs_select_behind == false);
  EXPECT_EQ(c->engine.merge.plan_step, 9u);
  EXPECT_EQ(c->engine.merge.merge_alpha_us, 250);
  EXPECT_EQ(c->engine.merge.omgs_mode, OmgsMode::kCount);
  EXPECT_FALSE(c->engine.merge.rgmerge_linger_auto);  // off by default
  absl::SetFlag(&FLAGS_rgmerge_linger, "auto");
  absl::SetFlag(&FLAGS_rgmerge_linger_max_us, int64_t{700});
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->engine.merge.rgmerge_linger_auto);
  EXPECT_EQ(c->engine.merge.rgmerge_linger_max_us, 700);
  EXPECT_FALSE(c->engine.merge.rgmerge_bind_late);  // early by default
  absl::SetFlag(&FLAGS_rgmerge_bind, "late");
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->engine.merge.rgmerge_bind_late);
}

TEST_F(ConfigTest, ReportsEveryBadFlagAtOnce) {
  absl::SetFlag(&FLAGS_threads, -1);
  absl::SetFlag(&FLAGS_socket_mode, "9");
  absl::StatusOr<DaemonConfig> c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Has(std::string(c.status().message()), "--threads"));
  EXPECT_TRUE(Has(std::string(c.status().message()), "--socket_mode"));
}

// The enumerated flags parse their spellings and refuse others with the accepted values.
TEST_F(ConfigTest, EnumeratedFlagsParseTheirSpellings) {
  const struct {
    const char* flag;
    std::vector<const char*> good;
    const char* accepted;  // in the error for a bad spelling
  } kFlags[] = {
      {"device", {"auto", "cpu", "cuda"}, "auto, cpu, cuda"},
      {"dense_fallback", {"auto", "off"}, "auto, off"},
      {"nonfinite", {"propagate", "error"}, "propagate, error"},
      {"merger", {"none", "fixed", "omgs", "rgmerge"}, "none"},
      {"log_level", {"debug", "info", "warning", "error"}, "debug, info, warning, error"},
  };
  for (const auto& f : kFlags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.flag);
    ASSERT_NE(flag, nullptr) << f.flag;
    for (const char* value : f.good) {
      std::string error;
      EXPECT_TRUE(flag->ParseFrom(value, &error)) << f.flag << "=" << value << ": " << error;
      EXPECT_EQ(flag->CurrentValue(), value);
    }
    std::string error;
    EXPECT_FALSE(flag->ParseFrom("bogus", &error)) << f.flag;
    EXPECT_TRUE(Has(error, "'bogus'")) << f.flag;
    EXPECT_TRUE(Has(error, f.accepted)) << f.flag;
  }
  absl::StatusOr<DaemonConfig> c = LoadConfig();  // the last good values: cuda, off, rgmerge
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.merger, MergerPolicy::kRgmerge);
}

// On spexd's command line a misspelt enumerated value stops the start, naming the flag.
TEST_F(ConfigTest, CommandLineRefusesABadValueNamingTheFlag) {
  const struct {
    const char* arg;
    const char* says;
  } kCases[] = {
      {"--device=gpu", "flag 'device'.*--device must be one of auto, cpu, cuda; got 'gpu'"},
      {"--dense_fallback=on", "flag 'dense_fallback'.*accepted: auto, off"},
      {"--nonfinite=ignore", "flag 'nonfinite'.*accepted: propagate, error"},
      {"--merger=greedy", "flag 'merger'.*accepted: none"},
      {"--log_level=verbose", "flag 'log_level'.*debug, info, warning, error"},
  };
  for (const auto& c : kCases) {
    std::vector<char*> argv = {const_cast<char*>("spexd"), const_cast<char*>(c.arg)};
    EXPECT_EXIT(absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data()),
                ::testing::ExitedWithCode(1), c.says);
  }
}

TEST(SocketPathTest, RankIsReplacedAndTheDefaultIsPerJobAndHostIndex) {
  DaemonConfig c;
  c.job = "myjob";
  c.socket = "/tmp/t/node{rank}.{rank}.sock";
  EXPECT_EQ(SocketPath(c, 3, 0, 1), "/tmp/t/node3.3.sock");
  c.socket.clear();
  const std::string alone = SocketPath(c, 3, 0, 1);
  EXPECT_TRUE(Has(alone, "/myjob/"));
  EXPECT_EQ(alone.substr(alone.size() - 5), ".sock");
  EXPECT_TRUE(Has(SocketPath(c, 3, 1, 2), ".1.sock"));
}

TEST(SpinUsTest, ExplicitOrAutomatic) {
  DaemonConfig c;
  c.engine.local_trainers = 2;
  c.spin_us = 7;
  EXPECT_EQ(SpinUs(c, 4, 1), 7);
  c.spin_us = -1;
  EXPECT_EQ(SpinUs(c, 2, 7), 50);  // 7 cores > 2 daemons x 3
  EXPECT_EQ(SpinUs(c, 2, 6), 0);
}

// auto sleeps beside the trainers' compute where they share the cores with the daemons (and
// sleeping is allowed at all); on and off as set.
TEST(SleepBesideComputeTest, AutoWhereTrainersShareTheCores) {
  DaemonConfig c;
  c.engine.local_trainers = 2;
  EXPECT_FALSE(WantsSleepBesideCompute(c, 1, 1));  // off by default
  c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kAuto;
  EXPECT_TRUE(SharesCores(c, 1, 3));
  EXPECT_FALSE(SharesCores(c, 1, 4));
  EXPECT_TRUE(WantsSleepBesideCompute(c, 1, 1));  // the main job's emulated host: one core
  EXPECT_TRUE(WantsSleepBesideCompute(c, 2, 6));  // 2 daemons x 3 on 6 cores
  EXPECT_FALSE(WantsSleepBesideCompute(c, 2, 7));
  c.mpi_wait_max_sleep_us = 0;  // waits inside MPI asked for
  EXPECT_FALSE(WantsSleepBesideCompute(c, 1, 1));
  c.mpi_wait_max_sleep_us = 1000;
  c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kOff;
  EXPECT_FALSE(WantsSleepBesideCompute(c, 1, 1));
  c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kOn;
  EXPECT_TRUE(WantsSleepBesideCompute(c, 1, 64));
}

}  // namespace
}  // namespace spex
