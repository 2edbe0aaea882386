"""Optimizers and schedules for CaCo pre-training.

This module mirrors the optimisation recipe of the MoCo v3 / CaCo reference
code (PyTorch) on top of the Keras 3 optimizer API:

* :class:`LARS` -- momentum SGD with *coupled* L2 weight decay and an optional
  layer-wise trust ratio (LARS).  With ``layer_adaptation=False`` it reduces
  to ``torch.optim.SGD(momentum=m, weight_decay=wd)``.
* :class:`AdamW` -- ``torch.optim.AdamW`` (the ViT recipes of DINO and MoCo v3), with
  the weight decay a schedule of the step (DINO's cosine 0.04 → 0.4) and DINO's per-tensor
  gradient clipping.
* :class:`WarmupCosine` -- linear warm-up followed by a cosine decay, the
  per-iteration learning-rate schedule of the reference code.
* :class:`CosineMomentum` -- cosine increase of the key-encoder EMA momentum
  from ``base`` to 1.
* :func:`paper_learning_rate` / :func:`build_encoder_optimizer` -- the paper's
  rule for choosing SGD vs. LARS and scaling the base learning rate with the
  global batch size.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import ops

from caco_tf import keras_compat

__all__ = [
    "LARS",
    "AdamW",
    "clip_by_tensor_norm",
    "WarmupCosine",
    "CosineMomentum",
    "paper_learning_rate",
    "build_encoder_optimizer",
    "as_schedule",
    "Ramp",
    "schedule",
]

# Global batch size from which the paper switches from SGD to LARS.
LARS_BATCH_THRESHOLD = 1024
# Base learning rates per 256 samples (linear scaling rule).
# AdamW: DINO's --lr (its ViT recipes; MoCo v3's ViT takes 1.5e-4).
_BASE_LR_PER_256 = {"sgd": 0.03, "lars": 0.3, "adamw": 5e-4}


def _l2_norm(x):
    # Frobenius norm over *all* entries (torch.norm(p) semantics), written out
    # explicitly so that it does not depend on ops.norm's rank handling.
    return ops.sqrt(ops.sum(ops.square(x)))


@keras.saving.register_keras_serializable(package="caco_tf")
class LARS(keras.optimizers.Optimizer):
    """LARS / momentum SGD with coupled weight decay (PyTorch semantics).

    This is the LARS variant used by MoCo v3 and CaCo.  For every variable
    ``p`` with gradient ``g`` and momentum buffer ``mu``:

    * ``layer_adaptation=True`` (LARS):

      - if ``p`` has rank > 1 (dense / conv kernels)::

            g = g + weight_decay * p
            q = trust_coefficient * ||p|| / ||g||   if ||p|| > 0 and ||g|| > 0
                1                                     otherwise
            g = q * g

      - rank <= 1 variables (biases, BatchNorm gamma/beta) get neither weight
        decay nor trust-ratio scaling, as in the reference code.

    * ``layer_adaptation=False``: ``g = g + weight_decay * p`` for *all*
      variables and no scaling, i.e. exactly
      ``torch.optim.SGD(lr, momentum, weight_decay)`` (dampening 0, no
      Nesterov).

    Then, in both modes::

        mu = momentum * mu + g
        p  = p - lr * mu

    Note that the learning rate multiplies the momentum buffer (PyTorch
    convention) rather than being folded into it (Keras ``SGD`` convention);
    the two differ when the learning rate changes over time.

    Weight decay is *coupled* (added to the gradient before the trust ratio
    and momentum).  It is therefore **not** forwarded to the Keras base class,
    which would apply decoupled (AdamW-style) decay on top: ``self.weight_decay``
    stays ``None`` and the coefficient lives in ``self.coupled_weight_decay``.
    Variables excluded with :meth:`exclude_from_weight_decay` receive no
    coupled decay.

    Args:
        learning_rate: float, ``LearningRateSchedule`` or callable.
        momentum: momentum factor in ``[0, 1]``.
        weight_decay: coupled L2 coefficient (>= 0).
        trust_coefficient: LARS ``eta``; only used with ``layer_adaptation``.
        layer_adaptation: ``True`` for LARS, ``False`` for plain torch-SGD.
        name: optimizer name.
        **kwargs: other base-optimizer arguments (``clipnorm``, ``use_ema``,
            ...).  ``weight_decay`` is intentionally *not* among them.
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum=0.9,
        weight_decay=1e-4,
        trust_coefficient=0.001,
        layer_adaptation=True,
        decay_rank1=True,
        clip_tensor_norm=0.0,
        name="lars",
        **kwargs,
    ):
        # The base class only accepts Python floats (not ints) as constants.
        if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
            learning_rate = float(learning_rate)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)

        momentum = float(momentum)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"`momentum` must be in [0, 1], got {momentum}.")
        weight_decay = float(weight_decay or 0.0)
        if weight_decay < 0.0:
            raise ValueError(
                f"`weight_decay` must be >= 0, got {weight_decay}."
            )
        trust_coefficient = float(trust_coefficient)
        if trust_coefficient <= 0.0:
            raise ValueError(
                "`trust_coefficient` must be > 0, got "
                f"{trust_coefficient}."
            )
        self.momentum = momentum
        self.coupled_weight_decay = weight_decay
        self.trust_coefficient = trust_coefficient
        self.layer_adaptation = bool(layer_adaptation)
        self.decay_rank1, self.clip_tensor_norm = bool(decay_rank1), float(clip_tensor_norm)

    def build(self, variables):
        """Create one momentum buffer per trainable variable."""
        if self.built:
            return
        super().build(variables)
        # Always allocate buffers (even for momentum == 0) so the update rule
        # has a single code path; mu == g in that case.
        self.momentums = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        """Apply one LARS / SGD update to ``variable``."""
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = _clipped(gradient, dtype, self.clip_tensor_norm)
        mu = self.momentums[keras_compat.optimizer_variable_index(self, variable)]

        # Ranks are static, so these branches are resolved at trace time.
        is_matrix = len(variable.shape) > 1
        use_decay = (
            self.coupled_weight_decay > 0.0
            and keras_compat.uses_weight_decay(self, variable)
            and (is_matrix or (not self.layer_adaptation and self.decay_rank1))
        )
        if use_decay:
            gradient = ops.add(
                gradient,
                ops.multiply(
                    ops.cast(self.coupled_weight_decay, dtype), variable
                ),
            )

        if self.layer_adaptation and is_matrix:
            param_norm = _l2_norm(variable)
            update_norm = _l2_norm(gradient)
            valid = ops.logical_and(
                ops.greater(param_norm, 0.0), ops.greater(update_norm, 0.0)
            )
            # Divide by a safe denominator so the unselected branch of the
            # `where` can never produce inf/NaN.
            safe_update_norm = ops.where(
                valid, update_norm, ops.ones_like(update_norm)
            )
            trust_ratio = ops.where(
                valid,
                ops.cast(self.trust_coefficient, dtype)
                * param_norm
                / safe_update_norm,
                ops.ones_like(param_norm),
            )
            gradient = ops.multiply(gradient, trust_ratio)

        # PyTorch momentum: mu = m * mu + g ; p = p - lr * mu.
        self.assign(
            mu,
            ops.add(ops.multiply(mu, ops.cast(self.momentum, dtype)), gradient),
        )
        self.assign_sub(variable, ops.multiply(mu, learning_rate))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                # Overrides the base entry (None): LARS' own coupled decay.
                "weight_decay": self.coupled_weight_decay,
                "trust_coefficient": self.trust_coefficient,
                "layer_adaptation": self.layer_adaptation,
                "decay_rank1": self.decay_rank1,
                "clip_tensor_norm": self.clip_tensor_norm,
            }
        )
        return config


