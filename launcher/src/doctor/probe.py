# The containment probe of `agent-sandbox doctor`: run inside the sandbox image as the agent's user
# (`python3 -I -S -c PROBE SPEC_JSON`, so nothing from the home or the environment runs before it: it
# uses the standard library only, and its session's home volume is a new one of its own). It only ever sends to the addresses the launcher put in SPEC: this
# host's own addresses, its resolvers, the router's egress side, and the loopback addresses the
# router's DNS hands out. One JSON line per check: {"name", "ok", "tried", "got"}. Where nested podman
# can run, SPEC["nested"] says how to run the static nested probe in a nested container; its lines are
# passed on after a "nested-podman" line that says whether it ran.
import errno
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

TIMEOUT = 2.0
# Each nested podman step (import, run, rmi); the run itself takes about one TIMEOUT.
NESTED_TIMEOUT = 8.0
SPEC = json.loads(sys.argv[1])
LOCK = threading.Lock()


def emit(name, ok, tried, got, warn=False):
    line = {"name": name, "ok": bool(ok), "tried": tried, "got": got, "warn": warn}
    with LOCK:
        print(json.dumps(line), flush=True)


def nameserver():
    with open("/etc/resolv.conf") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                return parts[1]
    return None


def query(name, qid):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", 1, 1)


def skip_name(r, i):
    while i < len(r):
        n = r[i]
        if n & 0xC0 == 0xC0:
            return i + 2
        if n == 0:
            return i + 1
        i += n + 1
    raise ValueError("truncated name")


def parse(r, qid):
    """(rcode, [A addresses]) of a response to our query."""
    if len(r) < 12:
        raise ValueError("short answer")
    rid, flags, qd, an = struct.unpack(">HHHH", r[:8])
    if rid != qid:
        raise ValueError("answer to another query")
    i = 12
    for _ in range(qd):
        i = skip_name(r, i) + 4
    addrs = []
    for _ in range(an):
        i = skip_name(r, i)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if rtype == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(r[i:i + 4]))
        i += rdlen
    return flags & 0xF, addrs


def dns_udp(server, name, family=socket.AF_INET, port=53):
    qid = int.from_bytes(os.urandom(2), "big")
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    try:
        s.sendto(query(name, qid), (server, port))
        return parse(s.recv(1500), qid)
    finally:
        s.close()


def dns_tcp(server, name):
    qid = int.from_bytes(os.urandom(2), "big")
    q = query(name, qid)
    with socket.create_connection((server, 53), timeout=TIMEOUT) as s:
        s.sendall(struct.pack(">H", len(q)) + q)
        data = b""
        while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
            chunk = s.recv(1500)
            if not chunk:
                break
            data += chunk
        return parse(data[2:], qid)


def describe(e):
    # An SSLError's errno is OpenSSL's error kind (1 for every verification failure), not errno's.
    if isinstance(e, ssl.SSLError):
        return f"{type(e).__name__}: {e.reason or e}"
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno)) + " (" + os.strerror(e.errno) + ")"
    return str(e)


BLOCKED = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.EADDRNOTAVAIL,
           errno.EAFNOSUPPORT}


def blocked(e):
    return isinstance(e, socket.timeout) or (isinstance(e, OSError) and e.errno in BLOCKED)


def check_dns(router):
    name, expect, unlisted = SPEC["name"], SPEC["expect"], SPEC["unlisted"]
    try:
        rcode, addrs = dns_udp(router, name)
        emit("dns-allowlisted", rcode == 0 and addrs == [expect],
             f"A {name} from the router {router}", f"rcode {rcode}, {addrs or 'no address'} (want {expect})")
    except Exception as e:  # noqa: BLE001 - every failure is the answer
        emit("dns-allowlisted", False, f"A {name} from the router {router}", describe(e))
    for proto, ask in (("udp", dns_udp), ("tcp", dns_tcp)):
        tried = f"A {unlisted} from the router over {proto.upper()}"
        try:
            rcode, addrs = ask(router, unlisted)
            emit(f"dns-unlisted-{proto}", rcode == 3 and not addrs, tried,
                 "NXDOMAIN" if rcode == 3 and not addrs else f"rcode {rcode}, {addrs}")
        except Exception as e:  # noqa: BLE001
            emit(f"dns-unlisted-{proto}", False, tried, describe(e))


