"""Every comparison method at every scale: one replica against two and four logical replicas
(what must be global is: NT-Xent's and MoCo v3's keys, Sinkhorn's sums, DINO's center, Barlow
Twins' cross-correlation, VICReg's variance and covariance, BatchNorm in the heads), and a run
stopped by a real SIGTERM inside an epoch that resumes to the uninterrupted run's end, bit for
bit, the method's state included."""

import contextlib
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import data, methods
from caco_tf.data import augment, masks
from caco_tf.training import callbacks, interrupts
from caco_tf.training.run_folder import RunFolder
from test_distributed import _assert_close, _cpus
from test_methods import NEW
from tiny_methods import BATCH, SIZE, by_tier, tiny, views


def _step(method, replicas=1, **tiny_arguments):
    """One step of ``method`` on a global batch of 4·BATCH (local crops for multi-crop
    methods), run eagerly (what is global is the same in a compiled step, and a compiled
    step traces once per replica: tests/test_distributed.py compiles them); the model and
    the step's loss."""
    multi = methods.model_class(method).CROPS.local
    batch = views(batch=4 * BATCH, local_crops=2 if multi else 0, method=method)
    with _cpus(replicas).scope() if replicas > 1 else contextlib.nullcontext():
        model = tiny(method, sync=True, any_size=multi, run_eagerly=True, **tiny_arguments)
    history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0).history
    return model, history["loss"][0]


@pytest.mark.parametrize("method", by_tier(NEW + ("moco_v2", "negative")))
def test_one_replica_equals_two_and_four(method):
    single, single_loss = _step(method)
    for replicas in (2, 4):
        mirrored, loss = _step(method, replicas)
        assert mirrored.distribute_strategy.num_replicas_in_sync == replicas
        assert loss == pytest.approx(single_loss, rel=1e-5, abs=1e-6), replicas
        for a, b in zip(single.weights, mirrored.weights):  # student, teacher and state
            _assert_close(b.numpy(), a.numpy(), f"{replicas} replicas: {a.path}")


# ---------------------------------------------------------------------- stop and resume
STEPS, EPOCHS, IMAGES = 2, 2, 2 * BATCH


def _train(method, folder, stop_after=None, **tiny_arguments):
    """``EPOCHS`` epochs of ``STEPS`` steps from the run folder's resume state, as
    ``caco_tf.pretrain`` trains (the resume state, its signal handling, the input stream's
    position); a real SIGTERM to this process after global step ``stop_after``.  Returns
    (the model, the last epoch's logs)."""
    keras.utils.set_random_seed(0)
    # Eager: the same machinery without a trace per model (tests/test_train_cli.py compiles).
    model = tiny(method, run_eagerly=True, **dict(tiny_arguments, **(
        {"freeze_prototypes_steps": 2} if method == "swav" else
        {"freeze_last_layer_steps": 2} if method == "dino" else {})))
    images = np.random.default_rng(0).integers(0, 256, (IMAGES, SIZE, SIZE, 1), np.uint8)
    point = RunFolder(folder).read_backup()
    kinds = methods.model_class(method).view_masks()  # a method of masks: its view, its masks
    views_of_run = (masks.MaskedViews(augment.DigitViews(
        num_views=methods.model_class(method).view_count()), kinds, (SIZE // 4,) * 2)
                    if kinds else augment.DigitViews())
    dataset = data.pretrain_dataset(images, BATCH, views_of_run, seed=0,
                                    first_epoch=point.epoch if point else 0,
                                    first_step=point.step if point else 0, steps_per_epoch=STEPS)
    signals = interrupts.StopSignals()
    resume = callbacks.Resume(folder, steps_per_epoch=STEPS, signals=signals, point=point)

    def stop(batch, logs=None):
        if int(model.optimizer.iterations.numpy()) == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    with signals:
        history = model.fit(dataset, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
                            callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=stop),
                                       resume])
    return model, {key: values[-1] for key, values in history.history.items()}


@pytest.mark.parametrize("method", by_tier(NEW))
def test_a_sigterm_inside_an_epoch_resumes_to_the_uninterrupted_end(method, tmp_path):
    uninterrupted, logs = _train(method, str(tmp_path / "uninterrupted"))
    folder = str(tmp_path / "stopped")
    with pytest.raises(interrupts.Interrupted, match="stopped by SIGTERM at epoch 2, step 1"):
        _train(method, folder, stop_after=STEPS + 1)
    resumed, resumed_logs = _train(method, folder)
    assert resumed_logs == logs  # the epoch's means, its steps before the stop included
    for a, b in zip(uninterrupted.weights + uninterrupted.optimizer.variables,
                    resumed.weights + resumed.optimizer.variables):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=a.path)
