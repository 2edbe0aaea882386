"""Reference points for the offline default's held-out kNN top-1 (k=5, T=0.07).

    python benchmarks/offline_baselines.py

Raw pixels and the untrained small ConvNet (3 seeds), evaluated exactly as train.py evaluates a
pre-trained backbone, so the pre-training gain reads off directly.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from caco_tf import data  # noqa: E402
from caco_tf.data import augment  # noqa: E402
from caco_tf.evaluation import knn as evaluation  # noqa: E402
from caco_tf.nets import backbones  # noqa: E402


def main():
    split = data.load_offline_mnist()
    (train_x, train_y), (test_x, test_y) = split["train"], split["test"]
    views = augment.DigitViews()

    def pixels(x):
        flat = x.reshape(len(x), -1).astype("float32")
        return flat / np.linalg.norm(flat, axis=1, keepdims=True)

    rows = [("raw pixels", 100 * evaluation.knn_accuracy(
        pixels(train_x), train_y, pixels(test_x), test_y, k=5, temperature=0.07))]
    for seed in range(3):
        keras.utils.set_random_seed(seed)
        backbone = backbones.build_backbone("small_convnet", (28, 28, 1))
        train_f = evaluation.extract_features(
            backbone, data.eval_dataset(train_x, 500, views.normalize))
        test_f = evaluation.extract_features(
            backbone, data.eval_dataset(test_x, 500, views.normalize))
        rows.append((f"untrained small ConvNet, seed {seed}", 100 * evaluation.knn_accuracy(
            train_f, train_y, test_f, test_y, k=5, temperature=0.07)))
    print("| encoder | held-out kNN top-1 (k=5, T=0.07) |\n|---|---|")
    for name, accuracy in rows:
        print(f"| {name} | {accuracy:.1f} % |")


if __name__ == "__main__":
    main()
