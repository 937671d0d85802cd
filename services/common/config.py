"""Declarative service configuration: every setting is a flag with a `RELAYGR_…` environment twin.

A service declares its settings as a frozen dataclass whose fields are built with `setting()`, deriving
from `ServiceConfig` (the settings every service shares). `load()`
turns that dataclass into an argparse parser where each field `foo_bar` becomes `--foo-bar`, whose
default is read from `RELAYGR_FOO_BAR` when set and from the field's documented default otherwise.
Precedence: command-line flag > environment variable > default. `markdown_table()` renders the same
declarations for docs/configuration.md, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar, get_type_hints

ENV_PREFIX = "RELAYGR_"

C = TypeVar("C")


def setting(
    default: Any,
    help: str,
    *,
    above: float | None = None,
    minimum: float | None = None,
    below: float | None = None,
    maximum: float | None = None,
    choices: Iterable[str] | None = None,
    items: type | None = None,
    distinct: bool = False,
    increasing: bool = False,
    may_be_empty: bool = False,
    secret: bool = False,
) -> Any:
    """A configuration field with its documented default and help text, and the bounds `check()` enforces:
    the value must be greater than `above` (`above=0`: positive), at least `minimum` (`minimum=0`: not
    negative), less than `below`, at most `maximum`, or one of `choices` (read them from the registry they
    name, never type them twice).

    With `items` (int, float or str) the setting is a comma-separated list of such values (`listed()`
    reads it): the bounds and choices apply to each item; `distinct` refuses repeats, `increasing` asks for
    distinct values in increasing order, and the list may be empty only with `may_be_empty`. A `secret`
    setting is left out of the settings' repr, so that no log or traceback shows it."""
    bounds = {
        "above": above, "minimum": minimum, "below": below, "maximum": maximum,
        "choices": None if choices is None else tuple(choices),
    }  # fmt: skip
    if items is not None:
        bounds["items"] = {"kind": items, "distinct": distinct or increasing, "increasing": increasing,
                           "may_be_empty": may_be_empty}  # fmt: skip
    return dataclasses.field(default=default, repr=not secret, metadata={"help": help, **bounds})


def numbers(default: str, help: str, kind: type = float, **options: Any) -> Any:
    """A setting listing positive values of `kind`, comma-separated (`options`: more of `setting()`'s, such
    as `may_be_empty` or other bounds for each item)."""
    return setting(default, help, items=kind, **{"above": 0, **options})


def grid(default: str, help: str, kind: type = float, **options: Any) -> Any:
    """A sweep's grid: `numbers` that are distinct and in increasing order."""
    return numbers(default, help, kind, increasing=True, **options)


def comma_list(text: str, kind: type = float) -> list:
    """The values of a comma-separated list, each converted by `kind` (blank items are skipped)."""
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def listed(config: Any, name: str) -> list:
    """The values of the list setting `name` of `config` (declared with `setting(..., items=...)`)."""
    field = next(field for field in dataclasses.fields(config) if field.name == name)
    return comma_list(getattr(config, name), field.metadata["items"]["kind"])


def _out_of_bounds(value: Any, metadata: Mapping[str, Any]) -> str | None:
    """What `value` should be, when it is outside the bounds in `metadata`; None when it is within them."""
    above, minimum, below, maximum, choices = (
        metadata.get(k) for k in ("above", "minimum", "below", "maximum", "choices")
    )
    # `not >` and the like: NaN is out of bounds too
    if above is not None and not value > above:
        return "positive" if above == 0 else f"more than {above}"
    if minimum is not None and not value >= minimum:
        return "not negative" if minimum == 0 else f"at least {minimum}"
    if below is not None and not value < below:
        return f"below {below}"
    if maximum is not None and not value <= maximum:
        return f"at most {maximum}"
    if choices is not None and value not in choices:
        return f"one of {', '.join(choices)}"
    return None


