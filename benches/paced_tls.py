#!/usr/bin/env python3
"""Open-loop paced TLS client for the benches: starts a new connection every 1/RATE s for SECONDS s
whether or not earlier ones have finished (like wrk2, which Debian does not ship), so a slow server
cannot lower the offered load. Each connection: TCP connect, TLS handshake with SNI NAME, one
`GET /small` with `Connection: close`, read to EOF, check the body. Prints one line of key=value pairs:
attempted, succeeded, failed, reasons (kind:count,...), p50_ms, p99_ms, max_ms, late_max_ms.
Connects only to the IP address it is given. Exit status 0 when every connection succeeded."""

import argparse
import asyncio
import collections
import ssl
import sys
import time


async def one(ip, port, name, ctx, timeout):
    start = time.monotonic()

    async def exchange():
        reader, writer = await asyncio.open_connection(ip, port, ssl=ctx, server_hostname=name)
        try:
            writer.write(f"GET /small HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            body = await reader.read(1 << 16)
            while True:
                more = await reader.read(1 << 16)
                if not more or len(body) > 1 << 20:
                    break
                body += more
        finally:
            writer.close()
        return body

    try:
        body = await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        return "timeout", None
    except ssl.SSLError as e:
        return f"tls:{e.reason or type(e).__name__}", None
    except OSError as e:
        return f"os:{type(e).__name__}", None
    if not body.startswith(b"HTTP/1.1 200") or b"hello from upstream" not in body:
        return "bad-response", None
    return None, time.monotonic() - start


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ip", required=True)
    p.add_argument("--port", type=int, default=443)
    p.add_argument("--name", required=True)
    p.add_argument("--rate", type=float, required=True, help="new connections per second")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--timeout", type=float, default=10.0, help="per connection, seconds")
    a = p.parse_args()

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    total = int(a.rate * a.seconds)
    tasks = []
    late_max = 0.0
    t0 = time.monotonic()
    for i in range(total):
        due = t0 + i / a.rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        else:
            late_max = max(late_max, now - due)
        tasks.append(asyncio.create_task(one(a.ip, a.port, a.name, ctx, a.timeout)))
    results = await asyncio.gather(*tasks)

    reasons = collections.Counter(r for r, _ in results if r)
    times = sorted(t for r, t in results if not r)
    pct = lambda q: f"{times[min(len(times) - 1, int(q * len(times)))] * 1000:.1f}" if times else "-"
    failed = sum(reasons.values())
    print(
        f"attempted={total} succeeded={len(times)} failed={failed}"
        f" reasons={','.join(f'{k}:{v}' for k, v in reasons.items()) or '-'}"
        f" p50_ms={pct(0.5)} p99_ms={pct(0.99)} max_ms={pct(1.0)} late_max_ms={late_max * 1000:.1f}"
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
