"""Who may call a ranker's CacheHandoffService: only another ranker of the fleet.

A Push writes into the receiver's DRAM and a Fetch reads a user's prefix out, so neither is open to every
client of the ranker's port (the routers, the trigger, the retrieval stub and whoever else the port admits
call RankerService there). The rule, decided by `Gate` on every call before anything is read:

- **Under mutual TLS** (`--tls-ca` set: every caller presents a certificate from the fleet's CA), the
  caller's certificate must carry one of `--handoff-peer-names`: a name of its subject alternative names
  (DNS or IP) or its common name, compared as issued. The default is the name on every ranker's
  certificate of the deploy (`*.ranker-headless.relaygr.svc.cluster.local`,
  deploy/components/tls/certificates.yaml), on no other service's. Refused: PERMISSION_DENIED.
- **Otherwise, with a fleet secret** (`--handoff-secret`, best from the environment), every caller must
  present it as call metadata (`METADATA_KEY`; `call_metadata` builds it for a ranker's own calls to its
  peers). Missing or wrong: UNAUTHENTICATED.
- **Otherwise** only callers on loopback are served (one host: a local fleet, the tests); any other is
  refused with PERMISSION_DENIED, saying what to configure.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

import grpc

from services.common.config import listed

log = logging.getLogger(__name__)

# The metadata key a caller presents the fleet's handoff secret under (gRPC keys are lower case).
METADATA_KEY = "relaygr-handoff-secret"


def call_metadata(config) -> tuple[tuple[str, str], ...]:
    """The metadata a ranker's calls to a peer's CacheHandoffService carry (`metadata=` of a Push or a
    Fetch): the fleet's handoff secret when `config` (a `HandoffSettings`) has one, else nothing."""
    return ((METADATA_KEY, config.handoff_secret),) if config.handoff_secret else ()


def is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:/path`) is on this host's
    loopback (a Unix socket is)."""
    scheme, _, address = peer.partition(":")
    if scheme in ("unix", "unix-abstract"):
        return True
    if scheme not in ("ipv4", "ipv6"):
        return False
    host = address.rpartition(":")[0].removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def certificate_names(auth_context: dict[str, list[bytes]]) -> set[str]:
    """The names a TLS peer's certificate carries: its subject alternative names and its common name."""
    names = set()
    for field in ("x509_subject_alternative_name", "x509_common_name"):
        names.update(value.decode(errors="replace") for value in auth_context.get(field, ()))
    return names


class Gate:
    """Decides whether a call to CacheHandoffService comes from a ranker (the rule in the module's doc)."""

    def __init__(self, config) -> None:
        self.mutual_tls = bool(config.tls and config.tls_ca)
        self.peer_names = frozenset(listed(config, "handoff_peer_names"))
        self._secret = config.handoff_secret.encode()

    def refusal(self, context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
        """Why the call is refused (its status code and message), or None when it is let in."""
        if self.mutual_tls:
            names = certificate_names(context.auth_context())
            if names & self.peer_names:
                return None
            return grpc.StatusCode.PERMISSION_DENIED, (
                f"CacheHandoffService serves rankers only: the caller's certificate names "
                f"{', '.join(sorted(names)) or 'nothing'}, none of --handoff-peer-names"
            )
        if self._secret:
            presented = next((v for k, v in context.invocation_metadata() if k == METADATA_KEY), None)
            if isinstance(presented, str) and hmac.compare_digest(presented.encode(), self._secret):
                return None
            return grpc.StatusCode.UNAUTHENTICATED, (
                "CacheHandoffService serves rankers only: the call must carry the fleet's handoff secret "
                f"(--handoff-secret) as {METADATA_KEY} metadata"
            )
        if is_loopback(context.peer()):
            return None
        return grpc.StatusCode.PERMISSION_DENIED, (
            "CacheHandoffService serves callers outside loopback only under mutual TLS (--tls-ca) or with "
            "a fleet secret (--handoff-secret)"
        )

    async def check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """Aborts the call unless it comes from a ranker."""
        refusal = self.refusal(context)
        if refusal is not None:
            code, message = refusal
            log.warning("%s from %s refused (%s): %s", method, context.peer(), code.name, message)
            await context.abort(code, message)
