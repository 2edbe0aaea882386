"""The backbone beyond SavedModel: ONNX (ONNX Runtime: Triton, C#, Java, the browser) and LiteRT
(TensorFlow Lite, on devices), the preprocessing inside, checked by their own runtimes.

Both take what the SavedModel's ``serving_default`` takes at the model's own size: uint8 images
``images`` [batch, S, S, C] (NHWC, any batch), scaled to [0, 1] and normalized with the
training mean and std inside the graph, and give ``features`` [batch, F] (or, exported from the
query encoder, ``embedding`` [batch, D], L2-normalized).  Unlike the SavedModel they do not
resize: send S×S images (the SavedModel's preprocessing: shorter side to round(S / 0.875), then
an S×S centre crop).  Why fixed: the antialiased resize (TensorFlow's ``ScaleAndTranslate``) has
no ONNX converter and no LiteRT kernel, and an approximation moves a ResNet-50's features by
more than 1e-4 of their scale.

- ONNX through ``tf2onnx.convert.from_function`` (opset 17): Keras' own ``export(format=
  "onnx")`` calls the same converter but exports the Keras model's float input only, without
  the preprocessing, and names its input and output after Keras' tensors.  ONNX Runtime refuses
  another dtype, rank or size by itself.
- LiteRT through TensorFlow's converter, builtin ops only (no Flex delegate needed), run by
  ``ai-edge-litert``'s interpreter.  The interpreter checks the dtype only: ``LiteRTModel``
  checks the rank and sizes before it runs.

The exporters need the optional packages of ``pip install "caco-tf[interop]"``.
"""

import numpy as np
import tensorflow as tf

from caco_tf.data.images import normalize_pixels, to_unit_float
from caco_tf.errors import UserError

ONNX_OPSET = 17


def _fixed_size_function(network, image_size, channels, mean, std, output):
    # NumPy constants: a tf.constant made outside the function would become an ONNX input.
    mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, image_size, image_size, channels],
                                                tf.uint8, name="images")])
    def serve(images):
        normalized = normalize_pixels(to_unit_float(images), mean, std)
        return {output: tf.cast(network(normalized, training=False), tf.float32)}

    return serve


def export_onnx(network, path, image_size, channels, mean, std, output="features"):
    """Write ``network`` (the backbone, or the query encoder for ``output="embedding"``) with
    its preprocessing as an ONNX model at ``path``; return ``path``."""
    try:
        import tf2onnx
    except ImportError:
        raise UserError('ONNX export needs tf2onnx: pip install "caco-tf[interop]"') from None
    function = _fixed_size_function(network, image_size, channels, mean, std, output)
    tf2onnx.convert.from_function(function, input_signature=function.input_signature,
                                  opset=ONNX_OPSET, output_path=path)
    return path


def export_litert(network, path, image_size, channels, mean, std, output="features"):
    """Write ``network`` with its preprocessing as a LiteRT (``.tflite``) model at ``path``."""
    function = _fixed_size_function(network, image_size, channels, mean, std, output)
    holder = tf.Module()
    # The tf.Variables themselves: handed the Keras model, the converter keeps its weights as
    # uninitialized variables and the model computes NaN.
    holder.weights = [getattr(v, "value", v) for v in network.variables]
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()], holder)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    with open(path, "wb") as handle:
        handle.write(converter.convert())
    return path


class OnnxModel:
    """An exported ONNX model in ONNX Runtime: ``model(images)`` → [batch, F]."""

    def __init__(self, path, threads=None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(path, options,
                                                    providers=["CPUExecutionProvider"])
        self.output = self.session.get_outputs()[0].name

    def __call__(self, images):
        return self.session.run([self.output], {"images": images})[0]


class LiteRTModel:
    """An exported LiteRT model in ``ai-edge-litert``'s interpreter: ``model(images)`` →
    [batch, F]; images of another dtype, rank or size are refused (``ValueError``), which the
    interpreter itself does not do for the rank and sizes."""

    def __init__(self, path, threads=None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=path, num_threads=threads)
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self.expected = [int(side) for side in self.input["shape_signature"]]  # -1: any batch
        self.batch = None

    def __call__(self, images):
        images = np.asarray(images)
        if images.dtype != self.input["dtype"]:
            raise ValueError(f"expected {np.dtype(self.input['dtype']).name} images, got "
                             f"{images.dtype}")
        if images.ndim != len(self.expected) or any(
                want not in (-1, got) for want, got in zip(self.expected, images.shape)):
            raise ValueError(f"expected images of shape {self.expected} (-1: any), got "
                             f"{list(images.shape)}")
        if images.shape[0] != self.batch:  # a new batch size: resize, allocate once
            self.interpreter.resize_tensor_input(self.input["index"], images.shape)
            self.interpreter.allocate_tensors()
            self.batch = images.shape[0]
        self.interpreter.set_tensor(self.input["index"], images)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"])
