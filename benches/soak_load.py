#!/usr/bin/env python3
"""Mixed client load for benches/soak.sh, and the soak's misbehaving upstreams.

`load`: for SECONDS s against one router, open loop (each kind paced by the clock, not by replies):
  tls        new TLS connection per 1/RATE s to the always-allowed name, GET /small, Connection: close
  http       the same over plain HTTP
  keepalive  KEEPALIVE connections each sending one request every 0.2 s on the same connection
  slow       a client every 2 s sending its request head one byte every 30 ms
  relay      one connection through the raw host:port listener, one request every 0.5 s, kept open
  garbage    a client every 0.5 s sending random bytes to the HTTP or TLS listener (must be closed promptly)
  fault      every 0.5 s in turn: a request to each faulty upstream and each name the resolver answers
             badly (--fault-names)
  reset-hello  a client every 0.5 s sending part of a ClientHello, then resetting the connection
  half-close   a client every second sending half a ClientHello, then ending its side: the router must
             close promptly
  slow-reader  a client every 5 s fetching a 4 MiB body over TLS and reading it 16 KiB every 10 ms; the
             body must arrive whole and unchanged
Everything the policy allows must succeed; fault and garbage clients must get a prompt result (a reply or
a close within their bound). Prints one key=value line per kind and exits 1 on any violation.

`faults`: run in the upstream namespace: a listener at SILENT that accepts and never answers, one at
RESET that answers half a response then resets. Connects only to the addresses it is given.

`resolver`: the router's resolver, on loopback: A records for the --answer names (and their subdomains,
as dnsmasq's --address), NXDOMAIN for every other name, and for the fault names a SERVFAIL, an empty
truncated answer, an answer later than the router waits, or no answer at all. It sends nothing but
answers to whoever asked."""

import argparse
import asyncio
import collections
import os
import random
import socket
import ssl
import struct
import sys
import time

BODY = b"hello from upstream"
REQ = "GET /small HTTP/1.1\r\nHost: {}\r\nConnection: {}\r\n\r\n"


class Kind:
    """Outcomes of one client kind."""

    def __init__(self):
        self.ok = 0
        self.reasons = collections.Counter()
        self.times = []
        self.outcomes = collections.Counter()

    def line(self, name):
        t = sorted(self.times)
        pct = lambda q: f"{t[min(len(t) - 1, int(q * len(t)))] * 1000:.1f}" if t else "-"
        reasons = ",".join(f"{k}:{v}" for k, v in self.reasons.items()) or "-"
        outcomes = ",".join(f"{k}:{v}" for k, v in sorted(self.outcomes.items())) or "-"
        return (
            f"kind={name} ok={self.ok} failed={sum(self.reasons.values())} reasons={reasons}"
            f" p50_ms={pct(0.5)} p99_ms={pct(0.99)} max_ms={pct(1.0)} outcomes={outcomes}"
        )


