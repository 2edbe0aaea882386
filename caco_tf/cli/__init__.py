"""The command-line entry points (console scripts in ``pyproject.toml``), one module per command.

=====================  ===============  ================================================
console script         module           also runs as
=====================  ===============  ================================================
``caco-train``         ``train``        ``python train.py``
``caco-evaluate``      ``evaluate``     ``python -m caco_tf.cli.evaluate``
``caco-figures``       ``figures``      ``python -m caco_tf.cli.figures``
``caco-export``        ``export``       ``python export/export_saved_model.py``
``caco-extract``       ``extract``      ``python export/extract_features.py``
``caco-import-torch``  ``import_torch``  ``python export/import_torch.py``
``caco-data-service``  ``data_service``  ``python -m caco_tf.cli.data_service``
``caco-compare``       ``compare``      ``python -m caco_tf.cli.compare``
=====================  ===============  ================================================

Every command calls ``start`` before anything imports TensorFlow, so it starts quietly
(``--verbose`` shows TensorFlow's start-up lines), runs its work through ``guard``, which
turns a ``caco_tf.errors.UserError`` into one ``error: ...`` line and exit status 2 (74 for a
failed write, 75 for a lost peer), and runs
as ``exit_after(main)`` (its module's ``console``), which ends the process as soon as it is done.
"""

import argparse
import atexit
import errno
import os
import re
import sys
import threading

# Lines TensorFlow prints at start-up on every machine, none of them about the user's run.
STARTUP_NOISE = re.compile("|".join([
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"cudart_stub\.cc.*Could not find cuda drivers",
    r"cpu_feature_guard\.cc.*This TensorFlow binary is optimized",
    r"^To enable the following instructions: .*rebuild TensorFlow",
    r"oneDNN custom operations are on",
    # Error-level, yet about the CPU only (no AVX-512, as AMD's): TensorFlow falls back, runs on.
    r"oneDNN supports DT_UINT8 only on platforms with AVX-512\. Falling back to the default "
    r"Eigen-based implementation",
    r"^To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
    r"^WARNING:absl:Variant folder .* has no dataset_info\.json",  # TFDS, before preparing
]))
# cuInit fails on every machine without an NVIDIA GPU; where the driver's device exists, the
# same line is a real error and is kept.
NO_GPU_NOISE = re.compile(r"failed call to cuInit")


def is_noise(line, gpu_machine=None):
    """Whether one line of standard error is start-up noise (``STARTUP_NOISE``)."""
    if gpu_machine is None:
        gpu_machine = os.path.exists("/dev/nvidiactl")
    return bool(STARTUP_NOISE.search(line) or (not gpu_machine and NO_GPU_NOISE.search(line)))


def start(argv=None):
    """Quiet TensorFlow's start-up unless ``--verbose`` is among the arguments.  Returns whether
    it is (a command's own ``--verbose`` may show more).

    C++ INFO and WARNING logs are turned off (``TF_CPP_MIN_LOG_LEVEL=2``, unless set), and lines
    absl writes before its initialization, which no log level reaches, are filtered out of the
    process's standard error (``is_noise``); every other line passes, errors included.
    """
    argv = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in argv
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        _filter_standard_error()
    return verbose


_filtering = False


def _filter_standard_error():
    """Route file descriptor 2 through a thread that drops ``is_noise`` lines.

    Only when standard error is the process's own (not a test's capture), and once."""
    global _filtering
    if _filtering or sys.stderr is not sys.__stderr__:
        return
    try:
        original = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:
        return
    gpu_machine = os.path.exists("/dev/nvidiactl")
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    _filtering = True

    def forward():
        pending = b""
        while True:
            chunk = os.read(read_end, 65536)
            pending += chunk
            # Whole lines, and progress bars' carriage-return segments, pass as they come.
            parts = re.split(rb"(?<=[\n\r])", pending)
            pending = parts.pop() if chunk else b""
            for part in parts + ([pending] if not chunk and pending else []):
                if part and not is_noise(part.decode("utf-8", "replace"), gpu_machine):
                    try:
                        os.write(original, part)
                    except OSError:  # a closed terminal: keep draining, or writers block
                        pass
            if not chunk:
                os.close(read_end)
                return

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()

    def restore():
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(original, 2)  # closes the pipe's write end: the thread reads to its end
        thread.join(timeout=2)

    atexit.register(restore)
    from caco_tf.training import interrupts  # no TensorFlow

    interrupts.BEFORE_EXIT.append(restore)


