#include "daemon/observe/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "daemon/util/log.h"

namespace spex {
namespace {

// Microseconds with nanosecond precision, as the trace format wants them.
std::string Micros(uint64_t ns) {
  const uint64_t frac = ns % 1000;
  char digits[4] = {static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                    static_cast<char>('0' + frac % 10), 0};
  return absl::StrCat(ns / 1000, ".", digits);
}

}  // namespace

std::string TimelinePath(const std::string& pattern, int rank, int nodes) {
  if (absl::StrContains(pattern, "{rank}")) {
    return absl::StrReplaceAll(pattern, {{"{rank}", absl::StrCat(rank)}});
  }
  if (nodes <= 1) return pattern;
  if (absl::EndsWith(pattern, ".json")) {
    return absl::StrCat(pattern.substr(0, pattern.size() - 5), ".", rank, ".json");
  }
  return absl::StrCat(pattern, ".", rank);
}

Timeline::Timeline(int node_rank) : node_rank_(node_rank) {}

Timeline::~Timeline() {
  if (recording()) Stop().IgnoreError();
}

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

uint64_t Timeline::exchanges_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

absl::Status Timeline::Start(const std::string& path, bool overwrite, uint64_t max_bytes) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (recording()) {
    return absl::FailedPreconditionError(absl::StrCat("a timeline is already being recorded to ",
                                                      this->path(),
                                                      "; stop it first (spexctl timeline stop)"));
  }
  if (path.empty()) return absl::InvalidArgumentError("the timeline needs a file path");
  // The RPC never follows a symlink nor replaces a file; the operator's flag may overwrite.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL | O_NOFOLLOW);
  const int fd = open(path.c_str(), flags, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string why =
        absl::StrCat("cannot create the timeline file ", path, ": ", std::strerror(err));
    if (err == EEXIST || err == ELOOP) {
      return absl::AlreadyExistsError(
          absl::StrCat(why, " (an existing file is never replaced; remove it or pick another)"));
    }
    return absl::FailedPreconditionError(why);
  }
  if (overwrite && fchmod(fd, 0600) != 0) {  // an existing file keeps its mode otherwise
    SPEX_LOG(WARNING) << "timeline " << path << ": chmod 0600: " << std::strerror(errno);
  }
  file_ = fdopen(fd, "w");
  if (file_ == nullptr) {
    close(fd);
    return absl::InternalError(absl::StrCat("fdopen ", path, ": ", std::strerror(errno)));
  }
  first_event_ = true;
  named_tracks_.clear();
  max_bytes_ = max_bytes;
  bytes_ = 2;
  capped_.store(false);
  std::fputs("[\n", file_);
  Emit(absl::StrFormat(
      R"({"name":"process_name","ph":"M","pid":%d,"tid":0,"args":{"name":"spexd node %d"}})",
      node_rank_, node_rank_));
  Emit(absl::StrFormat(R"({"name":"process_sort_index","ph":"M","pid":%d,"tid":0,)"
                       R"("args":{"sort_index":%d}})",
                       node_rank_, node_rank_));
  std::fwrite(buf_.data(), 1, buf_.size(), file_);
  bytes_ += buf_.size();
  buf_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    path_ = path;
    written_ = 0;
    quit_ = false;
    pending_.clear();
    pending_.reserve(1024);
  }
  writer_ = std::thread([this] { WriterLoop(); });
  recording_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (!recording()) {
    return absl::FailedPreconditionError(
        "no timeline is being recorded (start one with spexctl timeline start PATH or spexd "
        "--timeline=PATH)");
  }
  recording_.store(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_one();
  writer_.join();
  // An exchange that read recording_ before the store above may still append: take it too.
  std::vector<Entry> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(pending_);
  }
  Write(rest);
  std::fputs("\n]\n", file_);
  const bool ok = std::fflush(file_) == 0;
  std::fclose(file_);
  file_ = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok) return absl::DataLossError(absl::StrCat("writing the timeline ", path_, " failed"));
  return written_;
}

