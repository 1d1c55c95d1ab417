"""The multi-host rig: each part on its own host (a network namespace), links cut by nftables.

One machine, several hosts. Every host is a network namespace with one address in a
private /24 (``10.77.K.0/24``, K picked free per rig) on a bridge that lives in a hub
namespace of its own. The test process stays in the root namespace and reaches every
host through one more link to the bridge, at ``.254``: it is the clients' host and the
upstreams' host, and it reads Redis, the topics and the gateways' metrics from there.

A partition is an nftables table inside one side's namespace that drops (silently,
as a real partition does: no reset, no ICMP) every packet to and from the other
side's address, with a counter, so a test can prove the fault met traffic
(``Partition.packets``). A lossy link is the same table with ``numgen random mod
100 < P`` before the drop: P % of the packets, drawn by the kernel. Healing deletes
the table. (Delay needs ``netem``, which this kernel lacks: ``delay_proxy.py``.)

A redirect (``Rig.redirect``) is a ``nat`` table in one client's namespace whose
output hook DNATs every new connection to a part's address and port to somewhere
else (a delaying proxy on the observer). It slows one client's link to a part whose
clients learn its address from the part itself, as Kafka's do from the broker's
advertised listener: that address stays the one they dial, and only this namespace
rewrites it, so every other host's link is untouched.

Needs root, ``ip`` (iproute2) and ``nft`` (Debian's nftables): ``make netrig``.
``Rig.close`` deletes every namespace and link it made, whatever happened before;
``sweep`` removes what a killed run left behind (namespaces named after a dead pid).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from quantdrift.stack.ports import pid_alive

SUBNET = "10.77"
_PREFIX = "qdrig"
_counter = itertools.count()


class RigUnavailable(RuntimeError):
    """This machine cannot host the rig (not root, or ``ip``/``nft`` missing)."""


def available() -> str | None:
    """None if the rig can run here, else why not."""
    if os.geteuid() != 0:
        return "the rig needs root (network namespaces and nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"the rig needs `{tool}` (make netrig installs it)"
    return None


def run(*argv: str, stdin: str | None = None) -> str:
    """Run one ip/nft command; a failure raises with its stderr."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def sweep() -> list[str]:
    """Delete the namespaces (and so their links) of rigs whose process is gone."""
    removed = []
    for line in run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(rf"{_PREFIX}(\d+)x\d+-\w+", name)
        if m and not pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
            removed.append(name)
    for line in run("ip", "-o", "link", "show").splitlines():
        m = re.search(r"\d+: (qo(\d+)x\d+)[@:]", line)
        if m and not pid_alive(int(m.group(2))):
            subprocess.run(["ip", "link", "del", m.group(1)], capture_output=True, timeout=20)
            removed.append(m.group(1))
    return removed


def _free_subnet() -> int:
    """A third octet whose 10.77.K.0/24 no route of this machine uses."""
    used = set(re.findall(rf"{re.escape(SUBNET)}\.(\d+)\.", run("ip", "-4", "route", "show")))
    choices = [k for k in range(1, 251) if str(k) not in used]
    if not choices:
        raise RigUnavailable(f"no free {SUBNET}.K.0/24 left")
    return random.SystemRandom().choice(choices)


