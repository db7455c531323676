#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/: small, meaningful inputs for each target.

Run from anywhere: `python3 fuzz/seeds.py`. It rewrites the seed files it knows (named
`seed-*`) and leaves any other corpus file alone. The protobuf seeds are encoded here by hand
(field numbers from proto/rota/v1/rota.proto), so nothing but Python 3 is needed.
"""

import pathlib

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / f"seed-{name}").write_bytes(bytes(data))


# --- rule_parse ------------------------------------------------------------------------------

RULES = {
    "round-robin": "round_robin",
    "repeat": "repeat(n=5)",
    "spaced": " repeat( n = 5 ) ",
    "retry": "retry(rule=repeat(n=2), max_ms=200)",
    "retry-hash": "retry(rule=consistent_hash(balance=2.5),max_ms=60000)",
    "hash": "consistent_hash(balance=1.25)",
    "sticky": "sticky(ttl=1h 30m)",
    "least-request": "least_request(choices=3)",
    "availability": "availability_filtering(limit=7)",
    "weighted": "weighted()",
    "retry-sticky": "retry(rule=sticky)",
    "unbalanced": "retry(rule=repeat(n=2)",
    # A duration a nanosecond past the end of the range: an error, never an overflow.
    "ttl-at-the-end": "sticky(ttl=18446744073709551615s 1000000000ns)",
}
for name, text in RULES.items():
    write("rule_parse", name, text)

# --- policy_toml -----------------------------------------------------------------------------

POLICIES = {
    "doc": """[defaults]
rule = "round_robin"
isolation_fallback = "fail"

[services.orders]
rule = "repeat(n=3)"
breaker = { failure_threshold = 3, blackout_base = "10s", blackout_max = "30s" }
gray = { unversioned = 90, versions = { v2 = 10 } }
""",
    "gray-everywhere": """[defaults]
rule = "weighted"
gray = { unversioned = 1, versions = { canary = 1 } }

[services.payments]
isolation_fallback = "any"
gray = { unversioned = 5, versions = { canary = 2 } }

[services."a.b-c:d"]
rule = "sticky(ttl=90s)"
""",
    "breaker-table": """[services.search]
rule = "retry(rule=least_request, max_ms=250)"

[services.search.breaker]
failure_threshold = 1000
blackout_base = "1ms"
blackout_max = "1h"
""",
    "server-too": """[server]
listen = "127.0.0.1:50051"

[defaults]
rule = "consistent_hash(balance=1.5)"
""",
}
for name, text in POLICIES.items():
    write("policy_toml", name, text)

# --- config_toml -----------------------------------------------------------------------------

SCRATCH = "/tmp/rota-fuzz-config"
CONFIGS = {
    "server": """[server]
listen = "127.0.0.1:7000"
admin_listen = "off"
heartbeat_timeout = "20s"
max_instances_per_stream = 10
shutdown_grace = "3s"
in_flight_timeout = "1m"
latency_decay = "30s"
max_registrations_per_peer = 5
max_message_bytes = 1048576
service_idle_timeout = "10m"
max_services = 100
""",
    "tls": f"""[server]
listen = "127.0.0.1:7443"
tls_cert = "{SCRATCH}/cert.pem"
tls_key = "{SCRATCH}/key.pem"
tls_client_ca = "{SCRATCH}/cert.pem"
""",
    "auth": f"""[server]
listen = "0.0.0.0:50051"

[[auth.tokens]]
name = "ops"
token_file = "{SCRATCH}/token"
scopes = ["admin", "pick", "register:orders"]
""",
    "insecure-policies": """[server]
listen = "[::]:50051"
insecure = true

[defaults]
rule = "random"

[services.orders]
rule = "repeat(n=3)"
gray = { unversioned = 9, versions = { v2 = 1 } }
""",
    "bad-duration": """[server]
heartbeat_timeout = "0s"
""",
}
for name, text in CONFIGS.items():
    write("config_toml", name, text)

# --- request_decode --------------------------------------------------------------------------


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, value):
    """One field: ints as varints, str/bytes as length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def map_entries(number, mapping):
    return [(number, message((1, k), (2, v))) for k, v in mapping.items()]


def instance(service, id, host="127.0.0.1", port=9000, version="", zone="", weight=None, status=0, metadata=None):
    fields = [(1, id), (2, service), (3, host), (4, port), (5, version), (6, zone)]
    if weight is not None:
        fields.append((7, weight))
    fields += map_entries(8, metadata or {})
    fields.append((9, status))
    return message(*[(n, v) for n, v in fields if v != "" and v != 0 or n == 7])


