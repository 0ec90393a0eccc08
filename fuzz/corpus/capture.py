#!/usr/bin/env python3
"""Records the first message a real client sends to a loopback listener of our own.

Usage: capture.py tls|http|dns OUT_FILE -- CLIENT ARGV...   ({port} in the argv is replaced by the port)

Listens on 127.0.0.1 only, on a port the kernel picks, runs the client against it, and writes what the
client sent: for `tls` the records up to the end of the ClientHello (then the connection is closed, so
the client fails its handshake, which is expected); for `http` the request head and its body
(Content-Length, or chunked up to the last chunk), then a 404 is answered; for `dns` the first UDP
datagram (not answered). Nothing is sent anywhere but loopback.
"""
import socket
import subprocess
import sys
import threading


def read_tls_hello(conn):
    data = b""
    handshake = b""
    at = 0
    while True:
        while len(data) - at >= 5:
            length = int.from_bytes(data[at + 3:at + 5], "big")
            if len(data) - at < 5 + length:
                break
            handshake += data[at + 5:at + 5 + length]
            at += 5 + length
            if len(handshake) >= 4 and len(handshake) >= 4 + int.from_bytes(handshake[1:4], "big"):
                return data[:at]
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def read_http_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            chunked = value.strip().lower() == b"chunked"
    while chunked and not body.endswith(b"0\r\n\r\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    if chunked:
        length = len(body)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    return head + b"\r\n\r\n" + body[:length]


def capture_dns(out, argv):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(30)
    port = sock.getsockname()[1]
    argv = [a.replace("{port}", str(port)) for a in argv]
    client = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    data, _ = sock.recvfrom(65536)
    client.kill()
    client.wait()
    with open(out, "wb") as f:
        f.write(data)
    print(f"{out}: {len(data)} bytes from {argv[0]}")


def main():
    kind, out = sys.argv[1], sys.argv[2]
    assert sys.argv[3] == "--"
    if kind == "dns":
        return capture_dns(out, sys.argv[4:])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(30)
    port = listener.getsockname()[1]
    argv = [a.replace("{port}", str(port)) for a in sys.argv[4:]]
    client = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    result = {}

    def serve():
        conn, _ = listener.accept()
        conn.settimeout(30)
        with conn:
            result["bytes"] = read_tls_hello(conn) if kind == "tls" else read_http_request(conn)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(40)
    try:
        client.wait(20)
    except subprocess.TimeoutExpired:
        client.kill()
        client.wait()
    listener.close()
    data = result.get("bytes")
    if not data:
        sys.exit(f"{argv[0]}: nothing captured")
    with open(out, "wb") as f:
        f.write(data)
    print(f"{out}: {len(data)} bytes from {argv[0]}")


if __name__ == "__main__":
    main()
