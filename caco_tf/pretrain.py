"""From a configuration to a trained run folder: what ``train.py`` does, as a library call.

The run folder's files are named in ``caco_tf.training.run_folder``.
"""

import contextlib
import os
import shutil

import keras
import tensorflow as tf
import yaml

from caco_tf import __version__, data
from caco_tf.build import (build_planned_model, build_views, health_sample, load_data,
                           plan_run, precise_bn, view_masks)
from caco_tf.data import service
from caco_tf.run_settings import RunSettings
from caco_tf.evaluation.monitor import knn_monitor, knn_top1
from caco_tf.serving import export
from caco_tf.training import callbacks, decisions, distribute, interrupts, peers, run_folder
from caco_tf.training.interrupts import Interrupted
from caco_tf.training.run_folder import (RunFolder, is_write_failure, write_error,
                                         write_json_atomically)
from caco_tf.config import ConfigError, changed_settings, in_use, upgrade_saved_config


# Settings that change the schedules of a run in progress (learning rates, warm-up, EMA
# momentum, steps per epoch): a resume refuses them unless train.on_schedule_change says how.
# A method's per-step settings (its schedules) and those counted in epochs count too.
SCHEDULE_SETTINGS = ("data.source", "train.epochs", "train.batch_size", "train.learning_rate",
                     "train.lr_warmup_epochs", "train.optimizer")


def is_schedule_setting(name):
    """Whether a setting (dotted) changes the schedules of a run in progress."""
    from caco_tf.config import SETTINGS

    setting = SETTINGS.get(name)
    return name in SCHEDULE_SETTINGS or (setting is not None and name.startswith("method.") and (
        bool(setting.schedule or setting.in_steps) or not setting.passed))


# Settings that change what is trained (the method, the networks, the images' channels, and
# each method's settings declared ``trained``: a bank's rows, a head's width): a resume refuses
# them, since the checkpoint holds what the old ones built.
TRAINED_SETTINGS = ("method.name", "model.", "data.channels")


class TrainingStopped(ConfigError):
    """The run stopped itself (a NaN loss, a collapse with ``train.stop_on_collapse``)."""


def run(config, run_dir, verbose=1):
    """Pre-train (resuming if ``run_dir`` holds a backup), evaluate and export. Returns results.

    Under MultiWorkerMirroredStrategy every worker runs this with the same config; only the
    chief writes the run folder (holding its lock) and exports (the others return an empty
    dict); every worker computes its share of the kNN evaluations.  SIGTERM and SIGINT stop
    the run after a save (``interrupts.Interrupted``); a failed write to the run folder is a
    ``run_folder.WriteError``.
    """
    settings = RunSettings.of(config)  # the typed sections the builders take, once a run
    # First: a multi-worker strategy must be created before TensorFlow runs any op.
    strategy = distribute.make_strategy(settings.distribute.strategy,
                                        settings.distribute.collective_timeout_seconds)
    chief = distribute.is_chief(strategy)
    folder = RunFolder(run_dir)
    with contextlib.ExitStack() as stack:
        try:
            return _run(config, settings, folder, strategy, chief, verbose, stack)
        except (OSError, RuntimeError) as error:  # the run folder's writes (h5py's too);
            if not is_write_failure(error):     # reads fail as DataError earlier
                raise
            raise write_error(error, run_dir) from error


