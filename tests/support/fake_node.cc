// Several fake GPUs on one node and the link between them (fake_node.h).
#include "tests/support/fake_node.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace spex {
namespace fake {

FakeNode::FakeNode(std::vector<int> ordinals, bool peer_access, int cpu_threads)
    : peer_(peer_access) {
  for (int o : ordinals) devices_.push_back(std::make_unique<FakeDevice>(o, cpu_threads));
}

DevicePath FakeNode::path() {
  DevicePath p = home()->path();
  p.home = home()->ordinal();
  for (size_t i = 1; i < devices_.size(); ++i) {
    p.others.push_back({devices_[i]->ordinal(), devices_[i].get(), devices_[i].get()});
  }
  p.link = this;
  return p;
}

FakeDevice* FakeNode::device(int ordinal) {
  for (auto& d : devices_) {
    if (d->ordinal() == ordinal) return d.get();
  }
  return nullptr;
}

bool FakeNode::PeerAccess(int from, int to) const { return from == to || peer_; }

absl::Status FakeNode::Copy(int dst_device, void* dst, int src_device, const void* src,
                            size_t bytes) {
  FakeDevice* to = device(dst_device);
  FakeDevice* from = device(src_device);
  if (to == nullptr || from == nullptr || !to->IsDeviceMemory(dst, bytes) ||
      !from->IsDeviceMemory(src, bytes)) {
    const std::string what =
        absl::StrCat("link copy of ", bytes, " bytes from GPU ", src_device, " to GPU ", dst_device,
                     ": memory not on the GPUs it names");
    absl::MutexLock lock(&mu_);
    violations_.push_back(what);
    return absl::InternalError(what);
  }
  if (PeerAccess(dst_device, src_device)) {
    std::memcpy(dst, src, bytes);
    absl::MutexLock lock(&mu_);
    ++stats_.peer_copies;
    stats_.peer_bytes += bytes;
    return absl::OkStatus();
  }
  // Staged: device to host on the source GPU, host to device on the destination, in chunks.
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint8_t> host(std::min(bytes, kChunk));
  for (size_t at = 0; at < bytes; at += kChunk) {
    const size_t len = std::min(kChunk, bytes - at);
    std::memcpy(host.data(), static_cast<const uint8_t*>(src) + at, len);
    from->CountStaging(/*to_host=*/true, len);
    std::memcpy(static_cast<uint8_t*>(dst) + at, host.data(), len);
    to->CountStaging(/*to_host=*/false, len);
  }
  absl::MutexLock lock(&mu_);
  ++stats_.staged_copies;
  stats_.staged_bytes += bytes;
  return absl::OkStatus();
}

FakeNode::LinkStats FakeNode::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<std::string> FakeNode::violations() const {
  std::vector<std::string> out;
  for (const auto& d : devices_) {
    for (const std::string& v : d->violations()) {
      out.push_back(absl::StrCat("GPU ", d->ordinal(), ": ", v));
    }
  }
  absl::MutexLock lock(&mu_);
  out.insert(out.end(), violations_.begin(), violations_.end());
  return out;
}

}  // namespace fake
}  // namespace spex
