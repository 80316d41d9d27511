"""How many threads a context uses by default: the machine's physical cores (not its logical
CPUs). Reads ``/proc/cpuinfo`` on Linux; touches nothing else."""

from __future__ import annotations

import os


def physical_cores() -> int:
    """The physical cores (distinct socket and core ids of /proc/cpuinfo, at most the logical CPUs);
    elsewhere, or where that cannot be read, half the logical CPUs above 4 and all of them up to 4."""
    try:
        import platform
        if platform.system() == "Linux":
            cores = set()
            phys = core = None
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("physical id"):
                        phys = line.split(":")[1].strip()
                    elif line.startswith("core id"):
                        core = line.split(":")[1].strip()
                    elif not line.strip():
                        if core is not None:
                            cores.add((phys, core))
                        phys = core = None
            if cores:
                return max(1, min(len(cores), os.cpu_count() or 1))
    except Exception:
        pass
    n = os.cpu_count() or 2
    return max(1, n // 2 if n > 4 else n)
