"""What every method shares: the query encoder, the two-view step as a template, the metric
trackers, the online probe and the Keras plumbing; and, for the methods that use them, a key
encoder (``MomentumEncoder``), a bank (``MemoryBank``) and the warm-up pass that fills it.

A method is a ``keras.Model`` whose ``train_step`` is its algorithm, read top to bottom:

1. keys of both views from the key encoder (methods with keys), and queries from the query
   encoder, stacked [z¹; z²] against keys [k²; k¹]: each view is contrasted with the other;
2. ``contrast``: from the pre-step state, the loss, its gradient with respect to the queries
   and the bank's step, if the method has one;
3. the query encoder descends the loss;
4. the key encoder follows the query encoder (EMA).

A method gives step 2.  Most give it as two hooks, and the base differentiates the first:

- ``contrastive_loss(query1, query2, key1, key2, bank)``: the symmetric loss (the sum of the
  two views' batch means) from the queries, the keys (None without a key encoder) and the
  pre-step bank (None without one);
- ``update_bank(...)``: the bank's step after the loss (a FIFO write, a gradient step, or
  nothing).

``CaCo`` gives ``contrast`` itself: its tiled bank pass computes the loss, its gradient with
respect to the queries and the bank's update together (``caco_tf.bank``).

Before the method's own steps, methods with a bank run a MoCo-style warm-up pass
(``warmup_steps``) that trains the encoder against the bank while filling it FIFO with real key
embeddings, as the CaCo reference does; the key encoder is then re-synced to the query encoder.
"""

import collections
import math

import keras
import tensorflow as tf

from caco_tf import health, losses
from caco_tf.methods.memory_bank import MemoryBank
from caco_tf.methods.momentum_encoder import (MomentumEncoder, build_encoder,
                                             features_and_embeddings)
from caco_tf.training import distribute, steps

# What step 2 gives: the loss, d loss / d queries (None in evaluation), the bank's learning rate
# this step (0: no bank step) and the method's diagnostics (CaCo: ``bank.BankStatistics``).
Contrast = collections.namedtuple("Contrast", "loss query_gradient bank_lr diagnostics")


