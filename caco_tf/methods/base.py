"""The Keras model that trains every method: the one step they all run, its phases, the metric
trackers, and the Keras plumbing (compile, fit, export, summary, serialization).

A method is a ``keras.Model`` whose step is its algorithm, read top to bottom (``_step``):

1. the teacher's targets for the global crops, from the pre-step teacher (``targets``);
2. the student's outputs for every crop (``forward``), recorded on a tape, and the loss from
   them, the targets and the pre-step state (``method_loss``), which the tape differentiates;
   a method that gives its exact gradient (``EXACT_GRADIENT``: CaCo) computes the loss and
   its gradient with respect to the outputs after the tape instead (``objective``);
3. the state's own step, from the pre-step state (``update_state``): a queue's write, a
   center's move (CaCo's bank steps inside ``objective``);
4. every trainable part of the student descends the loss: backbone, projector and heads;
5. after the step (``after_step``): the teacher follows the student (EMA), SwAV's prototypes
   return to the unit sphere.

A run's steps are phases (``phases``): the warm-up, then the method's, split where a frozen
head thaws.

What a method declares, the hooks its step calls and the parts it builds are its algorithm's
(``algorithm.Algorithm``); its online probe is ``online_probe``'s, its summary's parts
``summary``'s, and the files of older versions ``old_files``'.
"""

import collections

import keras
import tensorflow as tf

from caco_tf import health
from caco_tf.methods import old_files, online_probe
from caco_tf.methods.algorithm import Algorithm, AuthorsViews, Crops, Objective
from caco_tf.methods.momentum_encoder import UNIT_LAYER
from caco_tf.methods.summary import parts_table
from caco_tf.training import distribute, steps

# A run's phase: from ``first_step`` on, the step of ``hooks`` (the method or the warm-up), the
# ``frozen`` heads left out of the optimizer; ``on_enter`` runs once at ``first_step``.
Phase = collections.namedtuple("Phase", "first_step hooks frozen on_enter")

# Arguments every method takes besides its own SETTINGS (build_model gives them).
COMMON_ARGUMENTS = ("warmup_steps", "online_probe_classes", "multi_crop", "sync_batchnorm",
                    "preprocessing", "run_settings")

# A method's file takes the types of its declarations (Crops, AuthorsViews, Objective) from
# here too.
__all__ = ["COMMON_ARGUMENTS", "AuthorsViews", "Crops", "Method", "Objective", "Phase"]


