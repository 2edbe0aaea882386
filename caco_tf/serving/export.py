"""Export of the backbone as a TF Serving SavedModel: ``OUT/<model_name>/<version>/``.

The graph does its own decoding, resizing and normalization, so a client sends raw pixels (or
encoded files) and a process that imports neither keras nor caco_tf can load it
(``tf.saved_model.load``, ``saved_model_cli``, TF Serving).

Signatures (C is the model's channel count, S its image size, F/D the feature/embedding sizes):

- ``serving_default``: ``images`` uint8 [batch, H, W, C], any H and W → ``features`` float32
  [batch, F], the pooled backbone output.
- ``embed`` (when an embedder is exported; ``train.py`` gives the query encoder): the same
  input → ``embedding`` float32 [batch, D], the L2-normalized projector output.
- ``serve_bytes``: ``image_bytes`` tf.string [batch] of encoded JPEG, PNG, GIF or BMP files
  (REST clients send ``{"b64": ...}``) → ``features``.  Each file is decoded to RGB (first
  frame of a GIF, alpha dropped) and, for C = 1, converted to grayscale (ITU-R 601 weights):
  TF's GIF and BMP decoders cannot produce one channel themselves.

Preprocessing, the same as evaluation: images already S×S are only scaled to [0, 1] and
normalized, ``(x - mean) / std`` (scalar or per-channel mean and std), exactly as
``data.eval_dataset`` does.  Any other size is first resized so that its shorter side is
``round(S / crop_fraction)`` (aspect ratio kept; bilinear with antialiasing, like PIL and
torchvision's ``Resize``), then centre-cropped to S×S (``crop_fraction`` 0.875: 256 → 224 for
ImageNet).

Bad input: a wrong rank or channel count fails in the graph with ``expected uint8 images
[batch, height, width, C]; got shape [...]`` (tf.Tensor input, TF Serving requests); NumPy input
from Python is stopped before, by the signature's binding, naming the expected
``TensorSpec(shape=(None, None, None, C), dtype=tf.uint8, name='images')``.  A tf.Tensor of
another dtype fails with "... was expected to be a uint8 tensor but is a float tensor".
Beware: the binding *casts* a NumPy array of another dtype to uint8 without a check, so
normalized float NumPy input silently gives wrong features; send uint8 pixels.  Undecodable
bytes fail in ``tf.io.decode_image`` ("Unknown image file format..." or the format's own
decode error).

Where a command writes (``caco-export``, ``caco-extract``): ``check_output`` refuses, before
any work, an output that exists or a path of the wrong kind (exit status 2) and a read-only
place (74); ``writing_output`` makes a write that fails one line (74) and removes what it wrote.
"""

import contextlib
import errno
import os
import shutil

import tensorflow as tf

from caco_tf.data import DEFAULT_CROP_FRACTION
from caco_tf.data.images import decode_image, preprocess
from caco_tf.errors import ConfigError
from caco_tf.serving import FORMATS
from caco_tf.training.run_folder import WriteError, errno_in, is_write_failure, write_advice


def expected_images(channels):
    """How the uint8 signatures' input is described in error messages."""
    return f"expected uint8 images [batch, height, width, {channels}]"


def check_images(images, channels):
    """Fail in the graph, with a readable message, when the rank or channel count is wrong.

    The signature's TensorSpec only stops NumPy input from Python: a tf.Tensor, or a TF Serving
    request, reaches the graph whatever its shape.
    """
    shape = tf.shape(images)
    # The rank is counted from the shape's values: grappler folds tf.rank / tf.size(shape) to
    # the 4 the signature declares, even when a tf.Tensor of another rank is passed.
    rank = tf.reduce_sum(tf.cast(shape >= 0, tf.int32))
    valid = tf.logical_and(tf.equal(rank, 4), tf.equal(shape[-1], channels))
    check = tf.debugging.Assert(valid, [expected_images(channels) + "; got shape", shape],
                                summarize=4)
    with tf.control_dependencies([check]):
        return tf.identity(images)


def _serving_root(functions):
    """The object to save: it tracks exactly the tf.Variables that the signatures read.

    Tracking the Keras models themselves would save each Keras variable twice (the
    ``keras.Variable`` and the tf.Variable it wraps) with the restore op writing one copy and the
    graph reading the other: TF2's loader copes, but TF Serving and ``saved_model_cli run``
    (the TF1 loader) then fail with "Could not find variable ..." (keras-team/keras#20095).
    ``keras.export.ExportArchive`` avoids it the same way.
    """
    root = tf.Module()
    variables = {}
    for function in functions:
        for variable in function.get_concrete_function().variables:
            variables.setdefault(id(variable), variable)
    root.served_variables = list(variables.values())
    return root