def guard(work, cleanup=None):
    """``work()``, which returns the exit status; a ``UserError`` it raises becomes one
    ``error: ...`` line and its exit status (2, or the error's ``exit_status``: 74 for a failed
    write), after ``cleanup()`` if given; a run stopped by a signal after saving
    (``Interrupted``) prints where it stopped and exits with 128 + the signal's number; a lost
    peer of a multi-worker run (``PeerError``) is one ``error:`` line and exit status 75."""
    from caco_tf.errors import UserError
    from caco_tf.training.interrupts import Interrupted
    from caco_tf.training.peers import PeerError

    try:
        return work()
    except UserError as error:
        if cleanup is not None:
            cleanup()
        say(f"error: {one_line(error)}")
        return getattr(error, "exit_status", 2)
    except Interrupted as stop:
        say(one_line(stop))
        return stop.exit_status
    except PeerError as lost:
        say(f"error: {one_line(lost)}")
        return lost.exit_status
    except KeyboardInterrupt:  # Ctrl-C outside training (which saves first): nothing to keep
        say("stopped by SIGINT")
        return 130


_peers_at_exit = False  # a multi-worker run: a finished worker leaves with its peers


def leave_with_peers():
    """A finished multi-worker run ends through TensorFlow's own exit, which meets every
    worker at a shutdown barrier: a worker gone at once would look lost to the chief still
    exporting the run."""
    global _peers_at_exit
    _peers_at_exit = True


def exit_after(main):
    """A command's console entry: run ``main()`` and end the process with its status at once
    (``end_process``).  Python's and TensorFlow's own teardown would take ~2 s more to free
    what the end of the process frees anyway, and a stopped multi-worker run's would wait on
    its coordination service for peers a preemption may already have ended."""
    try:
        status = main()
    except SystemExit as stop:  # argparse: --help, --version, a usage error
        status = stop.code
    if status is not None and not isinstance(status, int):
        say(str(status))
        status = 1
    if not status and _peers_at_exit:
        sys.exit(0)
    end_process(status or 0)


def end_process(status):
    """Exit with ``status`` at once, without Python's or TensorFlow's exit handlers, after
    flushing the output and forwarding what the standard-error filter holds."""
    from caco_tf.training import interrupts

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    interrupts.exit_now(status)


def say(line):
    """Print one line on standard error; nothing when it cannot be written (a closed
    terminal): the exit status still tells."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class _SurvivingOutput:
    """Standard output that outlives its reader: ``survive_closed_stdout``."""

    def __init__(self, stream, note):
        self._stream, self._note, self.lost = stream, note, None

    def write(self, text):
        if self.lost is None:
            try:
                return self._stream.write(text)
            except OSError as error:
                self._lose(error)
        return len(text)

    def flush(self):
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as error:
                self._lose(error)

    def _lose(self, error):
        if error.errno not in (errno.EPIPE, errno.EIO):
            raise error
        self.lost = error
        try:  # what stays in the buffer, and the interpreter's last flush, go nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        say(f"warning: standard output was closed ({error.strerror}); {self._note}")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def survive_closed_stdout(note):
    """Make a closed standard output (its reader gone: ``| head``, a closed terminal) one
    warning line on standard error, with ``note`` (what goes on), instead of an error: every
    later write is dropped."""
    if sys.stdout is not None and not isinstance(sys.stdout, _SurvivingOutput):
        sys.stdout = _SurvivingOutput(sys.stdout, note)


def one_line(error):
    """An error's message on one line (a wrapped library message keeps its words)."""
    return " ".join(str(error).split()) or type(error).__name__


class ArgumentParser(argparse.ArgumentParser):
    """``argparse``'s parser whose usage errors are one ``error: ...`` line and exit status 2,
    as every other user error (argparse prints the whole usage first); every command takes
    ``--version``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from caco_tf import __version__

        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def verbose_argument(parser, help_text="show TensorFlow's start-up lines"):
    parser.add_argument("--verbose", action="store_true", help=help_text)
