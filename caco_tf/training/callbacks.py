"""Callbacks that make a pre-training run observable and resumable.

The kNN monitor is an evaluation, in ``caco_tf.evaluation.monitor``.
"""

import collections
import logging
import os
import signal
import time

import keras
import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf import __version__, health, keras_compat
from caco_tf.nets import layers
from caco_tf.training import peers
from caco_tf.errors import ConfigError
from caco_tf.training.interrupts import Interrupted
from caco_tf.training.stop_reason import StopReason
from caco_tf.training.run_folder import (RunFolder, link_atomically, read_history,
                                         save_weights_atomically, write_json_atomically)


class HistoryJSON(keras.callbacks.Callback):
    """Writes every finished epoch's logs to a JSON list, surviving resumes.

    Keyed by epoch, so an epoch redone after a kill replaces its earlier partial record.  A
    damaged file (cut, edited by hand) is moved aside with one warning line, and a new one
    started: it is the run's log, not its state, and must not stop the run.
    """

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_train_begin(self, logs=None):
        self._load()  # a damaged file is moved aside before the first epoch, not after it

    def _load(self):
        try:
            return {row["epoch"]: row for row in read_history(self.path)}
        except ValueError as error:
            aside = f"{self.path}.damaged"
            os.replace(self.path, aside)
            logging.getLogger("caco_tf").warning(
                "warning: %s is damaged (%s): moved to %s; the history goes on from the next "
                "epoch (the earlier epochs' figures are in TensorBoard)", self.path, error, aside)
            return {}

    def on_epoch_end(self, epoch, logs=None):
        history = self._load()
        history[epoch + 1] = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        # Never a half-written file behind a kill or a full disk.
        write_json_atomically(self.path, [history[key] for key in sorted(history)], indent=1)


