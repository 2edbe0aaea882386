"""The CaCo model: a ``keras.Model`` whose ``train_step`` is the paper's algorithm.

One step, for a batch of images seen as two augmented views x1, x2:

1. keys k1, k2 from the momentum (key) encoder, and queries z1, z2 from the query encoder;
2. from the pre-step bank: for each image, the Most Probable Positive of the *other* view,
   j+ = argmax_j p(b_j | k) (eq. max_prob); the symmetric loss (eq. caco)
   CE(z1·B̂ᵀ/τ, j+(k2)) + CE(z2·B̂ᵀ/τ, j+(k1)) and its gradient with respect to the queries;
   the bank's cooperative-adversarial step (eq. real_update) from the same queries and bank,
   averaged over the global batch, with SGD momentum (``caco_tf.bank``'s two tiled passes);
3. the encoder descends the loss;
4. the key encoder's parameters move towards the query encoder's (EMA, cosine momentum).

Before the CaCo phase a warm-up pass (``warmup_steps``, one epoch in the configs) trains the
encoder with a MoCo-style loss against the bank while filling the bank FIFO with real key
embeddings, as the reference does; the key encoder is then re-synced to the query encoder.
"""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import distribute
from caco_tf import losses


def build_encoder(backbone, projector, name):
    """backbone → projector → L2 normalization: the query/key encoder φ_θ of the paper."""
    inputs = keras.Input(backbone.input_shape[1:])
    # float32 whatever the policy: the embedding feeds the bank's logits, softmax and loss.
    embedding = keras.layers.UnitNormalization(name="l2_normalize", dtype="float32")(
        projector(backbone(inputs)))
    return keras.Model(inputs, embedding, name=name)


def _as_schedule(value):
    """Accept a float or a LearningRateSchedule; return a callable of the step."""
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule):
        return value
    return lambda step: tf.constant(value, tf.float32)


