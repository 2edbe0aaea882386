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
            if final and self.comparison.trials_only:
                continue  # a pilot: the validation split alone
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
        check_book(comparison)
        super().__init__(ComparisonOracle(comparison), directory=comparison.folder,
                         project_name="tuner", overwrite=False)

    def run_trial(self, trial, **search_arguments):
        key = trial.hyperparameters.values["run"]
        try:
            entry = runner.run_one(self.comparison, key, say=self.say)
        except (Interrupted, UserError) as error:
            raise PassedThrough(error) from None
        except OSError as error:  # the comparison's own files: a full disk is one line too
            raise PassedThrough(write_error(error, error.filename or key,
                                              flag="--out")) from None
        # A run that stopped itself (a NaN loss) is finished and loses; KerasTuner's book gets
        # a score below any accuracy (its failed trials would end the search after three).
        return {"knn_top1": entry.get("knn_top1", FAILED_SCORE)}

    # KerasTuner's hooks for models: a run's model lives in its run folder.
    def save_model(self, trial_id, model, step=0):
        pass

    def load_model(self, trial):
        raise NotImplementedError("a comparison's models are in its run folders")


def check_book(comparison):
    """KerasTuner's book (``OUT/tuner/``: its oracle and trials) is whole, or one line naming
    the damaged file: the book is redundant (each run's folder says what it has), so it may go."""
    import os

    book = os.path.join(comparison.folder, "tuner")
    advice = (f"remove the folder {book} (KerasTuner's book of who runs what: each run's "
              f"folder keeps what it measured, and a run cut short resumes from its checkpoint)")
    for folder, _, files in os.walk(book):
        for name in sorted(files):
            if name.endswith(".json"):
                runner.read_json(os.path.join(folder, name), advice)


VARIABLES = ("KERASTUNER_TUNER_ID", "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT")


class Distribution:
    """KerasTuner's variables of a comparison spread over machines, checked."""

    def __init__(self, tuner_id, ip, port):
        self.tuner_id, self.ip, self.port = tuner_id, ip, port
        self.chief = "chief" in tuner_id  # KerasTuner's own rule

    @property
    def address(self):
        return f"{self.ip}:{self.port}"


def distribution():
    """The ``Distribution`` KerasTuner's variables describe, None when none is set; a
    ``ConfigError`` line for a missing or malformed one (before anything is planned)."""
    import os

    from caco_tf.config import ConfigError

    given = {name: os.environ.get(name, "").strip() for name in VARIABLES}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ConfigError(f"{', '.join(missing)} not set: a comparison over machines needs "
                          f"all of {', '.join(VARIABLES)} (docs/compare.md, 'On several "
                          f"machines'); unset them all to run on this machine alone")
    port = given["KERASTUNER_ORACLE_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"KERASTUNER_ORACLE_PORT must be a port number from 1 to 65535, got "
                          f"{port!r}")
    return Distribution(given["KERASTUNER_TUNER_ID"], given["KERASTUNER_ORACLE_IP"], int(port))


def check_port_free(where):
    """The chief's port can be served on (refused now, not after planning and calibration)."""
    import socket

    from caco_tf.config import ConfigError

    try:
        with socket.socket(socket.AF_INET6 if ":" in where.ip else socket.AF_INET) as probe:
            probe.bind((where.ip, where.port))
    except OSError as error:
        raise ConfigError(f"KERASTUNER_ORACLE_PORT {where.port} cannot be served on "
                          f"{where.ip} ({error.strerror}): choose another port (the same on "
                          f"every machine), or the chief's own address as "
                          f"KERASTUNER_ORACLE_IP") from None


def wait_for_chief(where, seconds, say=print, poll=1.0):
    """A worker waits up to ``seconds`` for its chief's port to answer, saying where; a
    ``PeerError`` line (exit 75) after that."""
    import socket

    from caco_tf.training.peers import PeerError

    say(f"waiting for the chief at {where.address} (KERASTUNER_ORACLE_IP and _PORT; up to "
        f"{seconds:.0f} s, --chief-timeout)")
    deadline = time.time() + seconds
    while True:
        try:
            socket.create_connection((where.ip, where.port), timeout=poll).close()
            return
        except OSError:
            if time.time() > deadline:
                raise PeerError(no_chief(where, seconds)) from None
            time.sleep(poll)


def no_chief(where, seconds):
    return (f"no chief answered at {where.address} within {seconds:.0f} s: start it "
            f"(KERASTUNER_TUNER_ID=chief, the same command) or correct KERASTUNER_ORACLE_IP and "
            f"_PORT, then start this worker again: its runs continue")


def search(comparison, say=print, timeout=None):
    """Run the comparison's runs this process is handed until none is left; a signal raises
    ``Interrupted`` (after the running training saved).  A chief whose comparison has
    finished serves nothing (no worker would come to end its server); a worker's every call
    to its chief waits ``timeout`` seconds at most (a ``PeerError`` line after that)."""
    import grpc
    from keras_tuner.src.distribute import oracle_client

    from caco_tf.training.peers import PeerError

    if distributed.is_chief_oracle() and all(
            runner.finished(comparison, key, final) for key, *_, final in comparison.runs()
            if not (final and comparison.trials_only)):
        say(f"every run of {comparison.folder} is measured: nothing to serve")
        return
    if timeout is not None:
        oracle_client.TIMEOUT = timeout  # KerasTuner's own, an hour
    tuner = ComparisonTuner(comparison, say=say)
    try:
        tuner.search(verbose=0)
    except PassedThrough as passed:
        raise passed.error from None
    except grpc.RpcError as error:  # a worker's chief gone or unreachable
        where = distribution()
        raise PeerError(no_chief(where, timeout or oracle_client.TIMEOUT)
                        if where else str(error)) from None


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
