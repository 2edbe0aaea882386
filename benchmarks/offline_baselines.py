"""Reference points for the offline default: raw pixels and the untrained encoder.

    python benchmarks/offline_baselines.py [--data mnist|mnist_validation] [--linear]

Raw pixels and the untrained backbone of the offline default itself (``configs/mnist.yaml``:
the same small ConvNet, 2×2 grid pooling included, as ``train.py`` builds it; training seeds
0, 1, 2), evaluated exactly as a pre-trained backbone is: weighted kNN top-1 (k=5, T=0.07) on
L2-normalized features, and with ``--linear`` the linear protocol (``caco-evaluate linear``'s
defaults, λ by cross-validation), so the gain from pre-training reads off directly.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from caco_tf import build, data  # noqa: E402
from caco_tf.evaluation import knn, linear  # noqa: E402
from caco_tf.training.config import load_config  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="mnist", choices=("mnist", "mnist_validation"))
    parser.add_argument("--linear", action="store_true", help="also the linear protocol")
    args = parser.parse_args(argv)
    config = load_config(os.path.join(ROOT, "configs", "mnist.yaml"),
                         [f"data.source={args.data}"])
    train, test = build.load_data(config)
    views = build.build_views(config)
    preprocessing = linear.Preprocessing(28, 1, views.mean, views.std)

    def pixels(x):
        flat = x.reshape(len(x), -1).astype("float32")
        return flat / np.linalg.norm(flat, axis=1, keepdims=True)

    rows = [("raw pixels", 100 * knn.knn_accuracy(
        pixels(train.images), train.labels, pixels(test.images), test.labels, k=5,
        temperature=0.07), None)]
    for seed in range(3):
        keras.utils.set_random_seed(seed)  # as train.py seeds the weights (train.seed)
        backbone = build.build_model(config, steps_per_epoch=1).backbone
        train_f = knn.extract_features(backbone, data.eval_dataset(train.images, 500,
                                                                   views.normalize))
        test_f = knn.extract_features(backbone, data.eval_dataset(test.images, 500,
                                                                  views.normalize))
        accuracy = 100 * knn.knn_accuracy(train_f, train.labels, test_f, test.labels, k=5,
                                          temperature=0.07)
        probe = None
        if args.linear:
            probe = linear.linear_evaluation(backbone, train, test, 10, preprocessing)["top1"]
        rows.append((f"untrained encoder of configs/mnist.yaml (grid pooling), seed {seed}",
                     accuracy, probe))
    print(f"`python benchmarks/offline_baselines.py --data {args.data}"
          f"{' --linear' if args.linear else ''}`\n")
    print("| encoder | kNN top-1 (k=5, T=0.07) | linear top-1 |\n|---|---|---|")
    for name, accuracy, probe in rows:
        print(f"| {name} | {accuracy:.1f} % | {'–' if probe is None else f'{probe:.1f} %'} |")


if __name__ == "__main__":
    main()
