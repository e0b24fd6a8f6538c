"""How much memory does shard 0's relay log take while a lost standby is rebuilt?

While a new standby starts (seconds: a new actor process), the driver has no snapshot
of it newer than the old one's, so shard 0 (the head) keeps every call it relays, and
then sends the whole log to the new standby (:meth:`dana.ps.relay.Relay.attach`). At
d = 25.6M (ResNet-50) every push's copy is 102 MB: a few seconds of pushes are
gigabytes. The log is bounded (``--relay-log-bytes``, :class:`dana.ps.recovery.RelayLog`):
beyond the bound calls go to a temporary file, and the new standby is sent the log in
chunks of :data:`~dana.ps.recovery.CHUNK_BYTES`.

This script plays the head's side of that: ``--pushes`` pushes of ``--d`` float32 (the
copy :meth:`~dana.ps.relay.Relay.push` keeps, of a ``--servers 1`` run: the whole
message for the standby) logged with no snapshot to trim them, then sent in chunks to
a new standby (a stand-in that drops what it gets), once with the bound
(``--limit``, default the runtime's 2 GiB) and once without (``--unbounded``: the code
before the bound). It prints the log's peak in memory, what went to disk, and the
process's peak resident memory above its start (``VmHWM``).

Run: ``python bench/relay_log_memory.py`` (about a minute and 3 GB of memory, 2 GB of
disk; ``--smoke``: tiny sizes, seconds). The last line:

    relay log peak resident MB M (bound MB B)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.ps.protocol import Method, Push  # noqa: E402
from dana.ps.recovery import RELAY_LOG_BYTES, RelayLog  # noqa: E402

MB = 1024**2


def status(key: str) -> int:
    """``/proc/self/status``'s ``key`` (``VmHWM``, ``VmRSS``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=25_557_032)
    parser.add_argument("--pushes", type=int, default=30)
    parser.add_argument("--limit", type=int, default=RELAY_LOG_BYTES)
    parser.add_argument("--unbounded", action="store_true", help="no bound (as before it)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.d, args.pushes, args.limit = 100_000, 10, 1_000_000
    limit = 2**62 if args.unbounded else args.limit
    message = np.random.default_rng(0).standard_normal(args.d).astype(np.float32)
    base = status("VmRSS")
    log = RelayLog(shards=1, limit=limit)  # the standby's receiver: no snapshot, no trim
    started = time.time()
    for seq in range(1, args.pushes + 1):
        log.add(Method.PUSH, [Push(0, seq, message).copy()])
    logged = time.time() - started
    sent = 0
    for chunk in log.chunks():  # what attach sends the new standby, chunk by chunk
        sent += len(chunk)
        del chunk
    peak = status("VmHWM") - base
    counters = log.counters()
    print(
        f"d {args.d:,}, {args.pushes} pushes of {message.nbytes / MB:.0f} MB logged in "
        f"{logged:.1f} s, {sent} sent in chunks; log in memory at most "
        f"{counters['log_peak_bytes'] / MB:.0f} MB (of {counters['log_peak_calls']} calls logged), "
        f"{counters['log_spilled_calls']} calls spilled, "
        f"{counters['log_peak_spilled_bytes'] / MB:.0f} MB on disk"
    )
    bound = "none" if args.unbounded else f"{limit / MB:.0f}"
    print(f"relay log peak resident MB {peak / MB:.0f} (bound MB {bound})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