def clip_by_tensor_norm(gradient, clip):
    """DINO's ``clip_gradients``: a tensor's gradient scaled by clip / (‖g‖ + 1e-6) when that
    is below 1.  Applied in ``update_step``, to the gradient summed over the replicas (Keras'
    own ``clipnorm`` clips each replica's share before the sum)."""
    factor = clip / (_l2_norm(gradient) + 1e-6)
    return ops.multiply(gradient, ops.minimum(factor, 1.0))


def _clipped(gradient, dtype, clip):
    """The gradient, dense, in the variable's dtype, clipped per tensor when ``clip`` > 0."""
    # A gathered weight's (KerasHub ViT's position embedding) comes as IndexedSlices: dense,
    # its repeated rows are summed, so the update's arithmetic and the norm take it.
    gradient = ops.cast(tf.convert_to_tensor(gradient), dtype)
    return clip_by_tensor_norm(gradient, ops.cast(clip, dtype)) if clip > 0.0 else gradient


@keras.saving.register_keras_serializable(package="caco_tf")
class AdamW(keras.optimizers.Optimizer):
    """``torch.optim.AdamW``: for each variable p with gradient g, at step t (from 1)::

        p = p · (1 - lr · wd(t))                  (decoupled decay; not for excluded p)
        m = β1·m + (1 - β1)·g ;  v = β2·v + (1 - β2)·g²
        p = p - lr · (m / (1 - β1^t)) / (√(v / (1 - β2^t)) + ε)

    PyTorch's ε sits outside the bias-corrected root (Keras' Adam folds the correction into
    the step size, which moves ε).  ``weight_decay`` may be a schedule of the step (DINO's
    cosine from 0.04 to 0.4).  ``decay_rank1=False`` exempts every variable of rank ≤ 1
    (biases, LayerNorm and BatchNorm scales and shifts: DINO's ``get_params_groups``);
    ``clip_tensor_norm`` > 0 clips each tensor's gradient first (DINO's ``clip_gradients``).
    """

    def __init__(self, learning_rate=1e-3, weight_decay=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, decay_rank1=True, clip_tensor_norm=0.0, name="adamw",
                 **kwargs):
        kwargs.pop("weight_decay", None)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if isinstance(weight_decay, dict):  # from get_config
            weight_decay = keras.saving.deserialize_keras_object(weight_decay)
        self.decoupled_weight_decay = weight_decay
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.decay_rank1, self.clip_tensor_norm = bool(decay_rank1), float(clip_tensor_norm)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.first_moments = self.add_optimizer_variables(variables, "m")
        self.second_moments = self.add_optimizer_variables(variables, "v")

    def current_weight_decay(self):
        """wd at this step (the optimizer's ``iterations`` before its increment)."""
        return ops.cast(as_schedule(self.decoupled_weight_decay)(self.iterations), "float32")

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = _clipped(gradient, dtype, self.clip_tensor_norm)
        index = keras_compat.optimizer_variable_index(self, variable)
        m, v = self.first_moments[index], self.second_moments[index]
        step = ops.cast(self.iterations + 1, dtype)
        if (self.decay_rank1 or len(variable.shape) > 1) and keras_compat.uses_weight_decay(
                self, variable):
            decay = ops.cast(self.current_weight_decay(), dtype)
            self.assign(variable, ops.multiply(variable, 1.0 - learning_rate * decay))
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * gradient)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * ops.square(gradient))
        first = m / (1.0 - ops.power(ops.cast(self.beta_1, dtype), step))
        second = v / (1.0 - ops.power(ops.cast(self.beta_2, dtype), step))
        self.assign_sub(variable, learning_rate * first / (ops.sqrt(second) + self.epsilon))

    def get_config(self):
        config = super().get_config()
        decay = self.decoupled_weight_decay
        config.update({
            "weight_decay": keras.saving.serialize_keras_object(decay)
            if isinstance(decay, keras.optimizers.schedules.LearningRateSchedule) else decay,
            "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
            "decay_rank1": self.decay_rank1, "clip_tensor_norm": self.clip_tensor_norm})
        return config