def record(selector, body):
    return bytes([selector]) + varint(len(body)) + body


(PICK, LEASE, REPORT, REGISTER, WATCH, LIST_INSTANCES, LIST_SERVICES, SET_POLICY, GET_POLICY, LIST_POLICIES, UPDATE,
 RESET_POLICY) = range(12)


def pick(service, rule="", version="", key="", zone="", exclude=()):
    fields = [(1, service), (2, rule), (3, version), (4, key), (5, zone)] + [(6, e) for e in exclude]
    return message(*[(n, v) for n, v in fields if v])


def ref(service, id):
    return message((1, service), (2, id))


REQUESTS = {
    "pick-round-robin": [record(PICK, pick("svc"))],
    "pick-version-exclude": [record(PICK, pick("svc", "round_robin", "v2", exclude=["a"]))],
    "pick-hash": [record(PICK, pick("svc", "consistent_hash(balance=1.25)", key="user-42"))],
    "pick-sticky-zone": [record(PICK, pick("svc", "sticky(ttl=30s)", key="k", zone="z1")),
                         record(PICK, pick("svc", "zone_avoidance", zone="z2"))],
    "pick-retry": [record(PICK, pick("svc", "retry(rule=weighted, max_ms=100)", exclude=["a", "b"]))],
    "pick-gray": [record(PICK, pick("gray")), record(PICK, pick("gray", "least_request(choices=2)"))],
    "pick-unknown": [record(PICK, pick("nobody", "random")), record(PICK, pick("bad name"))],
    "lease": [record(LEASE, message((1, "svc"), (2, "repeat(n=2)"), (4, 10)))],
    "lease-weighted": [record(LEASE, message((1, "svc"), (2, "weighted"), (3, "v2"), (4, 65536)))],
    "report": [record(REPORT, message(
        (1, message((1, "svc"), (2, "a"), (3, 1), (4, "round_robin"), (5, 1500), (6, 1))),
        (1, message((1, "svc"), (2, "d"), (5, 90000), (6, 2))),
        (1, message((1, "gone"), (2, "x"), (6, 3))),
    )), record(PICK, pick("svc", "response_time"))],
    "report-failures-then-best": [record(REPORT, message(
        *[(1, message((1, "svc"), (2, "a"), (6, 2)))] * 4)), record(PICK, pick("svc", "best_available"))],
    "register-announce": [record(REGISTER, message((1, message(
        (1, instance("svc", "p1", version="v2", zone="z1", weight=7, metadata={"team": "x"})),
        (1, instance("svc", "a")),
        (1, instance("new", "", host="10.0.0.1", port=80, status=2)),
    )))), record(PICK, pick("svc", "", "v2")), record(PICK, pick("new"))],
    "register-update-withdraw": [
        record(REGISTER, message((1, message((1, instance("svc", "p1")))))),
        record(REGISTER, message((3, message((1, ref("svc", "p1")), (2, 0), (3, 2), (4, message(*map_entries(1, {"k": "v"}))))))),
        record(REGISTER, message((2, b""))),
        record(REGISTER, message((4, message((1, ref("svc", "p1")), (1, ref("svc", "a")))))),
        record(REGISTER, message((4, b""))),
    ],
    "watch-list": [record(WATCH, message((1, "svc"))), record(WATCH, message((1, "unseen"))),
                   record(LIST_INSTANCES, message((1, "solo"))), record(LIST_SERVICES, b"")],
    "set-policy": [record(SET_POLICY, message((1, message(
        (1, "svc"), (2, "repeat(n=3)"), (3, 2),
        (4, message((1, 1), *[(2, message((1, "v2"), (2, 3)))])),
        (5, message((1, 2), (2, 100), (3, 1000))),
    )))), record(GET_POLICY, message((1, "svc"))), record(LIST_POLICIES, b""), record(PICK, pick("svc"))],
    "reset-policy": [record(SET_POLICY, message((1, message((1, "solo"), (2, "repeat(n=2)"))))),
                     record(RESET_POLICY, message((1, "solo"))), record(RESET_POLICY, message((1, "solo"))),
                     record(RESET_POLICY, message((1, "gray"))), record(PICK, pick("solo"))],
    "set-policy-bad": [record(SET_POLICY, message((1, message((1, "svc"), (3, 7))))),
                       record(SET_POLICY, message((1, message((1, "svc"), (5, message((2, 5000), (3, 10)))))))],
    "update-direct": [record(REGISTER, message((1, message((1, instance("solo", "mine")))))),
                      record(UPDATE, message((1, ref("solo", "mine")), (2, 0), (3, 3)))],
}
for name, records in REQUESTS.items():
    write("request_decode", name, b"".join(records))

