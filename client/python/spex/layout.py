"""Byte layout of spexd's shared segments, mirrored from proto/contract/layout.h.

This is a wire contract with the daemon: the offsets below must equal the static_asserts in
layout.h (tests/python checks them against the header). Change only together with
kLayoutVersion.
"""

LAYOUT_VERSION = 1
DOORBELL_MAGIC = 0x42585053  # "SPXB" little-endian
BUCKET_MAGIC = 0x4B585053  # "SPXK"
MAX_LOCAL_TRAINERS = 32
PAGE_BYTES = 4096
FLOAT_BYTES = 4
# The BucketHeader's dtype codes (kernels/half.h DType) and element sizes.
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# DoorbellSegment: one per node and trainer generation.
DOORBELL_MAGIC_OFFSET = 0
DOORBELL_VERSION_OFFSET = 4
DOORBELL_RING_OFFSET = 64  # futex word the engine waits on
DOORBELL_ENGINE_SLEEPING_OFFSET = 68  # 1 while the engine sleeps
DOORBELL_SHUTDOWN_OFFSET = 72  # 1 once the daemon is stopping
DOORBELL_ATTACHED_OFFSET = 128  # uint32 per trainer

# BucketHeader: the first page of every bucket buffer.
BUCKET_MAGIC_OFFSET = 0
BUCKET_VERSION_OFFSET = 4
BUCKET_ID_OFFSET = 8
BUCKET_ELEMENTS_OFFSET = 16
BUCKET_SLOTS_OFFSET = 24
BUCKET_DTYPE_OFFSET = 28  # uint32: the slots' data type, one of DTYPE_CODES' values
BUCKET_SLOT_STRIDE_OFFSET = 32
BUCKET_PUBLISHED_OFFSET = 64  # futex word: (uint32)(last step + 1)
BUCKET_WAITERS_OFFSET = 68  # trainers sleeping on published
BUCKET_STATUS_OFFSET = 72  # int32: 0 ok, else an error (fetch it with the Exchange RPC)
BUCKET_ATTACHED_OFFSET = 128  # uint32 per trainer
BUCKET_READY_OFFSET = 256  # uint64 per trainer, each on its own 64-byte line
BUCKET_READY_STRIDE = 64
BUCKET_READY_NS_OFFSET = 8  # in a trainer's ready line: CLOCK_MONOTONIC ns of its last input


def doorbell_attached_offset(local_rank: int) -> int:
    """Offset of trainer `local_rank`'s attached flag in the doorbell segment."""
    _check_rank(local_rank)
    return DOORBELL_ATTACHED_OFFSET + 4 * local_rank


def bucket_attached_offset(local_rank: int) -> int:
    """Offset of trainer `local_rank`'s attached flag in a bucket header."""
    _check_rank(local_rank)
    return BUCKET_ATTACHED_OFFSET + 4 * local_rank


def ready_offset(local_rank: int) -> int:
    """Offset of ready[local_rank] (uint64, = step + 1 once the input is written)."""
    _check_rank(local_rank)
    return BUCKET_READY_OFFSET + BUCKET_READY_STRIDE * local_rank


def ready_ns_offset(local_rank: int) -> int:
    """Offset of ready_ns[local_rank] (uint64): CLOCK_MONOTONIC nanoseconds when that trainer
    wrote its last input, stored before ready[local_rank] (0: not stamped)."""
    return ready_offset(local_rank) + BUCKET_READY_NS_OFFSET


def slot_stride(elements: int, elem_bytes: int = FLOAT_BYTES) -> int:
    """Bytes between input slots: the slot size rounded up to whole pages (elem_bytes: 4 for
    float32 buckets, 2 for bfloat16 and float16 ones)."""
    nbytes = elements * elem_bytes
    return (nbytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES


def input_offset(elements: int, slot: int) -> int:
    """Offset of input slot `slot` in a bucket buffer."""
    return PAGE_BYTES + slot * slot_stride(elements)


def output_offset(elements: int, slots: int) -> int:
    """Offset of the shared output slot in a bucket buffer with `slots` input slots."""
    return PAGE_BYTES + slots * slot_stride(elements)


def bucket_bytes(elements: int, slots: int) -> int:
    """Total size of a bucket buffer."""
    return PAGE_BYTES + (slots + 1) * slot_stride(elements)


# A device bucket (a daemon serving CUDA buffers) keeps the BucketHeader alone in a host shm page
# and its data in a CUDA IPC buffer: input slot r at r * slot_stride, the output after the last
# slot (DeviceInputOffset / DeviceOutputOffset / DeviceBucketBytes in layout.h).


def device_input_offset(elements: int, slot: int, elem_bytes: int = FLOAT_BYTES) -> int:
    """Offset of input slot `slot` in a device bucket's CUDA IPC buffer (elem_bytes: 2 for
    bfloat16 and float16 buckets)."""
    return slot * slot_stride(elements, elem_bytes)


def device_output_offset(elements: int, slots: int, elem_bytes: int = FLOAT_BYTES) -> int:
    """Offset of the output in a device bucket's CUDA IPC buffer with `slots` input slots."""
    return slots * slot_stride(elements, elem_bytes)


def device_bucket_bytes(elements: int, slots: int, elem_bytes: int = FLOAT_BYTES) -> int:
    """Total size of a device bucket's CUDA IPC buffer."""
    return (slots + 1) * slot_stride(elements, elem_bytes)


def _check_rank(local_rank: int) -> None:
    if not 0 <= local_rank < MAX_LOCAL_TRAINERS:
        raise ValueError(f"local_rank {local_rank} must be in 0..{MAX_LOCAL_TRAINERS - 1}")
