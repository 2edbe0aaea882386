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

# SIGHUP: the terminal or ssh session closed, the commonest end of a run started without nohup.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                if hasattr(signal, name))


class Interrupted(Exception):
    """The run stopped on a signal after saving its state; the message says where."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_status = 128 + int(signum)


class StopSignals:
    """While active (a context manager), SIGTERM, SIGINT and SIGHUP set ``received`` instead of
    ending the process; a second one ends it at once (the last saved state stays).  Outside the
    main thread, where Python cannot take signals, it does nothing."""

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            _write(f"stopped at once by a second {signal.Signals(signum).name}: the run "
                   f"resumes from its last saved state\n")
            os._exit(128 + signum)
        self.received = signum
        _write(f"\n{signal.Signals(signum).name} received: finishing the step and saving "
               f"(send it again to stop at once)\n")

    @property
    def name(self):
        return signal.Signals(self.received).name if self.received else None


def _write(text):
    # os.write, not print: the handler may run while the main thread is printing; and the
    # terminal may be gone (SIGHUP), which must not end the save.
    try:
        os.write(2, text.encode())
    except OSError:
        pass
