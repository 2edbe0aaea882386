"""A method's algorithm: what it declares and the hooks its step calls, with their defaults
(``Algorithm``); ``base.Method``, the Keras model that trains it, builds its parts from them.

A method declares the crops it takes (``CROPS``): two views, K equal views (W-MSE's), or two
global crops then local ones (multi-crop: CaCo, SwAV, DINO).  The views follow from it
(``caco_tf.build.build_views``) and every kind runs the same step: the crops come as one tuple,
the global crops first.

A method declares its parts; ``build_parts`` builds them, the model trains them:

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

A method declares what it consumes (``CONSUMES``): the pooled ``"features"`` of any backbone
(every method of the two-view era), or a ViT's ``"tokens"`` (``caco_tf.nets.tokens``: the patch
tokens, the encoder on the visible patches), which refuses a backbone without them in one line.
The masks it takes with its views (``view_masks``: ``caco_tf.data.masks``' kinds) come in the
batch after the crops, drawn per image from the views' seed; the step hands them to
``targets`` and ``forward`` as ``masks``.

A method may declare the views its authors train with (``AUTHORS_VIEWS``), which a
comparison gives it in place of the budget's (``caco_tf.comparison.trials.own_settings``); a
method that declares none trains on the budget's.

A method may offer a warm-up that runs before its own steps (``WARMUP``: the bank warm-up,
``bank_warmup.BankWarmup``, a part it opts into as it opts into a momentum teacher), switched
on by ``warmup_steps``.
"""

import collections

import tensorflow as tf

from caco_tf import losses
from caco_tf.errors import ConfigError
from caco_tf.methods.momentum_encoder import MomentumEncoder, build_encoder
from caco_tf.nets import tokens

# What ``objective`` gives (EXACT_GRADIENT methods): the loss, its gradient with respect to the
# outputs (their structure), and the method's diagnostics ({name: value}).
Objective = collections.namedtuple("Objective", "loss gradients diagnostics")

# The crops a method takes: ``views`` equal full-size views of each image (2, or K: a number or
# the name of the method's setting that gives it), and whether local crops may follow the two
# global ones (``local``: multi-crop, ``data.views multicrop``).
Crops = collections.namedtuple("Crops", "views local")

# The views a method's authors train with: ``data.views`` and the other ``data`` settings that
# shape them ({"crop_scale": [0.2, 1.0]}); ``local_share``: multi-crop's local crops' side as a
# share of the image's (DINOv2's 98 of 224 px), since no fixed side fits every budget's images.
AuthorsViews = collections.namedtuple("AuthorsViews", "views settings local_share",
                                      defaults=({}, None))


