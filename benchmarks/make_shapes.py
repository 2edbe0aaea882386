"""Generate an image folder laid out as ImageNet's, for trying "train on your own images":

    python benchmarks/make_shapes.py OUT [--train 200] [--val 50] [--size 96] [--seed 0] [--tiny]

OUT/train/<class>/*.png and OUT/val/<class>/*.png: 10 classes of shapes (circle, square,
triangle, star, cross, ring, diamond, hexagon, bar, chevron), each drawn at a random position,
size, rotation and colour over a random colour gradient with noise, so that only the shape
tells the class (the views' colour jitter and crops remove the rest).  Labels are for
evaluation only.  ``--tiny``: two small images a class and split (into a temporary folder
without OUT), a check that the script runs.
"""

import argparse
import math
import os
import sys
import tempfile

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from caco_tf.data.shapes import CLASSES, OUTLINES  # noqa: E402

# The shapes' outlines are the comparison benchmark's (data.source shapes), drawn here in colour
# at any size.
SHAPES = OUTLINES


def _polygon(points, angle, centre, radius):
    cos, sin = math.cos(angle), math.sin(angle)
    return [(centre[0] + radius * (x * cos - y * sin), centre[1] + radius * (x * sin + y * cos))
            for x, y in points]


def draw(shape, size, rng):
    """One image of ``shape``: uint8 [size, size, 3]."""
    start, end = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    ramp = np.linspace(0, 1, size)[:, None, None]
    background = (start * (1 - ramp) + end * ramp) * np.ones((size, size, 3))
    background += rng.normal(0, 12, (size, size, 3))
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8))
    pen = ImageDraw.Draw(image)
    radius = size * rng.uniform(0.18, 0.36)
    centre = rng.uniform(radius, size - radius, 2)
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    angle = rng.uniform(0, 2 * math.pi)
    box = [centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius]
    if shape == "circle":
        pen.ellipse(box, fill=colour)
    elif shape == "ring":
        pen.ellipse(box, outline=colour, width=max(2, int(radius * 0.3)))
    else:
        pen.polygon(_polygon(SHAPES[shape], angle, centre, radius), fill=colour)
    return np.asarray(image)


def make(out, train=200, val=50, size=96, seed=0):
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for shape in CLASSES:
            folder = os.path.join(out, split, shape)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                Image.fromarray(draw(shape, size, rng)).save(os.path.join(folder, f"{i:05d}.png"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--train", type=int, default=200, help="training images per class")
    parser.add_argument("--val", type=int, default=50, help="held-out images per class")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="two 32 px images a class and split")
    args = parser.parse_args(argv)
    if args.tiny:
        args.train, args.val, args.size = 2, 2, 32
    elif not args.out:
        parser.error("OUT is required (the folder to write)")
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or scratch
        make(out, args.train, args.val, args.size, args.seed)
        print(f"images: {os.path.abspath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
