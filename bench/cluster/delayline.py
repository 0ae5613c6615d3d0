"""A userspace delay line between the hosts of ``hosts.sh`` where the kernel has no
``sch_netem`` (``CONFIG_NET_SCH_NETEM`` unset: ``tc qdisc ... netem`` answers "Specified qdisc
kind is unknown"). Standard library only; run as root in the switch namespace.

    python3 delayline.py --delay MS [--loss PCT] [--seed N] NS=ADDR [NS=ADDR ...]

Each host namespace NS has a TUN device ``eth0`` holding ADDR (made by ``hosts.sh``). This
process attaches to every one of them (entering each namespace just long enough to open its
device), reads the IPv4 packets a host sends, and writes each to the TUN of the host owning its
destination address ``MS`` ms later (dropping ``PCT`` % at random): one-way delay ``MS``
between any two hosts, as ``netem delay MS`` on every host's link would give.

NOTE: TUN, not veth plus raw sockets: a TUN device carries whole IPv4 packets whose checksums
the sending kernel has already computed (no offloads unless asked for), so a packet can be
re-injected as it is; a veth frame seen by a packet socket may carry an unfinished checksum.
Packets to an address no host owns (IPv6, a public address) are dropped. Ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_MAX_PACKET = 65536


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def open_tun(namespace: str, name: str = "eth0") -> int:
    """A non-blocking fd on TUN device ``name`` of network namespace ``namespace``."""
    home = f"/proc/{os.getpid()}/task/{os.getpid()}/ns/net"
    back = os.open(home, os.O_RDONLY)
    try:
        _setns(f"/var/run/netns/{namespace}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TUN | _IFF_NO_PI))
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(back, _CLONE_NEWNET)
        os.close(back)
    return fd


def run(fds: dict[bytes, int], delay_s: float, loss: float, rng: random.Random) -> None:
    """Forward packets between the TUN fds (by destination address, 4 raw bytes) forever."""
    queue: list[tuple[float, int, int, bytes]] = []
    seq = 0
    readers = list(fds.values())
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        ready, _, _ = select.select(readers, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            while True:
                try:
                    packet = os.read(fd, _MAX_PACKET)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue
                out = fds.get(packet[16:20])
                if out is None or (loss and rng.random() < loss):
                    continue
                heapq.heappush(queue, (now + delay_s, seq, out, packet))
                seq += 1
        while queue and queue[0][0] <= time.monotonic():
            _, _, out, packet = heapq.heappop(queue)
            try:
                os.write(out, packet)
            except OSError:  # a host's device gone (tear-down): its packets are lost
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.0, help="one-way delay, ms")
    parser.add_argument("--loss", type=float, default=0.0, help="packet loss, percent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("hosts", nargs="+", metavar="NS=ADDR")
    args = parser.parse_args(argv)
    if args.delay < 0 or not 0 <= args.loss <= 100:
        parser.error("need --delay >= 0 and 0 <= --loss <= 100")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    fds = {}
    for item in args.hosts:
        namespace, _, address = item.partition("=")
        fds[bytes(int(x) for x in address.split("."))] = open_tun(namespace)
    print(f"delayline: {len(fds)} hosts, {args.delay:g} ms, {args.loss:g}% loss", flush=True)
    run(fds, args.delay / 1e3, args.loss / 100, random.Random(args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