class Algorithm:
    """What a method declares and the hooks of its step (the module docstring): the part of
    ``base.Method`` a method's file fills in."""

    method = None                  # the name ``method.name`` gives it
    SETTINGS = {}                  # its own settings: method.<method>.<key>
    SETTINGS_OF = None             # the method whose settings it reads instead (ablation rows)
    TEACHER = None                 # "momentum" or None
    TEACHER_HEADS = ()             # heads the momentum teacher copies (DINO's last layer)
    WARMUP = None                  # the part run before its steps (bank_warmup.BankWarmup)
    HEADS = ()                     # the student's heads, by attribute name
    PROJECTOR = {}                 # the projector's shape (nets.backbones.build_mlp; CaCo's)
    CROPS = Crops(views=2, local=False)  # the crops it takes (``Crops``)
    CONSUMES = "features"          # "features" (pooled, any backbone) or "tokens" (a ViT's)
    AUTHORS_VIEWS = None           # the views its authors use (``AuthorsViews``), or None
    EXACT_GRADIENT = False         # gives d loss / d outputs itself (``objective``)
    DIAGNOSTICS = ()               # scalar diagnostics of ``method_loss``, averaged per epoch
    BATCH_MATRIX = None            # a D x D matrix it estimates from the batch (its name)
    COLLAPSE_ADVICE = ("lower the learning rate (train.learning_rate) or lengthen its warm-up "
                       "(train.lr_warmup_epochs)")
    EMBEDDINGS_JUDGED = True       # the shared checks (uniformity, spread, rank) apply to it
    DIVERGENCE_ADVICE = ("lower the learning rate (train.learning_rate) or use train.precision "
                         "float32")     # what to change when its loss becomes NaN or infinite
    TEACHER_NAME = "teacher"       # the momentum teacher's name in ``summary``
    # Its rows of the documentation, beside what the attributes above say (docs/hooks.py).
    # docs/methods.md's table (``methods.docs_table``): the state it keeps, the quantities it
    # reduces over the global batch, without a momentum teacher what serves as one ("teacher"),
    # and the paper's ImageNet ResNet-50 linear top-1 (%) of the method (its tables
    # 200/800/multi).  Every method also gives its "name" in words ("MoCo v2"; the README
    # merges adjacent rows of one name and summary), what a view is trained "towards" and its
    # "negatives" (docs/getting-started.md's table, under its "full name" if not its name), the
    # README's "summary" if not "towards", and with its own ``COLLAPSE_ADVICE`` what that
    # failure is judged by ("collapse": docs/health.md's table).
    DOCS_ROW = {"state": "–", "global batch": "–", "paper": "–"}

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
    def authors_views(cls, image_size, patch=1):
        """{dotted setting: value} of the views its authors train with (``AUTHORS_VIEWS``) on
        images of ``image_size`` px: multi-crop's local side its share of the image, in whole
        patches of ``patch`` px (a ViT's grid drops a part of one); {} without a declaration."""
        if cls.AUTHORS_VIEWS is None:
            return {}
        views = {"data.views": cls.AUTHORS_VIEWS.views,
                 **{f"data.{key}": value for key, value in cls.AUTHORS_VIEWS.settings.items()}}
        if cls.AUTHORS_VIEWS.local_share:
            views["data.multicrop.local_size"] = max(
                patch, int(image_size * cls.AUTHORS_VIEWS.local_share) // patch * patch)
        return views

    @classmethod
    def view_masks(cls, settings=None):
        """The masks it takes with its views, one per kind (``caco_tf.data.masks``:
        ``RandomMasks``, ``BlockMasks``), from its section ``settings`` (else its defaults);
        none by default."""
        return ()

    @classmethod
    def crops_wording(cls):
        """What it takes, in words (docs/methods.md's table, its errors)."""
        views = cls.CROPS.views
        words = f"{views} view{'s' * (views != 1)}" if isinstance(views, int) else (
            f"K equal views (method.{cls.method}.{views}, default "
            f"{cls.SETTINGS[views].default})")
        masks = ", ".join(type(kind).__name__ for kind in cls.view_masks())
        return (words + (", or 2 global crops then local crops" if cls.CROPS.local else "")
                + (f", with its masks ({masks})" if masks else ""))

    @classmethod
    def check_batch(cls, settings, replica_batch, embedding_dim):
        """Why the method cannot train on a replica's batch of ``replica_batch`` images with
        ``embedding_dim``-dimensional projections (one line naming the setting to change), or
        None; ``settings``: its section of the run's configuration.  Asked before anything is
        built (``caco_tf.build.check_sizes``)."""

    def build_parts(self, backbone, projector):
        """Build the student's embedding network, its heads, the teacher, the state and the
        warm-up, in this order: their variables' initial values follow it."""
        if self.CONSUMES == "tokens" and not tokens.has_tokens(backbone):
            raise ConfigError(tokens.tokens_refusal(self.method, backbone.name))
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

    def frozen_until(self):
        """{head attribute name: the step at which it starts training}; none by default."""
        return {}

    # ------------------------------------------------------------------ what a method gives
    def targets(self, crops, training, masks=()):
        """The teacher's outputs [t¹, t²] for the global crops (pre-step); None without a
        momentum teacher.  ``masks``: the batch's (``view_masks``), given only when declared."""
        if self.TEACHER != "momentum":
            return None
        return [self.key_encoder(crop, training=training) for crop in crops[:2]]

    def forward(self, crops, training, masks=()):
        """The student's outputs for every crop (and the batch's ``masks``, given only to a
        method that declares them); by default each crop's raw projection
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
        projections (``forward``'s) normalized; None for a method of one view (no alignment
        to measure)."""
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
