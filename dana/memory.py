"""How much memory this process may use, and a check before a large allocation.

Low in the house (it imports dana.errors alone) so that every layer, the data readers
included, can refuse a size that cannot fit before allocating it.
"""

from __future__ import annotations

from dana.errors import ConfigError


def available_memory() -> int | None:
    """Bytes of memory available to this process (MemAvailable, within a cgroup limit);
    None where the system does not say."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit.isdigit() and available is not None:
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def check_fits(need: int, what: str, fix: str, available: int | None = None) -> None:
    """ConfigError, before anything is allocated, when ``what`` needs ``need`` bytes and
    fewer are available (``available``, default :func:`available_memory`); the message
    names both figures and ``fix``."""
    if available is None:
        available = available_memory()
    if available is not None and need > available:
        raise ConfigError(
            f"{what} needs about {_gib(need)} of memory; {_gib(available)} is available: {fix}"
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