# --- registry_model --------------------------------------------------------------------------
# One byte per operation: 3 * kind + stream. Kinds: 0 announce, 1 update, 2 withdraw, 3 close,
# 4 heartbeat, 5 advance. Instance bytes (x, y) as in fuzz_targets/registry_model.rs `spec`.

ANNOUNCE, UPDATE_OP, WITHDRAW, CLOSE, HEARTBEAT, ADVANCE = range(6)


def op(kind, stream, *args):
    return bytes([3 * kind + stream, *args])


def x(service=0, id=0, version=0, odd=0):
    """service 0..2 (s1..s3), id 0..3 (a, b, c, none), version 0/1 (none, v1), odd 9/10."""
    return (odd * 24 if odd else 0) + version * 12 + id * 3 + service


def y(weight=0, status=0, metadata=0, port2=False, no_host=False):
    """weight 0..4 (unset, 0, 1, 100, max), status 0..4 (unset, up, draining, down, unknown)."""
    if no_host:
        return 250 + weight
    return (50 if port2 else 0) + metadata * 25 + status * 5 + weight


def target(service=0, id=0):
    """service 0..3 (s1..s3, invalid), id 0..3 (a, b, h:1, empty)."""
    return id * 4 + service


MODEL = {
    "owner-wins": op(ANNOUNCE, 0, 1, x(), y())
    + op(ANNOUNCE, 1, 1, x(), y(weight=3))
    + op(WITHDRAW, 1, 1, target())
    + op(UPDATE_OP, 1, target(), y(weight=2)),
    "update-withdraw": op(ANNOUNCE, 2, 2, x(), y(), x(id=1), y(status=1, metadata=1))
    + op(UPDATE_OP, 2, target(), y(weight=2, status=2))
    + op(UPDATE_OP, 2, target(id=1), 75)
    + op(UPDATE_OP, 2, target(id=1), 50)
    + op(WITHDRAW, 2, 1, target(id=1))
    + op(WITHDRAW, 2, 0),
    "expiry": op(ANNOUNCE, 0, 1, x(), y())
    + op(ADVANCE, 0, 8)
    + op(HEARTBEAT, 0)
    + op(ADVANCE, 0, 8)
    + op(ADVANCE, 0, 8)
    + op(ANNOUNCE, 0, 1, x(id=1), y())
    + op(WITHDRAW, 0, 0)
    + op(CLOSE, 0)
    + op(ANNOUNCE, 0, 1, x(id=1), y()),
    "instance-limit": op(ANNOUNCE, 2, 5, *[v for i in range(5) for v in (x(id=i % 3), y())])
    + op(ANNOUNCE, 2, 4, x(), y(), x(id=1), y(), x(id=2), y(), x(id=3), y())
    + op(ANNOUNCE, 2, 1, x(id=3), y(port2=True))
    + op(ANNOUNCE, 2, 2, x(), y(weight=4), x(), y(weight=1)),
    "service-limits": op(ANNOUNCE, 0, 1, x(service=0), y())
    + op(ANNOUNCE, 1, 1, x(service=1), y())
    + op(ANNOUNCE, 2, 2, x(service=1), y(), x(service=2), y())
    + op(CLOSE, 0)
    + op(ANNOUNCE, 1, 1, x(service=1, id=1), y()),
    "idle-forget": op(ANNOUNCE, 2, 1, x(service=2), y())
    + op(WITHDRAW, 2, 0)
    + op(ADVANCE, 2, 15)
    + op(HEARTBEAT, 2)
    + op(ADVANCE, 2, 15)
    + op(ANNOUNCE, 2, 1, x(service=2), y()),
    "invalid": op(ANNOUNCE, 1, 4, x(odd=9), y(), x(odd=10), y(), x(), y(status=4), x(id=3), y(no_host=True))
    + op(ANNOUNCE, 1, 0)
    + op(UPDATE_OP, 1, target(service=3), y())
    + op(UPDATE_OP, 1, target(id=3), y()),
}
for name, data in MODEL.items():
    write("registry_model", name, data)
