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
