"""train.precision auto: what it picks from the machine's devices and CPU flags."""

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
