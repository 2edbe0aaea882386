"""What every method shares: its parts, the one step they all run, the metric trackers, the
online probe and the Keras plumbing.

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

A method declares the crops it takes (``CROPS``): two views, K equal views (W-MSE's), or two
global crops then local ones (multi-crop: CaCo, SwAV, DINO).  The views follow from it
(``caco_tf.build.build_views``) and every kind runs the same step: the crops come as one tuple,
the global crops first.

A method declares its parts; the base builds and trains them:

- the student: ``backbone`` → ``projector``, whose raw projection (``project``) the default
  ``forward`` gives (the embedding network ``query_encoder`` adds the L2 normalization, for
  the methods that work on the unit sphere), then the heads it names in ``HEADS`` (a
  predictor, prototypes, DINO's last layer), which it builds in ``build_heads``;
- the teacher, ``TEACHER``: ``"momentum"`` (an EMA copy of the embedding network and the
  ``TEACHER_HEADS``, its momentum the setting ``key_momentum``) or None (a method whose
  targets are its own outputs stops their gradient in its loss: SimSiam, SwAV);
- its state, built in ``build_state``: a bank (``MemoryBank``), a queue or a center;
- its settings, ``SETTINGS``: the section ``method.<name>`` of a run's configuration, each
  setting the constructor argument of its name (``caco_tf.config.Setting``).

A method may offer a warm-up that runs before its own steps (``WARMUP``: the bank warm-up,
``bank_warmup.BankWarmup``, a part it opts into as it opts into a momentum teacher), switched
on by ``warmup_steps``.  A run's steps are phases (``phases``): the warm-up, then the
method's, split where a frozen head thaws.
"""

import collections

import keras
import tensorflow as tf

from caco_tf import health, losses
from caco_tf.methods.momentum_encoder import UNIT_LAYER, MomentumEncoder, build_encoder
from caco_tf.methods.summary import parts_table
from caco_tf.training import distribute, steps

# What ``objective`` gives (EXACT_GRADIENT methods): the loss, its gradient with respect to the
# outputs (their structure), and the method's diagnostics ({name: value}).
Objective = collections.namedtuple("Objective", "loss gradients diagnostics")

# A run's phase: from ``first_step`` on, the step of ``hooks`` (the method or the warm-up), the
# ``frozen`` heads left out of the optimizer; ``on_enter`` runs once at ``first_step``.
Phase = collections.namedtuple("Phase", "first_step hooks frozen on_enter")

# The crops a method takes: ``views`` equal full-size views of each image (2, or K: a number or
# the name of the method's setting that gives it), and whether local crops may follow the two
# global ones (``local``: multi-crop, ``data.views multicrop``).
Crops = collections.namedtuple("Crops", "views local")

# Arguments every method takes besides its own SETTINGS (build_model gives them).
COMMON_ARGUMENTS = ("warmup_steps", "online_probe_classes", "multi_crop", "sync_batchnorm",
                    "preprocessing", "run_settings")


