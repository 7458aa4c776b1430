// The control round before every per-bucket exchange, its words (density keys, dead trainers,
// non-finite inputs) and the errors they become.
#include "daemon/engine/control_round.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

uint64_t NameHash(absl::string_view name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// The wire layout of the round. A value x that must be equal on every node travels as the pair
// (x, ~x): maxed over nodes, the pair is still (x, ~x) exactly when every node sent the same x.
enum Word {
  kId,
  kStep,
  kElements,
  kNotId,
  kNotStep,
  kNotElements,
  kDensityKey,
  kSparseUs,
  kDenseUs,
  kName,
  kNotName,
  kInputsFailed,
  kDeadTrainer,
  kNonfinite,
  kPolicy,
  kNotPolicy,
  kSparseAllreduce,
  kNotSparseAllreduce,
  kAllgatherUs,
  kOktopkUs,
  kWords
};

}  // namespace

uint64_t DensityKey(uint64_t change, float density) {
  uint32_t bits;
  std::memcpy(&bits, &density, 4);
  return (change << 32) | bits;
}

float DensityOfKey(uint64_t key) {
  const uint32_t bits = static_cast<uint32_t>(key);
  float d;
  std::memcpy(&d, &bits, 4);
  return d;
}

uint64_t DeadTrainerWord(int node, uint32_t local_rank, uint32_t pid) {
  return (1ull << 63) | (static_cast<uint64_t>(node & 0x7fff) << 48) |
         (static_cast<uint64_t>(local_rank & 0xffff) << 32) | pid;
}

std::string DeadTrainerName(uint64_t word) {
  return absl::StrCat("local trainer ", (word >> 32) & 0xffff, " (pid ", word & 0xffffffffu,
                      ") of node ", (word >> 48) & 0x7fff);
}

// Node in bits 62..48, local rank 47..32, index 31..0 (bucket indices are uint32): the maximum
// over nodes is the highest such node, the same on every node.
uint64_t NonfiniteWord(int node, uint32_t local_rank, uint32_t index) {
  return (1ull << 63) | (static_cast<uint64_t>(node & 0x7fff) << 48) |
         (static_cast<uint64_t>(local_rank & 0xffff) << 32) | index;
}

absl::Status DeadTrainerError(absl::string_view what, uint64_t word) {
  constexpr uint64_t kBrokenRankBit = static_cast<uint64_t>(kBrokenRank) << 32;
  const std::string fault =
      (word & kBrokenRankBit) == 0
          ? absl::StrCat(DeadTrainerName(word), " died")
          : absl::StrCat(DeadTrainerName(word & ~kBrokenRankBit),
                         " broke the shared-segment protocol (its ready word went back below the "
                         "step being exchanged: a trainer of that node wrote into a bucket's "
                         "header)");
  return absl::AbortedError(absl::StrCat(
      what, ": ", fault,
      ", so this step cannot complete; end the job (spexd takes a new one once the other "
      "trainers of that node have left)"));
}

absl::Status NonfiniteSkipError(uint64_t bucket, uint64_t step, uint64_t word,
                                absl::string_view where) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bucket ", bucket, " step ", step, ": non-finite gradient from ", NonfiniteName(word), where,
      " (nonfinite=error: this step is skipped on every node, the residual and the compressor's "
      "state are as before it, and the next step can go on)"));
}

std::string NonfiniteName(uint64_t word) {
  if (((word >> 32) & 0xffff) == kNonfiniteSum) {
    return absl::StrCat("the sum of node ", (word >> 48) & 0x7fff,
                        "'s local inputs (each finite there) overflowed at index ",
                        word & 0xffffffffu);
  }
  return absl::StrCat("local trainer ", (word >> 32) & 0xffff, " of node ", (word >> 48) & 0x7fff,
                      ", first non-finite value at index ", word & 0xffffffffu);
}

absl::Status RunControlRound(Collective* coll, const ExchangeKey& key, Control* c) {
  const uint64_t name = NameHash(key.compressor);
  uint64_t v[kWords];
  v[kId] = key.bucket_id;
  v[kStep] = key.step;
  v[kElements] = key.elements;
  v[kNotId] = ~key.bucket_id;
  v[kNotStep] = ~key.step;
  v[kNotElements] = ~key.elements;
  v[kDensityKey] = c->density_key;
  v[kSparseUs] = c->sparse_us;
  v[kDenseUs] = c->dense_us;
  v[kName] = name;
  v[kNotName] = ~name;
  v[kInputsFailed] = c->inputs_failed ? 1 : 0;
  v[kDeadTrainer] = c->dead_trainer;
  v[kNonfinite] = c->nonfinite;
  const uint64_t policy = NameHash(key.nonfinite);
  v[kPolicy] = policy;
  v[kNotPolicy] = ~policy;
  const uint64_t sparse_allreduce = NameHash(key.sparse_allreduce);
  v[kSparseAllreduce] = sparse_allreduce;
  v[kNotSparseAllreduce] = ~sparse_allreduce;
  v[kAllgatherUs] = c->allgather_us;
  v[kOktopkUs] = c->oktopk_us;
  if (coll->size() > 1) {
    if (absl::Status s = coll->AllReduce(v, kWords, ElemType::kUint64, ReduceOp::kMax); !s.ok()) {
      return s;
    }
  }
  if (v[kId] != ~v[kNotId] || v[kStep] != ~v[kNotStep] || v[kElements] != ~v[kNotElements]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket order differs between nodes: this node exchanged bucket ", key.bucket_id, " step ",
        key.step, " (", key.elements,
        " elements) while another node exchanged a different bucket, step or size. Every node "
        "must register the same buckets (same ids and sizes) and exchange them in the same "
        "order"));
  }
  if (v[kName] != ~v[kNotName]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", key.bucket_id, " uses compressor ", key.compressor,
        " on this node but another compressor on another node; every node must register a "
        "bucket with the same compressor (check --compressor and the trainers' per-bucket "
        "settings)"));
  }
  if (v[kPolicy] != ~v[kNotPolicy]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", key.bucket_id, " runs nonfinite=", key.nonfinite,
        " on this node but another policy on another node; start every spexd of the job with "
        "the same --nonfinite and --dense_fallback, and register the bucket with the same "
        "nonfinite and dense_fallback parameters (if any) on every node"));
  }
  if (v[kSparseAllreduce] != ~v[kNotSparseAllreduce]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", key.bucket_id, ": this node runs --sparse_allreduce=", key.sparse_allreduce,
        " but another node runs another exchange; start every spexd of the job with the same "
        "--sparse_allreduce (and --oktopk_* flags), and register the bucket with the same "
        "sparse_allreduce parameter (if any) on every node"));
  }
  c->density_key = v[kDensityKey];
  c->sparse_us = v[kSparseUs];
  c->dense_us = v[kDenseUs];
  c->allgather_us = v[kAllgatherUs];
  c->oktopk_us = v[kOktopkUs];
  c->inputs_failed = v[kInputsFailed] != 0;
  c->dead_trainer = v[kDeadTrainer];
  c->nonfinite = v[kNonfinite];
  return absl::OkStatus();
}

}  // namespace spex
