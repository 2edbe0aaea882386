"""Weighted kNN against a brute-force NumPy version."""

import numpy as np

from caco_tf import evaluation


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_knn(train, labels, test, k, temperature, classes):
    predictions = []
    for query in test:
        similarity = train @ query
        top = np.argsort(-similarity)[:k]
        votes = np.zeros(classes)
        for index in top:
            votes[labels[index]] += np.exp(similarity[index] / temperature)
        predictions.append(np.argmax(votes))
    return np.array(predictions)


def test_knn_matches_numpy():
    rng = np.random.default_rng(0)
    train, test = _unit(rng.normal(size=(200, 16))), _unit(rng.normal(size=(50, 16)))
    labels = rng.integers(0, 4, size=200)
    for k, temperature in [(1, 0.07), (5, 0.07), (20, 0.5)]:
        got = evaluation.knn_predict(train, labels, test, k, temperature, num_classes=4, chunk=7)
        np.testing.assert_array_equal(got, numpy_knn(train, labels, test, k, temperature, 4))


def test_weighting_can_overrule_majority():
    train = _unit(np.array([[1.0, 0.0], [0.0, 1.0], [0.1, 1.0]]))
    labels = np.array([0, 1, 1])
    query = _unit(np.array([[1.0, 0.05]]))
    # Two far neighbours of class 1 against one very close neighbour of class 0.
    assert evaluation.knn_predict(train, labels, query, k=3, temperature=0.07)[0] == 0
    assert evaluation.knn_predict(train, labels, query, k=3, temperature=100.0)[0] == 1


def test_knn_accuracy_on_separable_clusters():
    rng = np.random.default_rng(1)
    centres = _unit(rng.normal(size=(3, 8)))
    labels = np.repeat(np.arange(3), 30)
    train = _unit(centres[labels] + 0.05 * rng.normal(size=(90, 8)))
    test = _unit(centres[labels] + 0.05 * rng.normal(size=(90, 8)))
    assert evaluation.knn_accuracy(train, labels, test, labels, k=5) == 1.0
    assert evaluation.knn_accuracy(train, labels, test, (labels + 1) % 3, k=5) == 0.0
