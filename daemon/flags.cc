// Every spexd flag's definition, default and help text (flags.h); config.cc is their only reader.
#include "daemon/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(
    std::string, socket, "",
    "Unix socket path of the control channel. Default: /tmp/spex-<uid>/<job>/<host>[.<i>].sock, "
    "with .<i> added when several daemons share a host (i = index on the host). '{rank}' in the "
    "path is replaced by the node rank (one path pattern for all ranks of a local run).");
ABSL_FLAG(std::string, socket_mode, "0600", "Permission bits of the socket (octal, at most 0777).");
ABSL_FLAG(std::string, allow_uids, "",
          "Other users (comma-separated uids or names) whose connections are accepted, to read "
          "stats, health and session counts only (for monitoring). Sessions, SetDensity and "
          "timelines stay with spexd's own user and root; anyone else's connection is closed at "
          "once (the kernel's SO_PEERCRED says who connects).");
ABSL_FLAG(int, max_connections, 64,
          "Most open connections to the control socket; more are closed at once (and logged). "
          "Each trainer holds one or two.");
ABSL_FLAG(int, rpc_threads, 64,
          "Most threads serving calls (gRPC's resource quota); beyond it a call fails with "
          "RESOURCE_EXHAUSTED. A waiting Exchange holds one, as does an open checkpoint stream.");
ABSL_FLAG(int, max_streams_per_connection, 16,
          "Most calls one connection may have in flight at once (HTTP/2 "
          "MAX_CONCURRENT_STREAMS).");
ABSL_FLAG(absl::Duration, max_exchange_wait, absl::Minutes(10),
          "The longest an Exchange call waits for its result, whatever deadline the client set "
          "(then DEADLINE_EXCEEDED).");
ABSL_FLAG(int, max_checkpoint_streams, 0,
          "Most checkpoint streams (SaveBucketState, LoadBucketState) open at once; more get "
          "RESOURCE_EXHAUSTED. 0 = --local_trainers (each trainer saves or loads one bucket at a "
          "time). Each stream holds a thread (counted with waiting Exchange calls) and its "
          "record's memory (counted against --max_session_bytes and --max_daemon_bytes).");
ABSL_FLAG(absl::Duration, checkpoint_stream_timeout, absl::Minutes(1),
          "The longest a checkpoint stream stays open, whatever deadline the client set: a "
          "client that stops sending or reading its record is cancelled then.");
ABSL_FLAG(std::string, job, "",
          "Job name: part of the default socket path; when set, trainers must name the same job. "
          "Default: $SPEX_JOB, else $SLURM_JOB_ID, else 'default' (and not enforced).");
ABSL_FLAG(int, local_trainers, 1,
          "Trainer processes on this node; every bucket waits for all of them.");
ABSL_FLAG(std::string, compressor, "dense",
          "Default compressor of a bucket (per-bucket override at registration): dense, micro, "
          "exdyna, topk, "
          "gtopk, topk_union, randomk, thresh, dgc, gaussiank, redsync, redsync_trim, sidco_e, "
          "sidco_p, sidco_gp, "
          "sage, cltk, deft.");