@keras.saving.register_keras_serializable(package="caco_tf")
class ContrastiveMethod(keras.Model):
    """The shared base of the methods (``caco_tf.methods``); see the module docstring.

    Args:
      backbone: a ``keras.Model`` from images to pooled features (``caco_tf.nets.backbones``).
      projector: a ``keras.Model`` from features to the D-dimensional embedding.
      bank_size: K, the number of bank (or queue) rows.
      temperature: τ of the encoder loss.
      bank_temperature: τ of the bank update (a separate setting in the CaCo authors' code).
      bank_learning_rate: η of the bank, a float or a ``LearningRateSchedule`` of the step.
      bank_momentum: SGD momentum of the bank update.
      key_momentum: EMA momentum of the key encoder, a float or a schedule of the step.
      warmup_steps: steps of the MoCo-style warm-up pass that fills the bank (0: none, the
        bank keeps its random initialization; always 0 for methods without a bank).
      warmup_temperature: τ of the warm-up loss.
      warmup_every_method: methods without a bank (none, SimCLR) run the same warm-up pass too,
        so that every method starts its own loss from the same state (the fair ablation); they
        then hold a bank and a key encoder for it.
      resync_after_warmup: copy the query encoder into the key encoder when the warm-up ends,
        as the CaCo reference does.
      online_probe_classes: if set, an online linear probe (evaluation only): a Dense head with
        its own optimizer, trained on stop-gradient backbone features of view 1 whenever a
        batch carries labels; its accuracy is ``probe_top1``.  It never changes the encoder.
      multi_crop: batches hold two global crops then local crops (CaCo only).
      preprocessing: how images reach the backbone (``image_size``, ``channels``, ``mean``,
        ``std``, optionally ``crop_fraction``), for ``export``; ``build_model`` sets it.
      run_settings: the run configuration the model was built from (``build_model``), kept in
        the ``.keras`` file so that evaluation and export can rebuild the run around it.

    Every method takes the same arguments (a run's configuration builds any of them) and holds
    only the parts it uses: ``key_encoder`` and ``memory_bank`` are None for a method without
    keys or bank.

    A Keras citizen: ``get_config``/``from_config`` (so ``model.save("x.keras")`` and
    ``keras.models.load_model`` round-trip the encoders, bank, bank momentum, FIFO pointer,
    optimizer state and step), ``export`` (the serving SavedModel with its preprocessing, or
    ONNX / LiteRT), and a ``summary`` that names the parts and the bank's size.
    """

    method = None             # the name ``method.name`` gives it
    uses_bank = True          # False: no bank, no warm-up pass (nothing to fill)
    uses_key_encoder = True   # False: no keys, no EMA (SimCLR)
    learns_bank = False       # True: the bank takes gradient steps (``bank_lr`` is reported)
    supports_multi_crop = False

    def __init__(self, backbone, projector, bank_size=65536, temperature=0.08,
                 bank_temperature=0.08, bank_learning_rate=3.0, bank_momentum=0.9,
                 key_momentum=0.99, warmup_steps=0, warmup_temperature=0.2,
                 resync_after_warmup=True, online_probe_classes=None, multi_crop=False,
                 warmup_every_method=False, preprocessing=None, run_settings=None, name=None,
                 **kwargs):
        if multi_crop and not self.supports_multi_crop:
            raise ValueError(f"method {self.method!r} takes two views, not multi-crop")
        super().__init__(name=name or self.method, **kwargs)
        # The arguments as given, for get_config (schedules and all).
        self._arguments = dict(
            bank_size=bank_size, temperature=temperature, bank_temperature=bank_temperature,
            bank_learning_rate=bank_learning_rate, bank_momentum=bank_momentum,
            key_momentum=key_momentum, warmup_steps=warmup_steps,
            warmup_temperature=warmup_temperature, resync_after_warmup=resync_after_warmup,
            online_probe_classes=online_probe_classes, multi_crop=multi_crop,
            warmup_every_method=warmup_every_method, preprocessing=preprocessing,
            run_settings=run_settings)
        self.preprocessing = dict(preprocessing) if preprocessing else None
        self.run_settings = run_settings
        self.temperature = temperature
        self.bank_temperature = bank_temperature
        self.warmup_steps = int(warmup_steps) if self.uses_bank or warmup_every_method else 0
        self.warmup_every_method = bool(warmup_every_method)
        self.warmup_temperature = warmup_temperature
        self.resync_after_warmup = resync_after_warmup
        self.multi_crop = bool(multi_crop)

        self.backbone = backbone
        self.query_encoder = build_encoder(backbone, projector, "query_encoder")
        self.key_encoder = None
        if self.uses_key_encoder or self.warmup_steps:
            self.key_encoder = MomentumEncoder.following(self.query_encoder, backbone, projector,
                                                         key_momentum)
        self.memory_bank = None
        if self.uses_bank or self.warmup_steps:
            self.memory_bank = MemoryBank(bank_size, self.query_encoder.output_shape[-1],
                                          bank_learning_rate, bank_momentum)

        self.loss_tracker = keras.metrics.Mean(name="loss")
        self._create_method_trackers()
        self.bank_norm = keras.metrics.Mean(name="bank_norm")
        self.lr_tracker = keras.metrics.Mean(name="lr")
        self.bank_lr_tracker = keras.metrics.Mean(name="bank_lr")
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

    def _create_method_trackers(self):
        """Trackers of a method's own diagnostics (CaCo's MPP statistics); none by default."""

    def method_metrics(self):
        """The method's own trackers, reported after the loss."""
        return []

    # ------------------------------------------------------------------ Keras plumbing
    @property
    def projector(self):
        """The projection head (inside the query encoder: backbone → projector → L2 norm)."""
        return self.query_encoder.layers[-2]

    def get_config(self):
        config = {"name": self.name, "backbone": keras.saving.serialize_keras_object(
            self.backbone), "projector": keras.saving.serialize_keras_object(self.projector)}
        for key, value in self._arguments.items():
            config[key] = (keras.saving.serialize_keras_object(value) if isinstance(
                value, keras.optimizers.schedules.LearningRateSchedule) else value)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("backbone", "projector", "bank_learning_rate", "key_momentum"):
            if isinstance(config.get(key), dict):
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               serving_layout=False, version=1, image_size=None, channels=None, mean=None,
               std=None, crop_fraction=None, **kwargs):
        """Export the backbone for serving (``caco_tf.serving``).

        With its preprocessing (the model's own, from ``caco_tf.build_model``, or given here:
        ``image_size``, ``channels``, and the training normalization's ``mean`` and ``std`` in
        [0, 1] units): ``format`` ``tf_saved_model`` (Keras' name; also ``saved_model``) takes
        uint8 images in and gives features out (``serving_default``), the embedding (``embed``)
        and encoded files (``serve_bytes``), written at ``filepath``, or as TF Serving's
        ``filepath/backbone/<version>/`` with ``serving_layout``; ``onnx`` or ``litert``: one
        file at ``filepath``.  Without a preprocessing (a model composed by hand), the
        SavedModel takes what the backbone takes: float32 images, normalized as in training
        (``serving_default`` and ``embed``).  ``input_signature`` is not taken: the signatures
        are fixed.  Returns the path written.
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
        """The parts and their sizes: backbone, projector, key encoder, bank, online probe."""
        print_fn = print_fn or print

        def count(variables):
            return sum(math.prod(int(side) for side in v.shape) for v in variables)

        rows = [("backbone", f"{self.backbone.name}: images {tuple(self.backbone.input_shape[1:])}"
                 f" → features [{self.backbone.output_shape[-1]}]",
                 count(self.backbone.trainable_weights),
                 count(self.backbone.non_trainable_weights)),
                ("projector", f"features → embedding [{self.query_encoder.output_shape[-1]}], "
                 "L2-normalized", count(self.projector.trainable_weights),
                 count(self.projector.non_trainable_weights))]
        if self.key_encoder is not None:
            rows.append(("key encoder", "EMA copy of backbone + projector (not trained)", 0,
                         count(self.key_encoder.weights)))
        if self.memory_bank is not None:
            rows.append(("bank", f"K × D = {self.memory_bank.size:,} × "
                         f"{self.memory_bank.rows.shape[1]} rows, momentum, FIFO pointer", 0,
                         count(self.memory_bank.weights)))
        if self.online_probe is not None:
            rows.append(("online probe", f"features → {self.online_probe.output_shape[-1]} "
                         "classes (evaluation only)", count(self.online_probe.trainable_weights),
                         count(self.online_probe.non_trainable_weights)))
        print_fn(f'Model "{self.name}" ({type(self).__name__}, method.name {self.method})')
        print_fn(f"{'part':<14}{'what':<64}{'trainable':>12}{'not trained':>13}")
        for part, what, trainable, fixed in rows:
            print_fn(f"{part:<14}{what:<64}{trainable:>12,}{fixed:>13,}")
        total = sum(r[2] for r in rows), sum(r[3] for r in rows)
        print_fn(f"{'total':<78}{total[0]:>12,}{total[1]:>13,}")

    @property
    def metrics(self):
        bank = [self.bank_norm] if self.uses_bank else []
        bank_lr = [self.bank_lr_tracker] if self.learns_bank else []
        probe = [self.probe_top1] if self.online_probe is not None else []
        return ([self.loss_tracker] + self.method_metrics() + bank + [self.lr_tracker]
                + bank_lr + [self.alignment_tracker, self.uniformity_tracker] + probe)

    def compile(self, optimizer="sgd", **kwargs):
        super().compile(optimizer=optimizer, **kwargs)
        # Only the query encoder is optimized: the key encoder follows by EMA, the bank by its
        # own rule.  Building here keeps Keras from allocating slots for the key encoder.
        self.optimizer.build(self.query_encoder.trainable_variables)
        if self.online_probe is not None:
            self.probe_optimizer.build(self.online_probe.trainable_variables)

    def compile_from_config(self, config):
        """What ``keras.models.load_model`` calls to compile a loaded model: this class's own
        ``compile`` (the optimizer over the query encoder), which Keras skips for a model whose
        ``compile`` is overridden."""
        self.compile(**keras.saving.deserialize_keras_object(config))

    def load_own_variables(self, store):
        """The model has no variables of its own.  Files of caco_tf 0.2 kept the bank's three
        there: they go to ``memory_bank``, which loads them next (or are left aside)."""
        if len(store.keys()) == 3:
            if self.memory_bank is not None:
                self.memory_bank._rows_saved_by_owner = [store[str(i)] for i in range(3)]
            return
        super().load_own_variables(store)

    # Keras' fit builds a model symbolically on a data batch before the first step.  Every
    # variable here exists from __init__/compile, so there is nothing to build; and the build
    # converts the distributed batch eagerly, which under MultiWorkerMirroredStrategy fails
    # ("Attempt to convert a value (PerReplica...) with an unsupported type to a Tensor",
    # keras-team/keras#20585): tests/test_distributed.py's multi-worker tests fail without this.
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        return

    def call(self, images, training=False):
        """The query embedding z (the bank's space)."""
        return self.query_encoder(images, training=training)

    def features_and_embeddings(self, images, training=False):
        """The backbone's features and the query embeddings, from one pass of the backbone."""
        return features_and_embeddings(self.query_encoder, images, training)

    def make_train_function(self, force=False):
        """The warm-up pass, then the method's steps, ``steps_per_execution`` of them per call
        in one compiled loop that takes its batches itself (``training.steps.TrainFunction``:
        the phase by the optimizer's step, the resync at the warm-up's end, the time the steps
        wait for their batches)."""
        if self.train_function is not None and not force:
            return self.train_function
        self.train_function = steps.TrainFunction(
            self, self.warmup_step, self.train_step, self.warmup_steps,
            at_warmup_end=(lambda: self.key_encoder.sync(self.query_encoder))
            if self.resync_after_warmup else None)
        return self.train_function

    def fit(self, x=None, *args, **kwargs):
        """``keras.Model.fit``, refusing batches that several replicas cannot share equally.

        The steps gather keys and embeddings from every replica in equal shares, and weigh each
        replica's gradient by 1 / replicas: under a strategy of R replicas every batch must
        hold a multiple of R images (a dataset batched with ``drop_remainder=True``).  A
        ``tf.data.Dataset`` is used as it comes (its own shuffle), so ``shuffle`` defaults to
        False for it, sparing Keras' warning that it would ignore ``shuffle=True``.
        """
        distribute.check_replica_shares(x, self.distribute_strategy.num_replicas_in_sync)
        if isinstance(x, tf.data.Dataset) and len(args) < 7:  # shuffle is fit's 8th parameter
            kwargs.setdefault("shuffle", False)
        self.make_train_function()
        # The compiled loop ends its calls at the epochs' ends when it knows them.
        self.train_function.steps_per_epoch = kwargs.get("steps_per_epoch")
        return super().fit(x, *args, **kwargs)

    # ------------------------------------------------------------------ the steps
    def train_step(self, data):
        """One two-view step (module docstring): keys and queries; the loss, its gradient and
        the bank's step from the pre-step state (``contrast``); the encoder's descent; the key
        encoder's EMA."""
        view1, view2 = _views(data)
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()  # this step's, before the update

        # 1. Keys and queries.  Each view's query is contrasted with the other view's key:
        #    queries are stacked [z¹; z²] against keys [k²; k¹] from here on.
        keys = self._keys(view1, view2, training=True)
        with tf.GradientTape() as tape:
            queries = tf.concat([self.query_encoder(view1, training=True),
                                 self.query_encoder(view2, training=True)], 0)

        # 2. From the pre-step state: the loss, its gradient with respect to the queries, and
        #    the bank's step.
        contrast = self.contrast(queries, keys, step)

        # 3. The encoder descends the loss.
        self._descend(tape, queries, contrast.query_gradient)

        # 4. The key encoder follows the query encoder.
        if self.uses_key_encoder:
            self.key_encoder.follow(self.query_encoder, step)

        self._track(contrast, learning_rate)
        self._track_views(*tf.split(queries, 2))
        self._probe_step(data, view1)
        return self._logs()

    def test_step(self, data):
        """The method's loss and diagnostics without any update (encoders in inference mode)."""
        view1, view2 = _views(data)
        keys = self._keys(view1, view2, training=False)
        queries = tf.concat([self.query_encoder(view1, training=False),
                             self.query_encoder(view2, training=False)], 0)
        loss, diagnostics = self.evaluation_loss(queries, keys)
        bank_lr = (self.memory_bank.learning_rate(self.optimizer.iterations) if self.learns_bank
                   else tf.constant(0.0))
        self._track(Contrast(loss, None, bank_lr, diagnostics), self._encoder_learning_rate())
        self._track_views(*tf.split(queries, 2))
        self._probe_step(data, view1, learn=False)
        return self._logs()

    def warmup_step(self, data):
        """MoCo-style step that trains the encoder against the bank while filling it FIFO."""
        view1, view2 = _views(data)
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()
        key1, key2 = (self.key_encoder(view1, training=True),
                      self.key_encoder(view2, training=True))
        bank = self.memory_bank.read()
        bank_unit = losses.l2_normalize(bank)
        with tf.GradientTape() as tape:
            query1 = self.query_encoder(view1, training=True)
            query2 = self.query_encoder(view2, training=True)
            loss = (tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit,
                                                    self.warmup_temperature))
                    + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit,
                                                      self.warmup_temperature)))
        self._descend(tape, loss)
        # The method's diagnostics, against the bank this step read.
        diagnostics = self._warmup_diagnostics(query1, query2, key1, key2, bank)
        self.memory_bank.enqueue(key1, bank)  # one key per image
        self.key_encoder.follow(self.query_encoder, step)
        self._track(Contrast(loss, None, tf.constant(0.0), diagnostics), learning_rate)
        self._track_views(query1, query2)
        self._probe_step(data, view1)
        return self._logs()

    # ------------------------------------------------------------------ what methods give
    def contrast(self, queries, keys, step):
        """Step 2 from the two hooks: ``contrastive_loss`` and its gradient with respect to the
        queries, then ``update_bank``.  Returns a ``Contrast``."""
        bank = self.memory_bank.read() if self.uses_bank else None
        with tf.GradientTape() as tape:
            tape.watch(queries)
            query1, query2 = tf.split(queries, 2)
            key2, key1 = tf.split(keys, 2) if keys is not None else (None, None)
            loss = self.contrastive_loss(query1, query2, key1, key2, bank)
        query_gradient = tape.gradient(loss, queries)
        bank_lr = self.update_bank(query1, query2, key1, key2, bank, step)
        return Contrast(loss, query_gradient, bank_lr, None)

    def evaluation_loss(self, queries, keys):
        """(The loss, the method's diagnostics) without any update."""
        query1, query2 = tf.split(queries, 2)
        key2, key1 = tf.split(keys, 2) if keys is not None else (None, None)
        bank = self.memory_bank.read() if self.uses_bank else None
        return self.contrastive_loss(query1, query2, key1, key2, bank), None

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        """The symmetric loss from the queries, the keys (None without a key encoder) and the
        pre-step bank (None without one); it must not change any state."""
        raise NotImplementedError

    def update_bank(self, query1, query2, key1, key2, bank, step):
        """The bank's step from the pre-step ``bank``; returns its learning rate (0: none)."""
        return tf.constant(0.0)

    def _warmup_diagnostics(self, query1, query2, key1, key2, bank):
        """What the warm-up reports besides its loss (CaCo: the MPP statistics); None here."""
        return None

    # ------------------------------------------------------------------ pieces of a step
    def _logs(self):
        logs = {}
        for metric in self.metrics:
            result = metric.result()
            logs.update(result if isinstance(result, dict) else {metric.name: result})
        return distribute.reducible(logs)

    def _keys(self, view1, view2, training):
        """The key encoder's keys stacked [k²; k¹] (None for a method without keys, whose key
        encoder, if any, serves its warm-up only)."""
        if not self.uses_key_encoder:
            return None
        key1 = self.key_encoder(view1, training=training)
        key2 = self.key_encoder(view2, training=training)
        return tf.concat([key2, key1], 0)

    def _descend(self, tape, outputs, output_gradient=1.0):
        """One optimizer step of the query encoder down a loss.

        ``outputs`` were recorded on ``tape`` and the loss's gradient with respect to them is
        ``output_gradient``: the loss itself and 1, or the queries and the gradient that
        ``contrast`` computed.
        """
        # Keras sums gradients over replicas: each replica contributes its share of the mean.
        scale = 1.0 / distribute.num_replicas()
        if hasattr(self.optimizer, "scale_loss"):  # LossScaleOptimizer under mixed_float16
            scale = self.optimizer.scale_loss(tf.constant(scale))
        variables = self.query_encoder.trainable_variables
        self.optimizer.apply(tape.gradient(
            outputs, variables, output_gradients=tf.cast(output_gradient, tf.float32) * scale),
            variables)

    def _track(self, contrast, learning_rate):
        """The step's loss, learning rates and diagnostics (``_track_diagnostics``)."""
        self.loss_tracker.update_state(contrast.loss)
        self._track_diagnostics(contrast.diagnostics)
        self.lr_tracker.update_state(learning_rate)
        self.bank_lr_tracker.update_state(contrast.bank_lr)

    def _track_diagnostics(self, diagnostics):
        """The method's diagnostics; here the bank's mean row norm after the step."""
        if self.memory_bank is not None:
            self.bank_norm.update_state(self.memory_bank.mean_row_norm())

    def _track_views(self, query1, query2):
        """Alignment of the two views' query embeddings, and their uniformity (each view's
        batch, averaged): ``caco_tf.health``."""
        query1, query2 = tf.stop_gradient(query1), tf.stop_gradient(query2)
        self.alignment_tracker.update_state(health.alignment(query1, query2))
        self.uniformity_tracker.update_state(
            0.5 * (health.uniformity(query1) + health.uniformity(query2)))

    def _encoder_learning_rate(self):
        return tf.cast(self.optimizer.learning_rate, tf.float32)

    def _probe_step(self, data, view1, learn=True):
        """The online probe on view 1's backbone features, when enabled and the batch is labelled.

        Inference-mode and stop-gradient features (as keras-cv's ContrastiveTrainer): neither
        the encoder's gradients nor its BatchNorm statistics see the probe.
        """
        labels = _labels(data)
        if self.online_probe is None or labels is None:
            return
        features = tf.stop_gradient(tf.cast(self.backbone(view1, training=False), tf.float32))
        with tf.GradientTape() as tape:
            logits = self.online_probe(features, training=learn)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True)) / distribute.num_replicas()
        if learn:
            variables = self.online_probe.trainable_variables
            self.probe_optimizer.apply(tape.gradient(loss, variables), variables)
        self.probe_top1.update_state(labels, logits)

    # ------------------------------------------------------------------ shared losses
    def _batch_loss(self, queries, positives, keys):
        """Mean in-batch InfoNCE of this replica's queries against the global batch's keys."""
        return tf.reduce_mean(losses.batch_infonce_loss(
            queries, positives, distribute.all_gather(keys), self.temperature,
            offset=distribute.replica_offset(tf.shape(queries)[0])))

    def _moco_loss(self, query1, query2, key1, key2, bank):
        """The other view's key against every (normalized) bank row, both views."""
        bank_unit = losses.l2_normalize(bank)
        return (tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit, self.temperature))
                + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit, self.temperature)))


def _views(data):
    """Accept (view1, view2), (views, label) or {'views': ..., 'label': ...} batches."""
    if isinstance(data, dict):
        data = data["views"]
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        data = data[0]  # ((view1, view2), label): labels are for evaluation only
    view1, view2 = data[:2]  # a multi-crop batch: its two global crops
    return view1, view2


def _crops(data):
    """All views of a batch, in order (two global crops first for multi-crop batches)."""
    if isinstance(data, dict):
        data = data["views"]
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        data = data[0]
    return tuple(data)


def _labels(data):
    """The labels of a (views, label) or {'views': ..., 'label': ...} batch; None if absent."""
    if isinstance(data, dict):
        return data.get("label")
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], (tuple, list)):
        return data[1]
    return None
