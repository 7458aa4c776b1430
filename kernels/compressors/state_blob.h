// The byte codec of a compressor's saved state (Compressor::SaveState/LoadState, for
// checkpointing a training run): little-endian fixed-width fields appended to a string, and a
// reader that checks every read against the bytes left, so a truncated or corrupt blob is an
// error, never a read past its end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"

namespace spex {

// FNV-1a 64 over a blob's bytes. A sealed blob ends in the checksum of everything before it,
// so a corrupt byte anywhere is found before anything is loaded.
inline uint64_t StateChecksum(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The bytes of a sealed blob before its checksum (empty when it is too short to hold one), and
// whether the checksum matches them.
inline absl::string_view SealedBody(absl::string_view blob) {
  return blob.size() < sizeof(uint64_t) ? absl::string_view() : blob.substr(0, blob.size() - 8);
}
inline bool SealIntact(absl::string_view blob) {
  if (blob.size() < sizeof(uint64_t)) return false;
  uint64_t sum;
  std::memcpy(&sum, blob.data() + blob.size() - sizeof(sum), sizeof(sum));
  return StateChecksum(SealedBody(blob)) == sum;
}

class StateWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_arithmetic_v<T>, "fixed-width numbers only");
    const char* p = reinterpret_cast<const char*>(&v);
    out_.append(p, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    for (const T& x : v) Put<T>(x);
  }
  void PutString(absl::string_view s) {
    Put<uint64_t>(s.size());
    out_.append(s.data(), s.size());
  }
  // Appends the checksum of everything written so far: the blob's last field.
  void Seal() { Put<uint64_t>(StateChecksum(out_)); }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Every Get returns false (and reads nothing more) once the blob runs short.
class StateReader {
 public:
  explicit StateReader(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    static_assert(std::is_arithmetic_v<T>, "fixed-width numbers only");
    if (in_.size() < sizeof(T)) return Fail();
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  // A vector of at most `max` entries (the caller's bound, so a corrupt length cannot allocate).
  template <typename T>
  bool GetVector(std::vector<T>* v, uint64_t max) {
    uint64_t size;
    if (!Get(&size) || size > max || size > in_.size() / sizeof(T)) return Fail();
    v->resize(size);
    for (T& x : *v) Get(&x);
    return true;
  }
  bool GetString(std::string* s, uint64_t max) {
    uint64_t size;
    if (!Get(&size) || size > max || size > in_.size()) return Fail();
    s->assign(in_.data(), size);
    in_.remove_prefix(size);
    return true;
  }
  bool ok() const { return ok_; }
  // Every read succeeded and nothing is left over: the point to commit what was read.
  bool complete() const { return ok_ && in_.empty(); }
  size_t left() const { return in_.size(); }

 private:
  bool Fail() {
    ok_ = false;
    in_ = {};
    return false;
  }
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace spex