class CaCo(keras.Model):
    """Cooperative-adversarial contrastive learning (Wang et al., CaCo).

    Args:
      backbone: a ``keras.Model`` from images to pooled features (see ``caco_tf.backbones``).
      projector: a ``keras.Model`` from features to the D-dimensional embedding.
      bank_size: K, the number of bank rows (positives and negatives share them).
      temperature: τ of the encoder loss.
      bank_temperature: τ of the bank update (a separate setting in the authors' code).
      bank_learning_rate: η of the bank, a float or a ``LearningRateSchedule`` of the step.
      bank_momentum: SGD momentum of the bank update.
      key_momentum: EMA momentum of the key encoder, a float or a schedule of the step.
      warmup_steps: steps of the MoCo-style warm-up pass that fills the bank (0: none, the
        bank keeps its random initialization).
      warmup_temperature: τ of the warm-up loss.
      resync_after_warmup: copy the query encoder into the key encoder when the warm-up ends,
        as the reference does.
      online_probe_classes: if set, an online linear probe (evaluation only): a Dense head with
        its own optimizer, trained on stop-gradient backbone features of view 1 whenever a
        batch carries labels; its accuracy is ``probe_top1``.  It never changes the encoder.
      multi_crop: batches hold two global crops then local crops (``augment.MultiCropViews``);
        ``train_step`` is then ``multicrop_train_step``.  The backbone must accept every crop
        size (build it with input shape (None, None, C)).
    """

    def __init__(self, backbone, projector, bank_size=65536, temperature=0.08,
                 bank_temperature=0.08, bank_learning_rate=3.0, bank_momentum=0.9,
                 key_momentum=0.99, warmup_steps=0, warmup_temperature=0.2,
                 resync_after_warmup=True, online_probe_classes=None, multi_crop=False,
                 name="caco", **kwargs):
        super().__init__(name=name, **kwargs)
        self.backbone = backbone
        self.query_encoder = build_encoder(backbone, projector, "query_encoder")
        # A structural copy; its parameters start equal to the query encoder's, its BatchNorm
        # statistics are its own (it runs in training mode, as in the reference).
        self.key_encoder = build_encoder(keras.models.clone_model(backbone),
                                         keras.models.clone_model(projector), "key_encoder")
        self.key_encoder.set_weights(self.query_encoder.get_weights())
        dim = self.query_encoder.output_shape[-1]

        self.temperature = temperature
        self.bank_temperature = bank_temperature
        self.bank_learning_rate = _as_schedule(bank_learning_rate)
        self.bank_momentum = bank_momentum
        self.key_momentum = _as_schedule(key_momentum)
        self.warmup_steps = int(warmup_steps)
        self.warmup_temperature = warmup_temperature
        self.resync_after_warmup = resync_after_warmup
        self.multi_crop = bool(multi_crop)

        # The bank and its state are assigned by the step itself, never by an optimizer.
        state = dict(trainable=False, aggregation="only_first_replica")
        self.bank = self.add_weight(
            shape=(bank_size, dim), initializer=keras.initializers.RandomNormal(seed=0),
            name="bank", **state)
        self.bank_velocity = self.add_weight(
            shape=(bank_size, dim), initializer="zeros", name="bank_velocity", **state)
        self.bank_pointer = self.add_weight(
            shape=(), dtype="int32", initializer="zeros", name="bank_pointer", **state)
        self.bank_tile_rows = bank_lib.tile_rows(bank_size)

        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.contrast_top1 = keras.metrics.Mean(name="contrast_top1")
        self.positive_probability = keras.metrics.Mean(name="mpp_prob")
        self.distinct_positives = keras.metrics.Mean(name="distinct_mpp")
        self.bank_norm = keras.metrics.Mean(name="bank_norm")
        self.lr_tracker = keras.metrics.Mean(name="lr")
        self.bank_lr_tracker = keras.metrics.Mean(name="bank_lr")
        self._bank_ready = self.warmup_steps == 0

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

    # ------------------------------------------------------------------ Keras plumbing
    @property
    def metrics(self):
        probe = [self.probe_top1] if self.online_probe is not None else []
        return [self.loss_tracker, self.contrast_top1, self.positive_probability,
                self.distinct_positives, self.bank_norm, self.lr_tracker,
                self.bank_lr_tracker] + probe

    def compile(self, optimizer="sgd", **kwargs):
        super().compile(optimizer=optimizer, **kwargs)
        # Only the query encoder is optimized: the key encoder follows by EMA, the bank by its
        # own rule.  Building here keeps Keras from allocating slots for the key encoder.
        self.optimizer.build(self.query_encoder.trainable_variables)
        if self.online_probe is not None:
            self.probe_optimizer.build(self.online_probe.trainable_variables)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Every variable exists from __init__/compile, so Keras' symbolic build has nothing to
        # do; skipping it also avoids its eager reduce of a data batch, which fails under
        # MultiWorkerMirroredStrategy (keras-team/keras#20585).
        return

    def call(self, images, training=False):
        """The query embedding z (the bank's space)."""
        return self.query_encoder(images, training=training)

    def make_train_function(self, force=False):
        """The warm-up pass and the CaCo steps are two graphs; pick by the optimizer's step.

        Keras looks ``train_function`` up at every step, so the switch happens mid-``fit`` and
        after a resume (the step counter is part of every checkpoint).
        """
        if self.train_function is not None and not force:
            return self.train_function
        warmup_function = self._make_function(self.warmup_step)
        caco_function = self._make_function(self.train_step)

        def train_function(iterator):
            if not self._bank_ready:
                step = int(self.optimizer.iterations.numpy())
                if step < self.warmup_steps:
                    return warmup_function(iterator)
                if step == self.warmup_steps and self.resync_after_warmup:
                    self.sync_key_encoder()
                self._bank_ready = True
            return caco_function(iterator)

        self.train_function = train_function
        return train_function

    def sync_key_encoder(self):
        """Copy the query encoder's parameters into the key encoder (after the warm-up)."""
        for key, query in zip(self.key_encoder.trainable_variables,
                              self.query_encoder.trainable_variables):
            key.assign(query)

    # ------------------------------------------------------------------ the algorithm
    def train_step(self, data):
        if self.multi_crop:
            return self.multicrop_train_step(data)
        view1, view2 = _views(data)
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()  # this step's, before the update

        # 1. Keys and queries.  Each view's query is trained towards the MPP of the other
        #    view's key: queries are stacked [z¹; z²] against keys [k²; k¹] from here on.
        key1, key2 = self._keys(view1, view2, training=True)
        with tf.GradientTape() as tape:
            queries = tf.concat([self.query_encoder(view1, training=True),
                                 self.query_encoder(view2, training=True)], 0)

        # 2. From the pre-step bank: the MPPs, the loss and its gradient with respect to the
        #    queries; the bank takes its cooperative-adversarial step.
        loss, query_gradient, statistics, bank_lr = self._caco_bank_pass(
            queries, tf.concat([key2, key1], 0), step)

        # 3. The encoder descends the loss.
        self._descend(tape, queries, query_gradient)

        # 4. The key encoder follows the query encoder.
        self._update_key_encoder(step)

        self._track(loss, statistics, learning_rate, bank_lr)
        self._probe_step(data, view1)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    def multicrop_train_step(self, data):
        """The CaCo step over multi-crop batches (SwAV's protocol, as the reference does it).

        ``data`` holds the two global crops, then any number of local crops.  MPP indices come
        from the key embeddings of the two global crops only: each global crop's query is
        trained against the other global crop's MPP, each local crop's query against the MPPs
        of both global crops.  The loss is the two-view loss over the global pairs (a sum, as
        ``train_step``'s) plus twice the mean over the local pairs: twice the reference's
        (mean over global pairs + mean over local pairs), so that with no local crop this step
        is exactly the two-view step.  The bank's gradient weights the same pairs the same way,
        from the pre-step queries and bank.  Warm-up and evaluation use the global crops.
        """
        crops = _crops(data)
        global1, global2, local = crops[0], crops[1], crops[2:]
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()

        key1, key2 = self._keys(global1, global2, training=True)
        bank = tf.convert_to_tensor(self.bank)
        bank_unit = losses.l2_normalize(bank)

        with tf.GradientTape() as tape:
            query1 = self.query_encoder(global1, training=True)
            query2 = self.query_encoder(global2, training=True)
            local_queries = tf.concat(
                [tf.concat([query, query], 0) for query in
                 (self.query_encoder(crop, training=True) for crop in local)], 0) if local \
                else None
            queries = tf.concat([query1, query2], 0)
            statistics = self._statistics(tf.stop_gradient(queries),
                                          tf.concat([key2, key1], 0), bank)
            positive_index = statistics.positive_index
            # Every local crop's query, once against each global crop's MPP: [2 L N] pairs.
            local_positives = tf.tile(positive_index, [len(local)])
            loss = 2.0 * tf.reduce_mean(losses.caco_loss(queries, bank_unit, positive_index,
                                                         self.temperature))
            if local:
                loss += 2.0 * tf.reduce_mean(losses.caco_loss(
                    local_queries, bank_unit, local_positives, self.temperature))
        self._descend(tape, loss)

        gradient = bank_lib.cooperative_adversarial_gradient(
            queries, bank, positive_index, self.bank_temperature, views=2)
        if local:
            gradient += 2.0 * bank_lib.cooperative_adversarial_gradient(
                local_queries, bank, local_positives, self.bank_temperature)
        bank_lr = self._bank_step(bank, gradient, step, tf.shape(query1)[0])
        self._update_key_encoder(step)

        self._track(loss, statistics, learning_rate, bank_lr)
        self._probe_step(data, global1)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    def warmup_step(self, data):
        """MoCo-style step that trains the encoder against the bank while filling it FIFO."""
        view1, view2 = _views(data)
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()
        key1, key2 = self._keys(view1, view2, training=True)
        bank = tf.convert_to_tensor(self.bank)
        bank_unit = losses.l2_normalize(bank)
        loss, query1, query2 = self._encoder_step(
            view1, view2, lambda query1, query2: (
                tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit,
                                                self.warmup_temperature))
                + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit,
                                                  self.warmup_temperature))))

        # The diagnostics of the CaCo step, against the bank this step read.
        statistics = self._statistics(tf.concat([query1, query2], 0),
                                      tf.concat([key2, key1], 0), bank)
        # One key per image, gathered from all replicas in replica order.
        new_bank, new_pointer = bank_lib.enqueue(
            bank, distribute.all_gather(key1), tf.convert_to_tensor(self.bank_pointer))
        distribute.assign_in_sync([self.bank, self.bank_pointer], [new_bank, new_pointer])
        self._update_key_encoder(step)

        self._track(loss, statistics, learning_rate, tf.constant(0.0))
        self._probe_step(data, view1)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    def test_step(self, data):
        """The CaCo loss and diagnostics without any update (encoders in inference mode)."""
        view1, view2 = _views(data)
        key1, key2 = self._keys(view1, view2, training=False)
        queries = tf.concat([self.query_encoder(view1, training=False),
                             self.query_encoder(view2, training=False)], 0)
        bank = tf.convert_to_tensor(self.bank)
        statistics = self._statistics(queries, tf.concat([key2, key1], 0), bank)
        loss, _ = self._caco_loss(queries, bank, statistics)
        self._track(loss, statistics, self._encoder_learning_rate(),
                    self.bank_learning_rate(self.optimizer.iterations))
        self._probe_step(data, view1, learn=False)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    # ------------------------------------------------------------------ pieces of a step
    def _keys(self, view1, view2, training):
        return (self.key_encoder(view1, training=training),
                self.key_encoder(view2, training=training))

    def _statistics(self, queries, keys, bank):
        """``bank_lib.bank_statistics`` of queries [z¹; z²] against keys [k²; k¹]."""
        return bank_lib.bank_statistics(queries, keys, bank, self.temperature,
                                        self.bank_temperature, self.bank_tile_rows)

    def _caco_loss(self, queries, bank, statistics):
        """Eq. (caco), symmetrized, from the bank statistics of queries stacked [z¹; z²].

        ℓ_n = log Σ_j exp(z_n·b̂_j/τ) - z_n·b̂_{j+}/τ; the loss is the sum over the two views
        of each view's mean, i.e. twice the mean over the stack.  Returns (loss, b̂_{j+} [N, D]).
        """
        positive_unit = losses.l2_normalize(tf.gather(bank, statistics.positive_index))
        per_query = (statistics.loss_log_normalizer
                     - tf.reduce_sum(queries * positive_unit, axis=-1) / self.temperature)
        return 2.0 * tf.reduce_mean(per_query), positive_unit

    def _caco_bank_pass(self, queries, keys, step):
        """Everything of the CaCo step that touches the K×D bank, in two passes over its tiles.

        From the pre-step bank: the MPPs j+ of ``keys`` [k²; k¹], the symmetric loss of
        ``queries`` [z¹; z²] and its gradient with respect to them, and the bank's
        cooperative-adversarial momentum step, assigned on every replica.  Returns (loss,
        d loss / d queries, ``BankStatistics``, this step's bank lr).
        """
        bank = tf.convert_to_tensor(self.bank)
        statistics = self._statistics(queries, keys, bank)
        loss, positive_unit = self._caco_loss(queries, bank, statistics)
        settings = (self.temperature, self.bank_temperature)
        if distribute.num_replicas() > 1:  # the replicas' g are averaged before the momentum
            expected_unit, gradient = bank_lib.tiled_caco_gradient(
                queries, statistics, bank, *settings, 2, self.bank_tile_rows)
            bank_lr = self._bank_step(bank, gradient, step, tf.shape(queries)[0] // 2)
        else:
            bank_lr = self.bank_learning_rate(step)
            expected_unit, new_bank, new_velocity = bank_lib.tiled_caco_update(
                queries, statistics, bank, tf.convert_to_tensor(self.bank_velocity), *settings,
                bank_lr, self.bank_momentum, 2, self.bank_tile_rows)
            distribute.assign_in_sync([self.bank, self.bank_velocity], [new_bank, new_velocity])
        # d loss / d z_n = (2 / N) (Σ_j p_nj b̂_j - b̂_{j+}) / τ.
        count = tf.cast(tf.shape(queries)[0], tf.float32)
        query_gradient = (expected_unit - positive_unit) * (2.0 / (count * self.temperature))
        return loss, query_gradient, statistics, bank_lr

    def _bank_step(self, bank, gradient, step, local_batch):
        """Average the bank's gradient over the global batch, take the SGD-momentum step on the
        pre-step bank and assign it on every replica.  Returns this step's bank lr."""
        gradient = distribute.global_mean(gradient, local_batch)
        bank_lr = self.bank_learning_rate(step)
        new_bank, new_velocity = bank_lib.momentum_step(
            bank, tf.convert_to_tensor(self.bank_velocity), gradient, bank_lr, self.bank_momentum)
        distribute.assign_in_sync([self.bank, self.bank_velocity], [new_bank, new_velocity])
        return bank_lr

    def _encoder_step(self, view1, view2, loss_of_queries):
        """Queries of both views, the loss they give, one optimizer step on the query encoder."""
        with tf.GradientTape() as tape:
            query1 = self.query_encoder(view1, training=True)
            query2 = self.query_encoder(view2, training=True)
            loss = loss_of_queries(query1, query2)
        self._descend(tape, loss)
        return loss, query1, query2

    def _descend(self, tape, outputs, output_gradient=1.0):
        """One optimizer step of the query encoder down a loss.

        ``outputs`` were recorded on ``tape`` and the loss's gradient with respect to them is
        ``output_gradient``: the loss itself and 1, or the queries and the gradient that the
        bank pass computed.
        """
        # Keras sums gradients over replicas: each replica contributes its share of the mean.
        scale = 1.0 / distribute.num_replicas()
        if hasattr(self.optimizer, "scale_loss"):  # LossScaleOptimizer under mixed_float16
            scale = self.optimizer.scale_loss(tf.constant(scale))
        variables = self.query_encoder.trainable_variables
        self.optimizer.apply(tape.gradient(
            outputs, variables, output_gradients=tf.cast(output_gradient, tf.float32) * scale),
            variables)

    def _update_key_encoder(self, step):
        momentum = self.key_momentum(step)
        keys = self.key_encoder.trainable_variables
        queries = self.query_encoder.trainable_variables
        distribute.assign_in_sync(
            keys, [momentum * k + (1.0 - momentum) * q for k, q in zip(keys, queries)])

    def _track(self, loss, statistics, learning_rate, bank_lr):
        """The step's diagnostics, from the ``BankStatistics`` of its stacked views."""
        self.loss_tracker.update_state(loss)
        positive_index = statistics.positive_index
        self.contrast_top1.update_state(tf.reduce_mean(tf.cast(
            tf.equal(statistics.nearest_index, positive_index), tf.float32)))
        self.positive_probability.update_state(
            tf.reduce_mean(statistics.positive_probability))
        # How many bank rows serve as someone's positive (a collapse shows up here first).
        used = tf.math.unsorted_segment_max(
            tf.ones_like(positive_index), positive_index, tf.shape(self.bank)[0])
        self.distinct_positives.update_state(tf.reduce_sum(tf.maximum(used, 0)))
        self.bank_norm.update_state(statistics.mean_norm)
        self.lr_tracker.update_state(learning_rate)
        self.bank_lr_tracker.update_state(bank_lr)

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
