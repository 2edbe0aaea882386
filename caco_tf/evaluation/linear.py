"""Linear evaluation, the paper's protocol: a frozen backbone and one Dense layer.

The classifier is trained with Keras ``fit`` (SGD with momentum, cosine decay, 100 epochs by
default) and reported with ``model.evaluate`` as top-1 and top-5.  Two paths:

- no training augmentation (the default): the frozen features are computed once, in inference
  mode, and the classifier trains on the cached features: the same as training it on top of
  the frozen backbone, hundreds of times faster;
- with training augmentation, every epoch sees fresh views through the frozen backbone
  (inference mode, so its BatchNorm statistics stay fixed): ``augment="imagenet"``, the
  ImageNet recipe (RandomResizedCrop + flip); ``augment="digits"``, its analogue for digits,
  where a flip changes the class: a mild random crop, rotation, shear and shift
  (``DIGIT_AFFINE``, one bilinear resample, as the pre-training views).

Test images (and training images without augmentation) are prepared as everywhere else
(``caco_tf.data.eval_dataset``, the exported model's preprocessing): images at the model's
size S are only normalized; others are resized so that their shorter side is round(S / 0.875)
and centre-cropped to S (256 → 224 for ImageNet).  The splits are ``caco_tf.data`` sources
(arrays, image folders, TFDS), so transfer to any classification data set works the same way.

The head standardizes its input with a BatchNormalization without scale and offset before the
Dense layer (as MAE's linear probe does): at test time that is a fixed affine map, so the
classifier stays linear in the features, and one learning rate suits features of any scale.

The Dense kernel W carries an L2 penalty λ‖W‖² (a regularized multinomial logistic
regression).  On the cached path λ is chosen by default as the linear protocol the paper follows
for transfer (BYOL's) does: on the training split only, here by k-fold cross-validation over
``L2_GRID``; then the classifier is trained on the whole training split with the chosen λ and
tested once.  The test split never takes part in the choice.
"""

import math
import warnings

import keras
import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf import data
from caco_tf.data import augment as augment_lib
from caco_tf.data.images import decode_image, normalize_pixels
from caco_tf.evaluation import AUGMENTATIONS, L2_FOLDS, L2_GRID, knn

# The digits' training views: milder than pre-training's (crop area 0.3-1, rotation 15°), as
# the ImageNet recipe drops the pre-training's colour ops and keeps crop and flip.
DIGIT_AFFINE = dict(scale=(0.6, 1.0), rotation=10.0, shear=0.1, translate=0.1)


class Preprocessing:
    """The backbone's input: S×S images with C channels, normalized as ``(x - mean) / std``."""

    def __init__(self, image_size, channels, mean, std):
        self.image_size, self.channels = int(image_size), int(channels)
        self.mean, self.std = mean, std

    def normalize(self, images):
        """float images in [0, 1] → the backbone's input."""
        return normalize_pixels(tf.cast(images, tf.float32), tf.constant(self.mean, tf.float32),
                                tf.constant(self.std, tf.float32))

    def train(self, image, seed, augment="imagenet"):
        """The training transform of one uint8 image (``augment``: imagenet or digits)."""
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        image = data.to_unit_float(image)
        if augment == "digits":
            image = tf.image.resize(image, [self.image_size, self.image_size])
            image = augment_lib.random_affine(image[None], crop_seed, **DIGIT_AFFINE)[0]
        else:  # ImageNet: RandomResizedCrop(S) + flip
            image = random_resized_crop(image, crop_seed, self.image_size)
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return self.normalize(image)


