"""A parameter-server job of the tf_cnn_benchmarks shape, for the tf-ps launch test: the same flags
(--job_name, --ps_hosts, --worker_hosts, --task_index), no TensorFlow. A ``ps`` task serves on its
port until it is stopped; a ``worker`` task reaches every parameter server of the job (those on the
other nodes too), prints what each answered, and exits."""

import argparse
import socket
import socketserver
import sys
import time


class Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline().decode().strip()
        self.wfile.write(f"ps {self.server.task} got {line}\n".encode())


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--job_name", "--ps_hosts", "--worker_hosts"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--task_index", type=int, required=True)
    a = ap.parse_args()
    ps = a.ps_hosts.split(",")
    if a.job_name == "ps":
        port = int(ps[a.task_index].rsplit(":", 1)[1])
        socketserver.TCPServer.allow_reuse_address = True
        with socketserver.TCPServer(("0.0.0.0", port), Echo) as server:
            server.task = a.task_index
            print(f"Running parameter server {a.task_index} on port {port}", flush=True)
            server.serve_forever()
    for host in ps:
        addr, port = host.rsplit(":", 1)
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection((addr, int(port)), timeout=5) as s:
                    s.sendall(f"worker {a.task_index} of {len(a.worker_hosts.split(','))}\n".encode())
                    print(f"worker {a.task_index}: {host} answered: {s.makefile().readline().strip()}", flush=True)
                break
            except OSError:
                if time.time() > deadline:
                    print(f"worker {a.task_index}: no parameter server at {host}", flush=True)
                    return 1
                time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