class Resume(keras.callbacks.Callback):
    """Resume state in the run folder's ``backup/`` (``run_folder.RunFolder``), restored when
    training starts and saved

    - after every epoch;
    - inside an epoch every ``every_minutes`` (None: never), so a hard kill loses at most that;
    - after the step during which SIGTERM or SIGINT arrived (``signals``, an
      ``interrupts.StopSignals``): then it raises ``interrupts.Interrupted``.

    The state is everything a run needs to go on as if never stopped: the weights (encoders,
    key encoder, bank, bank momentum, FIFO pointer, optimizer state and step counter), the
    epoch and the steps done inside it, and the metric trackers' sums inside the epoch (so the
    epoch's logged means are those of an uninterrupted run).  Restored mid-epoch, the first
    ``step`` calls of the epoch's train function are passed over (the input pipeline starts at
    the same position: ``read_backup`` tells it).

    Only the writer (the chief) saves; every process restores the same state (under
    MultiWorkerMirroredStrategy all read the chief's).  Nothing is saved after an epoch that
    ``HealthMonitor`` stopped the run in (``model.stop_reason``): the last good state stays.

    Args:
      run_dir: the run folder (a path or a ``RunFolder``).
      writer: whether this process saves.
      changes: the settings changed since the backup, named if it cannot be restored.
      restored: called once the backup, if any, is restored.
      steps_per_epoch: recorded with every save (a resume checks the plan did not change).
      every_minutes: minutes between saves inside an epoch (None or 0: only at epoch ends).
      signals: the ``StopSignals`` whose signal stops the run after a save.
      point: the resume point when the caller has read it already (``RunFolder.read_backup``:
        a second read would checksum the checkpoint and warn of a damaged one again).
      position: the input pipeline's ``data.StreamPosition``: a save inside an epoch records
        every pipeline's place in the epoch's order (the chief gathers the workers' through
        the coordination service), from which a resume starts reading.
      peer_timeout: seconds the chief waits for a worker's place (None or 0: for ever; the
        stuck-peer watchdog still guards the wait).
      decided: what the run decided from its machines (``decisions.decide``), recorded with
        every save.
    """

    _UNREAD = object()

    def __init__(self, run_dir, writer=True, changes=(), restored=None, steps_per_epoch=None,
                 every_minutes=None, signals=None, point=_UNREAD, position=None,
                 peer_timeout=None, decided=None):
        super().__init__()
        self.position, self.peer_timeout, self.decided = position, peer_timeout, decided
        self.folder = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
        self.writer, self.changes, self.restored = writer, tuple(changes), restored
        self.steps_per_epoch = steps_per_epoch
        self.every = 60.0 * every_minutes if every_minutes else None
        self.signals = signals
        self._epoch, self._metrics, self._saved_at = 0, None, None
        self._point = point

    def on_train_begin(self, logs=None):
        point = self.folder.read_backup() if self._point is self._UNREAD else self._point
        if point is not None:
            try:
                self.model.load_weights(point.weights)
            except ValueError as error:
                # A backup of a model with other layers (online probe switched on, another
                # backbone, ...): Keras lists the layers; the user needs the settings.
                changed = (f"; settings changed since it was saved: {', '.join(self.changes)}"
                           if self.changes else "")
                if point.version != __version__:
                    changed += (f"; it was saved by caco-tf {point.version or 'before 0.2.0'}, "
                                f"this is {__version__} (CHANGELOG.md)")
                raise ConfigError(
                    f"cannot resume from {self.folder.backup}: it holds a model of another "
                    f"shape{changed}. Re-run with the settings it was trained with, or pass "
                    f"another --run-dir") from error
            keras_compat.set_initial_epoch(self.model, point.epoch)
            if point.step:
                self._metrics = point.metrics
                self._pass_over(point.step)
        if self.restored is not None:
            self.restored()
        self._saved_at = time.monotonic()

    def _pass_over(self, steps):
        """Make the train function's first calls return at once for the resumed epoch's
        ``steps`` done before the stop (the input stream starts after them): as many calls
        as whole ``steps_per_execution`` fit in them; the next call runs the rest of its share
        (``steps.TrainFunction`` aligns its calls by the step counter)."""
        train_function, remaining = self.model.train_function, [steps]

        def resumed(iterator):
            if remaining[0] >= self.model.steps_per_execution:
                remaining[0] -= self.model.steps_per_execution
                return {}
            self.model.train_function = train_function
            return train_function(iterator)

        self.model.train_function = resumed

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.position is not None:
            self.position.forget(epoch)
        if self._metrics:  # the resumed epoch's sums (Keras has just reset the trackers)
            for metric in self.model.metrics:
                for variable, value in zip(metric.variables, self._metrics.get(metric.name, ())):
                    variable.assign(value)
            self._metrics = None
        if self._agree(self._signalled(), False)[0]:  # saved at the last epoch's end
            self.stop(epoch, 0)

    def _signalled(self):
        return self.signals is not None and bool(self.signals.received)

    def on_train_batch_end(self, batch, logs=None):
        if not logs:
            return  # a step passed over by a resume
        if self.signals is not None:
            self.signals.step_ended()
        done = batch + 1
        stop = self._signalled()
        due = self.every is not None and time.monotonic() - self._saved_at >= self.every
        stop, due = self._agree(stop, due)
        if (stop or due) and done < (self.steps_per_epoch or self.params.get("steps") or 0):
            self._save(self._epoch, done)
            if stop:
                self.stop(self._epoch, done)
        # At an epoch's last step the epoch-end save follows (after the epoch's callbacks).

    def _agree(self, stop, due):
        """(stop, due) as every worker of a multi-worker run will act on them: true when true
        on any worker (one small all-reduce a step), so that a signal to one worker, or the
        chief's clock, makes every worker save the same step."""
        strategy = self.model.distribute_strategy
        if self.signals is None or getattr(strategy.extended, "_num_workers", 1) <= 1:
            return stop, due
        if not hasattr(self, "_any"):
            @tf.function(autograph=False)
            def any_worker(flags):
                per_replica = strategy.run(lambda: tf.identity(flags))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._any = any_worker
        stop_flag, due_flag = self._any(tf.constant([float(bool(stop)), float(bool(due))]))
        if stop_flag > 0 and not stop:
            self.signals.received = self.signals.received or signal.SIGTERM  # a peer's signal
        return bool(stop_flag > 0), bool(due_flag > 0)

    def on_epoch_end(self, epoch, logs=None):
        if not getattr(self.model, "stop_reason", None):
            self._save(epoch + 1, 0)

    def _save(self, epoch, step):
        if getattr(self.model, "stop_reason", None):
            return
        # Read on every worker (a distributed metric's value may be a collective).
        metrics = ({metric.name: [np.asarray(v.numpy()).tolist() for v in metric.variables]
                    for metric in self.model.metrics} if step else None)
        positions = self._positions(epoch, step)
        if self.writer:
            self.folder.write_backup(self.model, epoch, step, self.steps_per_epoch, metrics,
                                     positions, self.decided)
        self._saved_at = time.monotonic()

    def _positions(self, epoch, step):
        """Every input pipeline's place in the epoch's order after its first ``step`` batches,
        on the writer (None elsewhere, at an epoch's end, or when one is unknown)."""
        if self.position is None or not step:
            return None
        own = self.position.at(epoch, step)
        count, index = self.position.pipeline
        if count == 1:
            return [own] if own is not None else None
        key = f"caco_tf/position/{int(self.model.optimizer.iterations.numpy())}"
        peers.share(f"{key}/{index}", own)
        if not self.writer:
            return None
        places = [own if pipeline == index else peers.fetch(f"{key}/{pipeline}",
                                                            self.peer_timeout)
                  for pipeline in range(count)]
        return None if any(place is None for place in places) else places

    def stop(self, epoch, step):
        """Raise ``Interrupted``: the run stopped at ``epoch``, ``step`` on a signal."""
        where = (f"epoch {epoch + 1}, step {step} of {self.steps_per_epoch}" if step
                 else f"the end of epoch {epoch}")
        saved = f"saved in {self.folder.backup}" if self.writer else "the chief saved it"
        raise Interrupted(f"stopped by {self.signals.name} at {where} (global step "
                          f"{int(self.model.optimizer.iterations.numpy())}); {saved}; run the "
                          f"same command to continue", self.signals.received)


