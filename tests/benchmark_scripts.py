"""Load a script of benchmarks/ as a module: its ``main(argv)`` and its parts, for the tests."""

import importlib.util
import os

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")


def load(name):
    """benchmarks/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
