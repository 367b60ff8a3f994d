"""Run one TensorFlow parameter server and one worker side by side (the ``tf-ps`` launcher).

Written into each node's container by the kit and run with the benchmark's own interpreter
(Python 2.7 or 3), so it uses only the standard library of both. argv: N, then the N tokens
of the parameter-server command, then the tokens of the worker command. Both start at once;
the worker's exit status is the container's, and the parameter server (which never ends on
its own) is stopped then. A parameter server that ends first ends the worker and the pair.
"""

import signal
import subprocess
import sys
import time


def _stop(proc, grace_s=10.0):
    if proc.poll() is not None:
        return
    proc.terminate()
    deadline = time.time() + grace_s
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def main(argv):
    n = int(argv[0])
    ps_cmd, worker_cmd = argv[1:1 + n], argv[1 + n:]
    ps = subprocess.Popen(ps_cmd)
    worker = subprocess.Popen(worker_cmd)

    def on_term(signum, frame):
        _stop(worker)
        _stop(ps)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    while worker.poll() is None:
        code = ps.poll()
        if code is not None:
            sys.stderr.write("repro: the parameter server exited with status %d before the worker\n" % code)  # noqa: UP031 - Python 2 too
            _stop(worker)
            return code or 1
        time.sleep(0.2)
    _stop(ps)
    return worker.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
