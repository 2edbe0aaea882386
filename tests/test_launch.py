"""tests/launch.py: a command forked from the pre-imported server behaves as the same command
run as a subprocess."""

import os
import signal
import subprocess
import sys

import launch

SHOW = """
import os, random, signal, sys
print(sys.argv, os.getcwd(), os.environ.get("CACO_PROBE"), sys.path[0] == '')
print(os.getsid(0) == os.getpid(), signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, sys.stdin.read())
print("to standard error", file=sys.stderr)
random.seed(int(sys.argv[1]))
print(random.random(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_forked_command_is_the_same_process_as_a_subprocess(tmp_path):
    command = [sys.executable, "-c", SHOW, "7", "two words"]
    env = dict(os.environ, CACO_PROBE="probe")
    results = [run(command, input="given", capture_output=True, text=True, cwd=str(tmp_path),
                   env=env, start_new_session=True, timeout=60)
               for run in (launch.run, subprocess.run)]
    forked, plain = results
    with launch.Popen(command[:2] + ["pass"]) as process:
        assert isinstance(process, launch.Forked) == (
            os.environ.get("CACO_TESTS_FORK") != "0" and sys.platform.startswith("linux"))
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode, plain.stdout, plain.stderr)
    assert forked.returncode == -signal.SIGTERM and "two words" in forked.stdout
