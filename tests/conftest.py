"""Test session set-up: CPU only, four logical CPU devices (for MirroredStrategy tests: 2 and 4
replicas), quiet TensorFlow logs, no Grappler in the test process.

The suite is CPU-only by design, on every host: its figures are compared bit for bit or to
1e-5, which holds on one CPU and not across devices, and its multi-device tests use logical CPU
devices and local worker processes.  So a host's GPUs are hidden before TensorFlow starts
(``CUDA_VISIBLE_DEVICES``, inherited by the processes the tests start), and the suite runs the
same there as on the CPU-only CI machine.
"""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# XLA's persistent cache: the commands the tests start (train.py, the service's workers)
# compile the same XLA views again and again, ~4-8 s of a core each time here; with the cache
# once a session, loaded after (the same executable: the same values).  tests/test_data_service
# .py: 223 s without, 184 s with (the in-process modules: no change).  One folder for the
# session, made by the first process (the test workers inherit it), removed by that process.
_XLA_CACHE_FLAG = "--tf_xla_persistent_cache_directory="
if _XLA_CACHE_FLAG not in os.environ.get("TF_XLA_FLAGS", ""):
    _xla_cache, _owner = tempfile.mkdtemp(prefix="caco-tests-xla-"), os.getpid()
    atexit.register(lambda: os.getpid() == _owner and shutil.rmtree(_xla_cache, True))
    os.environ["TF_XLA_FLAGS"] = " ".join(
        filter(None, [os.environ.get("TF_XLA_FLAGS"), _XLA_CACHE_FLAG + _xla_cache]))

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 4)
except RuntimeError:  # already initialized by an earlier import: single-device tests still run
    pass

# Grappler rewrites every function a test instantiates (each tf.data pipeline copies and
# optimizes the process's whole function library): tests/test_data.py took 99 s without it,
# 118 s with it, side by side.  The tests compare runs made in the same process or against
# closed forms, so the rewrite changes nothing they check; the commands the tests start run
# with TensorFlow's defaults, as users do.
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


# The modules that take longest (pytest --durations, two workers), run first: with each module
# on one worker (pyproject's --dist loadfile), neither worker then waits long for the other at
# the end.  The other modules follow in their usual order.  The benchmark scripts' tiny modes
# (one test each, each its own unit: below) come after the long modules, shorter units that
# even out the two workers' ends.
SLOWEST_FIRST = ["test_comparison.py", "test_compare_vit.py", "test_distributed.py",
                 "test_data_service.py", "test_train_cli.py",
                 "test_long_run_faults.py", "test_augment.py", "test_user_data.py",
                 "test_keras_citizen.py", "test_torch_import.py", "test_data.py",
                 "test_methods_at_scale.py", "test_benchmarks.py"]
# Tests that xdist hands out one by one rather than with their module (--dist loadfile keeps a
# module on one worker, for its module fixtures): each runs a script of its own, they share no
# fixture, and together they take minutes.
SPREAD = ("test_benchmarks.py::test_a_script_runs_in_its_tiny_mode[",
          # test_comparison.py's two longest (540 s and 257 s unloaded, 2026-12-02), so that
          # they and the rest of their module may go to different workers
          "test_comparison.py::test_a_comparison_stopped_by_sigterm_continues",
          "test_comparison.py::test_runs_spread_over_two_workers_a_killed_one")


def pytest_collection_modifyitems(items):
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept within


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, but each test of ``SPREAD`` a work unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            if any(spread in nodeid for spread in SPREAD):
                return nodeid
            return super()._split_scope(nodeid)

    return Scheduling(config, log)

