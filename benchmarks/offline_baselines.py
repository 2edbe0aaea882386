"""Reference points for the offline default: raw pixels and the untrained encoder.

    python benchmarks/offline_baselines.py [--data mnist|mnist_validation] [--linear]

Raw pixels and the untrained backbone of the offline default itself (``configs/mnist.yaml``:
the same small ConvNet, 2×2 grid pooling included, as ``train.py`` builds it; training seeds
0, 1, 2), evaluated exactly as a pre-trained backbone is: weighted kNN top-1 (k=5, T=0.07) on
L2-normalized features, and with ``--linear`` the linear protocol (``caco-evaluate linear``'s
defaults, λ by cross-validation), so the gain from pre-training reads off directly.  Prints the
table (docs/results.md holds it).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402


def main(argv=None):
    import keras
    import numpy as np

    from caco_tf import RunSettings, build_model, load_config, load_data, run_views
    from caco_tf.data import eval_dataset
    from caco_tf.evaluation import knn, linear

    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__, output=False)
    parser.add_argument("--data", default="mnist", choices=("mnist", "mnist_validation"))
    parser.add_argument("--linear", action="store_true", help="also the linear protocol")
    parser.add_argument("--seeds", type=int, default=3, help="untrained encoders, seeds 0..N-1")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds = 1
    config = load_config(os.path.join(_harness.ROOT, "configs", "mnist.yaml"),
                         [f"data.source={args.data}"])
    train, test = load_data(RunSettings.of(config).data)
    views = run_views(config)
    preprocessing = linear.Preprocessing(28, 1, views.mean, views.std)

    def pixels(x):
        flat = x.reshape(len(x), -1).astype("float32")
        return flat / np.linalg.norm(flat, axis=1, keepdims=True)

    rows = [("raw pixels", 100 * knn.knn_accuracy(
        pixels(train.images), train.labels, pixels(test.images), test.labels, k=5,
        temperature=0.07), None)]
    for seed in range(args.seeds):
        keras.utils.set_random_seed(seed)  # as train.py seeds the weights (train.seed)
        backbone = build_model(config, steps_per_epoch=1).backbone
        train_f = knn.extract_features(backbone, eval_dataset(train.images, 500,
                                                              views.normalize))
        test_f = knn.extract_features(backbone, eval_dataset(test.images, 500, views.normalize))
        accuracy = 100 * knn.knn_accuracy(train_f, train.labels, test_f, test.labels, k=5,
                                          temperature=0.07)
        probe = None
        if args.linear:
            probe = linear.linear_evaluation(backbone, train, test, 10, preprocessing)["top1"]
        rows.append((f"untrained encoder of configs/mnist.yaml (grid pooling), seed {seed}",
                     accuracy, probe))
    print(f"`{_harness.command_line(__file__, argv)}`\n")
    print("| encoder | kNN top-1 (k=5, T=0.07) | linear top-1 |\n|---|---|---|")
    for name, accuracy, probe in rows:
        print(f"| {name} | {accuracy:.1f} % | {'–' if probe is None else f'{probe:.1f} %'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
