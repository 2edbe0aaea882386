"""The commands the tests start, forked from a process that has already imported TensorFlow.

Each ``train.py`` process spends ~6.5 s importing TensorFlow, Keras and what Keras imports
before its first line, and the suite starts dozens.  ``run`` and ``Popen`` take subprocess's
arguments: a command of this interpreter (``python SCRIPT``, ``-m MODULE`` or ``-c CODE``) is
forked from a server process that imported them once (one server per test worker and per
import-time environment: ``IMPORT_TIME``), everything else runs as a plain subprocess.  The
forked command is a real process: its own pid and session, the signals it is sent, the file
descriptors it is given, its own exit status; it starts as a fresh interpreter would (its
``sys.argv``, ``sys.path[0]``, working directory, environment, standard streams, default signal
handlers, random seeds), minus the imports.  Commands that test the start-up itself (what is
imported, TensorFlow's start-up lines) use ``subprocess``; ``CACO_TESTS_FORK=0`` runs every
command as a subprocess (tests/test_launch.py: both give the same), as do hosts other than
Linux (no ``fork`` on Windows; no sequenced-packet Unix sockets on macOS).

The server (this file run as a script) imports, binds a Unix socket, says ``ready``, and for
each request forks; it never runs a TensorFlow operation, so each child starts TensorFlow's
runtime (threads, devices, the cluster of a multi-worker run) for itself.
"""

import json
import os
import random
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Variables read while Python, TensorFlow or Keras start: a command with other values than a
# server's needs a server of its own.
IMPORT_TIME = ("PYTHON", "KERAS_", "TF_CPP_", "TF_ENABLE_", "OMP_", "OPENBLAS_", "MKL_", "LD_",
               "CUDA_VISIBLE_DEVICES")
INHERITED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCHLD)
PRELOAD = ["tensorflow", "keras", "caco_tf.pretrain", "caco_tf.cli.train",
           "caco_tf.cli.evaluate", "caco_tf.cli.export", "caco_tf.cli.extract",
           "caco_tf.cli.data_service", "caco_tf.config", "tensorboard"]


# ----------------------------------------------------------------------------- the tests' side

