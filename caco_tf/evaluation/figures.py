"""The paper's analysis figures from a run folder, as matplotlib PNGs.

    caco-figures --run RUN_DIR [--out DIR] [--queries 6] [--negatives 6]
                 [--points 1000] [--max-train 20000] [--seed 0]

Writes into ``DIR`` (default ``RUN_DIR/figures``):

- ``prob_acc.png`` (Fig. prob_acc): the mean maximum positive probability max_j p(b_j | k)
  (history ``mpp_prob``) and the kNN monitor's held-out top-1 (history ``knn_top1``, from
  ``evaluation.monitor.KNNMonitor``) over the epochs;
- ``t_sne.png`` (Fig. t_sne): t-SNE of L2-normalized held-out backbone features, coloured by
  class;
- ``query_ex.png`` (Fig. query_ex): random held-out queries, the surrogate of their Most
  Probable Positive bank row and of random negative rows.  MPP: j+ = argmax_j k·b̂_j for the
  query's key embedding k (key encoder, as in training); the surrogate of a bank row is the
  training image whose key embedding is the most similar to it (the bank holds no images).

The model is rebuilt from the run's ``config.yaml`` and ``checkpoints/last.weights.h5``; the
images are the run's own training and held-out splits.
"""

import math
import os

import numpy as np
import tensorflow as tf
from matplotlib.figure import Figure  # no pyplot: no GUI backend needed
from matplotlib.ticker import MaxNLocator

from caco_tf import losses
from caco_tf.build import load_run, method_settings
from caco_tf.methods.caco import CaCo
from caco_tf.evaluation import knn, linear, protocols
from caco_tf.errors import DataError
from caco_tf.training import run_folder
from caco_tf.training.run_folder import RunFolder

MONITOR_KEY = "knn_top1"  # what evaluation.monitor.KNNMonitor writes into the logs


# ---------------------------------------------------------------------------- Fig. prob_acc
def read_history(run_dir):
    """history.json: one dict of metrics per finished epoch ([] if absent)."""
    path = RunFolder(run_dir).history
    try:
        return run_folder.read_history(path)
    except ValueError as error:
        raise DataError(f"cannot read {path}: {error}; restore it, or move it away to draw "
                        f"the figures without it") from None


def plot_prob_acc(history, path, warmup_epochs=0, title="CaCo pre-training",
                  monitor_label="held-out kNN top-1"):
    """Mean max positive probability (left axis) and kNN top-1 (right axis) over epochs."""
    figure = Figure(figsize=(7, 4.2), dpi=120)
    axis = figure.add_subplot()
    epochs = [row["epoch"] for row in history if "mpp_prob" in row]
    probability = [row["mpp_prob"] for row in history if "mpp_prob" in row]
    if warmup_epochs:
        axis.axvspan(0.5, warmup_epochs + 0.5, color="0.9", label="MoCo-style warm-up")
    axis.plot(epochs, probability, color="tab:blue", marker=".", label="mean max positive prob.")
    axis.set_xlabel("epoch")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_ylabel("mean max positive probability", color="tab:blue")
    axis.tick_params(axis="y", labelcolor="tab:blue")
    axis.set_ylim(bottom=0)
    handles, labels = axis.get_legend_handles_labels()
    monitored = [(row["epoch"], row[MONITOR_KEY]) for row in history if MONITOR_KEY in row]
    if monitored:
        accuracy_axis = axis.twinx()
        x, y = zip(*monitored)
        accuracy_axis.plot(x, y, color="tab:orange", marker="o", label=monitor_label)
        accuracy_axis.set_ylabel("kNN top-1 (%)", color="tab:orange")
        accuracy_axis.tick_params(axis="y", labelcolor="tab:orange")
        more_handles, more_labels = accuracy_axis.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    else:
        axis.text(0.98, 0.03, "no kNN monitor in this run\n(evaluation.knn_monitor_every)",
                  transform=axis.transAxes, ha="right", va="bottom", fontsize=8, color="0.4")
    axis.legend(handles, labels, loc="upper left", fontsize=8)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


# ---------------------------------------------------------------------------- Fig. t_sne
def tsne(features, seed=0, perplexity=30.0):
    """2-D t-SNE of ``features`` [N, F] (scikit-learn's Barnes-Hut t-SNE, PCA init)."""
    from sklearn.manifold import TSNE

    perplexity = min(perplexity, (len(features) - 1) / 3.0)
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed,
                learning_rate="auto").fit_transform(np.asarray(features, np.float64))


