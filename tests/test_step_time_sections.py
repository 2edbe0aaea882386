"""benchmarks/step_time.py writes each kind of run into its own BENCHMARKS.md section, so
re-measuring one (the offline default's XLA gain) leaves the others' rows in place."""

from benchmark_scripts import load


def load_step_time():
    return load("step_time")


def test_each_kind_of_run_has_its_own_markers():
    step_time = load_step_time()
    begin = {argv: step_time.section_of(step_time.parse_args(argv.split()))[1]
             for argv in ("--only m_caco", "--interleave --only m_caco,m_caco_xla",
                          "--interleave --only r50_caco,r50_moco",
                          "--interleave --only r50_caco,m_caco", "--interleave")}
    assert begin["--only m_caco"] == "<!-- step_time: begin -->"
    assert begin["--interleave --only m_caco,m_caco_xla"] == \
        "<!-- step_time_offline_default: begin -->"
    for argv in ("--interleave --only r50_caco,r50_moco", "--interleave --only r50_caco,m_caco",
                 "--interleave"):
        assert begin[argv] == "<!-- step_time_interleaved: begin -->", argv


def test_rewriting_the_offline_default_section_keeps_the_resnet50_rows(tmp_path):
    step_time = load_step_time()
    sections = [step_time.SECTIONS[kind] for kind in ("interleaved", "offline_default")]
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n" + "\n".join(
        f"{title}\n\n{begin}\nold {n}\n{end}\n" for n, (title, begin, end) in enumerate(sections)))
    args = step_time.parse_args("--interleave --only m_caco,m_caco_xla".split())
    _, begin, end = step_time.section_of(args)
    step_time.write(f"{begin}\nnew\n{end}\n", str(path), args)
    text = path.read_text()
    assert "old 0" in text and "new" in text and "old 1" not in text