def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """``subprocess.run``'s arguments and result."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def Popen(args, **kwargs):
    """``subprocess.Popen``'s arguments; a ``Forked`` process for this interpreter's commands."""
    allowed = {"stdin", "stdout", "stderr", "cwd", "env", "text", "start_new_session"}
    if (os.environ.get("CACO_TESTS_FORK") == "0" or not sys.platform.startswith("linux")
            or len(args) < 2 or args[0] != sys.executable or set(kwargs) - allowed
            or (args[1] in ("-m", "-c") and len(args) < 3)
            or (args[1].startswith("-") and args[1] not in ("-m", "-c"))):
        return subprocess.Popen(args, **kwargs)
    return Forked(list(map(str, args)), **kwargs)


class Forked:
    """A command forked by the server: ``subprocess.Popen``'s attributes and methods."""

    def __init__(self, args, stdin=None, stdout=None, stderr=None, cwd=None, env=None,
                 text=False, start_new_session=False):
        self.args, self.returncode = args, None
        env = dict(os.environ if env is None else env)
        mine, theirs = [], []  # our ends of pipes; the child's descriptors (closed once sent)

        def child_end(target, number, readable):
            if target is None:
                return number
            if target == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
                return theirs[-1]
            if target == subprocess.PIPE:
                read_end, write_end = os.pipe()
                ours, child = (write_end, read_end) if readable else (read_end, write_end)
                mine.append(ours)
                theirs.append(child)
                return child
            return target if isinstance(target, int) else target.fileno()

        descriptors = [child_end(stdin, 0, True), child_end(stdout, 1, False)]
        descriptors.append(descriptors[1] if stderr == subprocess.STDOUT
                           else child_end(stderr, 2, False))
        mode = "" if text else "b"
        self.stdin = (os.fdopen(mine.pop(0), "w" + mode) if stdin == subprocess.PIPE else None)
        self.stdout = (os.fdopen(mine.pop(0), "r" + mode) if stdout == subprocess.PIPE else None)
        self.stderr = (os.fdopen(mine.pop(0), "r" + mode) if stderr == subprocess.PIPE else None)
        request = {"argv": args[1:], "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
                   "new_session": start_new_session,
                   # as exec keeps them: signals ignored here stay ignored in the command
                   "ignored": [int(number) for number in INHERITED
                               if signal.getsignal(number) == signal.SIG_IGN]}
        self._connection = _server(env).connect()
        try:
            socket.send_fds(self._connection, [json.dumps(request).encode()], descriptors)
            self.pid = json.loads(self._connection.recv(4096))["pid"]
        finally:
            for descriptor in theirs:
                os.close(descriptor)

    def poll(self):
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                message = self._connection.recv(4096)
            except BlockingIOError:
                return None
            finally:
                self._connection.setblocking(True)
            self._status(message)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                message = self._connection.recv(4096)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            finally:
                self._connection.settimeout(None)
            self._status(message)
        return self.returncode

    def _status(self, message):
        self.returncode = json.loads(message)["returncode"]
        self._connection.close()

    def communicate(self, input=None, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        outputs = {}
        readers = [threading.Thread(target=lambda s=stream: outputs.__setitem__(s, s.read()),
                                    daemon=True)
                   for stream in (self.stdout, self.stderr) if stream is not None]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return outputs.get(self.stdout), outputs.get(self.stderr)

    def send_signal(self, number):
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


_servers, _servers_lock = {}, threading.Lock()


def _server(env):
    key = tuple(sorted((name, value) for name, value in env.items()
                       if name.startswith(IMPORT_TIME) and name != "PYTHONPATH"))
    with _servers_lock:
        if key not in _servers:
            _servers[key] = Server(dict(env, PYTHONPATH=ROOT))
    return _servers[key]


class Server:
    """One server process: started at once, waited for at the first command."""

    def __init__(self, env):
        folder = tempfile.mkdtemp(prefix="caco-forks-")
        self.path, self.log = os.path.join(folder, "socket"), os.path.join(folder, "log")
        with open(self.log, "w") as log:  # TensorFlow's start-up lines are nobody's output
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), self.path], env=env, cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.ready = False

    def connect(self):
        if not self.ready:
            line = self.process.stdout.readline()
            if line != b"ready\n":
                with open(self.log) as log:
                    raise RuntimeError(f"the tests' fork server did not start: {log.read()}")
            self.ready = True
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(self.path)
        return connection


# ---------------------------------------------------------------------------- the server's side

def serve(path):
    """Import, listen at ``path``, fork for each request; returns only in a forked child, with
    its request.  Ends when the test process does (its pipe to our standard input closes)."""
    for module in PRELOAD:
        __import__(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    children = {}  # pid -> the connection that asked for it
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in events.select(timeout=0.02):
            if key.fileobj is sys.stdin:
                os._exit(0)
            connection, _ = listener.accept()
            message, descriptors, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                events.close()
                listener.close()
                connection.close()
                request["descriptors"] = descriptors
                return request
            for descriptor in set(descriptors):
                os.close(descriptor)
            connection.send(json.dumps({"pid": pid}).encode())
            children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid, None)
            if connection is not None:
                try:
                    connection.send(json.dumps(
                        {"returncode": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:  # the test stopped listening
                    pass
                connection.close()


_replaced = []


def become(request):
    """Turn this forked child into a fresh interpreter's ``python ARGV...`` and run it."""
    if request["new_session"]:
        os.setsid()
    for number, descriptor in enumerate(request["descriptors"]):
        os.dup2(descriptor, number)
    for descriptor in set(request["descriptors"]) - {0, 1, 2}:
        os.close(descriptor)
    for number in INHERITED:
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in request["ignored"]:
        signal.signal(number, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _replaced.extend([sys.stdin, sys.stdout, sys.stderr])  # collected, they would close 0-2
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) else -1,
                                       closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False,
                                       errors="backslashreplace")
    random.seed()
    numpy.random.seed()
    extra = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0:1] = [request["cwd"], *extra]
        sys.modules.pop(argv[1], None)  # imported here, it would be run as a second copy
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0:1] = ["", *extra]
        main = type(sys)("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        script = os.path.join(request["cwd"], argv[0])
        sys.argv = list(argv)
        sys.path[0:1] = [os.path.dirname(os.path.realpath(script)), *extra]
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    become(serve(sys.argv[1]))