def _run(config, settings, folder, strategy, chief, verbose, stack):
    run_dir = folder.path
    keras.utils.set_random_seed(settings.train.seed)
    train, held_out = load_data(settings.data)
    plan = plan_run(settings, train, strategy.num_replicas_in_sync)
    # One views object for the input pipeline, the model and the evaluations; building it
    # checks the views' shapes: before anything is written.
    views = build_views(settings.data, settings.views_per_image, view_masks(settings))
    if settings.data.service:  # servable, and the dispatcher answers
        service.check_servable(train, views)
        service.check_dispatcher(settings.data.service)
    if chief:  # the settings and data are sound: take the run folder (held until the end)
        created = not os.path.isdir(run_dir)
        os.makedirs(run_dir, exist_ok=True)
        stack.enter_context(folder.lock())
        if created:  # a run that fails before its first save leaves no folder behind
            stack.push(_discard_on_error(folder))
    batch, steps_per_epoch = plan.batch_size, plan.steps_per_epoch
    backup = folder.read_backup()
    changes = changes_since_backup(folder, config) if backup else []
    check_plan(config, run_dir, backup, changes, steps_per_epoch)
    if chief and changes:
        print(resumed_with(run_dir, backup, changes), flush=True)

    def write_config():
        with open(folder.config, "w") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)

    if chief and not changes:
        write_config()
        # else: once the backup is restored; a refused resume keeps the backup's config.yaml

    # What each machine would resolve on its own (precision: auto, XLA) is decided once for
    # the run and kept by its resumes.
    timeout = settings.distribute.collective_timeout_seconds
    decided, note = decisions.decide(settings.train, strategy,
                                     folder.read_decided() if backup else None, timeout)
    if note:
        print(note, flush=True)
    elif chief and decided["why"]:
        print(f"precision: {decided['precision']} ({decided['why']})", flush=True)
    with _dtype_policy(decided["precision"]), strategy.scope():
        model = build_planned_model(settings, plan, views)
    if chief:
        check_space(folder, model, settings.train.export)
    # Unreadable images: skipped, reported once per epoch, listed in the run folder.
    skipped = data.SkippedFiles(list_path=folder.skipped_files if chief else None)
    listed = data.listed_unreadable(folder.skipped_files) if chief and backup else []
    if chief:
        print(data.describe_inputs(train, held_out, folder.skipped_files), flush=True)
    if chief and backup:  # the bad files met before the stop stay listed
        skipped.relist(listed)
    # Epoch e is its own seeded pass over the images: a resumed run starts at the epoch and
    # step it stopped at, with the images, order and views it would have had, reading from
    # the place in the epoch's order its checkpoint recorded.  With the online probe the
    # batches carry the labels, which only the probe reads; the views are the same.
    position = data.StreamPosition()
    if settings.data.service:  # batches made by tf.data service's workers
        dataset = data.distribute(strategy, lambda context: service.served_pretrain_dataset(
            train, batch, views, settings.data.service, seed=settings.data.seed,
            input_context=context, skipped=skipped, channels=settings.data.channels,
            with_labels=plan.probe_classes is not None, first_epoch=backup.epoch if backup else 0,
            first_step=backup.step if backup else 0, steps_per_epoch=steps_per_epoch))
    else:
        dataset = data.distribute(strategy, lambda context: data.pretrain_dataset(
            train, batch, views, seed=settings.data.seed, input_context=context,
            skipped=skipped, image_size=settings.data.image_size,
            channels=settings.data.channels, with_labels=plan.probe_classes is not None,
            first_epoch=backup.epoch if backup else 0, first_step=backup.step if backup else 0,
            steps_per_epoch=steps_per_epoch, resume_at=backup.positions if backup else None,
            position=position))
    monitor = knn_monitor(settings, views, train, held_out, strategy)
    guard = callbacks.HealthMonitor(
        health_sample(settings, views, train), steps_per_epoch, batch,
        stop_on_collapse=settings.train.stop_on_collapse)
    # SIGTERM and SIGINT during training: finish the step, save, stop (after it, during the
    # evaluation and export, they stop the process at once: a re-run redoes only those).
    signals = interrupts.StopSignals()
    resume = callbacks.Resume(folder, writer=chief, changes=changes,
                              restored=write_config if chief and changes else None,
                              steps_per_epoch=steps_per_epoch,
                              every_minutes=settings.train.checkpoint_every_minutes,
                              signals=signals, point=backup, position=position,
                              peer_timeout=timeout, decided=decided)
    loggers = _loggers(folder) if chief else []
    # Every wait on a peer is timed, the epoch's end and the evaluations included.
    stuck = peers.watchdog(strategy, timeout)
    try:
        with signals, _lost_peers(strategy, model, stuck), _lost_batches(settings.data):
            model.fit(dataset, epochs=settings.train.epochs,
                      steps_per_epoch=steps_per_epoch,
                      shuffle=False,  # the dataset shuffles itself, once per epoch
                      verbose=verbose if chief else 0,
                      callbacks=([stuck] if stuck else [])
                      + [callbacks.Throughput(batch, steps_per_epoch), guard,
                         callbacks.ProgressBar()]
                      + _callbacks(resume, loggers, monitor, precise_bn(settings, views, train))
                      + [skipped.callback()])
    except Interrupted:
        for logger in loggers:
            if isinstance(logger, keras.callbacks.TensorBoard):
                logger.on_train_end()  # closes its event files: the curves so far are kept
        raise
    if model.stop_reason:
        last = folder.read_backup()
        kept = (f"its last good state (epoch {last.epoch}) is kept in {folder.backup}"
                if last else "no epoch finished before")
        advice = (model.DIVERGENCE_ADVICE if model.stop_reason.kind == "divergence"
                  else model.COLLAPSE_ADVICE)
        raise TrainingStopped(f"the run stopped: {model.stop_reason}; {kept}; {advice}")
    if signals.received:  # during the last epoch's end: its state is saved
        resume.stop(settings.train.epochs, 0)

    results = {"epochs": settings.train.epochs,
               "replicas": int(strategy.num_replicas_in_sync), "caco_tf": __version__}
    if held_out is not None and train.has_labels:
        with (stuck.watching("the end-of-run kNN evaluation") if stuck
              else contextlib.nullcontext()), _lost_peers(strategy, model, stuck), \
                _lost_batches(settings.data):
            results["knn_top1"] = knn_top1(model.backbone, views, settings, train, held_out,
                                           strategy)
    if not chief:
        return {}
    # The whole model as Keras saves it, beside the weights checkpoint: keras.models.load_model
    # reads it, and caco-evaluate and caco-export take it instead of the run folder.
    writing = folder.model
    try:
        if settings.train.export:
            model.save(folder.model)
            backbone = _local_copy(model.backbone)
            query_encoder = _local_copy(model.query_encoder)
            writing = folder.saved_model
            results["saved_model"] = export.export_backbone(
                backbone, folder.saved_model, settings.data.image_size,
                settings.data.channels, views.mean, views.std, embedder=query_encoder)
        writing = folder.results
        write_json_atomically(folder.results, results, indent=1)
    except tf.errors.OpError as error:  # TensorFlow's own writes (the SavedModel's variables)
        raise write_error(error, writing) from None
    return results