@keras.saving.register_keras_serializable(package="caco_tf")
class Method(Algorithm, keras.Model):
    """The shared base of the methods (``caco_tf.methods``); see the module docstring.

    Args:
      backbone: a ``keras.Model`` from images to pooled features (``caco_tf.nets.backbones``).
      projector: a ``keras.Model`` from features to the D-dimensional projection.
      warmup_steps: steps of the bank warm-up before the method's own (0: none).
      online_probe_classes: if set, an online linear probe (evaluation only, ``probe_top1``):
        a Dense head with its own optimizer on stop-gradient backbone features of the first
        crop of labelled batches.  It never changes the encoder.
      multi_crop: batches hold two global crops then local crops (methods whose ``CROPS``
        take local ones).
      sync_batchnorm: the heads' BatchNorm statistics over all replicas (as the projector's).
      preprocessing: how images reach the backbone (``image_size``, ``channels``, ``mean``,
        ``std``, optionally ``crop_fraction``), for ``export``; ``build_model`` sets it.
      run_settings: the run configuration the model was built from (``build_model``), kept in
        the ``.keras`` file so that evaluation and export can rebuild the run around it.
      **arguments: the method's own settings (``SETTINGS``, by constructor name); a setting
        not given takes its default.  Per-step quantities are floats or schedules of the step.

    A Keras citizen: ``model.save`` and ``keras.models.load_model`` round-trip every part, the
    state, the optimizer and the step; ``export`` (SavedModel, ONNX, LiteRT); ``summary``.
    """

    views_on_device = None  # augment.ColourOnDevice: the views' colour work, in the step
    stop_reason = None  # why its run stopped itself (training.stop_reason, HealthMonitor sets it)

    def __init__(self, backbone, projector, warmup_steps=0, online_probe_classes=None,
                 multi_crop=False, sync_batchnorm=False, preprocessing=None, run_settings=None,
                 name=None, **arguments):
        if multi_crop and not self.CROPS.local:
            raise ValueError(f"method {self.method!r} takes {self.crops_wording()}, not multi-crop")
        unknown = sorted(set(arguments) - set(self.argument_defaults()))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown arguments {', '.join(unknown)} "
                            f"(its own: {', '.join(self.argument_defaults()) or 'none'})")
        super().__init__(name=name or self.method)
        # The arguments as given, for get_config (schedules and all).
        self._arguments = dict(arguments, warmup_steps=warmup_steps,
                               online_probe_classes=online_probe_classes, multi_crop=multi_crop,
                               sync_batchnorm=sync_batchnorm, preprocessing=preprocessing,
                               run_settings=run_settings)
        for key, default in self.argument_defaults().items():
            setattr(self, key, arguments.get(key, default))
        self.preprocessing = dict(preprocessing) if preprocessing else None
        self.run_settings = run_settings
        self.multi_crop = bool(multi_crop)
        own = {key: getattr(self, key) for key in self.argument_defaults()}
        self.views_per_image = int(self.view_count(own))  # its settings, as given or defaulted
        self.masks_per_image = len(self.view_masks(own))
        self.sync_batchnorm = bool(sync_batchnorm)  # the heads' BatchNorm, as the projector's
        self.warmup_steps = int(warmup_steps)
        if self.warmup_steps and self.WARMUP is None:
            raise ValueError(f"method {self.method!r} has no bank warm-up")

        self.build_parts(backbone, projector)

        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.diagnostic_trackers = [keras.metrics.Mean(name=name) for name in self.DIAGNOSTICS]
        self._create_method_trackers()
        self.lr_tracker = keras.metrics.Mean(name="lr")
        # Health without labels (caco_tf.health): the two views' embeddings, batch by batch.
        self.alignment_tracker = keras.metrics.Mean(name="alignment")
        self.uniformity_tracker = keras.metrics.Mean(name="uniformity")
        self.input_wait = 0.0  # seconds the steps waited for their batches (a data stall)
        self.waiting_for_input = False

        online_probe.attach(self, online_probe_classes)
        self.built = True  # every variable exists now; Keras' restore callbacks need this

    def phases(self):
        """The run's phases (``Phase``): the warm-up while the step counter is below
        ``warmup_steps``, then the method's steps, split where a frozen part thaws."""
        thaws = self.frozen_until()
        starts = sorted({self.warmup_steps} | {s for s in thaws.values()
                                               if s > self.warmup_steps})
        phases = [Phase(0, self.warmup, frozenset(), None)] if self.warmup else []
        warmup_end = self.warmup.on_end() if self.warmup else None
        for start in starts:
            frozen = frozenset(name for name, until in thaws.items() if until > start)
            phases.append(Phase(start, self, frozen,
                                warmup_end if start == self.warmup_steps else None))
        return phases

    # ------------------------------------------------------------------ the step
    def _step(self, data, phase, learn=True):
        """One step of ``phase`` (module docstring); without ``learn``, the loss and the
        diagnostics only (evaluation: inference mode, nothing updated)."""
        hooks = phase.hooks
        crops, labels = _crops_and_labels(data)
        split = len(crops) - self.masks_per_image  # the masks come after the crops
        crops, masks = crops[:split], crops[split:]
        given = {"masks": masks} if masks else {}  # only a method that declares them
        if self.views_on_device is not None:
            crops = self.views_on_device.colour(crops)
        if len(crops) != self.views_per_image and not (self.CROPS.local and len(crops) > 2):
            raise ValueError(f"method {self.method!r} takes {self.views_per_image} views"
                             f"{' (or 2 global then local crops)' if self.CROPS.local else ''}"
                             f", got {len(crops)} crops")
        step = self.optimizer.iterations
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)  # this step's

        # 1. The teacher's targets, from the pre-step teacher.
        targets = hooks.targets(crops, training=learn, **given)
        # 2. The student's outputs and, differentiated by the tape, the loss.
        exact = learn and hooks.EXACT_GRADIENT
        with tf.GradientTape() as tape:
            outputs = hooks.forward(crops, training=learn, **given)
            if not exact:
                loss, diagnostics = hooks.method_loss(outputs, targets, step)
        if exact:
            loss, gradients, diagnostics = hooks.objective(outputs, targets, step)
        if learn:
            # 3. The state's step, from the pre-step state.
            diagnostics = dict(diagnostics, **(hooks.update_state(outputs, targets, step) or {}))
            # 4. Every trainable part descends the loss (but a frozen head).
            frozen = {id(v) for name in phase.frozen for v in getattr(self, name).weights}
            variables = [v for v in hooks.student_variables if id(v) not in frozen]
            self._descend(tape, variables, *((outputs, gradients) if exact else (loss,)))
            # 5. The teacher follows; the method's renormalizations.
            hooks.after_step(step)

        self.loss_tracker.update_state(loss)
        hooks.track_diagnostics(diagnostics)
        self.lr_tracker.update_state(learning_rate)
        embeddings = hooks.view_embeddings(outputs)
        if embeddings is not None:  # one view: nothing to align
            self._track_views(*embeddings)
        online_probe.step(self, labels, crops[0], learn)
        return self._logs()

    def train_step(self, data):
        """The method's own step (``_step``), outside any warm-up."""
        return self._step(data, Phase(0, self, frozenset(), None))

    def test_step(self, data):
        """The method's loss and diagnostics without any update (inference mode)."""
        return self._step(data, Phase(0, self, frozenset(), None), learn=False)

    def _descend(self, tape, variables, outputs, output_gradients=1.0):
        """One optimizer step of ``variables`` down the loss: ``outputs`` were recorded on
        ``tape`` and the loss's gradient with respect to them is ``output_gradients`` (the loss
        itself and 1, or the outputs and the gradient ``objective`` computed)."""
        # Keras sums gradients over replicas: each replica contributes its share of the mean.
        scale = 1.0 / distribute.num_replicas()
        if hasattr(self.optimizer, "scale_loss"):  # LossScaleOptimizer under mixed_float16
            scale = self.optimizer.scale_loss(tf.constant(scale))
        output_gradients = tf.nest.map_structure(
            lambda g: tf.cast(g, tf.float32) * scale, output_gradients)
        self.optimizer.apply(tape.gradient(outputs, variables,
                                           output_gradients=output_gradients), variables)

    def _logs(self):
        logs = {}
        for metric in self.metrics:
            result = metric.result()
            logs.update(result if isinstance(result, dict) else {metric.name: result})
        return distribute.reducible(logs)

    def _track_views(self, embedding1, embedding2):
        """Alignment of the two views' unit embeddings, and their uniformity (each view's
        batch, averaged): ``caco_tf.health``."""
        embedding1, embedding2 = tf.stop_gradient(embedding1), tf.stop_gradient(embedding2)
        self.alignment_tracker.update_state(health.alignment(embedding1, embedding2))
        self.uniformity_tracker.update_state(
            0.5 * (health.uniformity(embedding1) + health.uniformity(embedding2)))

    # ------------------------------------------------------------------ Keras plumbing
    @property
    def metrics(self):
        probe = [self.probe_top1] if self.online_probe is not None else []
        # One view, no alignment: an empty mean's 0 would read as bunched embeddings.
        views = [] if self.CROPS.views == 1 else [self.alignment_tracker, self.uniformity_tracker]
        return ([self.loss_tracker] + self.diagnostic_trackers + self.method_metrics()
                + [self.lr_tracker] + views + probe)

    def compile(self, optimizer="sgd", **kwargs):
        super().compile(optimizer=optimizer, **kwargs)
        replicas = self.distribute_strategy.num_replicas_in_sync
        clipping = [name for name in ("clipnorm", "global_clipnorm", "clipvalue")
                    if getattr(self.optimizer, name, None)]
        if clipping and replicas > 1:  # Keras' TF backend clips before the all-reduce
            raise ValueError(
                f"optimizer {clipping[0]} on {replicas} replicas clips each replica's share of "
                f"the gradient, not the gradient: use train.clip_gradient_norm (or the "
                f"clip_tensor_norm of caco_tf's LARS and AdamW), which clips the summed one")
        # The student's parts only: the teacher follows by EMA, the state by its own rule.
        # Building here keeps Keras from allocating slots for the teacher.
        self.optimizer.build(self.student_variables)
        online_probe.build_optimizer(self)

    def compile_from_config(self, config):
        """``keras.models.load_model`` compiles a loaded model through this: this class's
        ``compile``, which Keras skips for a model whose ``compile`` is overridden."""
        self.compile(**keras.saving.deserialize_keras_object(config))

    def load_own_variables(self, store):
        """The model has no variables of its own but in caco_tf 0.2's files (``old_files``)."""
        if not old_files.bank_rows_of_0_2(self, store):
            super().load_own_variables(store)

    # Skips fit's symbolic build, a Keras hook: why in keras_compat.OVERRIDDEN_HOOKS.
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        return

    def call(self, images, training=False):
        """The embedding z (the unit projection: the bank's space, the health measures')."""
        return self.query_encoder(images, training=training)

    def features_and_embeddings(self, images, training=False):
        """The backbone's features and the embeddings, from one pass of the backbone."""
        features = self.backbone(images, training=training)
        normalize = self.query_encoder.get_layer(UNIT_LAYER)
        return features, normalize(self.projector(features, training=training))

    def make_train_function(self, force=False):
        """The run's phases (``phases``), ``steps_per_execution`` steps per call in one
        compiled loop that takes its batches itself (``training.steps.TrainFunction``: the
        phase by the optimizer's step, the time the steps wait for their batches)."""
        if self.train_function is not None and not force:
            return self.train_function
        self.train_function = steps.TrainFunction(self, [
            (phase.first_step, lambda data, phase=phase: self._step(data, phase),
             phase.on_enter) for phase in self.phases()])
        return self.train_function

    def fit(self, x=None, *args, **kwargs):
        """``keras.Model.fit``, refusing batches that R replicas cannot share equally (the
        steps gather embeddings in equal shares and weigh each replica's gradient by 1 / R:
        batch with ``drop_remainder=True`` and a multiple of R).  A ``tf.data.Dataset`` keeps
        its own order (``shuffle`` defaults to False, sparing Keras' warning)."""
        distribute.check_replica_shares(x, self.distribute_strategy.num_replicas_in_sync)
        if isinstance(x, tf.data.Dataset) and len(args) < 7:  # shuffle is fit's 8th parameter
            kwargs.setdefault("shuffle", False)
        self.make_train_function()
        # The compiled loop ends its calls at the epochs' ends when it knows them.
        self.train_function.steps_per_epoch = kwargs.get("steps_per_epoch")
        return super().fit(x, *args, **kwargs)

    def get_config(self):
        config = {"name": self.name, "backbone": keras.saving.serialize_keras_object(
            self.backbone), "projector": keras.saving.serialize_keras_object(self.projector)}
        for key, value in self._arguments.items():
            config[key] = (keras.saving.serialize_keras_object(value) if isinstance(
                value, keras.optimizers.schedules.LearningRateSchedule) else value)
        return config

    @classmethod
    def from_config(cls, config):
        config = old_files.upgrade_arguments(cls, dict(config), COMMON_ARGUMENTS)
        for key, value in config.items():
            if isinstance(value, dict) and "class_name" in value:
                config[key] = keras.saving.deserialize_keras_object(value)
        return cls(**config)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               serving_layout=False, version=1, image_size=None, channels=None, mean=None,
               std=None, crop_fraction=None, **kwargs):
        """Export the backbone for serving, with its preprocessing (the model's own, or
        ``image_size``, ``channels``, ``mean`` and ``std`` given here): a SavedModel
        (``tf_saved_model``: uint8 images in, ``serving_default`` features, ``embed``,
        ``serve_bytes``; TF Serving's layout with ``serving_layout``), ``onnx`` or ``litert``
        (``caco_tf.serving.export.export_model``).  Without a preprocessing, the SavedModel
        takes float images as the backbone does.  The signatures are fixed.  Returns the path.
        """
        from caco_tf.serving import export as serving

        if input_signature is not None:
            raise ValueError("export takes no input_signature: the signatures are fixed "
                             "(caco_tf.serving.export)")
        given = {key: value for key, value in dict(image_size=image_size, channels=channels,
                 mean=mean, std=std, crop_fraction=crop_fraction).items() if value is not None}
        return serving.export_model(self, filepath, format=format,
                                    serving_layout=serving_layout, version=version,
                                    preprocessing=given, **kwargs)

    def summary(self, line_length=None, positions=None, print_fn=None, **kwargs):
        """Keras' summary (``keras.Model.summary``), then the method's parts and their sizes
        (backbone, projector, heads, teacher, state, probe)."""
        super().summary(line_length, positions, print_fn, **kwargs)
        for line in parts_table(self):
            (print_fn or print)(line)


def _crops_and_labels(data):
    """A batch's crops, two global crops first, and its labels (None if absent; they are for
    evaluation only): (view1, view2, ...), ((views), label) or {'views': ..., 'label': ...}."""
    if isinstance(data, dict):
        return _crops_and_labels(data["views"])[0], data.get("label")
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        return tuple(data[0]), data[1]
    return tuple(data), None
