"""Each method given what it needs, refused where it cannot work: W-MSE's whitening sub-batch no
larger than its embedding is one error line from caco-train and caco-compare before anything is
written, and W-MSE may have an embedding of its own; Barlow Twins' and VICReg's matrices
estimated from no more images than they have dimensions are one warning line at start; a bank
warm-up scales with a comparison's ``--epochs``; every method of the shapes budget plans."""

import logging

import pytest

from caco_tf.build import batch_cautions, build_model, plan_run
from caco_tf.cli import compare as compare_cli
from caco_tf.cli import train as train_cli
from caco_tf.comparison import trials
from caco_tf.config import load_config
from caco_tf.run_settings import RunSettings

from test_comparison import write_folder

# A budget on 120 images of 16 px where W-MSE cannot whiten: sub-batches of 32 images for 64
# dimensions (a shrunk covariance, whitening_epsilon 0.1, was once let through), the model's
# (configs/mnist.yaml's own projection for W-MSE set aside).
TINY = ["data.views=symmetric", "data.image_size=16", "model.widths=[8, 16, 32, 64]",
        "model.pool_grid=1", "model.projector_hidden=32", "model.embedding_dim=64",
        "train.jit_compile=false", "train.steps_per_execution=1", "evaluation.health_images=0",
        "evaluation.knn_monitor_every=0"]
SINGULAR = ["method.w_mse.whitening_size=32", "method.w_mse.whitening_epsilon=0.1",
            "method.w_mse.embedding_dim=0"]
REFUSAL = ("method.w_mse.whitening_size 32 must exceed model.embedding_dim (64): W-MSE whitens "
           "sub-batches of 32 images, whose 64x64 covariance is singular (rank 31 at most; "
           "whitening_epsilon only masks it); no sub-batch above 64 images divides a replica's "
           "batch of 32: set method.w_mse.embedding_dim below 32 (W-MSE's own projection) or "
           "raise train.batch_size")


class Counted:
    """A training source of ``count`` images, for the checks that only count them."""

    def __init__(self, count):
        self.count = count

    def __len__(self):
        return self.count


def lines_of(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("needs") / "images")  # 3 classes x 40


