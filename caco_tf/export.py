"""Export of the backbone as a TF Serving SavedModel: ``OUT/<model_name>/<version>/``.

The graph takes uint8 images and does resizing and normalization itself, so a serving client
sends raw pixels, and a process that imports neither keras nor caco_tf can load it.
"""

import os

import tensorflow as tf


class _BackboneModule(tf.Module):
    def __init__(self, backbone, embedder, image_size, channels, mean, std):
        super().__init__()
        self.backbone = backbone
        self.embedder = embedder
        self.image_size = image_size
        self.channels = channels
        self.mean = tf.constant(mean, tf.float32)
        self.std = tf.constant(std, tf.float32)

    def preprocess(self, images):
        images = tf.cast(images, tf.float32) / 255.0
        images = tf.image.resize(images, [self.image_size, self.image_size])
        return (images - self.mean) / self.std


def export_backbone(backbone, directory, image_size, channels, mean, std, embedder=None,
                    model_name="backbone", version=1):
    """Write the SavedModel and return its version directory.

    Signatures: ``serving_default`` (uint8 [B, H, W, C] → ``features`` [B, F]) and, when an
    ``embedder`` (the query encoder) is given, ``embed`` (→ ``embedding`` [B, D], L2-normalized).
    """
    module = _BackboneModule(backbone, embedder, image_size, channels, mean, std)
    spec = tf.TensorSpec([None, None, None, channels], tf.uint8, name="images")

    @tf.function(input_signature=[spec])
    def serve(images):
        return {"features": module.backbone(module.preprocess(images), training=False)}

    signatures = {"serving_default": serve}
    if embedder is not None:
        @tf.function(input_signature=[spec])
        def embed(images):
            return {"embedding": module.embedder(module.preprocess(images), training=False)}
        signatures["embed"] = embed

    path = os.path.join(directory, model_name, str(version))
    tf.saved_model.save(module, path, signatures=signatures)
    return path