@contextlib.contextmanager
def _lost_peers(strategy, model, stuck):
    """TensorFlow's error about a lost peer (under a multi-worker strategy) as one
    ``PeerError`` line naming it and where the run stood; the watchdog stops with the phase."""
    try:
        yield
    except BaseException as error:
        lost = (isinstance(error, tf.errors.OpError) and distribute.is_multi_worker(strategy)
                and peers.peer_error(error, int(model.optimizer.iterations.numpy()), stuck))
        if stuck is not None:
            stuck.close()  # this worker stops here: nothing more to time
        if not lost:
            raise
        raise lost from None


@contextlib.contextmanager
def _lost_batches(data_settings):
    """A batch the tf.data service lost (training or an evaluation pass) as one resumable
    ``BatchLost`` line."""
    try:
        yield
    except tf.errors.OpError as error:
        lost = service.batch_lost(error) if data_settings.service else None
        if lost is None:
            raise
        raise lost from None


def check_space(folder, model, exported=True):
    """A ``WriteError`` at the start, with the sizes, when the run folder's file system cannot
    hold what the run will write (``run_folder.space_needed``) beside what it holds."""
    needed, parts = run_folder.space_needed(model, exported)
    try:
        free = shutil.disk_usage(folder.path).free
    except OSError:
        return
    held = run_folder.size_of(folder.backup, folder.checkpoint, folder.model, folder.saved_model)
    if free + held < needed:
        raise run_folder.WriteError(
            f"cannot write {folder.path}: its file system has {_size(free)} free (and "
            f"{_size(held)} in files the run will replace) but the run's files need about "
            f"{_size(needed)} ({parts}); free space on its disk (or pass another --run-dir), "
            f"then run the same command to continue")


def _size(count):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024


