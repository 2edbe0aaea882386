"""What a resume inside an epoch costs before its first step, at 10 % and at 90 % of the epoch,
on a folder of 100,000 small generated JPEGs: a new process lists the folder, builds the
resumed input stream and takes its first batch.  Two ways to reach the resume point, run
interleaved: from the place the checkpoint records (``resume_at``, what a resume does now),
and by reading and checking every file before it (what a resume did before, and still does
for a checkpoint without the place).  Timed from the launch of the process and from the
building of the stream; bytes read are the process's ``rchar`` (/proc/self/io: every byte
read, from the disk or the page cache) over the stream's start.

    python benchmarks/resume_position.py                    # -> BENCHMARKS.md
    python benchmarks/resume_position.py --images 20000 --repeats 3 --output /tmp/r.md
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## A resume's way to its place in the epoch (`benchmarks/resume_position.py`)"


def make_folder(folder, count):
    """``count`` 96×96 RGB JPEGs of noise under ``folder`` (100 sub-folders of classes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    tiles = [Image.fromarray(rng.integers(0, 256, (96, 96, 3), np.uint8)) for _ in range(64)]
    for index in range(count):
        directory = os.path.join(folder, f"c{index % 100:03d}")
        if index < 100:
            os.makedirs(directory)
        tiles[index % 64].save(os.path.join(directory, f"{index:06d}.jpg"), quality=90)


def rchar():
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


def resumed_stream(folder, fraction, recorded, batch, size):
    """The resumed stream's first batch: {its seconds and bytes read, the step, the steps}."""
    from caco_tf import data
    from caco_tf.data import augment

    source = data.folder_source(folder)
    steps = len(source) // batch
    first_step = int(round(fraction * steps))
    place = [{"items": first_step * batch, "bad": []}] if recorded else None
    views = augment.AsymmetricViews(size, 3)
    start, read = time.perf_counter(), rchar()
    stream = data.pretrain_dataset(source, batch, views, seed=0, first_epoch=3,
                                   first_step=first_step, steps_per_epoch=steps,
                                   resume_at=place)
    next(iter(stream))
    return {"stream_s": time.perf_counter() - start, "bytes": rchar() - read,
            "step": first_step, "steps": steps}


def measure(folder, fraction, recorded, args):
    """A resume's first batch in a fresh process (in this one with ``--tiny``)."""
    start = time.perf_counter()
    if args.tiny:
        row = resumed_stream(folder, fraction, recorded, args.batch, args.size)
    else:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=_harness.ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", folder,
                                 str(fraction), str(int(recorded)), str(args.batch),
                                 str(args.size)], env=env,
                                capture_output=True, text=True, check=True, timeout=3600)
        row = json.loads(result.stdout.strip().splitlines()[-1])
    row["launch_s"] = time.perf_counter() - start
    return row


def section(rows, args, size):
    """The section's lines of ``rows`` ({(fraction, recorded): [measurements]}) on a folder of
    ``size`` bytes."""
    def median(key, what):
        return statistics.median(row[what] for row in rows[key])

    lines = []
    for fraction in sorted({fraction for fraction, _ in rows}):
        for recorded in (True, False):
            key = (fraction, recorded)
            if key not in rows:
                continue
            way = ("from the recorded place (now)" if recorded
                   else "reading and checking the files before it (before)")
            lines.append(
                f"| {fraction:.0%} (step {rows[key][0]['step']} of {rows[key][0]['steps']}) | "
                f"{way} | {median(key, 'launch_s'):.1f} | {median(key, 'stream_s'):.1f} | "
                f"{median(key, 'bytes') / 2**20:,.1f} |")
    return [
        f"{args.images:,} JPEGs of 96×96 (noise, {size / 2**20:.0f} MiB) in 100 class "
        f"folders, batch {args.batch}, asymmetric views of {args.size}×{args.size}; a new "
        f"process lists the folder, builds the stream resumed inside epoch 4 and takes its "
        f"first batch; medians of {args.repeats}, the "
        f"ways interleaved.  Bytes: the process's `rchar` over the stream's start (page cache "
        f"included: the files were just written).", "",
        "| resumed at | the stream reaches its place | launch → first batch (s) | "
        "stream → first batch (s) | bytes read (MiB) |",
        "|---|---|---:|---:|---:|", *lines, "",
        "From the recorded place the cost does not grow with the position: the stream skips "
        "the names of the items before it (no file is opened).  Reading them instead grows "
        "with the position: at 90 % of an ImageNet epoch (1.28 M files, ~140 GB) it read "
        "~126 GB before the first step."]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        row = resumed_stream(argv[1], float(argv[2]), argv[3] == "1", int(argv[4]),
                             int(argv[5]))
        print(json.dumps(row), flush=True)
        return 0
    parser = _harness.parser(__doc__)
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256, help="a batch of the ImageNet configs")
    parser.add_argument("--size", type=int, default=64, help="the views' side (of 96 px JPEGs)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--fractions", default="0.1,0.9",
                        help="where in the epoch the resume starts (0: a run's start, for "
                        "comparison)")
    parser.add_argument("--ways", default="recorded,reading",
                        help="recorded (from the checkpoint's place), reading (the files before "
                        "it read and checked), or both")
    args = parser.parse_args(argv)
    if args.tiny:
        args.images, args.batch, args.fractions, args.size = 200, 8, "0.5", 32
    ways = [way == "recorded" for way in args.ways.split(",")]
    fractions = [float(fraction) for fraction in args.fractions.split(",")]
    folder = tempfile.mkdtemp(prefix="resume_position-")
    try:
        began = time.perf_counter()
        make_folder(folder, args.images)
        size = sum(os.path.getsize(os.path.join(root, name))
                   for root, _, names in os.walk(folder) for name in names)
        print(f"{args.images:,} JPEGs, {size / 2**20:.0f} MiB, made in "
              f"{time.perf_counter() - began:.0f} s", flush=True)
        rows = {}
        for _ in range(args.repeats):  # interleaved: the machine's drift falls on all alike
            for fraction in fractions:
                for recorded in ways:
                    row = measure(folder, fraction, recorded, args)
                    print(fraction, recorded, row, flush=True)
                    rows.setdefault((fraction, recorded), []).append(row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = _harness.header(__file__, argv) + section(rows, args, size)
    _harness.publish(args, "resume_position", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
