// A Chrome-trace timeline of one node's exchanges (spexd --timeline=PATH, spexctl timeline
// start|stop): the JSON array format of the Trace Event Format, which chrome://tracing and
// Perfetto (ui.perfetto.dev) open. pid = the node rank, tid = the bucket id (one track per
// bucket, named "bucket N"); per exchange one complete ("X") event "exchange" (args: step,
// compressor, pattern, status, densities, bytes) enclosing one "X" event per phase span
// (wait_local, reduce_local, compress, collective, decode, publish; a phase may appear twice).
// Timestamps are CLOCK_MONOTONIC microseconds, so timelines of daemons on one host line up.
//
// Cost: nothing when not recording (one relaxed atomic load per exchange). While recording the
// engine thread copies the event into a buffer under a mutex; a writer thread formats and writes
// it every 100 ms. The file is a valid JSON array once Stop() returns (also from the destructor).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/observer.h"

namespace spex {

// The timeline file of node `rank` of `nodes` from --timeline's value: "{rank}" is replaced by
// the rank; without it, a world of several nodes gets ".<rank>" before a ".json" extension (or at
// the end), so daemons sharing a file system do not write one file.
std::string TimelinePath(const std::string& pattern, int rank, int nodes);

class Timeline final : public ExchangeObserver {
 public:
  explicit Timeline(int node_rank);
  ~Timeline() override;  // stops a recording
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording into `path` (mode 0600: it shows the job's buckets and timings).
  // `overwrite`: truncate an existing file (the --timeline flag); otherwise an existing file (or
  // a symlink) is refused with ALREADY_EXISTS (the RPC). `max_bytes` > 0: the recording stops
  // growing there (later exchanges are dropped, the file stays valid JSON; capped() tells).
  // FAILED_PRECONDITION while already recording.
  absl::Status Start(const std::string& path, bool overwrite, uint64_t max_bytes = 0);
  // Writes what is pending, closes the JSON array and the file; returns the exchanges written.
  // FAILED_PRECONDITION when not recording.
  absl::StatusOr<uint64_t> Stop();

  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  // Whether the current (or last) recording reached its size cap.
  bool capped() const { return capped_.load(std::memory_order_relaxed); }
  std::string path() const;
  uint64_t exchanges_written() const;

  void OnExchange(const ExchangeEvent& event) override;

 private:
  static constexpr int kMaxSpans = 16;
  struct Entry {
    uint64_t bucket = 0;
    uint64_t step = 0;
    uint64_t begin_ns = 0;
    uint64_t end_ns = 0;
    int code = 0;
    bool terminal = false;
    char pattern = 'D';
    char compressor[16] = {};
    double target_density = 0;
    double achieved_density = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    uint64_t gathered = 0;
    int spans = 0;
    PhaseSpan span[kMaxSpans];
  };

  void WriterLoop();
  // Formats `entries` into the file (writer thread, or Stop after joining it).
  void Write(const std::vector<Entry>& entries);
  void Emit(const std::string& event);
  // Writes buf_ unless that passes max_bytes_ (then drops it and sets capped_); false when
  // capped.
  bool Flush();

  const int node_rank_;
  std::atomic<bool> recording_{false};
  std::atomic<bool> capped_{false};

  std::mutex control_mu_;  // Start/Stop

  mutable std::mutex mu_;  // the pending buffer and the writer's wake-up
  std::condition_variable cv_;
  std::vector<Entry> pending_;
  bool quit_ = false;
  std::string path_;
  uint64_t written_ = 0;

  // The writer thread's (and Stop's, after joining it) only.
  std::FILE* file_ = nullptr;
  uint64_t max_bytes_ = 0;  // 0: no cap
  uint64_t bytes_ = 0;      // written to file_ so far
  bool first_event_ = true;
  std::set<uint64_t> named_tracks_;
  std::string buf_;
  std::thread writer_;
};

}  // namespace spex
