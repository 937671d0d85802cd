"""A DNS server on 127.0.0.1 for tests: a few lines of dnspython answering from records the test sets.

It answers a question with the records set for its name and type, else an empty NOERROR answer; `rcode`
makes it answer NXDOMAIN or SERVFAIL instead, and `silent` makes it drop questions (a DNS outage). A
dnspython resolver points at it with `resolver()`; a gRPC channel (c-ares) with a target naming it as the
authority, `dns://127.0.0.1:<port>/<name>:<port>` (`target()`).
"""

from __future__ import annotations

import socket
import threading

import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset


class LoopbackDns:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[str]] = {}  # (absolute name, type) -> rdata texts
        self.rcode = dns.rcode.NOERROR
        self.silent = False
        self.questions: list[tuple[str, str]] = []  # (absolute name, type) of every question received
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.05)
        self.port = self._socket.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="loopback-dns", daemon=True)

    def __enter__(self) -> LoopbackDns:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()

    def set(self, name: str, rdtype: str, texts: list[str]) -> None:
        """Answers `name` (absolute or not) of type `rdtype` with `texts` from now on (none: empty)."""
        self.records[(dns.name.from_text(name).to_text(), rdtype)] = list(texts)

    def resolver(self, lifetime_s: float = 2.0) -> dns.resolver.Resolver:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = ["127.0.0.1"]
        resolver.port = self.port
        resolver.timeout = resolver.lifetime = lifetime_s
        return resolver

    def target(self, name: str, port: int) -> str:
        """A gRPC target resolving `name` through this server."""
        return f"dns://127.0.0.1:{self.port}/{name}:{port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self._socket.recvfrom(65535)
            except TimeoutError:
                continue
            query = dns.message.from_wire(wire)
            (question,) = query.question
            key = (question.name.to_text(), dns.rdatatype.to_text(question.rdtype))
            self.questions.append(key)
            if self.silent:
                continue
            response = dns.message.make_response(query)
            response.set_rcode(self.rcode)
            texts = self.records.get(key, [])
            if texts and self.rcode == dns.rcode.NOERROR:
                response.answer.append(dns.rrset.from_text_list(question.name, 1, "IN", key[1], texts))
            self._socket.sendto(response.to_wire(), peer)