def plot_tsne(points, labels, path, title="t-SNE of held-out backbone features",
              class_names=None):
    """Scatter of 2-D points coloured by class, with a legend of the classes."""
    figure = Figure(figsize=(6.4, 5.6), dpi=120)
    axis = figure.add_subplot()
    classes = np.unique(labels)
    colours = _colours(len(classes))
    for colour, label in zip(colours, classes):
        chosen = labels == label
        name = class_names[label] if class_names is not None else str(label)
        axis.scatter(points[chosen, 0], points[chosen, 1], s=7, color=colour, label=name,
                     alpha=0.8, linewidths=0)
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_xlabel("t-SNE 1")
    axis.set_ylabel("t-SNE 2")
    axis.set_title(title)
    axis.legend(title="class", fontsize=8, markerscale=2.5, loc="center left",
                bbox_to_anchor=(1.0, 0.5), frameon=False)
    figure.tight_layout()
    figure.savefig(path)
    return path


def _colours(count):
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20" if count <= 20 else "turbo"]
    return [cmap(i if count <= 20 else i / max(1, count - 1)) for i in range(count)]


# ---------------------------------------------------------------------------- Fig. query_ex
def surrogates(bank_unit, train_embeddings, chunk=4096):
    """For each bank row, the index of the training embedding most similar (cosine) to it."""
    train_embeddings = tf.convert_to_tensor(train_embeddings, tf.float32)
    bank_unit = tf.convert_to_tensor(bank_unit, tf.float32)
    return np.concatenate([
        tf.argmax(tf.matmul(bank_unit[start:start + chunk], train_embeddings,
                            transpose_b=True), axis=-1).numpy()
        for start in range(0, int(bank_unit.shape[0]), chunk)])


def query_examples(query_keys, bank, train_embeddings, negatives=6, temperature=0.1, seed=0):
    """MPP and random negative bank rows for each query, and the surrogates of those rows.

    Returns dict: ``positive`` [Q] (j+), ``probability`` [Q] (p(b_j+ | k)), ``negatives``
    [Q, n] (rows ≠ j+, drawn uniformly), ``positive_surrogate`` [Q] and
    ``negative_surrogates`` [Q, n] (training image indices).
    """
    bank_unit = losses.l2_normalize(tf.convert_to_tensor(bank, tf.float32))
    query_keys = tf.convert_to_tensor(query_keys, tf.float32)
    positive = losses.most_probable_positive(query_keys, bank_unit).numpy()
    probability = tf.reduce_max(tf.nn.softmax(
        tf.matmul(query_keys, bank_unit, transpose_b=True) / temperature), axis=-1).numpy()
    rng = np.random.default_rng(seed)
    rows = int(bank_unit.shape[0])
    negative = np.stack([rng.choice(np.delete(np.arange(rows), j), size=negatives,
                                    replace=False) for j in positive])
    row_surrogate = {}
    needed = np.unique(np.concatenate([positive, negative.ravel()]))
    for row, image in zip(needed, surrogates(tf.gather(bank_unit, needed), train_embeddings)):
        row_surrogate[int(row)] = int(image)
    return {"positive": positive, "probability": probability, "negatives": negative,
            "positive_surrogate": np.array([row_surrogate[int(j)] for j in positive]),
            "negative_surrogates": np.vectorize(lambda j: row_surrogate[int(j)])(negative)}


def plot_query_examples(query_images, query_labels, examples, train_images, train_labels,
                        path, title="Surrogates of the MPP and of random negatives"):
    """One row per query: the query, its MPP's surrogate, then the negatives' surrogates.

    Surrogate captions are their class, green when it is the query's, red otherwise.
    """
    queries, negatives = examples["negatives"].shape
    columns = 2 + negatives
    width, height = max(6.5, 1.25 * columns + 0.4), 1.35 * queries + 0.9
    figure = Figure(figsize=(width, height), dpi=120)
    # 0.9 inch at the top for the title and the column headers, whatever the row count.
    grid = figure.add_gridspec(queries, columns, wspace=0.08, hspace=0.45,
                               top=1 - 0.9 / height, bottom=0.2 / height)

    def show(row, column, image, caption, colour="black", header=None):
        axis = figure.add_subplot(grid[row, column])
        image = np.asarray(image)
        if image.ndim == 3 and image.shape[-1] == 1:
            axis.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1)
        else:
            axis.imshow(np.clip(image, 0, 1))
        axis.set_xticks([])
        axis.set_yticks([])
        axis.set_xlabel(caption, color=colour, fontsize=8, labelpad=2)
        if header:
            axis.set_title(header, fontsize=9, fontweight="bold")
        if column == 1:  # set the MPP column apart
            for spine in axis.spines.values():
                spine.set_edgecolor("tab:blue")
                spine.set_linewidth(2)

    for q in range(queries):
        label = query_labels[q]
        show(q, 0, query_images[q], f"class {label}", header="query" if q == 0 else None)
        image = examples["positive_surrogate"][q]
        caption = f"{train_labels[image]} (p={examples['probability'][q]:.3f})"
        show(q, 1, train_images[image], caption, _match_colour(train_labels[image], label),
             header="MPP" if q == 0 else None)
        for n in range(negatives):
            image = examples["negative_surrogates"][q, n]
            show(q, 2 + n, train_images[image], f"{train_labels[image]}",
                 _match_colour(train_labels[image], label),
                 header=f"negative {n + 1}" if q == 0 else None)
    figure.suptitle(f"{title}\ncaption: the surrogate's class (green: the query's class); "
                    f"p: the MPP's probability", fontsize=9, y=1 - 0.1 / height, va="top")
    figure.savefig(path, bbox_inches="tight")
    return path


