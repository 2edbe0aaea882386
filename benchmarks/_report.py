"""What the benchmark scripts share: the machine's core count and their BENCHMARKS.md section."""

import functools
import os
import platform
import shlex
import shutil
import subprocess
import tempfile


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))  # what `nproc` reports
    except AttributeError:
        return os.cpu_count()


def cpu_model():
    """The CPU and the cores this process may use (seeded runs repeat bit for bit on one CPU
    model only, so every measurement names it)."""
    return f"{cpu_name()}, {cpu_count()} cores"


def cpu_name():
    """The CPU, as /proc/cpuinfo names it, with its family and model numbers."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def command_line(script, argv):
    """The ``Command: `python benchmarks/SCRIPT ...``` line of a section, less ``--output``."""
    shown = [a for a, before in zip(argv, [""] + argv)
             if not a.startswith("--output") and before != "--output"]
    return f"Command: `{shlex.join(['python', f'benchmarks/{script}', *shown])}`"


def publish(text, path, begin, end, title):
    """Print a section and write it into ``path`` (``write_section``)."""
    print(text)
    write_section(text, path, begin, end, title)
    print(f"wrote {path}")


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


# A chain of dependent integer adds retires one add per cycle on every x86 core, so timing a
# long chain gives the clock the cores really run at (a hypervisor's 'cpu MHz' is the nominal
# one; a boosted core runs faster, and a peak from it falls below a measured matmul).
_CLOCK_PROGRAM = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
  unsigned long x = 0, rounds = 200000000UL; struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (unsigned long i = 0; i < rounds; i++)
    __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                     "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%f\n", x / ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec)) / 1e6);
  return 0;
}
"""


def measured_clock_mhz(repeats=3):
    """The clock (MHz) one busy core runs at, from a timed chain of 1.6 G dependent adds (the
    best of ``repeats``); None without a C compiler or on another architecture."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        with tempfile.TemporaryDirectory() as folder:
            source, program = os.path.join(folder, "clock.c"), os.path.join(folder, "clock")
            with open(source, "w") as handle:
                handle.write(_CLOCK_PROGRAM)
            subprocess.run([compiler, "-O1", "-o", program, source], check=True,
                           capture_output=True, timeout=60)
            return max(float(subprocess.run([program], check=True, capture_output=True,
                                            text=True, timeout=60).stdout)
                       for _ in range(repeats))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)  # one clock measurement per process, however many rows ask
def theoretical_peak():
    """This machine's theoretical float32 peak from /proc/cpuinfo, and how it was worked out:
    cores × clock × float32 lanes per FMA unit × FMA units × 2 (a fused multiply-add is two
    operations).  Lanes: 16 with avx512f on Intel, 8 with avx2 + fma (and with AVX-512 on AMD
    Zen 4, whose 512-bit FMAs take two cycles), 4 otherwise.  Clock: the higher of the 'cpu MHz'
    the kernel reports (under a hypervisor the nominal clock) and the one measured by
    ``measured_clock_mhz`` (a boosted core's)."""
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
    measured = measured_clock_mhz()
    source = "the kernel's 'cpu MHz'"
    if measured and measured > clock:
        clock, source = measured, f"measured by a chain of dependent adds; reported {clock:.0f} MHz"
    if "avx512f" in flags and vendor == "GenuineIntel":
        lanes, isa = 16, "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        lanes, isa = 8, "AVX2 + FMA" if "avx512f" not in flags else "AVX-512 (two 256-bit halves)"
    else:
        lanes, isa = 4, "SSE"
    cores = cpu_count()
    flops = cores * clock * 1e6 * lanes * FMA_UNITS * 2
    return {"flops": flops, "description": (
        f"{cores} cores × {clock / 1000:.2f} GHz ({source}) × {lanes} float32 lanes ({isa}) × "
        f"{FMA_UNITS} FMA units × 2 = {flops / 1e9:,.1f} GFLOP/s")}
