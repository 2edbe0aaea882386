"""Networks: backbones (images → pooled features), the projector, and the layers they use.

- ``backbones``: ResNet-50 and ResNet-18 (torchvision layout and names), CIFAR ResNet-18, a
  small ConvNet, and CaCo's 3-layer projection MLP;
- ``sizes``: the feature-map size each backbone leaves of an image (no TensorFlow needed), so
  that a configuration is checked before anything is built;
- ``layers``: BatchNormalization with a fused CPU path and float64 synchronized statistics,
  precise-BatchNorm re-estimation;
- ``profiling``: FLOPs of a Keras model, for the benchmarks' utilization figures.
"""