def counted(rig: Rig, node: str, family: str, table: str) -> int:
    """Packets counted so far by the rules of nft table ``family table`` on ``node``."""
    out = run(*rig.exec_argv(node, ["nft", "-j", "list", "table", family, table]))
    total = 0
    for item in json.loads(out)["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                total += int(expr["counter"]["packets"])
    return total


@dataclass
class Partition:
    """Silent drops between ``a`` and ``b``, as rules in ``a``'s namespace."""

    rig: Rig
    a: str
    b: str
    table: str
    healed: bool = False

    def packets(self) -> int:
        """Packets dropped so far (both directions): the fault met traffic when > 0."""
        if self.healed:
            raise RuntimeError("the partition is healed: read packets() before heal()")
        return counted(self.rig, self.a, "inet", self.table)

    def heal(self) -> None:
        if not self.healed:
            run(*self.rig.exec_argv(self.a, ["nft", "delete", "table", "inet", self.table]))
            self.healed = True


@dataclass
class Redirect:
    """New connections from ``a`` to ``b``'s ``port`` sent to ``to`` instead (DNAT)."""

    rig: Rig
    a: str
    table: str

    def connections(self) -> int:
        """Connections redirected so far: a nat chain sees only each flow's first packet."""
        return counted(self.rig, self.a, "ip", self.table)

    def remove(self) -> None:
        run(*self.rig.exec_argv(self.a, ["nft", "delete", "table", "ip", self.table]))


@dataclass
class Rig:
    """Hosts on one bridge, each in its own namespace; the root namespace is the observer."""

    hosts: list[str]
    k: int = field(default_factory=_free_subnet)
    tag: str = field(default_factory=lambda: f"{os.getpid()}x{next(_counter)}")
    made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        why = available()
        if why is not None:
            raise RigUnavailable(why)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- addresses and commands ------------------------------------------------------

    def ns(self, host: str) -> str:
        return f"{_PREFIX}{self.tag}-{host}"

    def addr(self, host: str) -> str:
        """A host's address; ``observer`` is the root namespace's (the test process)."""
        if host == "observer":
            return f"{SUBNET}.{self.k}.254"
        return f"{SUBNET}.{self.k}.{self.hosts.index(host) + 1}"

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    # -- faults ----------------------------------------------------------------------

    def partition(self, a: str, b: str) -> Partition:
        """Drop every packet between ``a`` and ``b`` (rules in ``a``'s namespace)."""
        return self._drop(a, b, f"cut_{b}", "")

    def lossy(self, a: str, b: str, percent: int) -> Partition:
        """Drop ``percent`` % of the packets between ``a`` and ``b``, each one drawn at
        random by the kernel (``numgen random``), in both directions: a lossy link.
        The counter counts the dropped packets only."""
        if not 0 < percent < 100:
            raise ValueError(f"loss must be in 1..99 %, got {percent}")
        return self._drop(a, b, f"loss_{b}", f"numgen random mod 100 < {percent} ")

    def redirect(self, a: str, b: str, port: int, to: tuple[str, int]) -> Redirect:
        """Every new TCP connection ``a`` opens to ``b``:``port`` goes to ``to`` instead.
        Connections already open keep their path: redirect before ``a``'s client starts."""
        table = f"redirect_{b}"
        script = (
            f"table ip {table} {{\n"
            f"  chain out {{ type nat hook output priority -100; policy accept;\n"
            f"    ip daddr {self.addr(b)} tcp dport {port} counter dnat to {to[0]}:{to[1]}\n"
            "  }\n}\n"
        )
        run(*self.exec_argv(a, ["nft", "-f", "-"]), stdin=script)
        return Redirect(self, a, table)

    def _drop(self, a: str, b: str, table: str, match: str) -> Partition:
        peer = self.addr(b)
        script = (
            f"table inet {table} {{\n"
            f"  chain in {{ type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {peer} {match}counter drop\n  }}\n"
            f"  chain out {{ type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {peer} {match}counter drop\n  }}\n"
            "}\n"
        )
        run(*self.exec_argv(a, ["nft", "-f", "-"]), stdin=script)
        return Partition(self, a, b, table)

    # -- lifecycle -------------------------------------------------------------------

    def _build(self) -> None:
        hub = self.ns("hub")
        self._netns(hub)
        run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", hub, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            ns = self.ns(host)
            self._netns(ns)
            near, far = f"qh{self.tag}{i}", f"qp{self.tag}{i}"
            run("ip", "link", "add", near, "type", "veth", "peer", "name", far)
            run("ip", "link", "set", near, "netns", hub)
            run("ip", "link", "set", far, "netns", ns)
            run("ip", "-n", hub, "link", "set", near, "master", "br0", "up")
            run("ip", "-n", ns, "link", "set", far, "name", "eth0")
            run("ip", "-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        # The observer's link: the root namespace joins the bridge at .254.
        mine, theirs = f"qo{self.tag}", f"qq{self.tag}"
        run("ip", "link", "add", mine, "type", "veth", "peer", "name", theirs)
        self.made.append(f"link:{mine}")
        run("ip", "link", "set", theirs, "netns", hub)
        run("ip", "-n", hub, "link", "set", theirs, "master", "br0", "up")
        run("ip", "addr", "add", f"{self.addr('observer')}/24", "dev", mine)
        run("ip", "link", "set", mine, "up")

    def _netns(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self.made.append(f"netns:{name}")
        run("ip", "-n", name, "link", "set", "lo", "up")

    def close(self) -> None:
        """Delete every namespace and link this rig made (their veths go with them)."""
        errors = []
        for what in reversed(self.made):
            kind, name = what.split(":", 1)
            argv = ["ip", "netns", "del", name] if kind == "netns" else ["ip", "link", "del", name]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            if done.returncode != 0 and "Cannot find" not in done.stderr and kind == "netns":
                errors.append(f"{name}: {done.stderr.strip()}")
        self.made.clear()
        if errors:
            raise RuntimeError("rig teardown: " + "; ".join(errors))

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
