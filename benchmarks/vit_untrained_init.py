"""An untrained ViT under another initialization, probed beside the run it was trained as.

    python benchmarks/vit_untrained_init.py RUN [RUN ...] [--init xavier] [--probes knn,linear]

For each run folder, the same ViT with fresh weights drawn by ``model.vit_init INIT`` and the
run's ``train.seed`` (``caco-evaluate PROBE --run COPY --untrained --seed SEED``, in this process, on a copy of
the run's configuration with that one setting changed), written to
``RUN/eval_<probe>_untrained_<init>.json``; ``benchmarks/vit_offline_table.py`` reads them.  The
baseline a trained ViT must beat need not be the initialization it was trained from: on the
micro ViT's 4 px gray patches the default's patch embedding is 6.7x smaller than xavier's, and
the untrained features far weaker (docs/vit.md).
"""

import argparse
import os
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402


def untrained_copy(run, folder, init):
    """A run folder in ``folder`` with ``run``'s configuration but ``model.vit_init`` (a
    baseline reads no weights); returns (path, seed)."""
    with open(os.path.join(run, "config.yaml")) as handle:
        config = yaml.safe_load(handle)
    config["model"]["vit_init"] = init
    os.makedirs(folder, exist_ok=True)
    copy = tempfile.mkdtemp(prefix=os.path.basename(os.path.normpath(run)) + "_", dir=folder)
    with open(os.path.join(copy, "config.yaml"), "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return copy, int(config["train"]["seed"])


def tiny_run(folder):
    """A one-epoch MAE run on 64 offline digits, no XLA (``--tiny``: the script's path)."""
    from caco_tf.cli import train

    data = _harness.tiny_training(folder)[:2]  # the .npz sources: 64 digits, 32 held out
    run = os.path.join(folder, "held_mae_s0")
    settings = data + ["train.epochs=1", "train.lr_warmup_epochs=0", "train.jit_compile=false",
                       "train.steps_per_execution=1", "train.export=false",
                       "evaluation.knn_k=3"]
    code = train.main(["--config", "mnist_mae", "--run-dir", run]
                      + [a for s in settings for a in ("--set", s)])
    assert code in (None, 0), code
    return run


def main(argv=None):
    from caco_tf.cli import evaluate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="run folders written by caco-train")
    parser.add_argument("--init", default="xavier", choices=("xavier", "trunc_normal"))
    parser.add_argument("--probes", default="knn,linear")
    parser.add_argument("--tiny", action="store_true", help="a one-epoch run of its own (a test)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        runs = [tiny_run(folder)] if args.tiny else args.runs
        if args.tiny:
            args.probes = "knn"
        if not runs:
            parser.error("give one or more run folders")
        for run in runs:
            if not os.path.exists(os.path.join(run, "config.yaml")):
                sys.exit(f"error: {run} is not a run folder (no config.yaml)")
        for run in runs:
            copy, seed = untrained_copy(run, os.path.join(folder, "copies"), args.init)
            for probe in args.probes.split(","):
                out = os.path.join(run, f"eval_{probe}_untrained_{args.init}.json")
                code = evaluate.main([probe, "--run", copy, "--untrained", "--seed", str(seed),
                                      "--json", out])
                if code:
                    return code
                print(f"{run}: {probe} untrained ({args.init}, seed {seed}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
