"""train.precision auto: what it picks from the machine's devices and CPU flags."""

import dataclasses

from caco_tf.training import precision


def test_auto_picks_bfloat16_on_a_cpu_with_amx_only():
    amx = {"avx512f", "amx_tile", "amx_bf16"}
    assert precision.resolve("auto", gpus=[], flags=amx)[0] == "mixed_bfloat16"
    assert precision.resolve("auto", gpus=[], flags={"avx512f", "avx2"})[0] == "float32"
    assert precision.resolve("auto", gpus=["GPU:0"], flags=amx)[0] == "float32"
    # A policy named by hand is kept, with no reason to print.
    assert precision.resolve("mixed_float16", gpus=[], flags=amx) == ("mixed_float16", None)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu sse2 amx_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu sse2 amx_bf16\n")
    assert precision.cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "amx_bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) == set()


def test_one_decision_per_run_from_every_workers_machine():
    """Each worker's machine (fake flags and GPUs) makes its own choice; the run takes the
    chief's precision (the others say what they would have chosen), keeps the one it began
    with on a resume, and refuses, in one line, XLA on some machines only."""
    import pytest

    from caco_tf.config import load_config
    from caco_tf.errors import ConfigError
    from caco_tf.run_settings import RunSettings
    from caco_tf.training import decisions

    train = RunSettings.of(load_config(None, ["train.precision=auto",
                                              "train.jit_compile=false"])).train
    amx, plain = {"avx512f", "amx_bf16"}, {"avx512f"}
    choices = {"worker task 0": decisions.local(train, 2, gpus=[], flags=amx),
               "worker task 1": decisions.local(train, 2, gpus=[], flags=plain)}
    decided, notes = decisions.agree(choices, "worker task 0")
    assert decided == {"precision": "mixed_bfloat16", "xla": False, "why":
                       "auto: this CPU has AMX-BF16 units and no GPU is visible"}
    assert notes == {"worker task 1": "precision: mixed_bfloat16, the chief's; this machine "
                                      "would choose float32 (auto: this CPU has no AMX-BF16 "
                                      "units)"}
    # Resumed with worker 1 as the chief: the run's precision is the one it began with.
    decided, notes = decisions.agree(choices, "worker task 1", recorded=decided)
    assert decided["precision"] == "mixed_bfloat16" and list(notes) == ["worker task 1"]
    assert notes["worker task 1"].startswith("precision: mixed_bfloat16, the run's (decided "
                                             "when it began); this machine would choose float32")
    # XLA compiles the collectives on the GPU machine only: every worker stops with one line.
    train = dataclasses.replace(train, jit_compile=True)
    choices = {"worker task 0": decisions.local(train, 2, gpus=["GPU:0"], flags=plain),
               "worker task 1": decisions.local(train, 2, gpus=[], flags=plain)}
    with pytest.raises(ConfigError) as refused:
        decisions.agree(choices, "worker task 0")
    assert str(refused.value) == (
        "train.jit_compile true: the workers' machines disagree on XLA (worker task 0: on; "
        "worker task 1: off (no GPU)); set train.jit_compile false, or run every worker on "
        "machines of one kind")
