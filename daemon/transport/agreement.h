// Cross-node agreement on an outcome: every node says whether its part of something succeeded,
// and every node leaves with the same answer. Used at start-up (every flag check that must hold
// on all nodes) and by the engine (a step that failed on one node fails on all of them), so that
// one node's failure is an error everywhere instead of a hang in a collective the others wait in.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/transport/collective.h"

namespace spex {

// The bytes of the failed node's message that travel to the others (the rest is cut, "...").
constexpr size_t kAgreementTextWords = 32;  // 255 characters

// One tiny all-reduce (MAX of three uint64) over `coll`; every node must call it at the same
// point. Returns OK when every node passed OK. Otherwise a second all-reduce carries the lowest
// failed node's message (its first 255 characters) to every node, and every node returns an
// error: a node that failed returns its own `local` status; the others return a status with the
// lowest failed node's code and the message "node R failed <what>: <R's message> (node R's
// words; see its log)". If an all-reduce itself fails, returns that failure (with `what`). With
// one node, returns `local`.
absl::Status AgreeOnAllNodes(Collective* coll, const absl::Status& local, absl::string_view what);

}  // namespace spex