# ---------------------------------------------------------------------- W-MSE
def test_caco_train_refuses_sub_batches_no_larger_than_the_embedding(images, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [f"--set={s}" for s in TINY + SINGULAR + [
        f"data.source=folder:{images}", "method.name=w_mse", "train.batch_size=32",
        "train.epochs=1", "train.lr_warmup_epochs=0"]]
    status = train_cli.main(argv + ["--run-dir", str(run_dir), "--quiet"])
    captured = capsys.readouterr()
    assert (status, lines_of(captured.err)) == (2, [f"error: {REFUSAL}"]), captured.err[-2000:]
    assert not run_dir.exists()


def test_caco_compare_refuses_them_before_its_plan(images, tmp_path, capsys):
    out = tmp_path / "comparison"
    argv = ["--config", "mnist", "--data", f"folder:{images}", "--methods", "byol,w_mse",
            "--trials", "1", "--seeds", "1", "--few-labels", "0", "--batch-size", "32",
            "--epochs", "1", "--out", str(out), "--dry-run"]
    for setting in TINY + SINGULAR + ["train.lr_warmup_epochs=0"]:
        argv += ["--set", setting]
    status = compare_cli.main(argv)
    captured = capsys.readouterr()
    assert (status, lines_of(captured.err)) == (2, [f"error: w_mse, trial 0: {REFUSAL}"]), \
        captured.err[-2000:]
    assert not (out / "plan.json").exists() and not (out / "runs").exists()


@pytest.mark.parametrize("assignments, advice", [
    (["train.batch_size=256"], "set method.w_mse.whitening_size 128 (above 64, dividing a "
                               "replica's batch of 256) or method.w_mse.embedding_dim below 32"),
    (["train.batch_size=64", "method.w_mse.embedding_dim=48"],
     "method.w_mse.whitening_size 32 must exceed method.w_mse.embedding_dim (48)"),
])
def test_the_refusal_says_what_to_change(assignments, advice):
    config = load_config(None, ["method.name=w_mse", "model.embedding_dim=64",
                                "method.w_mse.whitening_size=32"] + assignments)
    with pytest.raises(Exception) as refused:
        plan_run(RunSettings.of(config), Counted(4000))
    assert advice in str(refused.value) and "\n" not in str(refused.value)


def test_w_mse_whitens_in_an_embedding_of_its_own():
    config = load_config(None, ["method.name=w_mse", "model.embedding_dim=64",
                                "method.w_mse.embedding_dim=16", "method.w_mse.whitening_size=32",
                                "train.batch_size=32", "model.projector_hidden=32"])
    plan = plan_run(RunSettings.of(config), Counted(4000))
    assert plan.embedding_dim == 16
    model = build_model(config, steps_per_epoch=plan.steps_per_epoch)
    assert model.embedding_dim == 16 and model.projector.output_shape[-1] == 16
    other = build_model(load_config(None, ["method.name=byol", "model.embedding_dim=64",
                                           "model.projector_hidden=32"]), steps_per_epoch=1)
    assert other.embedding_dim == 64  # the other methods keep model.embedding_dim


# ---------------------------------------------------------------------- Barlow Twins, VICReg
@pytest.mark.parametrize("method, matrix", [("barlow_twins", "cross-correlation"),
                                            ("vicreg", "covariance")])
def test_a_matrix_from_no_more_images_than_dimensions_is_one_warning(method, matrix, caplog):
    config = load_config(None, [f"method.name={method}", "model.embedding_dim=64",
                                "train.batch_size=32"])
    with caplog.at_level(logging.WARNING, logger="caco_tf"):
        plan_run(RunSettings.of(config), Counted(4000), replicas=2)  # over the global batch
    assert [record.getMessage() for record in caplog.records] == [
        f"warning: {method} estimates its 64x64 {matrix} from the global batch of 32 images "
        f"(train.batch_size 32), no more than model.embedding_dim 64: its rank is 31 at most, "
        f"so the loss cannot reach its optimum (it still trains); for a full-rank estimate "
        f"raise train.batch_size above 64 or lower model.embedding_dim below 32"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="caco_tf"):  # a caller that says it itself
        plan = plan_run(RunSettings.of(config), Counted(4000), warn=False)
    assert not caplog.records and len(batch_cautions(plan)) == 1
    config = load_config(None, [f"method.name={method}", "model.embedding_dim=64",
                                "train.batch_size=128"])
    with caplog.at_level(logging.WARNING, logger="caco_tf"):
        plan_run(RunSettings.of(config), Counted(4000))
    assert not caplog.records


# ---------------------------------------------------------------------- the bank warm-up
def test_the_bank_warm_up_scales_with_a_budgets_epochs():
    from caco_tf.methods.caco import scaled_warmups

    declared = load_config("shapes")  # 8 epochs, CaCo's warm-up 1
    assert scaled_warmups(declared, 8, ["caco"]) == []
    assert scaled_warmups(declared, 1, ["caco", "simclr"]) == ["method.caco.warmup_epochs=0"]
    assert scaled_warmups(declared, 4, ["caco"]) == []  # half an epoch rounds up: 1 stays
    assert scaled_warmups(declared, 3, ["caco"]) == ["method.caco.warmup_epochs=0"]
    digits = load_config("mnist")  # 40 epochs, CaCo's warm-up 2
    assert scaled_warmups(digits, 10, ["caco"]) == ["method.caco.warmup_epochs=1"]
    assert scaled_warmups(declared, 16, ["caco"]) == ["method.caco.warmup_epochs=2"]
    # An ablation row reads CaCo's section.
    assert scaled_warmups(declared, 1, ["negative"]) == ["method.caco.warmup_epochs=0"]
    assert scaled_warmups(declared, 1, ["simclr", "byol"]) == []  # no warm-up to scale
    # What the user wrote is theirs: kept (and refused in one line if it cannot be).
    assert scaled_warmups(declared, 1, ["caco"], ["method.caco.warmup_epochs=0"]) == []
    # Any method's warm-up, kept below the budget's epochs.
    late = load_config("shapes", ["method.barlow_twins.warmup_epochs=7"])
    assert scaled_warmups(late, 2, ["barlow_twins"]) == ["method.barlow_twins.warmup_epochs=1"]
    one = load_config("shapes", ["train.epochs=1", "method.name=caco"]
                      + scaled_warmups(declared, 1, ["caco"]))
    assert one["method"]["caco"]["warmup_epochs"] == 0


# ---------------------------------------------------------------------- the shapes budget
def test_every_method_of_the_shapes_budget_plans_and_two_are_warned(caplog):
    warned = {}
    for method in trials.comparison_methods():
        config = load_config("shapes", [f"method.name={method}"])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="caco_tf"):
            plan = plan_run(RunSettings.of(config), Counted(15000))
        warned[method] = [record.getMessage() for record in caplog.records]
        assert plan.embedding_dim == (16 if method == "w_mse" else 64), method
    assert {method for method, lines in warned.items() if lines} == {"barlow_twins", "vicreg"}
    assert all(len(lines) <= 1 for lines in warned.values())