def check_plan(config, run_dir, backup, changes, steps_per_epoch):
    """Refuse, in one line, a resume whose settings change what is trained
    (``TRAINED_SETTINGS``: the method, the networks, the bank), or the schedules of the run in
    progress unless ``train.on_schedule_change`` is ``rescale`` (then every schedule is
    re-planned over the new length and the run continues at its step: the learning rates and
    the EMA momentum jump to the new plan's values there)."""
    if backup is None:
        return
    trained = [change for change in changes if _changes_what_is_trained(change.split(":")[0])]
    if trained:
        raise ConfigError(
            f"cannot resume {run_dir} at epoch {backup.epoch}: {', '.join(trained)} would change "
            f"what is trained (its checkpoint holds what the settings it was trained with "
            f"built); re-run with those settings, or pass another --run-dir to train anew")
    if config["train"]["on_schedule_change"] == "rescale":
        return
    changed = [change for change in changes if is_schedule_setting(change.split(":")[0])]
    if backup.steps_per_epoch and backup.steps_per_epoch != steps_per_epoch:
        changed.append(f"steps per epoch: {backup.steps_per_epoch} -> {steps_per_epoch}")
    if changed:
        raise ConfigError(
            f"cannot resume {run_dir} at epoch {backup.epoch}: {', '.join(changed)} would "
            f"change the schedules of the run in progress; re-run with the settings it was "
            f"trained with, or add --set train.on_schedule_change=rescale to re-plan the rest "
            f"of the run over the new length")


def _changes_what_is_trained(key):
    from caco_tf.config import SETTINGS

    return key.startswith(TRAINED_SETTINGS) or getattr(SETTINGS.get(key), "trained", False)


def resumed_with(run_dir, backup, changes):
    """The line a resume with changed settings prints: what changed."""
    where = (f"epoch {backup.epoch + 1}, step {backup.step}" if backup.step
             else f"the end of epoch {backup.epoch}")
    return f"resuming {run_dir} at {where} with changed settings: {', '.join(changes)}"


def changes_since_backup(folder, config):
    """The settings that differ from the run folder's ``config.yaml`` when it holds a backup
    (a run to resume), as ``config.changed_settings`` lists them; else [].  A ``config.yaml``
    written before caco_tf 0.3.0 is compared in today's layout: the rename is no change."""
    folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
    if not (folder.has_backup() and os.path.exists(folder.config)):
        return []
    try:
        with open(folder.config) as handle:
            saved = upgrade_saved_config(yaml.safe_load(handle) or {})
        if not (isinstance(saved, dict) and all(isinstance(v, dict) for k, v in saved.items()
                                                if k in config and isinstance(config[k], dict))):
            raise ValueError("not a mapping of settings")
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as error:
        reason = (error.strerror if isinstance(error, OSError) else
                  f"not valid YAML: {error.problem} at line {error.problem_mark.line + 1}"
                  if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark else
                  "not valid YAML" if isinstance(error, yaml.YAMLError) else str(error))
        raise ConfigError(
            f"cannot read {folder.config} ({reason}): it records the settings the checkpoint "
            f"in {folder.backup} was trained with; restore it, or delete it to resume with "
            f"this command's settings") from None
    return changed_settings(in_use(saved), in_use(config))


def _discard_on_error(folder):
    """An exit callback for the ``ExitStack`` that holds the folder's lock (it runs before the
    lock is released): on an error, the folder this run created is removed if it holds
    nothing of value (``RunFolder.discard_if_valueless``)."""
    def on_exit(kind, error, trace):
        if kind is not None:
            folder.discard_if_valueless()
        return False  # the error goes on to the command

    return on_exit


def _loggers(folder):
    """What the chief writes every epoch: history, TensorBoard, the weights checkpoint."""
    return [callbacks.HistoryJSON(folder.history),
            keras.callbacks.TensorBoard(folder.tensorboard),
            callbacks.Checkpoint(folder.checkpoint, folder)]


def _callbacks(resume, loggers, monitor=None, precise=None):
    """The monitor and BatchNorm re-estimation, the resume state, then the chief's loggers.

    The monitor comes before the loggers: they record what it adds to the epoch's logs; the
    re-estimation after the monitor (its curve compares like with like), and both before the
    backup and the checkpoint (which save the new statistics).
    """
    return [callback for callback in (monitor, precise) if callback] + [resume] + loggers


@contextlib.contextmanager
def _dtype_policy(name):
    """Build the model under a keras dtype policy without leaking it to later code."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _local_copy(model):
    """A single-device copy of a (possibly mirrored) model, for evaluation and export."""
    if not _is_distributed(model):
        return model
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _is_distributed(model):
    return any(isinstance(getattr(v, "value", v), tf.distribute.DistributedValues)
               for v in model.weights)
