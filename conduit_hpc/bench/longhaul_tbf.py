"""Does the link model agree with a real rate-limited network? (needs CAP_NET_ADMIN)

    conduit-hpc bench longhaul-tbf [--smoke] [--rate-bytes-s 56000] [--latency-s 0.02]
                                   [--message-bytes 3608] [--messages 120]

Two network namespaces are joined by a veth pair; each end gets ``netem delay L`` with a
``tbf rate r`` child qdisc - the kernel's own token bucket. A sender in one namespace
first plays ping-pong with small messages on the idle link (one-way time = round trip /
2), then writes ``--messages`` messages of ``--message-bytes`` bytes back to back over one
TCP connection; the receiver in the other namespace timestamps the arrival of each whole
message (both read CLOCK_MONOTONIC, which namespaces share). The same sizes and hand-over
times go through :class:`~conduit_hpc.transport.link.LinkModel` with the same ``r`` and
``L``. Reported: steady-state throughput (messages after the first 10 %) and one-way time,
measured / model. Where the kernel has no ``netem`` (``sch_netem``), only the rate is
shaped and compared (the model's latency is then 0). TCP, IP and Ethernet headers (66
bytes per 1448-byte segment) count against ``tbf``'s rate and not the model's, so about
0.956 is agreement on throughput.

This checks the model against the kernel's shaper; it does not run the MPI job across the
namespaces (see docs/longhaul.md for why). Without the privilege to make namespaces it
reports that and returns ``{"skipped": reason}``. Not run by the test suite (it changes
the host's network namespaces while it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from conduit_hpc import jsontext
from conduit_hpc.bench._args import real, whole

RECEIVER = r"""
import json, socket, sys, time
n, size, pings, port = map(int, sys.argv[1:5])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("10.201.0.2", port)); srv.listen(1); print("ready", flush=True)
c, _ = srv.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def read(k):
    buf = bytearray()
    while len(buf) < k:
        chunk = c.recv(k - len(buf))
        if not chunk: raise SystemExit("connection closed")
        buf += chunk
    return buf
for _ in range(pings):
    c.sendall(read(16))
arrive = []
for _ in range(n):
    read(size); arrive.append(time.monotonic())
print(json.dumps(arrive), flush=True)
"""

SENDER = r"""
import json, socket, sys, time
n, size, pings, port = map(int, sys.argv[1:5])
s = socket.create_connection(("10.201.0.2", port), timeout=60)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtt = []
for _ in range(pings):
    t = time.monotonic(); s.sendall(b"x" * 16)
    got = 0
    while got < 16: got += len(s.recv(16 - got))
    rtt.append(time.monotonic() - t); time.sleep(0.2)
msg = b"y" * size
handed = []
for _ in range(n):
    handed.append(time.monotonic()); s.sendall(msg)
