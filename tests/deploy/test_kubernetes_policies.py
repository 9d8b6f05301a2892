"""deploy/k8s/network-policy.yaml: everything denied unless allowed, each pod talking only to whom it
must, with plain Redis and under Sentinel, and the traffic Sentinel needs let through; the example
Ingress, from the namespace the router's policy lets in."""

from __future__ import annotations

import yaml

from tests.deploy.kubernetes_objects import K8S, Object, one_object
from tests.support.deploy.schemas import kubernetes_validator, schema_errors

# The label of the policy that lets workers out to their models' store: an addition to the
# worker's own policy, read on its own (test_the_workers_reach_their_model_store_and_nothing_else).
MODEL_STORE_LABEL = ("switchboard.io/egress", "model-store")


def _is_store_egress(policy: Object) -> bool:
    key, value = MODEL_STORE_LABEL
    return bool(policy["metadata"].get("labels", {}).get(key) == value)


def _policies(manifests: list[Object]) -> list[Object]:
    """The namespace's policies, but the model store's egress."""
    return [
        document
        for document in manifests
        if document["kind"] == "NetworkPolicy" and not _is_store_egress(document)
    ]


def _selects(policy: Object, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are read here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _pod_labels(manifests: list[Object]) -> dict[str, dict[str, str]]:
    return {
        document["metadata"]["name"]: document["spec"]["template"]["metadata"]["labels"]
        for document in manifests
        if document["kind"] in ("Deployment", "StatefulSet")
    }


def _peers(policy: Object, direction: str) -> list[tuple[Object, list[Object]]]:
    """(peer, ports) of each rule of a policy, `from` for ingress, `to` for egress."""
    side = "from" if direction == "ingress" else "to"
    return [
        (peer, rule.get("ports", []))
        for rule in policy["spec"].get(direction, [])
        for peer in rule.get(side, [{}])  # a rule with no peers allows every peer
    ]


def test_everything_is_denied_unless_a_policy_allows_it(either_manifests: list[Object]) -> None:
    manifests = either_manifests
    policies = _policies(manifests)
    deny = [
        policy
        for policy in policies
        if policy["spec"]["podSelector"] == {}
        and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not policy["spec"].get("ingress")
        and not policy["spec"].get("egress")
    ]
    assert len(deny) == 1, "one default-deny policy selects every pod of the namespace"
    for name, labels in _pod_labels(manifests).items():
        own = [policy for policy in policies if policy["spec"]["podSelector"] and _selects(policy, labels)]
        assert len(own) == 1, f"{name}: one policy of its own says what it may do"
        assert set(own[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # DNS, for every pod, and nothing else in that policy.
    (dns,) = [policy for policy in policies if policy["metadata"]["name"] == "switchboard-dns"]
    assert dns["spec"]["podSelector"] == {} and dns["spec"]["policyTypes"] == ["Egress"]
    ((peer, ports),) = [(peer, ports) for peer, ports in _peers(dns, "egress")]
    assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert {(port["protocol"], port["port"]) for port in ports} == {("UDP", 53), ("TCP", 53)}


def _own_policy(manifests: list[Object], name: str) -> Object:
    labels = _pod_labels(manifests)[name]
    (policy,) = [p for p in _policies(manifests) if p["spec"]["podSelector"] and _selects(p, labels)]
    return policy


def _named(peer: Object) -> str:
    """Who a peer is: a pod of this namespace by its name label, or a namespace by its name."""
    if "namespaceSelector" in peer:
        assert "podSelector" not in peer
        return "namespace " + peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    return peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]


def _named_ports(manifests: list[Object]) -> dict[str, dict[str, int]]:
    """Pod name → its container's named ports, for every Deployment and StatefulSet."""
    return {
        document["metadata"]["name"]: {
            port["name"]: port["containerPort"]
            for container in document["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
        }
        for document in manifests
        if document["kind"] in ("Deployment", "StatefulSet")
    }


def _allowed(manifests: list[Object], policy: Object, direction: str) -> set[tuple[str, int]]:
    """(peer, port number) a policy allows; named ports are the selected pods' own (ingress)."""
    ports = _named_ports(manifests)
    selected = [name for name, labels in _pod_labels(manifests).items() if _selects(policy, labels)]
    found = set()
    for peer, peer_ports in _peers(policy, direction):
        assert peer_ports, "every rule names its ports"
        for port in peer_ports:
            number = port["port"]
            if isinstance(number, str):
                assert direction == "ingress", "egress rules name port numbers"
                numbers = {ports[name][number] for name in selected}
                if not numbers:
                    continue  # no pod here has that port (the sentinels' rules without Sentinel)
                (number,) = numbers
            found.add((_named(peer), number))
    return found


def test_each_pod_talks_only_to_whom_it_must(either_manifests: list[Object]) -> None:
    manifests = either_manifests
    policies = {
        name: next(p for p in _policies(manifests) if p["metadata"]["name"] == name)
        for name in (
            "switchboard-router",
            "switchboard-worker",
            "switchboard-redis",
            "switchboard-redis-sentinel",
        )
    }

    def allowed(name: str, direction: str) -> set[tuple[str, int]]:
        return _allowed(manifests, policies[name], direction)

    redis_out = {("switchboard-redis", 6379), ("switchboard-redis-sentinel", 26379)}
    # The router: requests from the ingress controller, scrapes from Prometheus; out, Redis alone
    # (under Sentinel, the sentinels first).
    router_port = _named_ports(manifests)["switchboard-router"]["http"]
    assert allowed("switchboard-router", "ingress") == {
        ("namespace ingress-nginx", router_port),
        ("namespace monitoring", router_port),
    }
    assert allowed("switchboard-router", "egress") == redis_out
    # Workers: only Prometheus' scrapes of the metrics port in; out, Redis alone.
    assert allowed("switchboard-worker", "ingress") == {
        ("namespace monitoring", _named_ports(manifests)["switchboard-worker"]["metrics"])
    }
    assert allowed("switchboard-worker", "egress") == redis_out
    # Redis: the router, the workers and KEDA's operator in; under Sentinel, the sentinels and the
    # other Redis pod too; out, only the other Redis pod and the sentinels.
    clients = {"switchboard-router", "switchboard-worker", "namespace keda"}
    assert allowed("switchboard-redis", "ingress") == {
        (client, 6379) for client in clients | {"switchboard-redis-sentinel", "switchboard-redis"}
    }
    assert allowed("switchboard-redis", "egress") == redis_out
    # The sentinels (their rules select no pod without Sentinel): asked by the clients, the Redis
    # pods and each other; out, the Redis pods and each other.
    if "switchboard-redis-sentinel" in _pod_labels(manifests):
        assert allowed("switchboard-redis-sentinel", "ingress") == {
            (client, 26379) for client in clients | {"switchboard-redis", "switchboard-redis-sentinel"}
        }
    assert allowed("switchboard-redis-sentinel", "egress") == redis_out


def _lets_through(manifests: list[Object], client: str, server: str, port: int) -> bool:
    """Whether the policies let `client` (a pod's name, or `namespace X`) reach `server` on `port`:
    the client's own policy lets it out (when it is ours), the server's lets it in."""
    labels = _pod_labels(manifests)
    inbound = _allowed(manifests, _own_policy(manifests, server), "ingress")
    if client.startswith("namespace "):
        return (client, port) in inbound
    outbound = _allowed(manifests, _own_policy(manifests, client), "egress")
    server_name = labels[server]["app.kubernetes.io/name"]
    client_name = labels[client]["app.kubernetes.io/name"]
    return (server_name, port) in outbound and (client_name, port) in inbound


def test_the_traffic_sentinel_needs_is_let_through(sentinel_manifests: list[Object]) -> None:
    manifests = sentinel_manifests
    sentinel, redis = "switchboard-redis-sentinel", "switchboard-redis"
    needed = [
        # The clients ask the sentinels for the primary, then use it.
        *[
            (client, server)
            for client in ("switchboard-router", "switchboard-worker", "namespace keda")
            for server in (sentinel, redis)
        ],
        (sentinel, redis),  # watching, and reconfiguring at a failover
        (sentinel, sentinel),  # hellos, votes
        (redis, redis),  # a replica copies its primary
        (redis, sentinel),  # a starting pod asks which pod is the primary
    ]
    ports = _named_ports(manifests)
    for client, server in needed:
        port = ports[server]["sentinel" if server == sentinel else "redis"]
        assert _lets_through(manifests, client, server, port), f"{client} cannot reach {server}:{port}"
    # And nothing else reaches them: not the ingress controller, not Prometheus.
    for outsider in ("namespace ingress-nginx", "namespace monitoring"):
        assert not _lets_through(manifests, outsider, sentinel, ports[sentinel]["sentinel"])
        assert not _lets_through(manifests, outsider, redis, ports[redis]["redis"])


def test_the_ingress_example_serves_the_router_over_tls(manifests: list[Object]) -> None:
    ingress = yaml.safe_load((K8S / "ingress.yaml").read_text())
    assert schema_errors(kubernetes_validator(ingress["apiVersion"], ingress["kind"]), ingress) == []
    spec = ingress["spec"]
    (tls,) = spec["tls"]
    (rule,) = spec["rules"]
    assert rule["host"] in tls["hosts"] and tls["secretName"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    (path,) = rule["http"]["paths"]
    service = one_object(manifests, "Service", "switchboard-router")
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    # The ingress controller's namespace is the one the router's policy lets in.
    controller = "namespace ingress-nginx"
    assert controller in {
        _named(peer) for peer, _ in _peers(_own_policy(manifests, "switchboard-router"), "ingress")
    }


PRIVATE_RANGES = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}
LINK_LOCAL = "169.254.0.0/16"  # the instance metadata service: a node role's credentials


def test_the_workers_reach_their_model_store_and_nothing_else(manifests: list[Object]) -> None:
    (store,) = [d for d in manifests if d["kind"] == "NetworkPolicy" and _is_store_egress(d)]
    spec = store["spec"]
    assert schema_errors(kubernetes_validator("networking.k8s.io/v1", "NetworkPolicy"), store) == []
    selected = [name for name, labels in _pod_labels(manifests).items() if _selects(store, labels)]
    assert selected == ["switchboard-worker"]
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    ((peer, ports),) = _peers(store, "egress")
    assert ports == [{"protocol": "TCP", "port": 443}]  # HTTPS only: S3, STS, the Hub
    # Beyond the cluster: not into the namespace's pods, other namespaces or the node's metadata.
    assert peer["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert PRIVATE_RANGES | {LINK_LOCAL} <= set(peer["ipBlock"]["except"])
