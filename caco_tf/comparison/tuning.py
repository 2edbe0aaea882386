"""The runs of a comparison handed out by KerasTuner, on one machine or several.

A comparison's runs are independent trainings; KerasTuner's oracle keeps the book of which one
runs where, and its distributed tuning spreads them over machines (its chief serves the oracle
over gRPC, each worker asks it for the next run).  Each KerasTuner trial is one run of the
plan (``Comparison.runs``): ``ComparisonOracle`` hands out, in the plan's order, the first run
that is neither finished (its folder's ``comparison.json``) nor running on another worker;
the final runs of a method wait (``IDLE``) until its trials have all finished.

One machine: ``caco-compare`` runs the oracle and the only worker in one process.  Several
(docs/compare.md): the same command on each machine, over one shared ``--out`` folder, with
KerasTuner's variables: ``KERASTUNER_TUNER_ID=chief`` on the machine serving the oracle,
``tuner0``, ``tuner1``, ... on the workers, and ``KERASTUNER_ORACLE_IP`` /
``KERASTUNER_ORACLE_PORT`` the chief's address on all.  A worker killed mid-run and started
again with its tuner id gets its run back (the oracle keeps it as that worker's ongoing trial)
and resumes it from its checkpoint; a measurement is never taken twice, since each run's
folder records what it has.
"""

import time

import keras_tuner
from keras_tuner.src.distribute import utils as distributed
from keras_tuner.src.engine import base_tuner
from keras_tuner.src.engine import trial as trial_module

from caco_tf.comparison import runner
from caco_tf.errors import UserError
from caco_tf.training.interrupts import Interrupted
from caco_tf.training.run_folder import write_error

RUNNING, IDLE, STOPPED = (trial_module.TrialStatus.RUNNING, trial_module.TrialStatus.IDLE,
                          trial_module.TrialStatus.STOPPED)
OBJECTIVE = keras_tuner.Objective("knn_top1", direction="max")
IDLE_SECONDS = 2.0  # a worker that waits for other workers' trials asks again after this
FAILED_SCORE = -1.0


class ComparisonOracle(keras_tuner.Oracle):
    """Hands out the comparison's runs (the module docstring), one per KerasTuner trial."""

    def __init__(self, comparison, **kwargs):
        super().__init__(objective=OBJECTIVE, max_trials=None,
                         max_consecutive_failed_trials=3, **kwargs)
        self.comparison = comparison

    def populate_space(self, trial_id):
        running = {trial.hyperparameters.values.get("run")
                   for trial in self.ongoing_trials.values()}
        waiting = False
        for key, method, trial, seed, final in self.comparison.runs():
            if key in running or runner.finished(self.comparison, key, final):
                continue
            if final and trial is None:
                waiting = True  # its method's trials are still running elsewhere
                continue
            return {"status": RUNNING, "values": {"run": key}}
        if waiting or running:
            time.sleep(IDLE_SECONDS)
            return {"status": IDLE}
        return {"status": STOPPED}


class PassedThrough(keras_tuner.errors.FatalError):
    """What KerasTuner must not record as a failed trial but let through: a signal that
    stopped the run (its trial stays the worker's, to resume) or a setting or file to fix."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class ComparisonTuner(base_tuner.BaseTuner):
    """Runs one run of the comparison per trial and reports its kNN top-1."""

    def __init__(self, comparison, say=print):
        self.comparison, self.say = comparison, say
        super().__init__(ComparisonOracle(comparison), directory=comparison.folder,
                         project_name="tuner", overwrite=False)

    def run_trial(self, trial, **search_arguments):
        key = trial.hyperparameters.values["run"]
        try:
            entry = runner.run_one(self.comparison, key, say=self.say)
        except (Interrupted, UserError) as error:
            raise PassedThrough(error) from None
        except OSError as error:  # the comparison's own files: a full disk is one line too
            raise PassedThrough(write_error(error, error.filename or key)) from None
        # A run that stopped itself (a NaN loss) is finished and loses; KerasTuner's book gets
        # a score below any accuracy (its failed trials would end the search after three).
        return {"knn_top1": entry.get("knn_top1", FAILED_SCORE)}

    # KerasTuner's hooks for models: a run's model lives in its run folder.
    def save_model(self, trial_id, model, step=0):
        pass

    def load_model(self, trial):
        raise NotImplementedError("a comparison's models are in its run folders")


def is_chief():
    """Whether this process serves the oracle (or runs alone)."""
    return not distributed.has_chief_oracle() or distributed.is_chief_oracle()


def search(comparison, say=print):
    """Run the comparison's runs this process is handed until none is left; a signal raises
    ``Interrupted`` (after the running training saved)."""
    tuner = ComparisonTuner(comparison, say=say)
    try:
        tuner.search(verbose=0)
    except PassedThrough as passed:
        raise passed.error from None


def wait_for_plan(comparison, seconds=600.0, poll=1.0):
    """A worker waits for the chief to write the plan and the splits (a shared folder)."""
    deadline = time.time() + seconds
    while comparison.read_plan() is None:
        if time.time() > deadline:
            from caco_tf.config import ConfigError

            raise ConfigError(f"no plan in {comparison.folder} after {seconds:.0f} s: start the "
                              f"chief (KERASTUNER_TUNER_ID=chief) with the same --out, on a "
                              f"folder every machine shares")
        time.sleep(poll)
    return comparison.plan