def _check_list(flag: str, text: str, metadata: Mapping[str, Any]) -> None:
    spec = metadata["items"]
    kind = "names" if spec["kind"] is str else "numbers"
    try:
        values = comma_list(text, spec["kind"])
    except ValueError as exc:
        raise ValueError(f"{flag}: {text!r} must list {kind}, comma-separated: {exc}") from exc
    wrong = [value for value in values if _out_of_bounds(value, metadata) is not None]
    unordered = spec["increasing"] and sorted(values) != values
    repeated = spec["distinct"] and len(set(values)) != len(values)
    if wrong or unordered or repeated or not (values or spec["may_be_empty"]):
        what = "distinct " if spec["distinct"] else ""
        bound = _out_of_bounds(wrong[0], metadata) if wrong else None
        order = " in increasing order" if spec["increasing"] else ""
        within = "" if bound is None else f", each {bound}"
        raise ValueError(f"{flag}: {text!r} must list {what}{kind}{order}, comma-separated{within}")


def check(config: Any) -> None:
    """Raises ValueError naming the flag of the first setting of `config` outside its declared bounds."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        flag = flag_name(field.name)
        if "items" in field.metadata:
            _check_list(flag, value, field.metadata)
            continue
        should = _out_of_bounds(value, field.metadata)
        if should == "not negative":
            raise ValueError(f"{flag} must not be negative")
        if should is not None:
            raise ValueError(f"{flag} must be {should}")


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _converter(annotation: Any) -> Any:
    if isinstance(annotation, types.UnionType):  # `str | None` and the like: take the non-None member
        members = [a for a in annotation.__args__ if a is not type(None)]
        annotation = members[0]
    if annotation is bool:
        return _parse_bool
    return annotation


def build_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        convert = _converter(hints[field.name])
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            type=convert,
            default=field.default,
            choices=None if "items" in field.metadata else field.metadata.get("choices"),
            metavar=field.name.upper(),
            # argparse formats help with %: a literal one is doubled
            help=f"{field.metadata['help'].replace('%', '%%')} [env {env_name(field.name)}]",
        )
    return parser


def load(
    cls: type[C],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str | None = None,
    description: str = "",
) -> C:
    """Parse flags and `RELAYGR_…` variables into an instance of the settings dataclass `cls`."""
    environ = os.environ if environ is None else environ
    parser = build_parser(cls, prog or cls.__name__, description)
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        raw = environ.get(env_name(field.name))
        if raw is None:
            continue
        try:
            value = _converter(hints[field.name])(raw)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{env_name(field.name)}={raw!r}: {exc}")
        parser.set_defaults(**{field.name: value})
    namespace = parser.parse_args(argv)
    config = cls(**vars(namespace))
    # A `resolved()` method fills in defaults that depend on the host, then `check` and `validate` run.
    try:
        resolved = getattr(config, "resolved", None)
        if resolved is not None:
            config = resolved()
        check(config)
        validate = getattr(config, "validate", None)
        if validate is not None:
            validate()
    except ValueError as exc:
        parser.error(str(exc))
    return config


def default_text(field: dataclasses.Field) -> str:
    """A setting's default as the configuration pages print it (None: unset unless given; its help says what
    applies then)."""
    if field.default is None:
        return "(unset)"
    return "(empty)" if field.default == "" else f"`{field.default}`"


def markdown_table(cls: type, beyond: Iterable[type] = ()) -> str:
    """The settings of `cls` as a Markdown table: flag, environment variable, default, meaning; only those
    it adds to the settings classes `beyond`."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    inherited = {field.name for base in beyond for field in dataclasses.fields(base)}
    for field in (field for field in dataclasses.fields(cls) if field.name not in inherited):
        rows.append(
            f"| `{flag_name(field.name)}` | `{env_name(field.name)}` | {default_text(field)} | "
            f"{field.metadata['help']} |"
        )
    return "\n".join(rows)


MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the default of --max-message-mb, for clients without a config

# Client-side load-balancing policies of gRPC that --lb-policy may name.
LB_POLICIES = ("round_robin", "pick_first")


def split_host_port(address: str, flag: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) as (host, port); ValueError naming `flag` otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag}: {address!r} is not host:port")
    return host, int(port)