ABSL_FLAG(double, density, 0.01, "Default target density in (0, 1] for sparse compressors.");
ABSL_FLAG(absl::Duration, register_timeout, absl::Seconds(30),
          "How long an Exchange waits for the other local trainers to register its bucket before "
          "failing with FAILED_PRECONDITION.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "On SIGTERM/SIGINT, how long to wait for in-flight exchanges before exiting anyway.");
ABSL_FLAG(
    int, spin_us, -1,
    "Microseconds the engine and trainers spin before sleeping on a futex; -1 = auto (50 when "
    "the host has more cores than its daemons x (local trainers + 1), else 0).");
ABSL_FLAG(int64_t, mpi_wait_max_sleep_us, 1000,
          "How the engine waits for its MPI all-reduces and all-gathers (host buffers) of at "
          "least --mpi_passive_wait_min_bytes: > 0 = non-blocking collectives tested with sleeps "
          "in between that grow with the wait, from 50 us to 1/32 of the time waited so far, at "
          "most this many microseconds (up to 1000000); 0 = every collective inside MPI (Open MPI "
          "polls, a core busy for the whole wait). The wire stage of --merge_overlap always waits "
          "passively, whatever the size (at most 50 us sleeps when this is 0).");
ABSL_FLAG(int64_t, mpi_passive_wait_min_bytes, 1 << 20,
          "The smallest collective (bytes of its result on each node) that waits passively "
          "(--mpi_wait_max_sleep_us); smaller ones wait inside MPI, where Open MPI's blocking "
          "forms take fewer rounds. 0 = every collective passive.");
ABSL_FLAG(std::string, mpi_sleep_beside_compute, "off",
          "off|on|auto. on: every collective of the engine non-blocking whatever its size, and "
          "its wait sleeps between MPI_Tests (as --mpi_wait_max_sleep_us) while this node's "
          "trainers compute beside it (a later bucket of their step not handed in yet); while "
          "they wait for results it tests without sleeping for its first 10 ms, then sleeps too. "
          "Small all-reduces go as an all-gather and a local reduction; "
          "--mpi_passive_wait_min_bytes is unused. off (default): waits by size "
          "(--mpi_passive_wait_min_bytes). auto: on when some node's daemons and trainers "
          "outnumber its cores (they share cores) and --mpi_wait_max_sleep_us > 0, else off.");
ABSL_FLAG(int, threads, 0,
          "Worker threads for local reduction and compression (0 = the CPUs of spexd's affinity "
          "mask).");
ABSL_FLAG(spex::DeviceChoice, device, spex::DeviceChoice::kAuto,
          "auto|cpu|cuda: where buckets live (cuda needs a --config=cuda build and a GPU).");
ABSL_FLAG(std::string, devices, "",
          "The GPUs (CUDA ordinals, comma-separated, e.g. 0,1,2,3) whose trainers this spexd "
          "serves on the GPU path; the first holds the node's sum and residual. Empty: every "
          "usable GPU (one per daemon, round robin, when several daemons share a host).");
ABSL_FLAG(bool, error_feedback, true,
          "Keep what a sparse exchange did not send (the residual) and add it to the next step's "
          "gradient.");
ABSL_FLAG(int64_t, min_sparse_elements, 16384,
          "Buckets with fewer elements always exchange dense.");
ABSL_FLAG(spex::DenseFallback, dense_fallback, spex::DenseFallback::kAuto,
          "auto: a sparse bucket exchanges dense where that is faster (--auto_decide: by the "
          "cost model, or by alternating sparse and dense exchanges for 2 x --probe_steps steps "
          "and keeping the faster); off: always sparse.");
ABSL_FLAG(int, probe_steps, 3, "Sparse and dense exchanges each timed by --dense_fallback=auto.");
ABSL_FLAG(
    spex::AutoDecide, auto_decide, spex::AutoDecide::kModel,
    "How --dense_fallback=auto and --sparse_allreduce=auto choose: model (at a bucket's first "
    "exchange, from the cost model of the link (--link_gbps, or measured once by every node), "
    "the node count, the bucket's size and density; the bucket probes where the model has no "
    "term for it: pattern A compressors, --oktopk_global=all, one node, and probes candidates "
    "within 1.5x of the cheapest against each other) or probe (alternate "
    "the candidates for 2 x --probe_steps exchanges, keep the faster). Every node must use "
    "the same value.");
ABSL_FLAG(double, link_gbps, 0,
          "The link rate the cost model of --auto_decide=model uses, Gbit/s each way per node; 0: "
          "measured by timed all-reduces at the first auto bucket's first exchange.");
ABSL_FLAG(double, link_latency_us, 5,
          "With --link_gbps: one message's latency node to node for the cost model, microseconds.");
ABSL_FLAG(spex::NonfinitePolicy, nonfinite, spex::NonfinitePolicy::kPropagate,
          "propagate|error: a step in which some trainer handed in a NaN or +-Inf gives every "
          "trainer a non-finite output (propagate; the exchange succeeds) or fails with "
          "INVALID_ARGUMENT naming the trainer and index (error). Either way the residual and the "
          "compressor's state stay as before that step. Every node must use the same value.");
ABSL_FLAG(int64_t, max_bucket_bytes, 0,
          "Most memory one bucket may take on this node (its shared segment, accumulator and an "
          "estimate of its compressor's state); 0 = --max_daemon_bytes. Larger registrations get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_session_bytes, 0,
          "Most memory the buckets one trainer registered may take; 0 = --max_daemon_bytes.");
ABSL_FLAG(int64_t, max_daemon_bytes, 0,
          "Most memory all buckets of this node may take; 0 = half the machine's memory, and no "
          "more than /dev/shm has free at start. With several GPUs (--devices) the three "
          "--max_*_bytes limits count memory on every one of them: a trainer's buffer on a GPU "
          "other than the first counts too.");
ABSL_FLAG(int, max_buckets_per_session, 4096, "Most buckets one trainer may register.");
ABSL_FLAG(bool, fp16_values, false,
          "A float32 bucket's sparse values travel as float16: pattern B's and Ok-Topk's pairs "
          "(indices as --wire_index_encoding says), and pattern A's values at the union (summed "
          "in float32, the average rounded once); error feedback keeps what rounding took off. "
          "A value past float16's range goes as float32 (docs/dtypes.md). Alone and in merge "
          "groups alike.");
ABSL_FLAG(spex::IndexEncoding, wire_index_encoding, spex::IndexEncoding::kDelta,
          "How sparse chunks carry their indices: delta (varint gaps where a node's indices are "
          "strictly ascending and that is smaller, else uint32) or u32 (always uint32). Each "
          "chunk says which in its flags: nodes may differ.");
ABSL_FLAG(spex::SparseAllreduce, sparse_allreduce, spex::SparseAllreduce::kAllGather,
          "How pattern-B buckets (topk, gtopk, randomk, dgc, gaussiank, redsync, redsync_trim, "
          "sidco_*, sage) sum their selections: allgather (every node receives every node's "
          "selection), oktopk (a sparse reduce-scatter by index region, then an all-gather of "
          "the reduced entries; other sparse compressors are refused; see --oktopk_global) or "
          "auto (the faster of the two by --auto_decide: the cost model, or a bucket's first 2 x "
          "--probe_steps sparse exchanges alternate the two and every node keeps the faster on "
          "the slowest node; other sparse compressors keep their own exchange).");
ABSL_FLAG(spex::OkTopkSelect, oktopk_global, spex::OkTopkSelect::kTopk,
          "With --sparse_allreduce=oktopk: topk (keep about density x elements of the summed "
          "entries; what a node selected and was not kept stays in its residual; about 2k pairs "
          "received per node) or all (keep every summed entry: the allgather result bit for bit).");
ABSL_FLAG(int, oktopk_recompute_every, 32,
          "With --oktopk_global=topk: the exact global top-k every this many exchanges, a "
          "threshold in between (>= 1).");
ABSL_FLAG(int, oktopk_rebalance_every, 64,
          "With --sparse_allreduce=oktopk: the index regions are re-agreed from the selections "
          "every this many exchanges (0: never, equal regions).");
ABSL_FLAG(int, residual_norm_every, 10,
          "Compute the residual norm for stats every this many steps (0: never).");
ABSL_FLAG(spex::MergerPolicy, merger, spex::MergerPolicy::kNone,
          "Which buckets share one exchange: none (one exchange per bucket), fixed (Horovod "
          "tensor fusion: the ready buckets every --fixed_cycle_ms, groups up to "
          "--fixed_threshold_bytes), omgs (a static plan: groups closing at "
          "--omgs_threshold_elements, or every --omgs_count buckets), rgmerge (what became ready "
          "on every node while the previous exchange ran). Every node must use the same.");
ABSL_FLAG(uint64_t, merge_window, 64,
          "--merger: at most this many buckets (1..64) are considered for one group round.");
ABSL_FLAG(uint64_t, max_group_elements, uint64_t{16} << 20,
          "--merger: a group holds at most this many elements (a larger bucket goes alone).");
ABSL_FLAG(uint64_t, fixed_threshold_bytes, uint64_t{64} << 20,
          "--merger=fixed: a group's fp32 bytes stay within this (0: no fusion).");
ABSL_FLAG(int64_t, fixed_cycle_ms, 5,
          "--merger=fixed: the cycle time, milliseconds between group rounds (may differ "
          "between nodes).");
ABSL_FLAG(uint64_t, omgs_threshold_elements, 8192,
          "--merger=omgs: a plan group closes with the bucket that brings it to this many "
          "elements (threshold mode, the default).");
ABSL_FLAG(uint64_t, omgs_count, 0,
          "--merger=omgs: > 0 selects count mode, a plan group of this many buckets.");
ABSL_FLAG(std::string, omgs_select, "behind",
          "--merger=omgs: behind (a plan group of sparse buckets of one compressor is selected "
          "and exchanged as one bucket of the summed size, as OMGS does) or ahead (every bucket "
          "selects from its own accumulator, exactly as unmerged).");
ABSL_FLAG(std::string, rgmerge_select, "ahead",
          "--merger=rgmerge: ahead (every bucket selects as unmerged) or behind (with "
          "--rgmerge_plan=model: the plan's groups of one compressor exchanged as one bucket).");
ABSL_FLAG(std::string, rgmerge_plan, "ready",
          "--merger=rgmerge: ready (each group is what became ready on every node while the "
          "previous exchange ran) or model (measure, then agree on and run the published "
          "three-step plan from step --merge_plan_step + 1 on). Every node must use the same.");
ABSL_FLAG(uint64_t, merge_plan_step, 0,
          "--rgmerge_plan=model, --omgs_mode=mgs: the step whose first group agrees on the "
          "measured inputs of the plan (0: 2 * --probe_steps + 16).");
ABSL_FLAG(std::string, omgs_mode, "threshold",
          "--merger=omgs: threshold (groups close at --omgs_threshold_elements), count (every "
          "--omgs_count buckets; also chosen by --omgs_count > 0) or mgs (OMGS-SGD's adaptive "
          "rule on measured timings, from step --merge_plan_step + 1 on; one bucket per exchange "
          "before).");
ABSL_FLAG(int64_t, rgmerge_slack_us, 0,
          "--rgmerge_plan=model: the slack delta of the plan's first step, microseconds.");
ABSL_FLAG(int64_t, merge_alpha_us, 0,
          "--rgmerge_plan=model, --omgs_mode=mgs, --rgmerge_linger=auto: the collective start-up "
          "alpha, microseconds (0: measured, a least-squares fit of the groups' wire time against "
          "their bytes).");
ABSL_FLAG(std::string, rgmerge_linger, "off",
          "--merger=rgmerge: off (each group round starts as soon as the head is ready) or auto "
          "(when the engine has been idle for a collective's start-up alpha and the next bucket "
          "is expected within alpha, wait for it; at most --rgmerge_linger_max_us per group). "
          "May differ between nodes.");
ABSL_FLAG(std::string, rgmerge_bind, "early",
          "--merger=rgmerge with --merge_overlap: early (the next group's round starts as soon as "
          "the previous group is handed to the wire) or late (while a group is on the wire, the "
          "next round waits until its local work, estimated from this node's earlier groups, "
          "would end as the wire does, so the group takes what became ready meanwhile). May "
          "differ between nodes.");
ABSL_FLAG(int64_t, rgmerge_linger_max_us, 2000,
          "--rgmerge_linger=auto: the longest a group round waits for further buckets, "
          "microseconds.");
ABSL_FLAG(bool, rgmerge_equal_tail, true,
          "--rgmerge_plan=model: split the plan's tail into equal groups, as the published code "
          "does.");
ABSL_FLAG(bool, merge_overlap, true,
          "--merger: run one group's collectives on a second thread (its own MPI communicator) "
          "while the engine thread reduces and selects the next group (needs "
          "MPI_THREAD_MULTIPLE; every node must use the same).");
ABSL_FLAG(spex::LogLevel, log_level, spex::LogLevel::kInfo, "debug|info|warning|error");
ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics over HTTP at HOST:PORT (e.g. 127.0.0.1:9400; GET /metrics). "
          "Empty (default): off. Loopback addresses only unless --metrics_allow_remote; the i-th "
          "daemon of a host serves PORT + i.");
ABSL_FLAG(bool, metrics_allow_remote, false,
          "Allow a --metrics_address that is not loopback (the endpoint has no authentication).");
ABSL_FLAG(std::string, timeline, "",
          "Record a Chrome-trace timeline of this node's exchanges into this file from the start "
          "(overwritten; '{rank}' is replaced by the node rank, else several nodes add .<rank>). "
          "Empty (default): off; spexctl timeline start|stop records at run time.");
ABSL_FLAG(std::string, timeline_dir, "",
          "The directory where spexctl timeline start may create timeline files (a name, or a "
          "path directly in it; never an existing file; mode 0600). It must belong to spexd's "
          "user and be closed to others' writes. Empty (default): recording at run time is "
          "refused.");
ABSL_FLAG(int64_t, timeline_max_bytes, int64_t{256} << 20,
          "A timeline file stops growing at this size (later exchanges are not recorded; the "
          "file stays valid JSON); 0: no limit.");
