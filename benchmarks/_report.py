"""What the benchmark scripts share: the machine's core count and their BENCHMARKS.md section."""

import os


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))  # what `nproc` reports
    except AttributeError:
        return os.cpu_count()


def write_section(text, path, begin, end, title):
    """Replace the text between the ``begin``/``end`` markers in ``path``, or append the
    section under ``title`` at the end."""
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in old and end in old:
        start, stop = old.index(begin), old.index(end) + len(end) + 1
        new = old[:start] + text + old[stop:]
    else:
        new = old.rstrip("\n") + "\n\n" + title + "\n\n" + text
    with open(path, "w") as handle:
        handle.write(new)


# FMA units per core: two on the x86 server cores these benchmarks meet (Intel Xeon Scalable
# Gold/Platinum: two AVX-512 FMA ports; AMD Zen 2-4: two 256-bit FMA pipes, Zen 4 runs
# AVX-512 through them in two halves, so 16 float32 lanes per FMA cycle, not 32).
FMA_UNITS = 2


def theoretical_peak():
    """This machine's theoretical float32 peak from /proc/cpuinfo, and how it was worked out:
    cores × clock × float32 lanes per FMA unit × FMA units × 2 (a fused multiply-add is two
    operations).  Lanes: 16 with avx512f on Intel, 8 with avx2 + fma (and with AVX-512 on AMD
    Zen 4, whose 512-bit FMAs take two cycles), 4 otherwise.  Clock: the 'cpu MHz' the kernel
    reports (under a hypervisor the nominal clock; a boost clock would raise the peak)."""
    flags, clock, vendor, family = set(), None, "", None
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "cpu MHz" and clock is None:
                    clock = float(value)
                elif key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "cpu family" and family is None:
                    family = int(value)
    except OSError:
        return None
    if not clock:
        return None
    if "avx512f" in flags and vendor == "GenuineIntel":
        lanes, isa = 16, "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        lanes, isa = 8, "AVX2 + FMA" if "avx512f" not in flags else "AVX-512 (two 256-bit halves)"
    else:
        lanes, isa = 4, "SSE"
    cores = cpu_count()
    flops = cores * clock * 1e6 * lanes * FMA_UNITS * 2
    return {"flops": flops, "description": (
        f"{cores} cores × {clock / 1000:.2f} GHz × {lanes} float32 lanes ({isa}) × "
        f"{FMA_UNITS} FMA units × 2 = {flops / 1e9:,.1f} GFLOP/s")}
