"""Networks: backbones (images → pooled features), the projector, and the layers they use.

- ``backbones``: ResNet-50 (torchvision v1.5 layout and names), CIFAR ResNet-18, a small
  ConvNet, and CaCo's 3-layer projection MLP;
- ``layers``: BatchNormalization with a fused CPU path and float64 synchronized statistics,
  precise-BatchNorm re-estimation;
- ``profiling``: FLOPs of a Keras model, for the benchmarks' utilization figures.
"""

from caco_tf.nets.backbones import BACKBONE_NAMES, build_backbone, build_projector

__all__ = ["BACKBONE_NAMES", "build_backbone", "build_projector"]