@keras.saving.register_keras_serializable(package="caco_tf")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up followed by cosine decay, evaluated per step.

    ::

        step < warmup:  base * step / warmup
        otherwise:      final + (base - final) * 0.5 *
                        (1 + cos(pi * (min(step, total) - warmup)
                                 / max(1, total - warmup)))

    Steps past ``total_steps`` keep the final value.  The step may be a Python
    number or a (graph) tensor; the result is a float32 tensor.

    Args:
        base_value: peak value reached at the end of warm-up.
        total_steps: number of steps of the whole schedule (> 0).
        warmup_steps: number of linear warm-up steps (0 <= warmup <= total).
        final_value: value at ``total_steps``.
    """

    def __init__(self, base_value, total_steps, warmup_steps=0, final_value=0.0):
        total_steps = int(total_steps)
        warmup_steps = int(warmup_steps)
        if total_steps <= 0:
            raise ValueError(f"`total_steps` must be > 0, got {total_steps}.")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                "`warmup_steps` must be in [0, total_steps], got "
                f"{warmup_steps} (total_steps={total_steps})."
            )
        self.base_value = float(base_value)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.final_value = float(final_value)

    def __call__(self, step):
        step = ops.minimum(
            ops.cast(step, "float32"), float(self.total_steps)
        )
        base = self.base_value
        final = self.final_value
        warmup = float(self.warmup_steps)
        # max(1, .) guards both divisions (warmup == 0, warmup == total).
        warm = base * step / max(1.0, warmup)
        progress = (step - warmup) / max(1.0, float(self.total_steps) - warmup)
        cosine = final + (base - final) * 0.5 * (
            1.0 + ops.cos(math.pi * progress)
        )
        return ops.where(ops.less(step, warmup), warm, cosine)

    def get_config(self):
        return {
            "base_value": self.base_value,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "final_value": self.final_value,
        }


@keras.saving.register_keras_serializable(package="caco_tf")
class CosineMomentum(keras.optimizers.schedules.LearningRateSchedule):
    """Cosine schedule for the key-encoder EMA momentum (BYOL / MoCo v3).

    ::

        m(step) = 1 - (1 - base) * (cos(pi * min(step, total) / total) + 1) / 2

    so ``m(0) = base`` and ``m(total) = 1``.  It is a ``LearningRateSchedule``
    only to reuse Keras' schedule (de)serialisation machinery.

    Args:
        base_value: momentum at step 0 (e.g. 0.99).
        total_steps: step at which the momentum reaches 1 (> 0).
    """

    def __init__(self, base_value=0.99, total_steps=1):
        total_steps = int(total_steps)
        if total_steps <= 0:
            raise ValueError(f"`total_steps` must be > 0, got {total_steps}.")
        base_value = float(base_value)
        if not 0.0 <= base_value <= 1.0:
            raise ValueError(f"`base_value` must be in [0, 1], got {base_value}.")
        self.base_value = base_value
        self.total_steps = total_steps

    def __call__(self, step):
        step = ops.minimum(
            ops.cast(step, "float32"), float(self.total_steps)
        )
        cosine = ops.cos(math.pi * step / float(self.total_steps))
        return 1.0 - (1.0 - self.base_value) * (cosine + 1.0) / 2.0

    def get_config(self):
        return {"base_value": self.base_value, "total_steps": self.total_steps}


@keras.saving.register_keras_serializable(package="caco_tf")
class Ramp(keras.optimizers.schedules.LearningRateSchedule):
    """From ``start`` to ``end`` over the first ``ramp_steps`` steps, then ``end``: linear, or
    on a half cosine (``shape="cosine"``)::

        p = min(step, ramp_steps) / ramp_steps
        linear: start + (end - start) * p
        cosine: end + (start - end) * (1 + cos(pi * p)) / 2

    A per-step quantity given as a schedule in a configuration (``schedule``), such as DINO's
    teacher temperature warming up from 0.04 to 0.07 over 30 epochs.
    """

    def __init__(self, start, end, ramp_steps, shape="linear"):
        if shape not in ("linear", "cosine"):
            raise ValueError(f"`shape` must be linear or cosine, got {shape!r}.")
        self.start, self.end = float(start), float(end)
        self.ramp_steps, self.shape = max(int(ramp_steps), 1), shape

    def __call__(self, step):
        progress = ops.minimum(ops.cast(step, "float32"), float(self.ramp_steps)) / float(
            self.ramp_steps)
        if self.shape == "linear":
            return self.start + (self.end - self.start) * progress
        return self.end + (self.start - self.end) * 0.5 * (1.0 + ops.cos(math.pi * progress))

    def get_config(self):
        return {"start": self.start, "end": self.end, "ramp_steps": self.ramp_steps,
                "shape": self.shape}


def schedule(value, shape, steps_per_epoch, total_steps):
    """A per-step setting's value (``caco_tf.config.Setting``'s ``schedule``) as a
    schedule of the step: a number is the start of ``shape`` ("constant", "cosine to 0": a
    ``WarmupCosine`` over the run, "cosine to 1": a ``CosineMomentum``); a mapping ``{start,
    end, epochs, shape}`` is a ``Ramp`` over its epochs (the whole run when absent)."""
    if isinstance(value, dict):
        epochs = value.get("epochs")
        steps = total_steps if epochs is None else round(epochs * steps_per_epoch)
        return Ramp(value["start"], value["end"], steps, value.get("shape", "linear"))
    if shape == "cosine to 0":
        return WarmupCosine(value, total_steps)
    if shape == "cosine to 1":
        return CosineMomentum(value, total_steps)
    return float(value)


def as_schedule(value):
    """A float or a ``LearningRateSchedule`` as a callable of the step."""
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule):
        return value
    return lambda step: ops.convert_to_tensor(value, "float32")


def paper_learning_rate(batch_size: int, optimizer: str = "auto"):
    """Return ``(kind, base_lr)`` following the CaCo paper's recipe.

    ``"auto"`` selects ``"sgd"`` below a global batch of 1024 and ``"lars"``
    from 1024 on.  The base learning rate follows the linear scaling rule:
    ``0.03 * batch / 256`` for SGD and ``0.3 * batch / 256`` for LARS.

    Raises:
        ValueError: unknown optimizer name or non-positive batch size.
    """
    batch_size = int(batch_size)
    if batch_size <= 0:
        raise ValueError(f"`batch_size` must be > 0, got {batch_size}.")
    kind = str(optimizer).lower()
    if kind == "auto":
        kind = "lars" if batch_size >= LARS_BATCH_THRESHOLD else "sgd"
    if kind not in _BASE_LR_PER_256:
        raise ValueError(
            f"Unknown optimizer {optimizer!r}; expected 'auto', 'sgd', "
            "'lars' or 'adamw'."
        )
    return kind, _BASE_LR_PER_256[kind] * batch_size / 256.0


def build_encoder_optimizer(
    batch_size: int,
    total_steps: int,
    warmup_steps: int,
    optimizer: str = "auto",
    learning_rate: float | None = None,
    weight_decay: float = 1e-4,
    momentum: float = 0.9,
    weight_decay_end: float | None = None,
    decay_biases_and_norms: bool = True,
    clip_gradient_norm: float = 0.0,
    final_learning_rate: float = 0.0,
    adamw_beta2: float = 0.999,
) -> keras.optimizers.Optimizer:
    """Build the encoder optimizer with a warm-up + cosine schedule.

    Both kinds are returned as :class:`LARS`: ``"lars"`` enables the
    layer-wise trust ratio, ``"sgd"`` disables it (torch-SGD semantics).

    Args:
        batch_size: global batch size, used for the SGD/LARS choice and the
            linear learning-rate scaling.
        total_steps: total optimisation steps of the run.
        warmup_steps: linear warm-up steps.
        optimizer: ``"auto"``, ``"sgd"`` or ``"lars"``.
        learning_rate: if given, overrides the paper's base learning rate
            (the peak of the schedule).
        weight_decay: coupled L2 coefficient (decoupled for ``"adamw"``).
        momentum: SGD momentum.
        weight_decay_end: ``"adamw"``: the weight decay at the end, reached on a cosine
            (DINO's ``--weight_decay_end``); ``None``: constant.
        decay_biases_and_norms: decay the variables of rank <= 1 too (off: DINO's groups).
        clip_gradient_norm: > 0 clips each tensor's gradient to this norm (DINO's
            ``--clip_grad``).
        final_learning_rate: the cosine's end (DINO's ``--min_lr``).
        adamw_beta2: ``"adamw"``: the second moment's decay (MAE's 0.95).
    """
    kind, base_lr = paper_learning_rate(batch_size, optimizer)
    if learning_rate is not None:
        base_lr = float(learning_rate)
    schedule = WarmupCosine(
        base_value=base_lr,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        final_value=final_learning_rate,
    )
    if kind == "adamw":
        decay = weight_decay if weight_decay_end is None else WarmupCosine(
            weight_decay, total_steps, final_value=weight_decay_end)
        return AdamW(learning_rate=schedule, weight_decay=decay, beta_2=adamw_beta2,
                     decay_rank1=decay_biases_and_norms, clip_tensor_norm=clip_gradient_norm)
    if weight_decay_end is not None:
        raise ValueError(f"a weight decay schedule (weight_decay_end {weight_decay_end}) "
                         f"needs the adamw optimizer, not {kind}")
    return LARS(
        learning_rate=schedule,
        momentum=momentum,
        weight_decay=weight_decay,
        layer_adaptation=(kind == "lars"),
        decay_rank1=decay_biases_and_norms,
        clip_tensor_norm=clip_gradient_norm,
        name=kind,
    )