void Timeline::OnExchange(const ExchangeEvent& e) {
  if (!recording_.load(std::memory_order_relaxed)) return;
  if (capped_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (quit_) return;
  Entry& x = pending_.emplace_back();
  const ExchangeRecord& rec = *e.record;
  x.bucket = rec.bucket_id;
  x.step = rec.step;
  x.begin_ns = e.begin_ns;
  x.end_ns = e.end_ns;
  x.code = static_cast<int>(e.code);
  x.terminal = e.terminal;
  x.pattern = rec.pattern.empty() ? '?' : rec.pattern[0];
  // Compressor names are identifiers; anything else is replaced so the JSON stays valid.
  for (size_t i = 0; i < rec.compressor.size() && i + 1 < sizeof(x.compressor); ++i) {
    const char c = rec.compressor[i];
    x.compressor[i] = (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  }
  x.target_density = rec.target_density;
  x.achieved_density = rec.achieved_density;
  x.bytes_sent = rec.bytes_sent;
  x.bytes_received = rec.bytes_received;
  x.gathered = rec.gathered_elements;
  x.spans = std::min<int>(e.spans.size(), kMaxSpans);
  std::copy_n(e.spans.begin(), x.spans, x.span);
  if (pending_.size() >= 4096) cv_.notify_one();
}

void Timeline::WriterLoop() {
  std::vector<Entry> batch;
  batch.reserve(1024);
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100),
                 [this] { return quit_ || pending_.size() >= 4096; });
    batch.swap(pending_);
    lock.unlock();
    Write(batch);
    std::fflush(file_);
    batch.clear();
    lock.lock();
  }
}

bool Timeline::Flush() {
  // Whole events only (each chunk starts with a separator), so the file stays valid JSON.
  if (max_bytes_ != 0 && bytes_ + buf_.size() > max_bytes_) {
    buf_.clear();
    if (!capped_.exchange(true)) {
      SPEX_LOG(WARNING) << "timeline " << path_ << " reached its size cap of " << max_bytes_
                        << " bytes (--timeline_max_bytes); later exchanges are not recorded";
    }
    return false;
  }
  std::fwrite(buf_.data(), 1, buf_.size(), file_);
  bytes_ += buf_.size();
  buf_.clear();
  return true;
}

void Timeline::Emit(const std::string& event) {
  if (!first_event_) buf_ += ",\n";
  first_event_ = false;
  buf_ += event;
}

void Timeline::Write(const std::vector<Entry>& entries) {
  if (entries.empty()) return;
  // absl::StrAppend (no format parsing): the writer shares the machine with the engine.
  const std::string pid = absl::StrCat(node_rank_);
  std::string& out = buf_;
  out.clear();
  for (const Entry& x : entries) {
    const std::string tid = absl::StrCat(x.bucket);
    if (named_tracks_.insert(x.bucket).second) {
      Emit(absl::StrCat(R"({"name":"thread_name","ph":"M","pid":)", pid, R"(,"tid":)", tid,
                        R"(,"args":{"name":"bucket )", tid, R"("}})"));
      Emit(absl::StrCat(R"({"name":"thread_sort_index","ph":"M","pid":)", pid, R"(,"tid":)", tid,
                        R"(,"args":{"sort_index":)", tid, "}}"));
    }
    absl::StrAppend(&out, ",\n", R"({"name":"exchange","cat":"exchange","ph":"X","pid":)", pid,
                    R"(,"tid":)", tid, R"(,"ts":)", Micros(x.begin_ns), R"(,"dur":)",
                    Micros(x.end_ns - x.begin_ns), R"(,"args":{"step":)", x.step);
    absl::StrAppend(&out, R"(,"compressor":")", x.compressor, R"(","pattern":")",
                    absl::string_view(&x.pattern, 1), R"(","status":")",
                    absl::StatusCodeToString(static_cast<absl::StatusCode>(x.code)),
                    R"(","terminal":)", x.terminal ? "true" : "false");
    absl::StrAppend(&out, R"(,"target_density":)", x.target_density, R"(,"achieved_density":)",
                    x.achieved_density, R"(,"bytes_sent":)", x.bytes_sent, R"(,"bytes_received":)",
                    x.bytes_received, R"(,"gathered_elements":)", x.gathered, "}}");
    for (int i = 0; i < x.spans; ++i) {
      const PhaseSpan& s = x.span[i];
      absl::StrAppend(&out, ",\n", R"({"name":")", PhaseName(s.phase),
                      R"(","cat":"phase","ph":"X","pid":)", pid, R"(,"tid":)", tid, R"(,"ts":)",
                      Micros(s.begin_ns), R"(,"dur":)", Micros(s.end_ns - s.begin_ns));
      absl::StrAppend(&out, R"(,"args":{"step":)", x.step, "}}");
    }
    // Under a cap, event by event, so the cap cuts between exchanges.
    if ((max_bytes_ != 0 || out.size() > (1 << 16)) && !Flush()) break;
  }
  Flush();
  std::lock_guard<std::mutex> lock(mu_);
  written_ += entries.size();
}

}  // namespace spex
