"""MAE's reconstructions as a figure (``caco-figures reconstruction``): for each image, the
image, what the encoder saw (the visible patches, the masked ones grey), and the decoder's
reconstruction with the visible patches pasted back, as MAE's demo notebook shows them."""

import os

import numpy as np
import tensorflow as tf

from caco_tf.build import eval_dataset, load_data, load_run
from caco_tf.errors import ConfigError
from caco_tf.run_settings import RunSettings


def reconstruction_figure(model, images, masks, path, views):
    """Write one row per image (image | visible patches | reconstruction) to ``path``;
    ``images``: normalized ``[B, H, W, C]`` as the model takes them, ``masks`` ``[B, h, w]``
    True where masked, ``views``: the run's (their mean and std turn the values to pixels)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    images = tf.convert_to_tensor(images, tf.float32)
    reconstructed = model.reconstruct(images, masks).numpy()
    mean, std = np.asarray(views.mean, np.float32), np.asarray(views.std, np.float32)
    patch = images.shape[1] // masks.shape[1]
    hidden = np.repeat(np.repeat(np.asarray(masks), patch, 1), patch, 2)[..., None]

    def pixels(x):
        return np.clip(np.asarray(x) * std + mean, 0.0, 1.0)
    shown = [pixels(images), np.where(hidden, 0.5, pixels(images)), pixels(reconstructed)]
    count = images.shape[0]
    figure, axes = pyplot.subplots(count, 3, figsize=(6, 2 * count), squeeze=False)
    for row in range(count):
        for column, (title, picture) in enumerate(zip(
                ("image", "visible patches", "reconstruction"), shown)):
            axis = axes[row][column]
            picture = picture[row]
            axis.imshow(picture[..., 0] if picture.shape[-1] == 1 else picture,
                        cmap="gray" if picture.shape[-1] == 1 else None, vmin=0.0, vmax=1.0)
            axis.set_xticks([]), axis.set_yticks([])
            if row == 0:
                axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return path


def reconstruction_figures(run_dir, out_dir=None, count=8, seed=0):
    """Write ``reconstruction.png`` of a run whose method reconstructs (MAE) into ``out_dir``
    (default RUN/figures): ``count`` images of its held-out split (else its training images),
    each masked as in training, drawn from ``seed``; the paths written."""
    if count <= 0:
        raise ConfigError(f"--count must be positive, got {count}")
    run = load_run(run_dir)
    if not hasattr(run.model, "reconstruct"):
        raise ConfigError(f"reconstructions need a run of a method that reconstructs "
                          f"(method.name mae), and {run_dir} trained "
                          f"{run.config['method']['name']}")
    settings = RunSettings.of(run.config)
    train, held_out = load_data(settings.data)
    batch = next(iter(eval_dataset(settings, run.views, held_out or train).unbatch()
                      .batch(count)))
    images = batch[0] if isinstance(batch, tuple) else batch
    kind = run.model.view_masks({"mask_ratio": run.model.mask_ratio})[0]
    masks = kind.draw(tf.constant([seed, 0], tf.int64), images.shape[0], run.model.rows,
                      run.model.cols)
    out_dir = out_dir or os.path.join(run_dir, "figures")
    os.makedirs(out_dir, exist_ok=True)
    return [reconstruction_figure(run.model, images, masks,
                                  os.path.join(out_dir, "reconstruction.png"), run.views)]
