"""What .ci/wheel-smoke runs inside a fresh environment holding only the built wheel, from a
folder outside the checkout: python wheel_smoke.py CHECKOUT_RUN CHECKOUT_OUTPUT."""

import json
import os
import subprocess
import sys

COMMANDS = ("caco-train", "caco-evaluate", "caco-figures", "caco-export", "caco-extract",
            "caco-import-torch", "caco-data-service", "caco-compare")
BIN = os.path.dirname(sys.executable)


def run(*command, expect=0):
    done = subprocess.run([os.path.join(BIN, command[0]), *command[1:]], capture_output=True,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != expect:
        sys.exit(f"{' '.join(command)}: exit {done.returncode}, expected {expect}\n"
                 f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def history(run_dir):
    from caco_tf.training.callbacks import is_wall_clock

    with open(os.path.join(run_dir, "history.json")) as handle:
        return [{k: v for k, v in row.items() if not is_wall_clock(k)}
                for row in json.load(handle)]


def main(checkout_run, checkout_output):
    import caco_tf

    assert "site-packages" in caco_tf.__file__, caco_tf.__file__  # not the checkout
    for command in COMMANDS:
        assert "usage:" in run(command, "--help").stdout
        assert run(command, "--version").stdout.strip() == f"{command} {caco_tf.__version__}"
    listed = run("caco-train", "--list-configs").stdout.split()
    assert "mnist" in listed and "imagenet_resnet50_b256" in listed, listed

    trained = run("caco-train", "--run-dir", "run", "--quiet", "--set", "train.epochs=2",
                  "--set", "method.caco.warmup_epochs=1")
    knn = [line for line in trained.stdout.splitlines() if line.startswith("kNN top-1:")]
    with open(checkout_output) as handle:
        expected = [line for line in handle.read().splitlines() if line.startswith("kNN top-1:")]
    assert knn == expected and knn, (knn, expected)
    assert history("run") == history(checkout_run), "the history differs from the checkout's"

    paper = run("caco-train", "--config", "imagenet_resnet50_b256", "--run-dir", "paper",
                expect=2)
    assert paper.stderr.startswith("error: ") and "manual" in paper.stderr, paper.stderr

    evaluated = run("caco-evaluate", "knn", "--run", "run")
    assert "kNN" in evaluated.stdout, evaluated.stdout
    exported = run("caco-export", "--run", "run", "--out", "served")
    assert os.path.exists(os.path.join("served", "backbone", "1", "saved_model.pb")), (
        exported.stdout)
    print(f"wheel {caco_tf.__version__} on Python {sys.version.split()[0]}: import, "
          f"{len(COMMANDS)} commands' --help and --version, --list-configs, two epochs ({knn[0]}), "
          f"imagenet_resnet50_b256 up to TFDS's manual directory, caco-evaluate, caco-export")


if __name__ == "__main__":
    main(*sys.argv[1:])