def _match_colour(label, query_label):
    return "tab:green" if label == query_label else "tab:red"


# ---------------------------------------------------------------------------- from a run
def _images_at(batches, preprocessing, indices):
    """The images at ``indices`` of (normalized images, labels) batches, in [0, 1] to show."""
    wanted = {int(i) for i in indices}
    found, start = {}, 0
    for images, _ in batches:
        for offset in range(int(images.shape[0])):
            if start + offset in wanted:
                found[start + offset] = images[offset].numpy()
        start += int(images.shape[0])
        if len(found) == len(wanted):
            break
    pixels = np.stack([found[int(i)] for i in indices])
    return pixels * np.asarray(preprocessing.std) + np.asarray(preprocessing.mean)


def make_figures(run_dir, out_dir=None, queries=6, negatives=6, points=1000, max_train=20000,
                 seed=0):
    """Write the three PNGs for ``run_dir``; returns their paths."""
    run = load_run(run_dir)
    config, evaluation_config = run.config, run.config["evaluation"]
    out_dir = out_dir or RunFolder(run_dir).figures
    os.makedirs(out_dir, exist_ok=True)
    name = config.get("name", os.path.basename(os.path.normpath(run_dir)))
    monitor = (f"held-out kNN top-1 (k={evaluation_config['knn_monitor_k']}, "
               f"T={evaluation_config['knn_monitor_temperature']:g})")
    paths = [plot_prob_acc(read_history(run_dir), os.path.join(out_dir, "prob_acc.png"),
                           warmup_epochs=method_settings(config).get("warmup_epochs", 0),
                           title=f"{name}: mean max positive probability and kNN accuracy",
                           monitor_label=monitor)]

    labelled = protocols.load_labelled_data(None, config)
    preprocessing = protocols.preprocessing_for(config)
    batch = config["evaluation"]["batch_size"]
    held_out = linear.eval_batches(labelled.test, preprocessing, batch)
    # The first max_train training images (in order) are the surrogates' candidates.
    train = linear.eval_batches(labelled.train, preprocessing, batch).take(
        math.ceil(max_train / batch))
    rng = np.random.default_rng(seed)

    features, labels = knn.extract_features(run.model.backbone, held_out)
    chosen = np.sort(rng.choice(len(features), size=min(points, len(features)), replace=False))
    paths.append(plot_tsne(tsne(features[chosen], seed), labels[chosen],
                           os.path.join(out_dir, "t_sne.png"),
                           title=f"{name}: t-SNE of {len(chosen)} held-out backbone features"))

    if not isinstance(run.model, CaCo):
        return paths  # the MPPs and their surrogates are CaCo's
    # Key embeddings (key encoder, inference mode): the space the bank and its MPPs live in.
    train_keys, train_labels = knn.extract_features(run.model.key_encoder, train)
    picked = np.sort(rng.choice(len(features), size=min(queries, len(features)), replace=False))
    query_images = _images_at(held_out, preprocessing, picked)
    query_keys = run.model.key_encoder(
        preprocessing.normalize(query_images), training=False).numpy()
    bank = run.model.memory_bank.rows.numpy()
    examples = query_examples(query_keys, bank, train_keys, min(negatives, len(bank) - 1),
                              method_settings(config)["temperature"], seed)
    shown = np.unique(np.concatenate([examples["positive_surrogate"],
                                      examples["negative_surrogates"].ravel()]))
    shown_images = dict(zip(shown.tolist(), _images_at(train, preprocessing, shown)))
    paths.append(plot_query_examples(
        query_images, labels[picked], examples, shown_images, train_labels,
        os.path.join(out_dir, "query_ex.png"),
        title=f"{name}: surrogates of the MPP and of random negatives"))
    return paths