class Checkpoint(keras.callbacks.Callback):
    """The weights after every epoch, except after one the run stopped in, written atomically
    (``run_folder.save_weights_atomically``).

    ``folder``: the ``RunFolder`` whose resume checkpoint of the same epoch's end, when
    ``Resume`` has just written it, the checkpoint becomes a hard link of: the same bytes
    (``weights_bytes``), written once an epoch instead of twice."""

    def __init__(self, path, folder=None):
        super().__init__()
        self.path, self.folder = path, folder

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self.model, "stop_reason", None):
            return
        newest = self.folder.newest if self.folder is not None else None
        if newest and newest[:2] == (epoch + 1, 0) and os.path.exists(newest[2]):
            if link_atomically(newest[2], self.path):
                return
        save_weights_atomically(self.model, self.path)


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing only the short list of what a run is judged by (every
    metric still reaches History, ``history.json`` and TensorBoard)."""

    SHOWN = ("loss", "mpp_prob", "mpp_usage", "probe_top1", "knn_top1", "rank_embedding",
             "images_per_s", "data_wait")

    def on_train_batch_end(self, batch, logs=None):
        # Keras numbers a call by its last step as if it ran steps_per_execution steps; the
        # epoch's last call may run fewer (steps.TrainFunction ends it at the epoch's end).
        if self.target:  # the steps of an epoch (ProgbarLogger.set_params)
            batch = min(batch, self.target - 1)
        super().on_train_batch_end(batch, self._shown(logs))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, self._shown(logs))

    def _shown(self, logs):
        return {key: logs[key] for key in self.SHOWN if key in (logs or {})}


def is_wall_clock(key):
    """Whether a history column is a measured time (never equal twice, so left out when two
    runs' histories are compared bit for bit): Throughput's and each monitor's ``*_seconds``."""
    return key in ("step_ms", "images_per_s", "data_wait") or key.endswith("_seconds")


class Throughput(keras.callbacks.Callback):
    """Per epoch, into the logs: ``step_ms`` (mean wall time of a step), ``images_per_s``
    (global batch × steps / time) and ``data_wait``, the share of that time the steps waited
    for their batches (``ContrastiveMethod.input_wait``): near 0 when the input pipeline
    keeps up, towards 1 when it stalls training.  The first epoch includes compiling.

    And the compute a learning curve is read against: ``steps`` and ``images_seen`` since the
    run began, and ``train_seconds``, the epoch's steps' time (``step_ms`` × the epoch's
    steps: an epoch resumed after a stop counts as if never stopped; the epoch's end — the
    monitor, the checkpoint — is not in it)."""

    def __init__(self, global_batch, steps_per_epoch=None):
        super().__init__()
        self.global_batch = int(global_batch)
        self.steps_per_epoch = steps_per_epoch
        self._start = self._last = None
        self._steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._steps = time.perf_counter(), 0
        self._first = self._iterations()
        self.model.input_wait = 0.0

    def _iterations(self):
        return int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        if not logs:  # steps a resume passed over: the clock starts after them
            self._start = time.perf_counter()
            return
        # A call runs up to steps_per_execution steps: count them by the step counter.
        self._last, self._steps = time.perf_counter(), self._iterations() - self._first

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self._steps:
            return
        elapsed = max(self._last - self._start, 1e-9)
        logs["step_ms"] = 1000.0 * elapsed / self._steps
        logs["images_per_s"] = self.global_batch * self._steps / elapsed
        logs["data_wait"] = min(1.0, getattr(self.model, "input_wait", 0.0) / elapsed)
        steps = self._iterations()
        logs["steps"], logs["images_seen"] = steps, steps * self.global_batch
        if self.steps_per_epoch:
            logs["train_seconds"] = logs["step_ms"] * self.steps_per_epoch / 1000.0


# Collapse thresholds of every method (documented in docs/health.md), measured on the offline
# digits (validation split): healthy runs kept uniformity at -0.44 or below, a run whose
# warm-up was too short bunched its embeddings to -0.02...-0.08 within an epoch of the resync.
# Each method adds the check of its own known failure (``Method.collapse``).
COLLAPSE_UNIFORMITY = -0.2   # the views' embeddings all near one point (0: a single point)
COLLAPSE_RANK = 2.0          # RankMe of the embeddings
# ``embedding_std`` (``losses.embedding_spread``, SimSiam's measure) on the digits: 0.92-0.99 with
# uniformity below -1.9 over 6 epochs with SimSiam's predictor; 0.81 and -0.69 without it.
COLLAPSE_SPREAD, COLLAPSE_SPREAD_UNIFORMITY = 0.85, -1.0


# An epoch as a method's collapse check sees it: ``done`` epochs so far, of ``steps`` steps and
# ``images`` images each.
EpochCount = collections.namedtuple("EpochCount", "done steps images")


def is_collapsed(logs, model=None, epoch=EpochCount(1, 0, 0)):
    """Why an epoch's ``logs`` show a collapse, or None: the method's own check
    (``model.collapse``: CaCo's positives on a few bank rows, SwAV's loss at ln K, DINO's
    uniform teacher), then, unless the method's embeddings say nothing of it
    (``EMBEDDINGS_JUDGED``: MAE's), the embeddings' uniformity above ``COLLAPSE_UNIFORMITY``,
    their spread (``embedding_std``, SimSiam's measure) under ``COLLAPSE_SPREAD`` while they
    bunch, or their effective rank under ``COLLAPSE_RANK``."""
    reason = model.collapse(logs, epoch) if model is not None else None
    if reason or not getattr(model, "EMBEDDINGS_JUDGED", True):
        return reason
    if "uniformity" in logs and float(logs["uniformity"]) > COLLAPSE_UNIFORMITY:
        return (f"the embeddings bunch together (uniformity {float(logs['uniformity']):.3f}, "
                f"above {COLLAPSE_UNIFORMITY})")
    spread, uniformity = (float(logs.get(key, default)) for key, default in (
        ("embedding_std", 1.0), ("uniformity", -4.0)))
    if spread < COLLAPSE_SPREAD and uniformity > COLLAPSE_SPREAD_UNIFORMITY:
        return (f"the projections turn towards one direction (spread {spread:.3f} of an even "
                f"spread's, uniformity {uniformity:.2f})")
    if "rank_embedding" in logs and float(logs["rank_embedding"]) < COLLAPSE_RANK:
        return f"the embeddings' effective rank is {float(logs['rank_embedding']):.2f}"
    return None


class HealthMonitor(keras.callbacks.Callback):
    """Health without labels, every epoch, into the logs (and so History, ``history.json`` and
    TensorBoard): ``rank_embedding`` and ``rank_features``, the effective rank (RankMe) of the
    embeddings and of the backbone features of a fixed sample of un-augmented training images
    (``caco_tf.health``); beside the step's own ``alignment``, ``uniformity``, ``mpp_usage``
    and ``mpp_entropy``.

    A collapse (``is_collapsed``, judged from the first epoch that ends after the warm-up)
    prints one warning line saying what to change (the method's ``COLLAPSE_ADVICE``), once;
    ``stop_on_collapse`` also stops the run, keeping the last good checkpoint.  A NaN or Inf
    loss always stops the run at once, keeps the last good checkpoint and says at which step:
    ``model.stop_reason`` then holds why (a ``StopReason``; ``Resume`` and ``Checkpoint`` save
    nothing more).

    Args:
      sample: batches of normalized images (or (images, labels)), the same every epoch.
      steps_per_epoch, batch_size: an epoch's steps and the global batch (the methods' own
        checks count epochs and images).
      stop_on_collapse: stop the run when a collapse shows.
    """

    def __init__(self, sample=None, steps_per_epoch=0, batch_size=0, stop_on_collapse=False):
        super().__init__()
        self.sample, self.steps, self.batch = sample, int(steps_per_epoch), int(batch_size)
        self.stop_on_collapse = bool(stop_on_collapse)
        self.warned = False
        self._encode = None

    def on_train_begin(self, logs=None):
        self.model.stop_reason = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or self.model.stop_reason:
            return
        value = float(np.asarray(loss).reshape(-1)[0])
        if not np.isfinite(value):
            step = int(self.model.optimizer.iterations.numpy())
            self.model.stop_reason = StopReason("divergence", (
                f"the loss became {value} at step {step} (epoch {self._epoch + 1}, batch "
                f"{batch + 1})"))
            self.model.stop_training = True

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self.model.stop_reason:
            return
        if self.sample is not None:
            logs.update(self.ranks())
        if self.in_warmup():
            return  # recorded, not judged: early training bunches and spreads again (below)
        count = EpochCount(epoch + 1, self.steps, self.steps * self.batch)
        if not self.model.judged(count):
            return  # an epoch a method's own check must not judge yet (SwAV, DINO)
        reason = is_collapsed(logs, self.model, count)
        if reason and not self.warned:
            self.warned = True
            logging.getLogger("caco_tf").warning(
                "warning: collapse after epoch %d: %s; %s", epoch + 1, reason,
                self.model.COLLAPSE_ADVICE)
        if reason and self.stop_on_collapse:
            self.model.stop_reason = StopReason(
                "collapse", f"a collapse after epoch {epoch + 1} ({reason})")
            self.model.stop_training = True

    def in_warmup(self):
        """Whether every step so far was a warm-up step.  The collapse rule judges the epochs
        after it: the collapse it measures follows the resync, and a warm-up's early epochs can
        bunch the embeddings for an epoch and spread them again (a ResNet-18 on the digit
        folder: uniformity −0.09 in its second epoch, −0.54 two epochs later; kNN rising)."""
        warmup = getattr(self.model, "warmup_steps", 0)
        return warmup > 0 and int(self.model.optimizer.iterations.numpy()) <= warmup

    def ranks(self):
        """{'rank_embedding': ..., 'rank_features': ...} of the current encoders on the sample."""
        if self._encode is None:  # compiled: run eagerly, the passes cost ~1.3 s an epoch offline
            self._encode = tf.function(self.model.features_and_embeddings, autograph=False)
        features, embeddings = [], []
        for batch in peers.ticking(self.sample):  # a long pass: the watchdog times each batch
            batch_features, batch_embeddings = self._encode(
                batch[0] if isinstance(batch, tuple) else batch)
            features.append(tf.cast(batch_features, tf.float32))
            embeddings.append(tf.cast(batch_embeddings, tf.float32))
        return {"rank_embedding": float(health.effective_rank(tf.concat(embeddings, 0))),
                "rank_features": float(health.effective_rank(tf.concat(features, 0)))}


class PreciseBatchNorm(keras.callbacks.Callback):
    """After the last epoch, re-estimate the backbone's BatchNorm moving statistics on
    un-augmented training images (``layers.recalibrate_batchnorm``).

    Place it before the checkpoint callback, so that the saved weights (and the evaluation and
    export that follow ``fit``) carry the new statistics; after the kNN monitor, so that its
    curve compares like with like.  Training is unaffected: the query encoder normalizes with
    batch statistics, and the key encoder keeps its own moving statistics.

    Args:
      data: batched dataset of normalized images, or of (images, labels) pairs (labels unused).
      backbone: the model to recalibrate (default: ``self.model.backbone``).
    """

    def __init__(self, data, backbone=None):
        super().__init__()
        self.data, self.backbone = data, backbone

    def on_epoch_end(self, epoch, logs=None):
        if self.params and epoch + 1 == self.params.get("epochs"):
            layers.recalibrate_batchnorm(self.backbone or self.model.backbone,
                                         peers.ticking(self.data))
