"""Stopping a run cleanly: SIGTERM (a preemption, a scheduler), SIGINT (Ctrl-C) and SIGHUP (a
closed terminal or ssh session) ask the run to finish its step, save its full state and exit;
a second signal exits at once.

The handlers only record the signal; ``callbacks.Resume`` reads it after every step, saves and
raises ``Interrupted``, which the command turns into one line and exit status 128 + the signal's
number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), the shells' convention for a process a
signal ended.
"""

import os
import signal
import threading

# Called before a second signal ends the process at once (``os._exit``, which runs no atexit
# handler): the command's filter of standard error forwards what it holds.
BEFORE_EXIT = []
# SIGHUP: the terminal or ssh session closed, the commonest end of a run started without nohup.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                if hasattr(signal, name))


class Interrupted(BaseException):
    """The run stopped on a signal after saving its state; the message says where.  A
    ``BaseException``, as ``KeyboardInterrupt`` is: raised by a signal's handler between a
    comparison's runs it may land inside library code that catches every ``Exception``
    (``inspect`` turns it into a TypeError, KerasTuner retries the trial), which would lose it."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_status = 128 + int(signum)


class StopSignals:
    """While active (a context manager), SIGTERM, SIGINT and SIGHUP set ``received`` instead of
    ending the process; a second one ends it at once (the last saved state stays).  Outside the
    main thread, where Python cannot take signals, it does nothing."""

    # Seconds after a signal without a step ending (the run waits inside one: for its input, or
    # a long compiled call) before saying that it waits.
    WAITING_NOTE_SECONDS = 5.0

    def __init__(self):
        self.received = None
        self.steps = 0  # steps ended while active (``step_ended``)
        self._previous = {}
        self._wakeup = None

    def step_ended(self):
        """Called after every step: a signal followed by none is one the run waits to act on."""
        self.steps += 1

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            self._watch()
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._wakeup is not None:
            previous, write_end = self._wakeup
            signal.set_wakeup_fd(previous)
            os.close(write_end)  # the watcher reads the end of its pipe and stops
            self._wakeup = None

    def _watch(self):
        """Python runs a signal's handler only when the main thread runs Python code: while a
        step waits inside TensorFlow (for input that never comes: a hung disk), it would never
        run, and no signal but SIGKILL could end the run.  The interpreter's C handler also
        writes each signal's number to a wake-up pipe: a thread reads it, says when the run
        waits (no step ends), and ends the process at a second signal."""
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_end)
            os.close(write_end)
            return
        self._wakeup = (previous, write_end)
        threading.Thread(target=self._watcher, args=(read_end,), name="stop-signals",
                         daemon=True).start()

    def _watcher(self, read_end):
        seen = 0
        while True:
            try:
                numbers = os.read(read_end, 64)
            except OSError:
                numbers = b""
            if not numbers:
                os.close(read_end)
                return
            for signum in numbers:
                if signum not in SIGNALS:
                    continue
                seen += 1
                if seen > 1:
                    self._stop_at_once(signum)
                timer = threading.Timer(self.WAITING_NOTE_SECONDS, self._note_waiting,
                                        [signum, self.steps])
                timer.daemon = True
                timer.start()

    def _note_waiting(self, signum, steps):
        if self.steps == steps:  # no step has ended since the signal
            _write(f"{signal.Signals(signum).name} received {self.WAITING_NOTE_SECONDS:g} s ago "
                   f"and the step in progress has not ended (it waits for its input, or a long "
                   f"compiled call): the run saves once it ends; send "
                   f"{signal.Signals(signum).name} again to stop at once (the run resumes from "
                   f"its last saved state)\n")

    @staticmethod
    def _stop_at_once(signum):
        _write(f"stopped at once by a second {signal.Signals(signum).name}: the run resumes "
               f"from its last saved state\n")
        exit_now(128 + signum)

    def _handle(self, signum, frame):
        if self.received is not None:
            if self._wakeup is None:  # else the watcher, which sees every signal, does it
                self._stop_at_once(signum)
            return
        self.received = signum
        _write(f"\n{signal.Signals(signum).name} received: finishing the step and saving "
               f"(send it again to stop at once)\n")

    @property
    def name(self):
        return signal.Signals(self.received).name if self.received else None


def exit_now(status):
    """End the process with ``status`` at once (``os._exit``: no atexit handler, nor
    TensorFlow's), after the ``BEFORE_EXIT`` calls."""
    for call in BEFORE_EXIT:
        try:
            call()
        except Exception:  # noqa: BLE001 — nothing may keep the process from ending
            pass
    os._exit(status)


def _write(text):
    # os.write, not print: the handler may run while the main thread is printing; and the
    # terminal may be gone (SIGHUP), which must not end the save.
    try:
        os.write(2, text.encode())
    except OSError:
        pass
