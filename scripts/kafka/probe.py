"""Asks a Kafka broker for its cluster metadata and says whether it is ready to serve.

    python3 scripts/kafka/probe.py 127.0.0.1:9092

Exits 0 and prints the cluster id, the brokers and the active controller when the broker
answers a Metadata request (v4) listing at least one broker and a controller; exits 1 with
the reason otherwise. Standard library only, so it runs before anything else is installed.
"""

import socket
import struct
import sys

METADATA = 3
VERSION = 4
CORRELATION_ID = 7


def request(client_id: bytes) -> bytes:
    header = struct.pack(">hhih", METADATA, VERSION, CORRELATION_ID, len(client_id)) + client_id
    # topics = null (all topics), allow_auto_topic_creation = false
    body = struct.pack(">ib", -1, 0)
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


class Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self):
        length = self.take(">h")
        if length < 0:
            return None
        value = self.data[self.pos : self.pos + length].decode()
        self.pos += length
        return value


def probe(address: str, timeout: float) -> str:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request(b"km0-probe"))
        (size,) = struct.unpack(">i", read_exact(sock, 4))
        reply = Reader(read_exact(sock, size))
    if reply.take(">i") != CORRELATION_ID:
        raise ValueError("reply to another request")
    reply.take(">i")  # throttle_time_ms
    brokers = []
    for _ in range(reply.take(">i")):
        node = reply.take(">i")
        broker_host = reply.string()
        broker_port = reply.take(">i")
        reply.string()  # rack
        brokers.append(f"{node}@{broker_host}:{broker_port}")
    cluster = reply.string()
    controller = reply.take(">i")
    if not brokers:
        raise ValueError("no broker registered yet")
    if controller < 0:
        raise ValueError("no active controller yet")
    return f"cluster {cluster}, brokers {', '.join(brokers)}, controller {controller}"


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: probe.py HOST:PORT", file=sys.stderr)
        return 2
    try:
        print(probe(sys.argv[1], timeout=5.0))
    except (OSError, ValueError, struct.error) as error:
        print(f"not ready: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