def check_target(target: str, flag: str) -> None:
    """Raises ValueError naming `flag` unless `target` is a gRPC target a service may dial.

    Accepted: `host:port`; `dns:///host:port` (or `dns://resolver/host:port`), whose every address is a
    backend balanced by --lb-policy and re-resolved when connections drop; `ipv4:a.b.c.d:port,...` and
    `ipv6:[addr]:port,...`, fixed address lists. A port is required: gRPC would silently pick 443.
    """
    scheme, sep, rest = target.partition(":")
    if not sep or scheme not in ("dns", "ipv4", "ipv6"):
        split_host_port(target, flag)
        return
    if scheme == "dns":
        if rest.startswith("//"):
            rest = rest[2:].partition("/")[2]
        split_host_port(rest, flag)
        return
    version = 4 if scheme == "ipv4" else 6
    for address in rest.split(","):
        host, _ = split_host_port(address, flag)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is None or ip.version != version or (version == 6 and not address.startswith("[")):
            example = "1.2.3.4:50050" if version == 4 else "[fd00::1]:50050"
            raise ValueError(f"{flag}: {address!r} in {target!r} is not an {scheme} address:port ({example})")


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Settings every service shares. Subclasses redeclare `port` and `metrics_port` defaults."""

    host: str = setting("127.0.0.1", "address to bind the gRPC and metrics ports on (0.0.0.0 in containers)")
    port: int = setting(0, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(0, "Prometheus metrics port (0 picks a free port; -1 disables)")
    drain_grace_s: float = setting(10.0, "seconds in-flight RPCs get to finish after SIGTERM")
    log_level: str = setting("INFO", "logging level (DEBUG, INFO, WARNING, ERROR)")
    keepalive_ms: int = setting(
        30_000, "ms between HTTP/2 keepalive pings on channels to peer services (finds dead peers)", above=0
    )
    reconnect_backoff_ms: int = setting(
        100,
        "first wait before redialling a peer service that went away (growing 1.6x a try, to 10x): a "
        "restarted peer is found again within a fraction of a second, not gRPC's default 1-120 s",
        above=0,
    )
    reuse_port: bool = setting(
        False,
        "let a replacement process bind the same gRPC port (SO_REUSEPORT) and serve before this one drains; "
        "off, a second process on the port fails to start",
    )
    max_message_mb: int = setting(
        MAX_MESSAGE_BYTES >> 20, "largest gRPC message accepted or sent, in MiB", above=0
    )
    tls_cert: str = setting("", "PEM certificate chain; with --tls-key, serves TLS and dials peers over TLS")
    tls_key: str = setting("", "PEM private key for --tls-cert")
    tls_ca: str = setting(
        "", "PEM CA bundle: verifies peers; on a server it also requires client certificates"
    )
    health_port: int = setting(
        -1,
        "plaintext port serving only the gRPC health service, with the main port's SERVING state, for "
        "kubelet probes (which cannot present a client certificate); -1 disables, 0 picks a free port",
    )
    lb_policy: str = setting(
        "round_robin",
        "load balancing over the addresses of a peer target (dns:///name:port lists every replica): "
        "round_robin spreads calls, pick_first keeps one connection",
        choices=LB_POLICIES,
    )
    max_connection_age_s: float = setting(
        30.0,
        "seconds after which the server asks a client to reconnect (GOAWAY), so clients re-resolve "
        "and new replicas get traffic (0: never)",
        minimum=0,
    )
    max_connection_age_grace_s: float = setting(
        10.0, "seconds the calls in flight on such a connection get to finish before it closes", minimum=0
    )
    otlp_endpoint: str = setting(
        "",
        "OpenTelemetry collector that receives traces over OTLP/gRPC (http://collector:4317 plaintext, "
        "https:// TLS); empty: tracing off",
    )
    gc_freeze: bool = setting(
        True,
        "once warm, collect and freeze the start-up heap (gc.freeze) so later garbage collections skip it: "
        "a full collection of a ranker's heap otherwise stops it for 100+ ms",
    )
    trace_sample_ratio: float = setting(
        0.01,
        "share of Recommends traced, decided where the trace starts (the retrieval stub); the other services "
        "follow their caller's decision",
        minimum=0,
    )

    def validate(self) -> None:
        check(self)
        if self.trace_sample_ratio > 1:
            raise ValueError("--trace-sample-ratio must be at most 1")
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError("--otlp-endpoint must start with http:// (plaintext) or https:// (TLS)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key must be given together")
        if not -1 <= self.health_port < 65536:
            raise ValueError("--health-port must be a port number, 0 (a free port) or -1 (off)")
        if self.health_port > 0 and self.health_port in (self.port, self.metrics_port):
            raise ValueError("--health-port must differ from --port and --metrics-port")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)