def random_resized_crop(image, seed, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """A crop of random area (``scale`` of the image) and aspect ``ratio``, resized to size².

    TensorFlow's Inception/ImageNet sampler (the whole image when 10 draws do not fit).
    """
    begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=ratio, area_range=scale, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    crop = tf.slice(image, begin, extent)
    return tf.image.resize(crop, [size, size], method="bilinear")


def linear_head(feature_dim, num_classes, batchnorm=True, l2=0.0, regularizer=None):
    """Features [B, F] → logits [B, classes]: (parameter-free standardization →) one Dense.

    ``l2``: λ of the penalty λ‖W‖² on the Dense kernel, added to the mean cross-entropy;
    ``regularizer``: the kernel's penalty itself, in place of ``l2``'s (``HeadFits``').
    """
    inputs = keras.Input((feature_dim,), name="features")
    features = inputs
    if batchnorm:
        features = keras.layers.BatchNormalization(center=False, scale=False, momentum=0.9,
                                                   name="standardize")(features)
    # Zero init: the problem is convex, and a fixed start makes runs repeatable.
    if regularizer is None and l2:
        regularizer = keras.regularizers.L2(l2)
    logits = keras.layers.Dense(num_classes, kernel_initializer="zeros",
                                kernel_regularizer=regularizer, name="linear")(features)
    return keras.Model(inputs, logits, name="linear_head")


# Steps of the head run in one graph call: the same steps in the same order (the same weights
# to the bit), without Keras' Python work between steps, which dominates so small a model.
STEPS_PER_EXECUTION = 64


def compile_classifier(model, total_steps, learning_rate=0.03, momentum=0.9, weight_decay=0.0):
    """SGD with momentum, learning rate on a cosine to zero over ``total_steps`` (a number, or
    a variable set before each fit: ``HeadFits``); top-1 and top-5 metrics."""
    if not isinstance(total_steps, tf.Variable):
        total_steps = max(1, total_steps)
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, total_steps)
    model.compile(
        optimizer=keras.optimizers.SGD(schedule, momentum=momentum,
                                       weight_decay=weight_decay or None),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1"),
                 keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5")],
        steps_per_execution=STEPS_PER_EXECUTION)


def linear_evaluation(backbone, train, test, num_classes, preprocessing, epochs=100,
                      batch_size=256, learning_rate=0.03, momentum=0.9, weight_decay=0.0,
                      augment="none", batchnorm=True, seed=0, verbose=0, l2=None,
                      l2_grid=L2_GRID, l2_folds=L2_FOLDS):
    """Train one Dense layer on the frozen ``backbone``; top-1 and top-5 (%) on ``test``.

    ``train``, ``test``: labelled ``caco_tf.data`` sources (or anything ``data.eval_dataset``
    takes with labels).  ``l2``: λ of the kernel's L2 penalty, or ``"auto"`` (cached path
    only): the best of ``l2_grid`` by ``l2_folds``-fold cross-validation on ``train``
    (:func:`select_l2`); None: ``"auto"`` on the cached path, 0 with training augmentation.
    Returns a dict with ``top1``, ``top5``, the image counts, the settings used and, for
    ``"auto"``, every candidate's cross-validated top-1 (``l2_scores``) and ``l2_folds``.
    """
    if augment not in AUGMENTATIONS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)}, got {augment!r}")
    if l2 is None:
        l2 = "auto" if augment == "none" else 0.0
    if l2 == "auto" and augment != "none":
        raise ValueError("l2='auto' chooses λ on cached features: pass a number with "
                         f"augment={augment!r}")
    if l2 != "auto" and not float(l2) >= 0:
        raise ValueError(f"l2 must be 'auto' or a number >= 0, got {l2!r}")
    fit = dict(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
               momentum=momentum, weight_decay=weight_decay)
    keras.utils.set_random_seed(seed)
    feature_dim = int(backbone.output_shape[-1])
    l2_scores, fits = None, None
    if augment == "none":
        (train_features, train_labels), (test_features, test_labels) = _cached_features(
            backbone, train, test, preprocessing, batch_size)
        fits = HeadFits(feature_dim, num_classes, batchnorm, learning_rate, momentum,
                        weight_decay)
        if l2 == "auto":
            l2_scores = select_l2(train_features, train_labels, num_classes, l2_grid, l2_folds,
                                  batchnorm=batchnorm, seed=seed, fits=fits, **fit)
            l2 = best_l2(l2_scores)
            keras.utils.set_random_seed(seed)  # the final fit starts as a fixed-λ run would
        train_data = feature_batches(train_features, train_labels, batch_size, shuffle_seed=seed)
        test_data = feature_batches(test_features, test_labels, batch_size)
        train_count, test_count = len(train_features), len(test_features)
        classifier = fits.fresh(float(l2))
    else:
        train_data, train_count = _augmented_images(train, preprocessing, batch_size, seed,
                                                    augment)
        test_data, test_count = eval_batches(test, preprocessing, batch_size), len(test)
        head = linear_head(feature_dim, num_classes, batchnorm, float(l2))
        classifier = _frozen_classifier(backbone, head, preprocessing)
    trainable = backbone.trainable
    backbone.trainable = False  # only the head's variables train (restored below)
    try:
        _train(classifier, train_data, train_count, verbose=verbose, fits=fits, **fit)
        scores = _test(classifier, test_data)
    finally:
        backbone.trainable = trainable
    result = {"top1": 100.0 * float(scores["top1"]), "top5": 100.0 * float(scores["top5"]),
              "loss": float(scores["loss"]), "train_images": int(train_count),
              "test_images": int(test_count), "epochs": int(epochs),
              "batch_size": int(batch_size), "learning_rate": float(learning_rate),
              "momentum": float(momentum), "weight_decay": float(weight_decay),
              "l2": float(l2), "augment": augment, "standardize": bool(batchnorm),
              "path": "cached features" if augment == "none" else "images"}
    if l2_scores is not None:
        result.update(l2_folds=int(l2_folds),
                      l2_scores={f"{value:g}": score for value, score in l2_scores.items()})
    return result