print(json.dumps({"rtt": rtt, "handed": handed}), flush=True)
time.sleep(1.0)
"""


BURST = 3028  # tbf's bucket (two full frames), the model's burst_bytes


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


class Namespaces:
    """Two namespaces ``a`` and ``b`` joined by a veth pair shaped by netem + tbf."""

    def __init__(self, rate_bytes_s: float, latency_s: float) -> None:
        tag = os.getpid() % 100000
        self.a, self.b = f"cdt-a-{tag}", f"cdt-b-{tag}"
        self.va, self.vb = f"cva{tag}", f"cvb{tag}"
        self.rate, self.latency = rate_bytes_s, latency_s
        self.made: list[str] = []
        self.netem = True  # False where the kernel has no netem: latency not emulated

    def __enter__(self) -> Namespaces:
        try:
            for ns in (self.a, self.b):
                sh("ip", "netns", "add", ns)
                self.made.append(ns)
            sh("ip", "link", "add", self.va, "type", "veth", "peer", "name", self.vb)
            for ns, dev, addr in ((self.a, self.va, "10.201.0.1/24"),
                                  (self.b, self.vb, "10.201.0.2/24")):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                bits = int(self.rate * 8)
                tbf = ("tbf", "rate", f"{bits}bit", "burst", str(BURST), "latency", "10s")
                tc = ("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev)
                try:
                    sh(*tc, "root", "handle", "1:", "netem", "delay",
                       f"{self.latency * 1e3:g}ms", "limit", "100000")
                    sh(*tc, "parent", "1:1", "handle", "10:", *tbf)
                except subprocess.CalledProcessError as err:
                    if "unknown" not in (err.stderr or "").lower():
                        raise
                    # no sch_netem in this kernel: shape the rate only, no added delay
                    self.netem = False
                    sh(*tc, "root", *tbf)
        except (subprocess.CalledProcessError, OSError) as err:
            self.__exit__(None, None, None)
            detail = getattr(err, "stderr", "") or str(err)
            raise PermissionError(f"cannot make shaped network namespaces here: "
                                  f"{detail.strip()}") from err
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30,
                           check=False)
        self.made = []

    def run(self, ns: str, code: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code,
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)


def measure(args: argparse.Namespace) -> dict:
    from conduit_hpc.transport.link import LinkModel, LinkParams

    pings, port = 5, 47000 + os.getpid() % 1000
    n, size = args.messages, args.message_bytes
    with Namespaces(args.rate_bytes_s, args.latency_s) as net:
        rx = net.run(net.b, RECEIVER, str(n), str(size), str(pings), str(port))
        tx: subprocess.Popen[str] | None = None
        try:
            assert rx.stdout is not None
            if rx.stdout.readline().strip() != "ready":
                err = rx.stderr.read() if rx.stderr else ""
                raise RuntimeError(f"receiver did not start: {err}")
            tx = net.run(net.a, SENDER, str(n), str(size), str(pings), str(port))
            out_tx, err_tx = tx.communicate(timeout=args.timeout)
            out_rx, err_rx = rx.communicate(timeout=args.timeout)
        finally:
            for proc in (rx, tx):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
        if tx is None or tx.returncode or rx.returncode:
            raise RuntimeError(f"sender/receiver failed: {err_tx[-500:]} {err_rx[-500:]}")
        netem = net.netem
    latency = args.latency_s if netem else 0.0
    sent = json.loads(out_tx.strip().splitlines()[-1])
    arrive = json.loads(out_rx.strip().splitlines()[-1])
    handed = sent["handed"]
    params = LinkParams(args.rate_bytes_s, latency, burst_bytes=BURST)  # as tbf's bucket
    model = LinkModel(params, start_s=handed[0])
    predicted = [model.schedule(size, t).arrive_s for t in handed]
    k = max(1, n // 10)  # steady state: after the first 10 % (TCP slow start)

    def rate(times: list[float]) -> float:
        return (n - k) * size / (times[-1] - times[k - 1])

    one_way = min(sent["rtt"]) / 2
    one_way_model = LinkModel(params, start_s=0.0).schedule(16, 10.0).arrive_s - 10.0
    return {"bench": "longhaul_tbf", "rate_bytes_s": args.rate_bytes_s,
            "latency_s": latency, "message_bytes": size, "messages": n,
            "netem": netem if netem else "not in this kernel: rate only, no added latency",
            "throughput_measured_bytes_s": rate(arrive),
            "throughput_model_bytes_s": rate(predicted),
            "throughput_ratio": rate(arrive) / rate(predicted),
            # tbf also pays for 66 header bytes per 1448-byte TCP segment
            "throughput_ratio_header_adjusted": rate(arrive) / rate(predicted) * 1514 / 1448,
            "one_way_measured_s": one_way, "one_way_model_s": one_way_model,
            "last_arrival_measured_s": arrive[-1] - handed[0],
            "last_arrival_model_s": predicted[-1] - handed[0]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench longhaul-tbf")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rate-bytes-s", type=real(0, 1e12, open_lo=True), default=56000.0)
    p.add_argument("--latency-s", type=real(0, 60), default=0.02)
    # a forward message, 64 rows
    p.add_argument("--message-bytes", type=whole(1, 1 << 30), default=3608)
    p.add_argument("--messages", type=whole(1, 10**7), default=120)
    p.add_argument("--timeout", type=real(0, 1e6, open_lo=True), default=120.0)
    args = p.parse_args(argv)
    if args.smoke:
        args.messages = 30
    t0 = time.perf_counter()
    try:
        result = measure(args)
    except PermissionError as err:
        result = {"bench": "longhaul_tbf", "skipped": str(err)}
    result["wall_s"] = time.perf_counter() - t0
    print(jsontext.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
