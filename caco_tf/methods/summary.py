"""``Method.summary``: a method's parts, what each is, and its variables' sizes."""

import math

import keras


def parts_table(model):
    """The lines of ``model.summary()``: every part (backbone, projector, heads, teacher,
    state, online probe), what it is, and the sizes of its trainable and other variables."""
    rows = [("backbone", f"{model.backbone.name}: images {tuple(model.backbone.input_shape[1:])}"
             f" → features [{model.backbone.output_shape[-1]}]", *_sizes(model.backbone)),
            ("projector", f"features → embedding [{model.embedding_dim}], L2-normalized",
             *_sizes(model.projector))]
    for name in model.HEADS:
        head = getattr(model, name)
        width = head.output.shape[-1] if isinstance(head, keras.Model) else getattr(
            head, "units", None)
        rows.append((name, type(head).__name__ + (f" → [{width:,}]" if width else ""),
                     *_sizes(head)))
    if model.key_encoder is not None:
        heads = "".join(f" + {name}" for name in model.TEACHER_HEADS)
        rows.append((model.TEACHER_NAME,
                     f"EMA copy of backbone + projector{heads} (not trained)", 0,
                     _count(model.key_encoder.weights)))
    for layer in _state_layers(model):
        rows.append((layer.name.replace("memory_", ""), layer.describe(), 0,
                     _count(layer.weights)))
    if model.online_probe is not None:
        rows.append(("online probe", f"features → {model.online_probe.output_shape[-1]} "
                     "classes (evaluation only)", *_sizes(model.online_probe)))
    lines = [f'Model "{model.name}" ({type(model).__name__}, method.name {model.method})',
             f"{'part':<14}{'what':<64}{'trainable':>12}{'not trained':>13}"]
    lines += [f"{part:<14}{what:<64}{trainable:>12,}{fixed:>13,}"
              for part, what, trainable, fixed in rows]
    total = sum(r[2] for r in rows), sum(r[3] for r in rows)
    return lines + [f"{'total':<78}{total[0]:>12,}{total[1]:>13,}"]


def _count(variables):
    return sum(math.prod(int(side) for side in v.shape) for v in variables)


def _sizes(layer):
    return _count(layer.trainable_weights), _count(layer.non_trainable_weights)


def _state_layers(model):
    """The state's layers (bank, queues, center): the model's layers that hold variables and
    train none, besides its networks."""
    networks = {id(part) for part in [model.backbone, model.query_encoder, model.key_encoder,
                                      model.online_probe] + model.heads if part is not None}
    return [layer for layer in model.layers
            if id(layer) not in networks and not isinstance(layer, keras.Model)
            and layer.weights and not layer.trainable_weights]
