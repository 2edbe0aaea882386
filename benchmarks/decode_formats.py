"""Does reading WebP, TIFF and EXIF orientations slow a JPEG folder?  The file pipeline's
decoding (``images.decode_file_image``: TIFF through Pillow, EXIF orientation parsed in the
graph) against TensorFlow's plain ``tf.io.decode_image``, on the same generated JPEG folder,
interleaved round by round in one process.

    python benchmarks/decode_formats.py                    # -> BENCHMARKS.md
    python benchmarks/decode_formats.py --images 256 --rounds 3 --output /tmp/d.md
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## JPEG folder: decoding with WebP, TIFF and EXIF support (`benchmarks/decode_formats.py`)"


def make_jpegs(folder, count, rotated, seed=0):
    """``count`` camera-like JPEGs (375×500, quality 90) with an EXIF orientation tag: 1
    (upright), or 1 to 8 in turn when ``rotated``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (375 // 25, 500 // 25, 3), dtype=np.uint8)
    for index in range(count):
        image = Image.fromarray(np.roll(base, index, axis=1)).resize((500, 375))
        exif = image.getexif()
        exif[0x0112] = 1 + index % 8 if rotated else 1
        image.save(os.path.join(folder, f"{index:05d}.jpg"), quality=90, exif=exif)
    return sorted(os.path.join(folder, name) for name in os.listdir(folder))


def rate(tf, paths, decode, size):
    """Images a second through read → decode → resize to ``size`` → batch, in parallel."""
    from caco_tf.data.images import resize_and_center_crop, to_unit_float

    dataset = tf.data.Dataset.from_tensor_slices(paths).map(
        lambda path: resize_and_center_crop(to_unit_float(decode(tf.io.read_file(path)))[None],
                                            size)[0],
        num_parallel_calls=_harness.cpu_count()).batch(64).prefetch(2)
    start = time.perf_counter()
    for _ in dataset:
        pass
    return len(paths) / (time.perf_counter() - start)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args(argv)
    if args.tiny:
        args.images, args.rounds, args.size = 8, 1, 32

    import tensorflow as tf

    from caco_tf.data import images

    def plain(contents):
        return tf.io.decode_image(contents, channels=3, expand_animations=False)

    rows = ["| JPEG folder | `tf.io.decode_image` (images/s) | `images.decode_file_rgb` "
            "(images/s) | ratio, round by round: median (min–max) |", "|---|---:|---:|---:|"]
    for rotated in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            paths = make_jpegs(folder, args.images, rotated)
            rates = _harness.interleave(
                {"plain": lambda: rate(tf, paths, plain, args.size),
                 "file": lambda: rate(tf, paths, images.decode_file_rgb, args.size)},
                args.rounds)
        ratios = [f / p for f, p in zip(rates["file"], rates["plain"])]
        rows.append(f"| {'EXIF orientations 1-8 in turn' if rotated else 'upright (orientation 1)'}"
                    f" | {statistics.median(rates['plain']):.0f} | "
                    f"{statistics.median(rates['file']):.0f} | {statistics.median(ratios):.2f} "
                    f"({min(ratios):.2f}–{max(ratios):.2f}) |")
        print(rows[-1], flush=True)
    lines = _harness.header(__file__, argv) + [
        f"{args.images} JPEGs of 500×375 (quality 90), read → decode → resize and crop to "
        f"{args.size} → batches of 64, `tf.data` map on as many threads as cores; "
        f"{args.rounds} rounds, the two in turn, after one warm-up round. `tf.io.decode_image` "
        "reads JPEG, PNG, GIF, BMP and WebP and ignores EXIF; `images.decode_file_rgb` adds "
        "TIFF (through Pillow, only for TIFF files) and turns EXIF-rotated JPEGs upright "
        "(parsed in the graph).", "", *rows, "",
        "The upright row is what the added support costs a folder that needs none (the EXIF "
        "parse, the TIFF test, an identity transpose); the rotated row adds the rotations "
        "themselves, work that plain decoding skips by leaving the images sideways. Ratios "
        "below 1 are slower; this machine's speed swings between two levels from round to "
        "round, hence the pairwise ratios."]
    _harness.publish(args, "decode_formats", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