async def read_response(reader):
    """Reads one HTTP/1.1 response with Content-Length; returns (status line, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    body = await reader.readexactly(length)
    return head.split(b"\r\n", 1)[0], body


def check(status, body):
    if not status.startswith(b"HTTP/1.1 200") or BODY not in body:
        raise ValueError("bad-response")


async def timed(kind, coro, timeout):
    start = time.monotonic()
    try:
        outcome = await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        kind.reasons["timeout"] += 1
        return
    except ValueError as e:
        kind.reasons[str(e)] += 1
        return
    except ssl.SSLError as e:
        kind.reasons[f"tls:{e.reason or type(e).__name__}"] += 1
        return
    except (OSError, asyncio.IncompleteReadError) as e:
        kind.reasons[f"os:{type(e).__name__}"] += 1
        return
    kind.ok += 1
    kind.times.append(time.monotonic() - start)
    if outcome:
        kind.outcomes[outcome] += 1


async def one_shot(ip, port, name, ctx):
    reader, writer = await asyncio.open_connection(
        ip, port, ssl=ctx, server_hostname=name if ctx else None
    )
    try:
        writer.write(REQ.format(name, "close").encode())
        await writer.drain()
        check(*await read_response(reader))
    finally:
        writer.close()


async def slow(ip, port, name):
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        for b in REQ.format(name, "close").encode():
            writer.write(bytes([b]))
            await writer.drain()
            await asyncio.sleep(0.03)
        check(*await read_response(reader))
    finally:
        writer.close()


async def read_to_close(reader):
    """Everything until the peer closes: (the bytes, whether it ended with a reset)."""
    data = b""
    try:
        while chunk := await reader.read(1 << 16):
            data += chunk
    except ConnectionResetError:
        return data, True
    return data, False


async def garbage(ip, port):
    """Random bytes; the router must close (or answer and close) promptly. A reply is not checked."""
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        writer.write(os.urandom(random.randint(1, 4096)))
        await writer.drain()
        data, reset = await read_to_close(reader)
    finally:
        writer.close()
    if reset:
        return "reset"
    return data[9:12].decode(errors="replace") if data.startswith(b"HTTP/1.") else ("close" if not data else "other")


async def fault(ip, port, name):
    """A request to a faulty upstream: a 5xx reply or a close is the prompt result wanted. Returns what
    came back (the status code, `close`, `truncated` for part of a response, with `+reset` after a
    reset)."""
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        writer.write(REQ.format(name, "close").encode())
        await writer.drain()
        data, reset = await read_to_close(reader)
        end = "+reset" if reset else ""
        if data.startswith(b"HTTP/1.1 200") and BODY in data:
            raise ValueError("fault-answered-200")
    finally:
        writer.close()
    if not data:
        return "close" + end
    code = data[9:12].decode(errors="replace")
    return ("truncated-" if code == "200" else "") + code + end


def client_hello(name):
    """The bytes of a real ClientHello for `name` (Python's own TLS client, never sent by it)."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def big_body():
    """The slow reader's body: 4 MiB with a period of 251 bytes, which a lost, repeated or reordered
    piece breaks."""
    return bytes(i % 251 for i in range(4 << 20))


async def reset_hello(ip, name):
    """Part of a ClientHello, then a reset (SO_LINGER 0). Nothing is expected back."""
    hello = client_hello(name)
    reader, writer = await asyncio.open_connection(ip, 443)
    writer.write(hello[: random.randint(1, len(hello) - 1)])
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def half_close(ip, name):
    """Half a ClientHello, then the end of the client's side: the hello can never complete, so the
    router must close at once (an alert or a bare close)."""
    hello = client_hello(name)
    reader, writer = await asyncio.open_connection(ip, 443)
    try:
        writer.write(hello[: len(hello) // 2])
        await writer.drain()
        writer.write_eof()
        data, reset = await read_to_close(reader)
    finally:
        writer.close()
    if reset:
        return "reset"
    return "alert" if data[:1] == b"\x15" else ("close" if not data else "other")


async def slow_reader(ip, name, ctx, expected):
    """GET /big over TLS, read 16 KiB every 10 ms; the body must be exactly `expected`."""
    reader, writer = await asyncio.open_connection(ip, 443, ssl=ctx, server_hostname=name, limit=1 << 16)
    try:
        writer.write(f"GET /big HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise ValueError("bad-response")
        body = bytearray()
        while len(body) < len(expected):
            chunk = await reader.read(16 << 10)
            if not chunk:
                break
            body += chunk
            await asyncio.sleep(0.01)
        if bytes(body) != expected:
            raise ValueError(f"body-{'short' if len(body) < len(expected) else 'changed'}")
    finally:
        writer.close()


async def expect(coro, want, floor=0.0):
    """`coro`'s outcome, which must satisfy `want` and take at least `floor` s: a fault that did not
    happen (a black hole that refused at once, a resolver that answered) is a failure, not a pass."""
    start = time.monotonic()
    outcome = await coro
    if not want(outcome):
        raise ValueError(f"unexpected-{outcome}")
    if time.monotonic() - start < floor:
        raise ValueError(f"too-soon-{outcome}")
    return outcome


def fault_expectation(name, connect_timeout, idle_timeout):
    """What a request to the fault `name` must get back, and how long it must at least take."""
    is_502 = lambda o: o == "502"
    label = name.split(".")[0]
    return {
        "refused": (is_502, 0.0),
        "silent": (lambda o: o == "close", 0.8 * idle_timeout),
        "reset": (lambda o: o.startswith("truncated-200"), 0.0),
        "blackhole": (is_502, 0.8 * connect_timeout),
        "servfail": (is_502, 0.0),
        "truncated": (is_502, 0.0),
        "slowdns": (is_502, 0.8 * connect_timeout),
        "silentdns": (is_502, 0.8 * connect_timeout),
    }.get(label, (lambda o: True, 0.0))


async def persistent(kind, ip, port, name, period, until):
    """One connection, a request every `period` s; reconnects (counted as a failure) if it breaks."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 5)
        except (OSError, asyncio.TimeoutError) as e:
            kind.reasons[f"connect:{type(e).__name__}"] += 1
            await asyncio.sleep(period)
            continue
        try:
            while time.monotonic() < until:
                start = time.monotonic()
                writer.write(REQ.format(name, "keep-alive").encode())
                await writer.drain()
                check(*await asyncio.wait_for(read_response(reader), 5))
                kind.ok += 1
                kind.times.append(time.monotonic() - start)
                await asyncio.sleep(period)
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            kind.reasons[f"broken:{type(e).__name__}:{e}"[:60]] += 1
        finally:
            writer.close()


async def paced(rate, seconds, make, tasks):
    t0 = time.monotonic()
    for i in range(int(rate * seconds)):
        due = t0 + i / rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.create_task(make(i)))


async def load(a):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    kinds = collections.defaultdict(Kind)
    tasks = []
    until = time.monotonic() + a.seconds
    ip, name = a.ip, a.name
    faults = [
        (n, kinds[f"fault-{n.split('.')[0]}"], fault_expectation(n, a.connect_timeout, a.idle_timeout))
        for n in a.fault_names.split(",")
    ]

    def new_tls(_):
        return timed(kinds["tls"], one_shot(ip, 443, name, ctx), 10)

    def new_http(_):
        return timed(kinds["http"], one_shot(ip, a.http_port, name, None), 10)

    def slow_client(_):
        return timed(kinds["slow"], slow(ip, a.http_port, name), 15)

    def garbage_client(i):
        # Closed at the latest when the peek timeout expires.
        return timed(kinds["garbage"], garbage(ip, a.http_port if i % 2 else 443), a.peek_timeout + 3)

    def fault_request(i):
        # The never-answering upstream is closed at the router's idle timeout (5 s in soak.sh); a
        # black-holed SYN, and a resolver slow or silent, at its connect timeout.
        fault_name, kind, (want, floor) = faults[i % len(faults)]
        request = expect(fault(ip, a.http_port, fault_name), want, floor)
        return timed(kind, request, max(a.idle_timeout, a.connect_timeout) + 3)

    def reset_hello_client(_):
        return timed(kinds["reset-hello"], reset_hello(ip, name), 5)

    def half_close_client(_):
        return timed(kinds["half-close"], expect(half_close(ip, name), lambda o: o in ("close", "alert")), 2)

    expected = big_body()

    def slow_reader_client(_):
        return timed(kinds["slow-reader"], slow_reader(ip, name, ctx, expected), 30)

    gens = [
        paced(a.rate, a.seconds, new_tls, tasks),
        paced(a.rate, a.seconds, new_http, tasks),
        paced(0.5, a.seconds, slow_client, tasks),
        paced(2, a.seconds, garbage_client, tasks),
        paced(2, a.seconds, fault_request, tasks),
        paced(2, a.seconds, reset_hello_client, tasks),
        paced(1, a.seconds, half_close_client, tasks),
        paced(0.2, a.seconds, slow_reader_client, tasks),
        persistent(kinds["relay"], ip, a.relay_port, name, 0.5, until),
    ]
    gens += [persistent(kinds["keepalive"], ip, a.http_port, name, 0.2, until) for _ in range(a.keepalive)]
    await asyncio.gather(*gens)
    await asyncio.gather(*tasks)
    for k in sorted(kinds):
        print(kinds[k].line(k))
    return 0 if all(not v.reasons for v in kinds.values()) else 1


async def serve_faults(a):
    held = []

    async def silent(reader, writer):
        held.append(writer)  # never answered, never closed: the client or the router gives up

    async def reset(reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            # SO_LINGER 0: close sends a RST mid-response.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (OSError, asyncio.IncompleteReadError):
            pass
        writer.transport.abort()

    s1 = await asyncio.start_server(silent, a.silent, 80)
    s2 = await asyncio.start_server(reset, a.reset, 80)
    print("ready", flush=True)
    async with s1, s2:
        await asyncio.gather(s1.serve_forever(), s2.serve_forever())


def dns_reply(query, rcode=0, tc=False, ip=None):
    """A reply to `query` (its header and question): `ip` as one A record with TTL 300, or nothing."""
    qid, flags = struct.unpack("!HH", query[:4])
    flags = 0x8000 | (flags & 0x0100) | 0x0080 | rcode | (0x0200 if tc else 0)
    answer = b""
    if ip is not None:
        answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 300, 4) + socket.inet_aton(ip)
    return struct.pack("!HHHHHH", qid, flags, 1, 1 if ip else 0, 0, 0) + query[12:] + answer


def dns_question(data):
    """(name, qtype, the query up to its question's end), or None for anything else."""
    if len(data) < 12 or struct.unpack("!H", data[4:6])[0] != 1 or data[2] & 0x80:
        return None
    labels, at = [], 12
    while at < len(data) and len(labels) < 128:
        n = data[at]
        if n == 0:
            break
        if n & 0xC0:
            return None
        labels.append(data[at + 1 : at + 1 + n].decode("ascii", "replace").lower())
        at += 1 + n
    if at + 5 > len(data):
        return None
    qtype = struct.unpack("!H", data[at + 1 : at + 3])[0]
    return ".".join(labels), qtype, data[: at + 5]


async def serve_resolver(a):
    answers = dict(x.split("=", 1) for x in a.answer)
    faults = {n: "servfail" for n in a.servfail}
    faults.update({n: "truncated" for n in a.truncated})
    faults.update({n: "slow" for n in a.slow})
    faults.update({n: "silent" for n in a.silent})

    def lookup(table, name):
        # The name or a name it is under, as dnsmasq's --address.
        parts = name.split(".")
        return next((table[".".join(parts[i:])] for i in range(len(parts)) if ".".join(parts[i:]) in table), None)

    loop = asyncio.get_running_loop()

    class Resolver(asyncio.DatagramProtocol):
        def connection_made(self, transport):
            self.t = transport

        def datagram_received(self, data, addr):
            q = dns_question(data)
            if q is None:
                return
            name, qtype, query = q
            fault = lookup(faults, name)
            if fault == "silent":
                return
            if fault == "servfail":
                reply = dns_reply(query, rcode=2)
            elif fault == "truncated":
                reply = dns_reply(query, tc=True)
            else:
                ip = lookup(answers, name)
                if fault == "slow":
                    ip = answers.get(a.slow_answer)
                reply = dns_reply(query, rcode=0 if ip or fault else 3, ip=ip if qtype == 1 else None)
            if fault == "slow":
                loop.call_later(a.slow_seconds, self.t.sendto, reply, addr)
            else:
                self.t.sendto(reply, addr)

    await loop.create_datagram_endpoint(Resolver, local_addr=(a.listen, a.port))
    print("ready", flush=True)
    await asyncio.Event().wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("--ip", required=True)
    lp.add_argument("--name", required=True)
    lp.add_argument("--http-port", type=int, default=80)
    lp.add_argument("--relay-port", type=int, required=True)
    lp.add_argument("--fault-names", required=True, help="comma-separated")
    lp.add_argument("--rate", type=float, default=20, help="new TLS and new HTTP connections per second, each")
    lp.add_argument("--keepalive", type=int, default=4)
    lp.add_argument("--peek-timeout", type=float, default=10)
    lp.add_argument("--seconds", type=float, required=True)
    lp.add_argument("--connect-timeout", type=float, default=10, help="the router's, in seconds")
    lp.add_argument("--idle-timeout", type=float, default=5, help="the router's, in seconds")
    fp = sub.add_parser("faults")
    fp.add_argument("--silent", required=True)
    fp.add_argument("--reset", required=True)
    rp = sub.add_parser("resolver")
    rp.add_argument("--listen", required=True)
    rp.add_argument("--port", type=int, default=53)
    rp.add_argument("--answer", action="append", default=[], help="NAME=IPV4")
    rp.add_argument("--servfail", action="append", default=[])
    rp.add_argument("--truncated", action="append", default=[])
    rp.add_argument("--slow", action="append", default=[])
    rp.add_argument("--silent", action="append", default=[])
    rp.add_argument("--slow-seconds", type=float, default=15)
    rp.add_argument("--slow-answer", default="", help="the --answer name whose address a slow name gets")
    a = p.parse_args()
    if a.cmd == "load":
        return asyncio.run(load(a))
    asyncio.run(serve_faults(a) if a.cmd == "faults" else serve_resolver(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
