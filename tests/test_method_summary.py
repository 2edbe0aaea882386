"""``Method.summary`` extends Keras': Keras' table of the model's layers first, then the
method's parts (``methods.summary.parts_table``), through the same ``print_fn``."""

import re

from tiny_methods import tiny


def test_the_summary_is_keras_table_then_the_methods_parts():
    model = tiny("dino", online_probe_classes=3)
    printed = []
    model.summary(print_fn=printed.append)
    keras_table, *parts = printed
    assert 'Model: "dino"' in keras_table and "Total params" in keras_table
    assert re.search(r"query_encoder \(Functional\)", keras_table)
    assert parts[0] == 'Model "dino" (DINO, method.name dino)'
    for part in ("backbone", "projector", "last_layer", "teacher", "center", "online probe"):
        assert any(line.startswith(f"{part} ") for line in parts), part
    assert parts[-1].startswith("total ")
