"""Peak resident memory of one call, for the benchmark scripts (Linux ``/proc``)."""

from __future__ import annotations


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``, ...) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset the resident high-water mark (Linux: writing 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
