"""spex: the Python client of spexd, the per-node sparse gradient exchange daemon.

- `spex.Client`: a session with the node's daemon (buckets in shared memory, doorbell or RPC
  exchanges, stats); `device="cuda"` for buckets in the daemon's GPU memory (`spex.cuda`).
- `spex.torch`: the PyTorch DDP communication hook (`spex.torch.register(ddp_model, ...)`).
- `spex.cluster.LocalCluster`: starts daemons under mpirun on this machine (tests, demos);
  `spex.emulated.EmulatedCluster`: the same on emulated hosts (network namespaces, rate, latency).
"""

from .client import DEVICES, MODES, Bucket, Client, connect
from .errors import (
    BucketOrderError,
    CudaRuntimeError,
    DaemonUnavailableError,
    ExchangeTimeoutError,
    NotImplementedByDaemon,
    OwnInputRefused,
    SessionLostError,
    SpexError,
    SpexSecurityError,
    SpexTypeError,
    SpexValueError,
)
from .paths import client_socket_path, default_job, default_socket_path

__version__ = "0.1.0"

__all__ = [
    "DEVICES", "MODES", "Bucket", "Client", "connect", "BucketOrderError", "CudaRuntimeError",
    "DaemonUnavailableError", "ExchangeTimeoutError", "NotImplementedByDaemon", "OwnInputRefused", "SessionLostError", "SpexError",
    "SpexSecurityError", "SpexTypeError", "SpexValueError", "client_socket_path", "default_job", "default_socket_path", "__version__",
]