@keras.saving.register_keras_serializable(package="caco_tf")
class Method(keras.Model):
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

    method = None                  # the name ``method.name`` gives it
    SETTINGS = {}                  # its own settings: method.<method>.<key>
    SETTINGS_OF = None             # the method whose settings it reads instead (ablation rows)
    TEACHER = None                 # "momentum" or None
    TEACHER_HEADS = ()             # heads the momentum teacher copies (DINO's last layer)
    WARMUP = None                  # the part run before its steps (bank_warmup.BankWarmup)
    HEADS = ()                     # the student's heads, by attribute name
    PROJECTOR = {}                 # the projector's shape (nets.backbones.build_mlp; CaCo's)
    CROPS = Crops(views=2, local=False)  # the crops it takes (``Crops``)
    EXACT_GRADIENT = False         # gives d loss / d outputs itself (``objective``)
    DIAGNOSTICS = ()               # scalar diagnostics of ``method_loss``, averaged per epoch
    BATCH_MATRIX = None            # a D x D matrix it estimates from the batch (its name)
    views_on_device = None  # augment.ColourOnDevice: the views' colour work, in the step
    COLLAPSE_ADVICE = ("lower the learning rate (train.learning_rate) or lengthen its warm-up "
                       "(train.lr_warmup_epochs)")
    DIVERGENCE_ADVICE = ("lower the learning rate (train.learning_rate) or use train.precision "
                         "float32")     # what to change when its loss becomes NaN or infinite
    TEACHER_NAME = "teacher"       # the momentum teacher's name in ``summary``
    stop_reason = None  # why its run stopped itself (training.stop_reason, HealthMonitor sets it)
    # docs/methods.md's row, beside what the attributes above say: the state it keeps, the
    # quantities it reduces over the global batch and, without a momentum teacher, what
    # serves as one ("teacher") (``caco_tf.methods.docs_table``).
    # docs/methods.md's row: the state it keeps, what it reduces over the global batch, and
    # the paper's ImageNet ResNet-50 linear top-1 (%) of the method (its tables 200/800/multi).
    DOCS_ROW = {"state": "–", "global batch": "–", "paper": "–"}

    def __init__(self, backbone, projector, warmup_steps=0, online_probe_classes=None,
                 multi_crop=False, sync_batchnorm=False, preprocessing=None, run_settings=None,
                 name=None, **arguments):
        if multi_crop and not self.CROPS.local:
            raise ValueError(f"method {self.method!r} takes {self.crops_wording()}, not "
                             f"multi-crop")
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
        self.views_per_image = int(self.view_count(  # its settings, as given or defaulted
            {key: getattr(self, key) for key in self.argument_defaults()}))
        self.sync_batchnorm = bool(sync_batchnorm)  # the heads' BatchNorm, as the projector's
        self.warmup_steps = int(warmup_steps)
        if self.warmup_steps and self.WARMUP is None:
            raise ValueError(f"method {self.method!r} has no bank warm-up")

        self.backbone = backbone
        self._projector_name = projector.name  # its layer in the embedding network
        self.query_encoder = build_encoder(backbone, projector, "query_encoder")
        self.build_heads()
        self.key_encoder = (self.momentum_teacher(self.key_momentum)
                            if self.TEACHER == "momentum" else None)
        self.memory_bank = None
        self.build_state()
        # The warm-up adds what it needs and the method lacks (a bank, a key encoder).
        self.warmup = self.WARMUP(self) if self.warmup_steps else None

        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.diagnostic_trackers = [keras.metrics.Mean(name=name) for name in self.DIAGNOSTICS]
        self._create_method_trackers()
        self.lr_tracker = keras.metrics.Mean(name="lr")
        # Health without labels (caco_tf.health): the two views' embeddings, batch by batch.
        self.alignment_tracker = keras.metrics.Mean(name="alignment")
        self.uniformity_tracker = keras.metrics.Mean(name="uniformity")
        self.input_wait = 0.0  # seconds the steps waited for their batches (a data stall)
        self.waiting_for_input = False

        self.online_probe = None
        if online_probe_classes:
            # Parameter-free standardization, then one Dense: the features' scale then sets
            # neither the probe's speed nor its learning rate.
            self.online_probe = keras.Sequential([
                keras.Input((backbone.output_shape[-1],)),
                keras.layers.BatchNormalization(center=False, scale=False, momentum=0.9,
                                                dtype="float32"),
                keras.layers.Dense(online_probe_classes, dtype="float32")], name="online_probe")
            self.probe_optimizer = keras.optimizers.Adam(1e-2)
            self.probe_top1 = keras.metrics.SparseCategoricalAccuracy(name="probe_top1")
        self.built = True  # every variable exists now; Keras' restore callbacks need this

    # ------------------------------------------------------------------ what a method declares
    @classmethod
    def argument_defaults(cls):
        """{constructor argument: default} of the method's settings (``SETTINGS``); a setting
        counted in epochs is an argument in steps (default 0)."""
        return {setting.argument or key: 0 if setting.in_steps else setting.default
                for key, setting in cls.SETTINGS.items() if setting.passed}

    @classmethod
    def view_count(cls, settings=None):
        """K, the equal full-size views it takes of each image (``CROPS.views``); ``settings``:
        its section of a run's configuration (else its defaults)."""
        views = cls.CROPS.views
        if isinstance(views, int):
            return views
        return (settings or {}).get(views, cls.SETTINGS[views].default)

    @classmethod
    def crops_wording(cls):
        """What it takes, in words (docs/methods.md's table, its errors)."""
        views = cls.CROPS.views
        words = f"{views} views" if isinstance(views, int) else (
            f"K equal views (method.{cls.method}.{views}, default "
            f"{cls.SETTINGS[views].default})")
        return words + (", or 2 global crops then local crops" if cls.CROPS.local else "")

    @classmethod
    def check_batch(cls, settings, replica_batch, embedding_dim):
        """Why the method cannot train on a replica's batch of ``replica_batch`` images with
        ``embedding_dim``-dimensional projections (one line naming the setting to change), or
        None; ``settings``: its section of the run's configuration.  Asked before anything is
        built (``caco_tf.build.check_sizes``)."""

    def build_heads(self):
        """Build the student's heads (``HEADS``)."""

    def build_state(self):
        """Build the method's state (``self.memory_bank``, a queue, a center)."""

    def _create_method_trackers(self):
        """Trackers beyond ``DIAGNOSTICS`` (CaCo's MPPs), which ``method_metrics`` lists."""

    def method_metrics(self):
        return []

    @classmethod
    def projector_shape(cls, settings):
        """``build_mlp``'s arguments for a run whose method section is ``settings``."""
        return cls.PROJECTOR

    @property
    def embedding_dim(self):
        return int(self.query_encoder.output_shape[-1])

    @property
    def projector(self):  # inside the embedding network: backbone → projector → L2
        return self.query_encoder.get_layer(self._projector_name)

    @property
    def heads(self):
        return [getattr(self, name) for name in self.HEADS]

    def _teacher_heads(self):
        return [getattr(self, name) for name in self.TEACHER_HEADS]

    def momentum_teacher(self, momentum):
        """An EMA copy (``MomentumEncoder``) of the embedding network and the
        ``TEACHER_HEADS``, equal to them now; ``momentum``: a float or a schedule of the step."""
        return MomentumEncoder.following(
            [self.query_encoder] + self._teacher_heads(), self.backbone, self.projector,
            momentum, heads=self._teacher_heads())

    def _chain_variables(self, heads):
        """The embedding network's trainable variables, then those of ``heads``."""
        return self.query_encoder.trainable_variables + [
            v for head in heads for v in head.trainable_variables]

    @property
    def student_variables(self):
        """Every trainable variable the loss trains, in the optimizer's order."""
        return self._chain_variables(self.heads)

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

    def frozen_until(self):
        """{head attribute name: the step at which it starts training}; none by default."""
        return {}

    # ------------------------------------------------------------------ what a method gives
    def targets(self, crops, training):
        """The teacher's outputs [t¹, t²] for the global crops (pre-step); None without a
        momentum teacher."""
        if self.TEACHER != "momentum":
            return None
        return [self.key_encoder(crop, training=training) for crop in crops[:2]]

    def forward(self, crops, training):
        """The student's outputs for every crop; by default each crop's raw projection
        (``project``): the method or its loss normalizes what it needs.  A method with heads
        may give a dict per crop, its ``"projection"`` beside the heads' outputs."""
        return [self.project(crop, training) for crop in crops]

    def method_loss(self, outputs, targets, step):
        """(the loss, {diagnostic: value}) from the outputs, the targets and the pre-step
        state; it changes no state.  The tape differentiates it (unless ``EXACT_GRADIENT``)."""
        raise NotImplementedError

    def objective(self, outputs, targets, step):
        """``EXACT_GRADIENT`` methods: an ``Objective`` (and their state's pre-step step)."""
        raise NotImplementedError

    def update_state(self, outputs, targets, step):
        """The state's step from the pre-step state, after the loss; returns diagnostics to
        add ({name: value}) or None."""

    def after_step(self, step):
        """After the descent: the momentum teacher follows the student."""
        if self.TEACHER == "momentum":
            self.key_encoder.follow(self._chain_variables(self._teacher_heads()), step)

    def view_embeddings(self, outputs):
        """The two global crops' unit embeddings (alignment, uniformity): by default their
        projections (``forward``'s) normalized."""
        return tuple(losses.l2_normalize(output["projection"] if isinstance(output, dict)
                                         else output) for output in outputs[:2])

    def track_diagnostics(self, diagnostics):
        """Update the trackers from a step's diagnostics (the warm-up's too, which may lack
        the method's own)."""
        for tracker in self.diagnostic_trackers:
            if tracker.name in diagnostics:
                tracker.update_state(diagnostics[tracker.name])

    def collapse(self, logs, epoch):
        """Why an epoch's logs show this method's known failure (``callbacks.is_collapsed``
        checks uniformity and rank too), or None; ``epoch``: a ``callbacks.EpochCount``."""

    def judged(self, epoch):  # whether the health monitor judges it (past the warm-up)
        return True

    # ------------------------------------------------------------------ the step
    def _step(self, data, phase, learn=True):
        """One step of ``phase`` (module docstring); without ``learn``, the loss and the
        diagnostics only (evaluation: inference mode, nothing updated)."""
        hooks = phase.hooks
        crops, labels = _crops(data), _labels(data)
        if self.views_on_device is not None:
            crops = self.views_on_device.colour(crops)
        if len(crops) != self.views_per_image and not (self.CROPS.local and len(crops) > 2):
            raise ValueError(f"method {self.method!r} takes {self.views_per_image} views"
                             f"{' (or 2 global then local crops)' if self.CROPS.local else ''}"
                             f", got {len(crops)} crops")
        step = self.optimizer.iterations
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)  # this step's

        # 1. The teacher's targets, from the pre-step teacher.
        targets = hooks.targets(crops, training=learn)
        # 2. The student's outputs and, differentiated by the tape, the loss.
        exact = learn and hooks.EXACT_GRADIENT
        with tf.GradientTape() as tape:
            outputs = hooks.forward(crops, training=learn)
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
        self._track_views(*hooks.view_embeddings(outputs))
        self._probe_step(labels, crops[0], learn)
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

    # ------------------------------------------------------------------ pieces of a step
    def project(self, crop, training):
        """The student's raw projection of a crop: backbone → projector, before the
        embedding network's L2 normalization (``query_encoder`` gives the unit one)."""
        return self.projector(self.backbone(crop, training=training), training=training)

    def _forward_by_resolution(self, crops, network, training):
        """``network`` on every crop, crops of one size in one pass (their BatchNorm statistics
        shared, as SwAV's and DINO's references batch them); one output per crop."""
        outputs, start = [], 0
        while start < len(crops):
            end = start + 1
            while end < len(crops) and crops[end].shape[1:] == crops[start].shape[1:]:
                end += 1
            together = network(tf.concat(crops[start:end], 0), training=training)
            outputs += tf.split(together, end - start) if end - start > 1 else [together]
            start = end
        return outputs

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

    def _probe_step(self, labels, images, learn=True):
        """The online probe on the first crop's backbone features, when enabled and the batch
        is labelled: inference-mode and stop-gradient features (as keras-cv's
        ContrastiveTrainer), so neither the encoder's gradients nor its BatchNorm see it."""
        if self.online_probe is None or labels is None:
            return
        features = tf.stop_gradient(tf.cast(self.backbone(images, training=False), tf.float32))
        with tf.GradientTape() as tape:
            logits = self.online_probe(features, training=learn)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True)) / distribute.num_replicas()
        if learn:
            variables = self.online_probe.trainable_variables
            self.probe_optimizer.apply(tape.gradient(loss, variables), variables)
        self.probe_top1.update_state(labels, logits)

    # ------------------------------------------------------------------ Keras plumbing
    @property
    def metrics(self):
        probe = [self.probe_top1] if self.online_probe is not None else []
        return ([self.loss_tracker] + self.diagnostic_trackers + self.method_metrics()
                + [self.lr_tracker, self.alignment_tracker, self.uniformity_tracker] + probe)

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
        if self.online_probe is not None:
            self.probe_optimizer.build(self.online_probe.trainable_variables)

    def compile_from_config(self, config):
        """``keras.models.load_model`` compiles a loaded model through this: this class's
        ``compile``, which Keras skips for a model whose ``compile`` is overridden."""
        self.compile(**keras.saving.deserialize_keras_object(config))

    def load_own_variables(self, store):
        """The model has no variables of its own.  Files of caco_tf 0.2 kept the bank's three
        there: they go to ``memory_bank``, which loads them next (or are left aside)."""
        if len(store.keys()) == 3:
            if self.memory_bank is not None:
                self.memory_bank._rows_saved_by_owner = [store[str(i)] for i in range(3)]
            return
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
        config = _upgrade_arguments(cls, dict(config))
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
        given = {key: value for key, value in dict(
            image_size=image_size, channels=channels, mean=mean, std=std,
            crop_fraction=crop_fraction).items() if value is not None}
        return serving.export_model(self, filepath, format=format,
                                    serving_layout=serving_layout, version=version,
                                    preprocessing=given, **kwargs)

    def summary(self, print_fn=None, **kwargs):
        """The parts and their sizes (backbone, projector, heads, teacher, state, probe)."""
        for line in parts_table(self):
            (print_fn or print)(line)


def _upgrade_arguments(cls, config):
    """A ``.keras`` file's arguments in this version's terms: caco_tf 0.3 gave every method
    CaCo's (bank, temperatures, warm-up, ``warmup_every_method``); those a method does not
    take are left aside, and a method without a bank ran no warm-up without that switch."""
    if "warmup_every_method" in config:
        every = config.pop("warmup_every_method")
        if not every and config.get("warmup_steps") and not getattr(cls, "BANK", False):
            config["warmup_steps"] = 0
    known = set(cls.argument_defaults()) | set(COMMON_ARGUMENTS) | {"name", "backbone", "projector"}
    return {key: value for key, value in config.items() if key in known}


def _crops(data):
    """Every crop of a batch, two global crops first: (view1, view2, ...), ((views), label)
    or {'views': ..., 'label': ...}."""
    if isinstance(data, dict):
        data = data["views"]
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        data = data[0]  # ((views), label): labels are for evaluation only
    return tuple(data)


def _labels(data):
    """The labels of a (views, label) or {'views': ..., 'label': ...} batch; None if absent."""
    if isinstance(data, dict):
        return data.get("label")
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        return data[1]
    return None
