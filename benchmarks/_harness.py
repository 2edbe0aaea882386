"""What the benchmark scripts share: the machine and versions a figure was measured with,
interleaved timing of alternatives, each script's own section of BENCHMARKS.md, and the tiny
mode that tests/test_benchmarks.py runs to check that every script still runs.

A script::

    parser = _harness.parser(__doc__)                # --tiny and --output
    args = parser.parse_args(argv)
    times = _harness.interleave({"a": run_a, "b": run_b}, rounds=1 if args.tiny else 7)
    _harness.publish(args, "name", "## Title", _harness.header(__file__, argv) + lines)

``--tiny``: the smallest sizes and one or two rounds; the section goes into ``--output`` if
given, else into a temporary copy of BENCHMARKS.md (written, checked, thrown away).
"""

import argparse
import datetime
import functools
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS_MD = os.path.join(ROOT, "BENCHMARKS.md")
if ROOT not in sys.path:  # the scripts import caco_tf from this checkout
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# ------------------------------------------------------------------------------ the machine
from caco_tf.machine import cpu_count, cpu_name, machine  # noqa: E402,F401  (the scripts' names)


def versions():
    """'TensorFlow 2.21.0, Keras 3.15.1': what the figures were measured with."""
    import keras
    import tensorflow as tf

    return f"TensorFlow {tf.__version__}, Keras {keras.__version__}"


# ------------------------------------------------------------------------------ the script
def parser(doc, output=True):
    """An argument parser with ``--tiny`` (and ``--output``, the Markdown file written)."""
    made = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--tiny", action="store_true",
                      help="the smallest sizes and one or two rounds: a check that the script "
                           "runs, not a measurement (writes only into --output if given)")
    if output:
        made.add_argument("--output", help="the Markdown file whose section this writes "
                                           "(default: BENCHMARKS.md)")
    return made


def command_line(script, argv):
    """`python benchmarks/SCRIPT ...` as run, less ``--output`` and ``--note`` (a note is a
    paragraph of its own)."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--output", "--note"):
            skip = True
        elif not arg.startswith(("--output=", "--note=")):
            shown.append(arg)
    return shlex.join(["python", f"benchmarks/{os.path.basename(script)}", *shown])


def header(script, argv, *details):
    """A section's first lines: the command, the date, the machine and the versions (and
    ``details``, sentences about the run)."""
    return [f"Command: `{command_line(script, argv)}` — {datetime.date.today()}, {machine()}; "
            f"{versions()}." + "".join(f" {d}" for d in details), ""]


def tiny_training(folder, images=64, held_out=32):
    """``--set`` assignments of a ``train.py`` run at the smallest sizes: the first ``images``
    offline digits for training and ``held_out`` held out (written into ``folder`` as .npz),
    one epoch, the offline default's network at its narrowest, one step a call, no XLA."""
    import numpy as np

    from caco_tf.data.sources import load_offline_mnist

    digits, paths = load_offline_mnist(), {}
    for split, count in (("train", images), ("test", held_out)):
        paths[split] = os.path.join(folder, f"{split}.npz")
        np.savez(paths[split], images=digits[split][0][:count], labels=digits[split][1][:count])
    return [f"data.source=npz:{paths['train']}", f"data.held_out=npz:{paths['test']}",
            "train.epochs=1", "train.lr_warmup_epochs=0", "method.caco.warmup_epochs=0",
            "model.widths=[8, 16, 32, 64]", "model.projector_hidden=32", "model.embedding_dim=16",
            "method.caco.bank_size=64", "train.jit_compile=false",
            "train.steps_per_execution=1", "evaluation.knn_k=3", "evaluation.knn_monitor_every=0"]


# ------------------------------------------------------------------------------ the timing
def interleave(alternatives, rounds, warmup=1, show=None):
    """{name: [its figure of each round]}: every round calls each alternative once, in turn,
    the order reversed every other round, so that a drift of a shared machine hits all alike;
    ``warmup`` untimed rounds first (tracing, compilation, caches).  The figure is what the call
    returns if it returns a number (a rate or a time it measured itself), else its seconds.
    ``show``: a format of a figure (e.g. "{:.1f}") to print each round's."""
    names = list(alternatives)
    figures = {name: [] for name in names}
    for index in range(warmup + rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            value = alternatives[name]()
            seconds = time.perf_counter() - start
            if index >= warmup:
                figures[name].append(value if isinstance(value, (int, float)) else seconds)
        if show and index >= warmup:
            print(f"round {index - warmup + 1}: " + ", ".join(
                f"{name} {show.format(figures[name][-1])}" for name in names), flush=True)
    return figures


# ------------------------------------------------------------------------------ the section
def markers(name):
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(text, path, name, title):
    """Replace the text between ``name``'s markers in ``path`` by ``text`` (which holds them),
    or append it under ``title``."""
    begin, end = markers(name)
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + text + old[old.index(end) + len(end) + 1:]
    else:
        new = old.rstrip("\n") + "\n\n" + title + "\n\n" + text
    with open(path, "w") as handle:
        handle.write(new)


def publish(args, name, title, lines, default=BENCHMARKS_MD):
    """Print the section ``name`` (``lines`` between its markers) and write it into
    ``args.output`` (``default`` if not given); with ``--tiny`` and no ``--output``, into a
    temporary copy of ``default``, which is checked and thrown away."""
    begin, end = markers(name)
    if args.tiny:
        lines = ["**`--tiny`: a check that the script runs, not a measurement.**", ""] + lines
    text = "\n".join([begin, *lines, end]) + "\n"
    print(text, flush=True)
    if args.output or not args.tiny:
        write_section(text, args.output or default, name, title)
        print(f"wrote {args.output or default}")
        return
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, os.path.basename(default))
        if os.path.exists(default):
            shutil.copy(default, copy)
        write_section(text, copy, name, title)
        written = open(copy).read()
        if written.count(begin) != 1 or text not in written:
            raise RuntimeError(f"section {name} was not written whole into {copy}")


# ------------------------------------------------------------------------------ float32 peak
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
    flags, clock, vendor = set(), None, ""
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
