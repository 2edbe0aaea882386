"""tf.data service's parts for ``data.service`` (``caco-data-service``; docs/data-service.md).

    caco-data-service dispatcher [--port 5050]
    caco-data-service worker --dispatcher HOST:PORT [--port 5051] [--host NAME]

Each prints one line naming its address, then serves until stopped (Ctrl-C, SIGTERM).  The
trainers send their pipeline to the dispatcher (``data.service: HOST:PORT``); the workers run
it and must read the image files at the paths the trainers list.
"""

import signal
import socket
import threading

from caco_tf import cli


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-data-service",
                                description="Run a tf.data service dispatcher or worker.")
    parts = parser.add_subparsers(dest="part", required=True)
    dispatcher = parts.add_parser("dispatcher", help="the service's dispatcher (one per run)")
    dispatcher.add_argument("--port", type=int, default=5050, help="its port (0: any free one)")
    worker = parts.add_parser("worker", help="a worker: runs the pipeline")
    worker.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    worker.add_argument("--port", type=int, default=5051, help="its port (0: any free one)")
    worker.add_argument("--host", default=socket.getfqdn(),
                        help="the name trainers reach this machine by (default: its own)")
    for part in (dispatcher, worker):
        cli.verbose_argument(part)
    return parser.parse_args(argv)


# The server this process runs, held until the process ends (``cli.exit_after``): a server's
# deletion waits for its jobs and its dispatcher, which may be gone.
SERVING = []
# A worker learns of a new job (a trainer's pipeline) at its next heartbeat: TensorFlow's
# default of 30 s would delay every start and resume by up to that much.
HEARTBEAT_MS = 1000


def free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.errors import ConfigError

        if not 0 <= args.port < 65536:
            raise ConfigError(f"--port must be in 0..65535, got {args.port}")
        port = args.port or free_port()
        import tensorflow as tf

        service = tf.data.experimental.service
        if args.part == "dispatcher":
            SERVING.append(service.DispatchServer(service.DispatcherConfig(port=port)))
            print(f"dispatcher: {socket.getfqdn()}:{port} (data.service for the trainers)",
                  flush=True)
        else:
            from caco_tf.data import service as data_service

            data_service.check_dispatcher(args.dispatcher)
            address = data_service.service_address(args.dispatcher).removeprefix("grpc://")
            SERVING.append(service.WorkerServer(service.WorkerConfig(
                dispatcher_address=address, worker_address=f"{args.host}:{port}", port=port,
                heartbeat_interval_ms=HEARTBEAT_MS)))
            print(f"worker: {args.host}:{port} for the dispatcher at {address}", flush=True)
        stopped = threading.Event()  # the servers run in TensorFlow's threads until the exit
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, lambda *_: stopped.set())
        stopped.wait()
        return 0  # the process ends at once (cli.exit_after): stopping a server can wait

    return cli.guard(work)


def console():
    """``caco-data-service``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
