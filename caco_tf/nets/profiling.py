"""Model FLOPs of a training step, counted from the layers (for the utilization figure).

TensorFlow 2.21 exposes XLA's HLO (``experimental_get_compiler_ir``) but no public cost
analysis, and the TF1 profiler has no FLOP statistics for the convolution back-propagation ops;
so the count is analytical.  Convention (the usual one for model-FLOPs utilization):

* FLOPs = 2 × multiply-adds of the convolutions and matrix products; BatchNorm, ReLU, pooling,
  residual adds and the optimizer's element-wise updates are left out (about 1 % of a ResNet);
* a backward pass costs twice its forward pass (gradients of the inputs and of the weights);
* each layer is counted once, at the shapes of its first call, per example.
"""

import math

import keras

from caco_tf.nets.layers import NormalizedDense

__all__ = ["CACO_BANK_MATMULS", "MOCO_BANK_MATMULS", "bank_matmul_flops", "forward_flops",
           "layer_forward_flops", "method_step_flops", "train_step_flops"]

# [B, D] × [D, K] products of one step, both views together (see ``train_step_flops``).
# CaCo: MPP of the two keys (2), loss logits of the two queries (2) and their gradient with
# respect to the queries (2), the bank gradient, which recomputes the logits and back-propagates
# them to the bank (2 + 2).  The step's diagnostics (contrast accuracy, MPP probability) are not
# model FLOPs and are not counted.
CACO_BANK_MATMULS = 10
# MoCo v2: logits of the two queries against the queue (2) and their gradient (2).
MOCO_BANK_MATMULS = 4

_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)


def _known(dims, layer):
    if any(d is None for d in dims):
        raise ValueError(f"layer {layer.name!r} has an unknown output size {dims}: build the "
                         "model with a fixed input shape to count its FLOPs")
    return dims


def layer_forward_flops(layer):
    """Forward FLOPs of one call of ``layer`` on one example (0 for parameter-free layers).

    Nested models are summed over their layers.  A layer with a kernel of a type not counted
    here raises, rather than silently leaving its products out.
    """
    if isinstance(layer, keras.Model):
        return forward_flops(layer)
    if isinstance(layer, _CONVOLUTIONS):
        shape = tuple(layer.output.shape)
        spatial = shape[1:-1] if layer.data_format == "channels_last" else shape[2:]
        # kernel: (*window, input channels per group, filters): one multiply-add per entry
        # for every output position.
        return 2 * math.prod(_known(spatial, layer)) * math.prod(layer.kernel.shape)
    if isinstance(layer, keras.layers.Dense):
        # Leading dimensions other than the batch (a Dense on sequences) multiply the count.
        positions = math.prod(_known(tuple(layer.output.shape)[1:-1], layer))
        return 2 * positions * math.prod(layer.kernel.shape)
    if isinstance(layer, NormalizedDense):  # a product with its (normalized) kernel
        return 2 * math.prod(layer.kernel.shape)
    if hasattr(layer, "kernel"):
        raise NotImplementedError(f"no FLOP count for layer {layer.name!r} "
                                  f"({type(layer).__name__})")
    return 0


def forward_flops(model):
    """Forward FLOPs of ``model`` per example: its convolutions and dense layers."""
    return sum(layer_forward_flops(layer) for layer in model.layers)


def bank_matmul_flops(batch, bank_size, dim, matmuls):
    """FLOPs of ``matmuls`` products of a [batch, dim] matrix with the [bank_size, dim] bank."""
    return matmuls * 2 * batch * bank_size * dim


def train_step_flops(encoder_flops, batch, bank_size=0, dim=0,
                     bank_matmuls=CACO_BANK_MATMULS):
    """Model FLOPs of one two-view step with a query and a momentum key encoder.

    ``encoder_flops``: forward FLOPs of one encoder (backbone + projector) per image.  Per
    image of the batch: the query encoder's forward and backward on both views (2 × 3) and the
    key encoder's forward on both views (2 × 1), i.e. 8 encoder forwards; plus the step's
    products with the bank (``bank_matmuls``, see ``CACO_BANK_MATMULS``).
    """
    return 8 * encoder_flops * batch + bank_matmul_flops(batch, bank_size, dim, bank_matmuls)


def method_step_flops(model, crop_sizes, batch, config):
    """Counted model FLOPs of one training step of a method's ``model`` (``Method``) on
    ``batch`` images cut into crops of ``crop_sizes`` pixels: the student's forward on every
    crop three times (forward and backward), the momentum teacher's forward on the two global
    crops, and the products with a bank, a queue or a support set; ``config`` (the run's)
    rebuilds a multi-crop backbone at each crop's size."""
    def network(part, size):
        if None not in part.input_shape[1:3]:
            return forward_flops(part)
        # A multi-crop network takes any size: its backbone built again at this crop's size,
        # then its projector (on pooled features, the same at every size).
        from caco_tf.nets import backbones

        settings = config["model"]
        fixed = backbones.build_backbone(settings["backbone"],
                                         (size, size, part.input_shape[-1]),
                                         widths=settings["widths"],
                                         pool_grid=settings["pool_grid"])
        return forward_flops(fixed) + forward_flops(model.projector)

    def head(layer):  # a functional head, or one layer called outside a graph (prototypes)
        return (forward_flops(layer) if isinstance(layer, keras.Model)
                else 2 * math.prod(layer.kernel.shape) if hasattr(layer, "kernel") else 0)

    heads = sum(head(h) for h in model.heads)
    student = sum(network(model.query_encoder, size) + heads for size in crop_sizes)
    teacher = 0
    if model.TEACHER == "momentum":
        teacher = 2 * network(model.key_encoder, crop_sizes[0])
    rows = 0  # rows of a bank, queue or support set each view's embedding meets
    if model.memory_bank is not None and model.method == "caco":
        rows = model.memory_bank.size * CACO_BANK_MATMULS / 2
    elif model.memory_bank is not None:
        rows = model.memory_bank.size * MOCO_BANK_MATMULS / 2
    elif getattr(model, "support_set", None) is not None:
        rows = model.support_set.size  # the nearest-neighbour search, no gradient
    return batch * (3 * student + teacher) + 2 * 2 * batch * rows * model.embedding_dim
