"""A parameter-server job of the tf_cnn_benchmarks shape, for the tf-ps launch test: the same flags
(--job_name, --ps_hosts, --worker_hosts, --task_index), no TensorFlow. A ``ps`` task serves on its
port until it is stopped; a ``worker`` task greets every parameter server of the job (those on the
other nodes too), prints what each answered, and exits once every server has seen every worker."""

import argparse
import socket
import socketserver
import sys
import time


class Greet(socketserver.StreamRequestHandler):
    """Records the worker that greets it and answers how many workers it has seen."""

    def handle(self) -> None:
        worker = self.rfile.readline().decode().strip()
        self.server.seen.add(worker)
        self.wfile.write(f"ps {self.server.task} got {worker}, {len(self.server.seen)} seen\n".encode())


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--job_name", "--ps_hosts", "--worker_hosts"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--task_index", type=int, required=True)
    a = ap.parse_args()
    ps = a.ps_hosts.split(",")
    workers = len(a.worker_hosts.split(","))
    if a.job_name == "ps":
        port = int(ps[a.task_index].rsplit(":", 1)[1])
        socketserver.TCPServer.allow_reuse_address = True
        with socketserver.ThreadingTCPServer(("0.0.0.0", port), Greet) as server:
            server.task, server.seen = a.task_index, set()
            print(f"Running parameter server {a.task_index} on port {port}", flush=True)
            server.serve_forever()
    # A barrier: greet every parameter server until each has seen every worker. A server that stops after
    # greeting us has passed it: its own node's worker only ends once every server has seen every worker.
    me, pending, greeted = f"worker {a.task_index} of {workers}", set(ps), set()
    deadline = time.time() + 120
    while pending:
        for host in sorted(pending):
            addr, port = host.rsplit(":", 1)
            try:
                with socket.create_connection((addr, int(port)), timeout=5) as s:
                    s.sendall(f"{me}\n".encode())
                    answer = s.makefile().readline().strip()
            except OSError:
                if host in greeted:
                    pending.discard(host)
                continue
            if host not in greeted:
                print(f"worker {a.task_index}: {host} answered: {answer.rsplit(',', 1)[0]}", flush=True)
                greeted.add(host)
            if answer.endswith(f", {workers} seen"):
                pending.discard(host)
        if time.time() > deadline:
            print(f"worker {a.task_index}: no barrier with {sorted(pending)}", flush=True)
            return 1
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
