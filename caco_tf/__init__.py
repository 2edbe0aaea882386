"""caco-tf: CaCo (cooperative-adversarial contrastive learning) in Keras 3 / TensorFlow."""

import os

# TensorFlow's default CPU allocator leaves every tensor over glibc's 32 MB mmap ceiling (a
# K=65,536 bank is 64 MB) to a fresh mmap, so each step page-faults its bank-sized tensors anew;
# the BFC pool (what TensorFlow uses on GPUs) keeps and reuses them.  It halved the bank part of
# a step at K=65,536 (README "Performance").  Read when TensorFlow's runtime starts; an explicit
# TF_CPU_ALLOCATOR_USE_BFC=false in the environment wins.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