def select_l2(features, labels, num_classes, grid=L2_GRID, folds=L2_FOLDS, batchnorm=True,
              seed=0, fits=None, **fit):
    """Cross-validated top-1 (%) of the linear head for each λ in ``grid``: {λ: score}.

    ``features`` [N, F], ``labels`` [N]: the training split only.  The rows are shuffled
    (``seed``) into ``folds`` parts; each λ trains on all parts but one and is scored on that
    one, in turn, with the settings ``fit`` (epochs, batch_size, learning_rate, momentum,
    weight_decay) of the final classifier.  Every λ sees the same folds.  ``fits``: the
    ``HeadFits`` to train with (one is made otherwise).
    """
    folds = int(folds)
    if folds < 2 or folds > len(features):
        raise ValueError(f"l2_folds must be between 2 and the {len(features)} training images, "
                         f"got {folds}")
    if not grid or min(grid) < 0:
        raise ValueError(f"l2_grid must hold numbers >= 0, got {grid!r}")
    fits = fits or HeadFits(features.shape[1], num_classes, batchnorm, fit["learning_rate"],
                            fit["momentum"], fit["weight_decay"])
    parts = np.array_split(np.random.default_rng(seed).permutation(len(features)), folds)
    splits = [(np.concatenate(parts[:k] + parts[k + 1:]), held)  # (train rows, held-out rows)
              for k, held in enumerate(parts)]
    scores = {}
    for l2 in grid:
        correct = 0
        for rest, held in splits:
            keras.utils.set_random_seed(seed)
            head = fits.fresh(float(l2))
            _train(head, feature_batches(features[rest], labels[rest], fit["batch_size"],
                                         shuffle_seed=seed), len(rest), fits=fits, **fit)
            top1 = _test(head, feature_batches(features[held], labels[held],
                                               fit["batch_size"]))["top1"]
            correct += float(top1) * len(held)
        scores[float(l2)] = 100.0 * correct / len(features)
    return scores


class VariableL2(keras.regularizers.Regularizer):
    """λ‖W‖² with λ in a variable: ``keras.regularizers.L2``'s arithmetic, λ set between fits."""

    def __init__(self, l2):
        self.l2 = l2

    def __call__(self, x):
        return keras.ops.cast(self.l2, dtype=x.dtype) * keras.ops.sum(keras.ops.square(x))


class HeadFits:
    """One linear head trained afresh many times over (λ's cross-validation, then the final
    fit): before each fit its weights, standardization statistics and optimizer state go back
    to their start, and λ and the cosine's length are variables, so that Keras traces its train
    and test functions once rather than once a fit (on a few-label split a fit costs little
    more than its tracing).  Each fit is the one ``linear_head`` compiled afresh by
    ``compile_classifier`` makes, to the bit (``tests/test_linear.py``)."""

    def __init__(self, feature_dim, num_classes, batchnorm=True, learning_rate=0.03,
                 momentum=0.9, weight_decay=0.0):
        self.l2 = tf.Variable(0.0, trainable=False, name="l2")
        self.total_steps = tf.Variable(1.0, trainable=False, name="total_steps")
        self.head = linear_head(feature_dim, num_classes, batchnorm,
                                regularizer=VariableL2(self.l2))
        compile_classifier(self.head, self.total_steps, learning_rate, momentum, weight_decay)
        self.head.optimizer.build(self.head.trainable_variables)
        self.start = [(v, v.numpy()) for v in self.head.variables + self.head.optimizer.variables]

    def fresh(self, l2):
        """The head at its start, with penalty ``l2``."""
        for variable, value in self.start:
            variable.assign(value)
        self.l2.assign(l2)
        return self.head