def connect(kind, ip, port):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    tried = f"TCP to {kind} {ip} port {port}"
    name = f"tcp-{kind}-{ip}"
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        emit(name, True, tried, "no socket: " + describe(e))
        return
    s.settimeout(TIMEOUT)
    try:
        s.connect((ip, port))
        emit(name, False, tried, "connected")
    except ConnectionRefusedError:
        emit(name, False, tried, "refused by the target: the packet got there")
    except OSError as e:
        emit(name, blocked(e), tried, describe(e))
    finally:
        s.close()


def udp(kind, ip, port):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    name = f"udp-{kind}-{ip}"
    tried = f"UDP to {kind} {ip} port {port}"
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.sendto(b"agent-sandbox doctor", (ip, port))
        s.close()
        # Sent: whether it arrived is for the launcher's listener on this host to say.
        emit(name + "-sent", True, tried, "sent (the launcher's listener checks it never arrives)")
    except OSError as e:
        emit(name + "-sent", blocked(e), tried, describe(e))


def other_dns(kind, ip, port):
    name = f"dns-{kind}-{ip}"
    tried = f"A {SPEC['name']} from {kind} {ip} port {port} (not the router)"
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        rcode, addrs = dns_udp(ip, SPEC["name"], family, port)
        emit(name, False, tried, f"answered: rcode {rcode}, {addrs}")
    except Exception as e:  # noqa: BLE001
        emit(name, blocked(e) or isinstance(e, socket.timeout), tried, describe(e))


def hello(sni):
    sni = sni.encode()
    ext = struct.pack(">HHHBH", 0, len(sni) + 5, len(sni) + 3, 0, len(sni)) + sni
    ext += bytes.fromhex("002b0003020304" "000a00040002001d" "000d000400020403")
    ext += bytes.fromhex("003300260024001d0020") + os.urandom(32)
    body = b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32)
    body += bytes.fromhex("000413011302" "0100") + struct.pack(">H", len(ext)) + ext
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


def check_refusals():
    ip, unlisted = SPEC["expect"], SPEC["unlisted"]
    tried = f"TLS ClientHello with SNI {unlisted} to {ip}:443"
    try:
        with socket.create_connection((ip, 443), timeout=TIMEOUT) as s:
            s.sendall(hello(unlisted))
            r = b""
            while len(r) < 7:
                chunk = s.recv(7 - len(r))
                if not chunk:
                    break
                r += chunk
        ok = len(r) >= 7 and r[0] == 0x15 and r[6] == 49
        got = "access_denied alert" if ok else f"{r.hex() or 'nothing'}"
        emit("tls-unlisted-sni", ok, tried, got)
    except Exception as e:  # noqa: BLE001
        emit("tls-unlisted-sni", False, tried, describe(e))
    tried = f"HTTP GET with Host {unlisted} to {ip}:80"
    try:
        with socket.create_connection((ip, 80), timeout=TIMEOUT) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: {unlisted}\r\nConnection: close\r\n\r\n".encode())
            r = b""
            while len(r) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                r += chunk
        text = r.decode("latin-1")
        first = text.split("\r\n", 1)[0]
        emit("http-unlisted-host", " 403 " in first + " " and unlisted in text, tried,
             first or "nothing")
    except Exception as e:  # noqa: BLE001
        emit("http-unlisted-host", False, tried, describe(e))


def check_ipv6():
    try:
        with open("/proc/net/if_inet6") as f:
            addrs = [line.split() for line in f if line.strip()]
    except OSError:
        addrs = []
    other = [a[-1] + " " + a[0] for a in addrs if a[-1] != "lo"]
    emit("no-ipv6", not other, "IPv6 addresses of the sandbox's interfaces (/proc/net/if_inet6)",
         "none beside loopback" if not other else ", ".join(other))