def _check_statistics(channels, **statistics):
    for name, value in statistics.items():
        size = tf.constant(value).shape.num_elements()
        if size not in (1, channels):
            raise ValueError(f"{name} must be a scalar or one value per channel ({channels}), "
                             f"got {value!r}")


def export_saved_model(backbone, path, image_size, channels, mean, std, embedder=None,
                       crop_fraction=DEFAULT_CROP_FRACTION):
    """Write the SavedModel (signatures in the module docstring) at ``path``; return it.

    ``mean`` and ``std`` are those of the training normalization, in [0, 1] pixel units.
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
    _check_statistics(channels, mean=mean, std=std)

    def normalized(images):
        return preprocess(check_images(images, channels), image_size, mean, std, crop_fraction)

    images_spec = tf.TensorSpec([None, None, None, channels], tf.uint8, name="images")

    # Both signatures call this one function: the backbone is traced (and saved) once.
    @tf.function(input_signature=[tf.TensorSpec([None, image_size, image_size, channels],
                                                tf.float32)], autograph=False)
    def features(pixels):
        return backbone(pixels, training=False)

    @tf.function(input_signature=[images_spec], autograph=False)
    def serve(images):
        return {"features": features(normalized(images))}

    def one_file(contents):
        return normalized(decode_image(contents, channels)[tf.newaxis])[0]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
                 autograph=False)
    def serve_bytes(image_bytes):
        # Files differ in size: decode and resize one by one, then run the backbone on the batch.
        images = tf.map_fn(
            one_file, image_bytes,
            fn_output_signature=tf.TensorSpec([image_size, image_size, channels], tf.float32))
        return {"features": features(images)}

    signatures = {"serving_default": serve, "serve_bytes": serve_bytes}
    if embedder is not None:
        @tf.function(input_signature=[images_spec], autograph=False)
        def embed(images):
            return {"embedding": embedder(normalized(images), training=False)}
        signatures["embed"] = embed

    tf.saved_model.save(_serving_root(signatures.values()), path, signatures=signatures)
    return path


def export_backbone(backbone, directory, image_size, channels, mean, std, embedder=None,
                    model_name="backbone", version=1, crop_fraction=DEFAULT_CROP_FRACTION):
    """``export_saved_model`` in TF Serving's layout: ``directory/<model_name>/<version>/``
    (TF Serving's ``--model_base_path`` is ``directory/<model_name>``); returns that path."""
    return export_saved_model(backbone, os.path.join(directory, model_name, str(version)),
                              image_size, channels, mean, std, embedder, crop_fraction)


def export_float_saved_model(backbone, path, embedder=None):
    """A SavedModel of what the backbone itself takes: ``images`` float32 [batch, H, W, C]
    (already normalized as in training) → ``features``; and → ``embedding`` (``embed``) with an
    embedder.  For a model that knows no preprocessing."""
    spec = tf.TensorSpec([None, *backbone.input_shape[1:]], tf.float32, name="images")

    @tf.function(input_signature=[spec], autograph=False)
    def serve(images):
        return {"features": backbone(images, training=False)}

    signatures = {"serving_default": serve}
    if embedder is not None:
        @tf.function(input_signature=[spec], autograph=False)
        def embed(images):
            return {"embedding": embedder(images, training=False)}
        signatures["embed"] = embed
    tf.saved_model.save(_serving_root(signatures.values()), path, signatures=signatures)
    return path


PREPROCESSING = ("image_size", "channels", "mean", "std")


def export_model(model, path, format="saved_model", serving_layout=False, version=1,
                 output="features", preprocessing=None, hub_class="auto"):
    """Export a method model (``caco_tf.methods``) in ``format``, preprocessing inside, from
    what the model knows of it (``model.preprocessing``, updated by ``preprocessing``).
    ``saved_model`` (also Keras' ``tf_saved_model``): at ``path``, or
    ``path/backbone/<version>/`` with ``serving_layout``; ``onnx``, ``litert``: one file at
    ``path`` (``caco_tf.serving.interop``; ``output``: ``features``, or ``embedding``);
    ``keras-hub``: a preset directory of ``hub_class`` (``caco_tf.serving.hub``).  A model
    that knows no preprocessing is exported as a SavedModel of float images
    (``export_float_saved_model``).  Returns the path written."""
    settings = dict(model.preprocessing or {}, **(preprocessing or {}))
    format = "saved_model" if format == "tf_saved_model" else format
    if format == "keras-hub":  # float images in, normalized as the preset's preprocessing.json
        from caco_tf.serving import hub

        return hub.export_preset(model.backbone, path, {
            key: settings[key] for key in PREPROCESSING if key in settings}, hub_class=hub_class)
    if not set(PREPROCESSING) <= set(settings):
        if format != "saved_model":
            raise ValueError(f"{format} export needs the model's preprocessing: pass "
                             f"{', '.join(PREPROCESSING)} (or build the model with "
                             f"caco_tf.build_model)")
        if serving_layout:
            path = os.path.join(path, "backbone", str(version))
        return export_float_saved_model(model.backbone, path, embedder=model.query_encoder)
    arguments = dict(image_size=settings["image_size"], channels=settings["channels"],
                     mean=settings["mean"], std=settings["std"])
    if format == "saved_model":
        crop = settings.get("crop_fraction", DEFAULT_CROP_FRACTION)
        if serving_layout:
            return export_backbone(model.backbone, path, embedder=model.query_encoder,
                                   version=version, crop_fraction=crop, **arguments)
        return export_saved_model(model.backbone, path, embedder=model.query_encoder,
                                  crop_fraction=crop, **arguments)
    if format in ("onnx", "litert"):
        from caco_tf.serving import interop

        network = model.backbone if output == "features" else model.query_encoder
        write = interop.export_onnx if format == "onnx" else interop.export_litert
        return write(network, path, output=output, **arguments)
    raise ValueError(f"format must be one of {', '.join(FORMATS)} (or tf_saved_model), got "
                     f"{format!r}")


# --- where a command writes its output -----------------------------------------------------------

def check_output(out, kind, option="--out", inside="", other_choice="", example=""):
    """Refuse, before any work, an output that a command (``caco-export``, ``caco-extract``)
    must not write, naming its ``option``: a ``ConfigError`` (exit status 2) for a path to
    change, a ``WriteError`` (74) for a place that cannot be written.

    ``kind`` "folder": ``out/inside`` is written whole, so it must be absent or an empty
    folder; "file": ``out`` must be absent (``example``: a file name to suggest when it is a
    folder).  An existing export is refused, never replaced.  The folders above it must be
    folders, the nearest existing one writable.  Returns nothing; writes nothing.
    """
    target = os.path.join(out, inside) if inside else out
    named = f"{option} {target}" if target == out else target
    instead = f"pass another {option}" + (f" or {other_choice}," if other_choice else "")
    missing = _outermost_missing(target)
    if missing is None and kind == "folder":
        if not os.path.isdir(target):
            raise ConfigError(f"{named} is a file, not a folder: {instead} or remove it")
        held = sorted(os.listdir(target))
        if held:
            listed = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise ConfigError(f"{named} already holds files ({listed}): {instead} or remove it")
    elif missing is None:
        if os.path.isdir(target):
            raise ConfigError(f"{named} is a folder, not a file: pass a file's path (e.g. "
                              f"{os.path.join(target, example or 'output')})")
        raise ConfigError(f"{named} already exists: {instead} or remove it")
    place = target if missing is None else os.path.dirname(missing)
    if not os.path.isdir(place):
        where = (f"{option} {out}" if place == os.path.abspath(out)
                 else f"{option} {out}: {place}")
        raise ConfigError(f"{where} is a file, not a folder: pass another {option} or remove it")
    if not os.access(place, os.W_OK | os.X_OK):
        code = errno.EROFS if os.statvfs(place).f_flag & os.ST_RDONLY else errno.EACCES
        raise WriteError(f"cannot write {target}: {os.strerror(code)}; make it writable or "
                         f"pass another {option}")


@contextlib.contextmanager
def writing_output(out, option="--out", inside=""):
    """Around a command's write of ``out/inside`` (checked by ``check_output``): a write that
    fails (a full disk, an I/O error; TensorFlow's, h5py's and Python's own) is one
    ``WriteError`` line (exit status 74) naming ``option``, and what was written of it is
    removed, so that the same command runs again once the disk is fixed."""
    target = os.path.join(out, inside) if inside else out
    missing = _outermost_missing(target)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        yield
    except (OSError, RuntimeError, tf.errors.OpError) as error:
        if not is_write_failure(error):
            raise
        if missing is not None:
            _remove(missing)
        elif os.path.isdir(target):  # an empty folder given: empty again
            for name in os.listdir(target):
                _remove(os.path.join(target, name))
        code = getattr(error, "errno", None) or errno_in(error)
        cause = os.strerror(code) if code else " ".join(str(error).split())
        raise WriteError(f"cannot write {target}: {cause}; {write_advice(code, 'it')} or pass "
                         f"another {option}") from None


def _outermost_missing(path):
    """The outermost of ``path`` and its parent folders that does not exist, or None."""
    path, missing = os.path.abspath(path), None
    while not os.path.lexists(path):
        path, missing = os.path.dirname(path), path
    return missing


def _remove(path):
    """Delete a file or a folder with what it holds, as far as it can be."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)