def best_l2(scores):
    """The λ of the best score; ties go to the larger λ (the simpler classifier)."""
    return max(scores, key=lambda l2: (scores[l2], l2))


def feature_batches(features, labels, batch_size, shuffle_seed=None):
    """(features, labels) batches; reshuffled every epoch when ``shuffle_seed`` is given."""
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(len(features), seed=shuffle_seed,
                                  reshuffle_each_iteration=True)
    return dataset.batch(batch_size)


def _train(classifier, train_data, train_count, epochs, batch_size, learning_rate, momentum,
           weight_decay, verbose=0, fits=None):
    """Fit ``classifier`` for ``epochs`` on a cosine over all its steps: compiled here, or, as
    ``fits``' head (``HeadFits``), compiled already and given the cosine's length."""
    steps = epochs * math.ceil(train_count / batch_size)
    if fits is None:
        compile_classifier(classifier, steps, learning_rate, momentum, weight_decay)
    else:
        fits.total_steps.assign(max(1, steps))
    # Every epoch in one pass, each repetition of the data reshuffled as a new epoch's would
    # be: Keras' work between epochs is most of a small fit's time (a few-label split's epoch
    # is one step).  shuffle=False: the datasets shuffle themselves.
    classifier.fit(train_data.repeat(epochs), epochs=1, verbose=verbose, shuffle=False)


def _test(classifier, test_data):
    """``classifier.evaluate`` over one pass of ``test_data``: loss, top1, top5 (fractions)."""
    with warnings.catch_warnings():
        # Decoded sources drop bad files, so their length is unknown until the end; Keras
        # warns when such a dataset ends, though evaluate wants exactly one pass.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        return classifier.evaluate(test_data, verbose=0, return_dict=True)


def eval_batches(source, preprocessing, batch_size):
    """(normalized images, labels) batches in order: the evaluation transform."""
    return data.eval_dataset(source, batch_size, preprocessing.normalize,
                             image_size=preprocessing.image_size,
                             channels=preprocessing.channels)


def decoded_examples(source, channels):
    """(uint8 image [H, W, channels], label) per example, in order; bad files dropped."""
    dataset = source.ordered()
    if getattr(source, "encoded", False):
        dataset = dataset.map(lambda item, label: (
            decode_image(source.load(item[0]), channels), label),
            num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
    return dataset


def _augmented_images(source, preprocessing, batch_size, seed, augment,
                      shuffle_buffer=10_000):
    """Fresh views every epoch: per-example seeds from a stream re-randomized each epoch."""
    count = len(source)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    dataset = decoded_examples(source, preprocessing.channels).shuffle(
        min(count, shuffle_buffer), seed=seed, reshuffle_each_iteration=True)
    dataset = tf.data.Dataset.zip(dataset, seeds).map(
        lambda example, pair: (preprocessing.train(example[0], pair, augment), example[1]),
        num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE), count


def _cached_features(backbone, train, test, preprocessing, batch_size):
    """The frozen features of both splits, computed once: ((features, labels), (...))."""
    return tuple(knn.extract_features(
        backbone, eval_batches(source, preprocessing, batch_size), normalize=False)
        for source in (train, test))


def _frozen_classifier(backbone, head, preprocessing):
    """images → backbone (inference mode) → head, as one model for fit/evaluate."""
    size, channels = preprocessing.image_size, preprocessing.channels
    inputs = keras.Input((size, size, channels), name="images")
    features = backbone(inputs, training=False)
    return keras.Model(inputs, head(features), name="linear_classifier")


def pixels_backbone(preprocessing):
    """The identity on normalized pixels, flattened: the raw-pixel baseline's 'backbone'."""
    size, channels = preprocessing.image_size, preprocessing.channels
    return keras.Sequential([keras.Input((size, size, channels)), keras.layers.Flatten()],
                            name="pixels")