def check_process():
    caps = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cap"):
                k, v = line.split(":")
                caps[k] = int(v.strip(), 16)
    held = {k: hex(v) for k, v in caps.items() if k != "CapBnd" and v}
    emit("no-capabilities", not held, "capabilities of the agent's process (/proc/self/status)",
         "none" if not held else f"holds {held}")
    for path in ("/etc/hosts", "/etc/resolv.conf"):
        try:
            with open(path, "a"):
                pass
            emit(f"read-only-{path}", False, f"open {path} for writing", "opened")
        except OSError as e:
            emit(f"read-only-{path}", e.errno in (errno.EROFS, errno.EACCES, errno.EPERM),
                 f"open {path} for writing", describe(e))
    uid = os.getuid()
    sockets = ["/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock",
               f"/run/user/{uid}/podman/podman.sock"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        sockets.append(os.path.join(runtime, "podman/podman.sock"))
    found = [p for p in sockets if os.path.exists(p)]
    mounts = mountinfo()
    found += [m for m in mounts if m.endswith(".sock")]
    emit("no-podman-socket", not found, "podman and docker API sockets", ", ".join(found) or "none")
    allowed = {"/", SPEC["project"], SPEC["home"], "/etc/hosts", "/etc/resolv.conf", "/etc/hostname",
               "/run/.containerenv", "/etc/passwd", "/etc/group", "/run/secrets", "/run/podman-init",
               # Credential injection: the session CA and the bundle with it (no secret in either).
               "/etc/agent-sandbox/session-ca.pem", "/etc/ssl/certs/ca-certificates.crt"}
    extra = sorted(m for m in mounts if m not in allowed
                   and not m.startswith(("/proc", "/dev", "/sys")))
    emit("host-mounts", not extra, "mounts beside the image, the project and the home volume",
         "none" if not extra else ", ".join(extra))


def check_setuid():
    start = time.monotonic()
    try:
        out = subprocess.run(["find", "/", "-xdev", "-perm", "/6000", "-type", "f"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        # The walk's time shows where a slow run went (a cold cache after an image load).
        took = f" ({time.monotonic() - start:.1f}s)"
        emit("no-setuid", not out, "setuid/setgid files (find / -xdev -perm /6000)",
             ("none" if not out else ", ".join(out[:5])) + took)
    except Exception as e:  # noqa: BLE001
        emit("no-setuid", False, "find / -xdev -perm /6000", describe(e))


def mountinfo():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4:
                points.append(parts[4].replace("\\040", " "))
    return points


def last_line(text):
    return (text.strip().splitlines() or [""])[-1]


def check_nested():
    """The static nested probe, in a nested container of the sandbox's own podman (--network host)."""
    nested = SPEC["nested"]
    image, tarball = nested["image"], nested["tarball"]
    tried = f"podman import {tarball}; podman run --network host: the nested probe"
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError as e:
        emit("nested-podman", False, tried, "reading /proc/self/ns/net: " + describe(e))
        return

    took = []

    def podman(*args):
        start = time.monotonic()
        try:
            return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=NESTED_TIMEOUT)
        finally:
            took.append(f"{args[0]} {time.monotonic() - start:.1f}s")

    try:
        r = podman("import", "--quiet", tarball, image)
        if r.returncode != 0:
            emit("nested-podman", False, tried, f"podman import: exit {r.returncode}: {last_line(r.stderr)}")
            return
        try:
            r = podman("run", "--rm", "--network", "host", image, *nested["command"], "--netns", netns)
        finally:
            # The doctor removes the session's home volume (a throw-away one) and everything in it;
            # removing the image anyway keeps a home this probe is ever run in free of it.
            podman("rmi", "--force", image)
    except Exception as e:  # noqa: BLE001 - every failure is the answer
        emit("nested-podman", False, tried, describe(e))
        return
    lines = []
    for line in r.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and name.startswith("nested-") and name != "nested-podman":
            lines.append(item)
    ran = r.returncode == 0 and bool(lines)
    emit("nested-podman", ran, tried,
         f"a nested container ran the probe ({len(lines)} checks below; {', '.join(took)})" if ran
         else f"podman run: exit {r.returncode}: {last_line(r.stderr)}")
    for item in lines:
        emit(item["name"], item.get("ok") is True, str(item.get("tried", "")), str(item.get("got", "")))


def check_reach(name):
    tried = f"HTTPS handshake with {name}:443 through the router"
    try:
        ctx = ssl.create_default_context()
        with socket.create_connection((name, 443), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                emit(f"reach-{name}", True, tried, f"{s.version()} with {name}")
    except Exception as e:  # noqa: BLE001
        emit(f"reach-{name}", False, tried, describe(e))


def main():
    router = nameserver()
    # The slow checks (a walk of the image, nested podman's start) run beside the network ones.
    threads = [threading.Thread(target=check_setuid)]
    if SPEC.get("nested"):
        threads.append(threading.Thread(target=check_nested))
    for kind, ip, port in SPEC["tcp"]:
        threads.append(threading.Thread(target=connect, args=(kind, ip, port)))
    for kind, ip, port in SPEC["dns"]:
        threads.append(threading.Thread(target=other_dns, args=(kind, ip, port)))
    for t in threads:
        t.start()
    if router:
        check_dns(router)
    else:
        emit("dns-allowlisted", False, "read /etc/resolv.conf", "no nameserver")
    for kind, ip, port in SPEC["udp"]:
        udp(kind, ip, port)
    check_refusals()
    check_ipv6()
    check_process()
    for name in SPEC.get("reach", []):
        check_reach(name)
    for t in threads:
        t.join()


main()
