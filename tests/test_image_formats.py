"""Every image a user has is used or accounted for: JPEG (CMYK, progressive, EXIF-rotated,
upper-case extensions), PNG (RGBA, 16-bit, palette), GIF, BMP, WebP and TIFF decode in
training, evaluation and extraction; other files are counted and listed, never passed over
silently.  Files are generated with Pillow."""

import io
import os
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from caco_tf.data import images, pipeline, sources
from caco_tf.serving import extraction


def picture(height=24, width=40):
    """An asymmetric gradient: a wrong orientation or channel order changes it visibly."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([y * 10, x * 6, (x + y) * 3], -1).astype(np.uint8)


def encoded(image, format, **options):
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def every_format():
    """{file name: bytes} of one picture in every format and variant the issue names."""
    rgb = Image.fromarray(picture())
    sixteen = Image.fromarray((picture()[..., 0].astype(np.uint16) * 257))
    return {
        "plain.jpg": encoded(rgb, "JPEG", quality=95),
        "cmyk.jpeg": encoded(rgb.convert("CMYK"), "JPEG", quality=95),
        "progressive.JPG": encoded(rgb, "JPEG", quality=95, progressive=True),
        "rgba.png": encoded(rgb.convert("RGBA"), "PNG"),
        "sixteen.PNG": encoded(sixteen, "PNG"),
        "palette.png": encoded(rgb.convert("P"), "PNG"),
        "animated.gif": encoded(rgb, "GIF"),
        "bitmap.bmp": encoded(rgb, "BMP"),
        "photo.webp": encoded(rgb, "WEBP", lossless=True),
        "scan.tif": encoded(rgb, "TIFF"),
        "scan16.TIFF": encoded(sixteen, "TIFF", compression="tiff_lzw"),
    }


def pillow_rgb(contents):
    with Image.open(io.BytesIO(contents)) as image:
        if image.mode.startswith("I;16"):
            return np.repeat((np.asarray(image) >> 8).astype(np.uint8)[..., None], 3, -1)
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


@pytest.mark.parametrize("name,contents", sorted(every_format().items()))
def test_every_format_passes_the_check_and_decodes_as_pillow_does(name, contents):
    assert bool(pipeline.looks_complete(tf.constant(contents)))
    decoded = images.decode_file_rgb(tf.constant(contents)).numpy()
    expected = pillow_rgb(contents)
    assert decoded.shape == expected.shape == (24, 40, 3)
    tolerance = 8 if name.lower().endswith((".jpg", ".jpeg")) else 1  # two JPEG decoders
    assert np.abs(decoded.astype(int) - expected.astype(int)).max() <= tolerance
    if not name.lower().endswith((".tif", ".tiff")):
        # What the exported serve_bytes runs: in the graph, TIFF excepted.
        graph = tf.function(lambda c: images.decode_image(c, 3))
        np.testing.assert_array_equal(graph(tf.constant(contents)).numpy(), decoded)


def exif_jpeg(orientation, big_endian=False):
    """A JPEG whose APP1 segment holds one EXIF directory with the orientation tag, written
    by hand in either byte order."""
    order = ">" if big_endian else "<"
    tiff = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(order + "I", 8)
    tiff += struct.pack(order + "H", 1) + struct.pack(order + "HHIHH", 0x0112, 3, 1,
                                                      orientation, 0)
    tiff += struct.pack(order + "I", 0)
    segment = b"Exif\x00\x00" + tiff
    plain = encoded(Image.fromarray(picture()), "JPEG", quality=95)
    return plain[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + plain[2:]


@pytest.mark.parametrize("big_endian", [False, True])
def test_exif_orientations_turn_jpegs_upright_as_pillow_does(big_endian):
    for orientation in range(1, 9):
        contents = exif_jpeg(orientation, big_endian)
        assert int(images.exif_orientation(tf.constant(contents))) == orientation
        decoded = images.decode_rgb(tf.constant(contents)).numpy().astype(int)
        expected = pillow_rgb(contents).astype(int)
        assert decoded.shape == expected.shape, orientation
        assert np.abs(decoded - expected).max() <= 8, orientation
    assert int(images.exif_orientation(tf.constant(every_format()["rgba.png"]))) == 1


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    """Two class folders: every format, a truncated JPEG, and files that are no images."""
    root = tmp_path_factory.mktemp("photos")
    for index, label in enumerate(("cats", "dogs")):
        folder = root / label
        folder.mkdir()
        for name, contents in every_format().items():
            (folder / name).write_bytes(contents)
        (folder / "broken.jpg").write_bytes(every_format()["plain.jpg"][:300])
    (root / "cats" / "notes.txt").write_text("not an image")
    (root / "dogs" / "phone.heic").write_bytes(b"\x00" * 64)
    (root / "dogs" / ".DS_Store").write_bytes(b"\x00" * 16)
    return str(root)


def test_a_photo_folder_is_counted_and_its_other_files_listed(photo_folder, tmp_path):
    source = sources.folder_source(photo_folder)
    assert len(source) == 2 * (len(every_format()) + 1)
    listing = tmp_path / "skipped_files.txt"
    line = sources.describe_inputs(source, None, str(listing))
    assert line == (f"images: {len(source)} for training; passed over 2 files of an "
                    f"unsupported type (.heic, .txt); files passed over are listed in {listing}")
    assert sorted(listing.read_text().splitlines()) == sorted(  # .DS_Store: hidden, ignored
        f"unsupported type\t{os.path.join(photo_folder, path)}"
        for path in ("cats/notes.txt", "dogs/phone.heic"))


def test_evaluation_reads_every_format_and_lists_the_unreadable(photo_folder, tmp_path):
    source = sources.folder_source(photo_folder)
    listing = tmp_path / "skipped_files.txt"
    skipped = pipeline.SkippedFiles(list_path=str(listing))
    batches = list(pipeline.eval_dataset(source, 8, lambda x: x, image_size=16, channels=3,
                                         skipped=skipped))
    used = sum(int(images.shape[0]) for images, _ in batches)
    assert used == 2 * len(every_format())  # all but the two truncated files
    assert skipped.total == 2
    assert sorted(listing.read_text().splitlines()) == [
        f"unreadable\t{os.path.join(photo_folder, label, 'broken.jpg')}"
        for label in ("cats", "dogs")]


def test_training_views_read_every_format(photo_folder):
    from caco_tf.data import augment

    source = sources.folder_source(photo_folder)
    views = augment.AsymmetricViews(16, 3)
    skipped = pipeline.SkippedFiles(examples=100)
    stream = pipeline.pretrain_dataset(source, 11, views, skipped=skipped,
                                       steps_per_epoch=2)
    first_epoch = list(stream.take(2))
    assert all(view.shape == (11, 16, 16, 3) for batch in first_epoch for view in batch)
    # Only the truncated files are passed over (met again as the stream reads ahead).
    assert {os.path.basename(name) for name in skipped._names} <= {"broken.jpg"}


def test_extraction_reads_tiff_and_warns_of_other_files(photo_folder, capsys):
    source = extraction.folder_source(os.path.join(photo_folder, "dogs"))
    records = list(source.records)
    read = {os.path.basename(path) for image, _, path in records if image is not None}
    assert read == set(every_format())
    warning = capsys.readouterr().err
    assert "warning: passed over 1 file of another type than" in warning
    assert "phone.heic" in warning


def test_a_named_pipe_named_as_an_image_is_listed_and_never_read(tmp_path, capsys):
    """A named pipe (any file that is not a regular one) named as an image would block its
    reader for ever: the listing passes it over, says so and lists it."""
    folder = tmp_path / "images"
    (folder / "cats").mkdir(parents=True)
    (folder / "dogs" / "old").mkdir(parents=True)
    for name in ("cats/a.png", "dogs/d.png"):
        (folder / name).write_bytes(every_format()["rgba.png"])
    os.mkfifo(folder / "cats" / "b.png")
    os.mkfifo(folder / "dogs" / "old" / "c.jpg")
    source = sources.folder_source(str(folder))
    images = [str(folder / "cats" / "a.png"), str(folder / "dogs" / "d.png")]
    assert list(source.paths) == images
    listing = tmp_path / "skipped_files.txt"
    assert sources.describe_inputs(source, None, str(listing)) == (
        f"images: 2 for training; passed over 2 files named as images but not regular files "
        f"(named pipes, devices, broken links); files passed over are listed in {listing}")
    assert listing.read_text().splitlines() == [
        f"not a regular file\t{folder / 'cats' / 'b.png'}",
        f"not a regular file\t{folder / 'dogs' / 'old' / 'c.jpg'}"]
    assert extraction.list_image_files(str(folder)) == images
    assert "warning: passed over 2 files named as images but not regular files" in (
        capsys.readouterr().err)


def test_hidden_folders_and_files_are_ignored_and_images_beside_class_folders_listed(tmp_path):
    """Jupyter's empty .ipynb_checkpoints/ beside the images made them a folder of one (empty)
    class: "no images".  Images beside class folders have no class: listed, not used."""
    flat = tmp_path / "flat"
    (flat / ".ipynb_checkpoints").mkdir(parents=True)
    for name in ("a.png", "b.png", ".hidden.png"):
        (flat / name).write_bytes(every_format()["rgba.png"])
    assert list(sources.folder_source(str(flat)).paths) == [str(flat / "a.png"),
                                                            str(flat / "b.png")]
    classes = tmp_path / "classes"
    for name in ("cats/a.png", "dogs/b.png", "stray.png", "README.txt"):
        (classes / name).parent.mkdir(parents=True, exist_ok=True)
        (classes / name).write_bytes(every_format()["rgba.png"])
    source = sources.folder_source(str(classes))
    assert source.class_names == ("cats", "dogs") and len(source) == 2
    listing = tmp_path / "skipped_files.txt"
    assert sources.describe_inputs(source, None, str(listing)) == (
        f"images: 2 for training; passed over 1 file of an unsupported type (.txt) and 1 file "
        f"beside the class folders (an image there has no class); files passed over are listed "
        f"in {listing}")
    assert sorted(listing.read_text().splitlines()) == [
        f"outside the class folders\t{classes / 'stray.png'}",
        f"unsupported type\t{classes / 'README.txt'}"]


def test_float_tiffs_decode_to_their_values_or_are_named_unreadable(tmp_path, caplog):
    """32-bit float TIFFs decoded all black (Pillow clips [0, 1] to 0-1 of 255): [0, 1] and
    [0, 255] are scaled; another range is unreadable, and named."""
    gray = picture()[..., 0]
    folder = tmp_path / "floats"
    folder.mkdir()
    Image.fromarray(gray.astype(np.float32) / 255.0, "F").save(folder / "unit.tif")
    Image.fromarray(gray.astype(np.float32), "F").save(folder / "bytes.tif")
    Image.fromarray(gray.astype(np.float32) * 300.0, "F").save(folder / "other.tif")
    for name in ("unit.tif", "bytes.tif"):
        decoded = images.decode_file_image(tf.constant((folder / name).read_bytes()), 1)
        np.testing.assert_array_equal(decoded.numpy()[..., 0], gray, err_msg=name)
    source = sources.folder_source(str(folder))
    listing = tmp_path / "skipped_files.txt"
    skipped = pipeline.SkippedFiles(list_path=str(listing))
    batches = list(pipeline.eval_dataset(source, 8, lambda x: x, image_size=16, channels=1,
                                         skipped=skipped))
    assert sum(int(batch.shape[0]) for batch in batches) == 2
    assert listing.read_text() == f"unreadable\t{folder / 'other.tif'}\n"
    with caplog.at_level("WARNING"):
        assert skipped.report() == 1
    assert f"skipped 1 unreadable image file ({folder / 'other.tif'})" in caplog.text


def test_a_file_that_passes_the_check_and_fails_to_decode_is_named(tmp_path, caplog):
    """A PNG whose signature and end are intact but whose header is not: the per-epoch warning
    names it and skipped_files.txt lists it (they said "(, ...)" and missed it)."""
    from caco_tf.data import augment

    folder = tmp_path / "images"
    folder.mkdir()
    good = every_format()["rgba.png"]
    for number in range(5):  # 2 batches of 3 need all 6 files: bad.png is met
        (folder / f"{number}.png").write_bytes(good)
    (folder / "bad.png").write_bytes(good[:16] + b"\xff" * 40 + good[56:])  # IHDR damaged
    source = sources.folder_source(str(folder))
    listing = tmp_path / "skipped_files.txt"
    skipped = pipeline.SkippedFiles(list_path=str(listing))
    stream = pipeline.pretrain_dataset(source, 3, augment.AsymmetricViews(16, 3),
                                       skipped=skipped, steps_per_epoch=2)
    assert all(view.shape == (3, 16, 16, 3) for batch in stream.take(2) for view in batch)
    assert listing.read_text() == f"unreadable\t{folder / 'bad.png'}\n"
    with caplog.at_level("WARNING"):
        skipped.report("epoch 1")
    # Met once in the epoch's pass, and maybe again in the next pass read ahead: one name.
    assert f"unreadable image file{'s' * (skipped.total > 1)} ({folder / 'bad.png'}); the " in (
        caplog.text)
