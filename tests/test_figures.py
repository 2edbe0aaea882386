"""The analysis figures: MPP and surrogate selection against NumPy, t-SNE on separable
clusters, and the three PNGs from a (tiny, mocked-TFDS) run folder."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from matplotlib.image import imread

from caco_tf.cli import figures as figures_cli
from caco_tf.evaluation import figures
from tiny_run import make_run


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_surrogates_are_the_most_similar_training_embeddings():
    rng = np.random.default_rng(0)
    train = _unit(rng.normal(size=(50, 8)))
    chosen = rng.integers(0, 50, size=12)
    bank = _unit(train[chosen] + 0.01 * rng.normal(size=(12, 8)))
    np.testing.assert_array_equal(figures.surrogates(bank, train, chunk=5), chosen)
    bank = _unit(rng.normal(size=(30, 8)))
    np.testing.assert_array_equal(figures.surrogates(bank, train),
                                  np.argmax(bank @ train.T, axis=1))


def test_query_examples_pick_the_mpp_and_distinct_negatives():
    rng = np.random.default_rng(1)
    bank = rng.normal(size=(40, 8)) * rng.uniform(0.5, 2.0, size=(40, 1))  # rows of any norm
    keys = _unit(rng.normal(size=(5, 8)))
    train = _unit(rng.normal(size=(60, 8)))
    examples = figures.query_examples(keys, bank, train, negatives=6, temperature=0.1, seed=0)
    logits = keys @ _unit(bank).T / 0.1  # against the L2-normalized bank, as in training
    np.testing.assert_array_equal(examples["positive"], np.argmax(logits, axis=1))
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(examples["probability"], softmax.max(1), rtol=1e-5)
    for positive, negatives in zip(examples["positive"], examples["negatives"]):
        assert positive not in negatives and len(set(negatives)) == 6
    nearest = np.argmax(_unit(bank) @ train.T, axis=1)  # every row's surrogate
    np.testing.assert_array_equal(examples["positive_surrogate"],
                                  nearest[examples["positive"]])
    np.testing.assert_array_equal(examples["negative_surrogates"],
                                  nearest[examples["negatives"]])


@pytest.mark.slow
def test_tsne_keeps_separable_clusters_apart_and_is_seeded():
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(3), 20)
    features = 5.0 * rng.normal(size=(3, 16))[labels] + 0.3 * rng.normal(size=(60, 16))
    points = figures.tsne(features, seed=0)
    assert points.shape == (60, 2)
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    np.fill_diagonal(distance, np.inf)
    assert np.all(labels[np.argmin(distance, axis=1)] == labels)  # 1-NN, leave one out
    np.testing.assert_allclose(figures.tsne(features, seed=0), points)


HISTORY = [{"epoch": e, "mpp_prob": 0.01 * e, **({"knn_top1": 50.0 + e} if e % 2 == 0 else {})}
           for e in range(1, 7)]


@pytest.mark.parametrize("history", [HISTORY, [{k: v for k, v in row.items() if k != "knn_top1"}
                                               for row in HISTORY]])
def test_prob_acc_plot_with_and_without_the_monitor(history, tmp_path):
    path = figures.plot_prob_acc(history, str(tmp_path / "prob_acc.png"), warmup_epochs=2)
    image = imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 500


@pytest.mark.slow
def test_the_three_figures_from_a_run_folder(tmp_path, capsys):
    run_dir, _ = make_run(tmp_path / "run", history=HISTORY)
    with tfds.testing.mock_data(num_examples=40):
        status = figures_cli.main(["--run", run_dir, "--points", "30", "--queries", "3",
                                   "--negatives", "4"])
    assert status == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.rsplit("/", 1)[-1] for line in out] == ["prob_acc.png", "t_sne.png",
                                                         "query_ex.png"]
    for line in out:
        assert imread(line.split("figure: ", 1)[1]).shape[0] > 200


def test_not_a_run_folder_is_a_one_line_error(tmp_path, capsys):
    assert figures_cli.main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no config.yaml in") and len(err.strip().splitlines()) == 1
