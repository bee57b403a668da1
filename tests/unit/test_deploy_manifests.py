"""deploy/: the Kubernetes manifests against the Kubernetes schemas (kubernetes-validate, strict:
an unknown or misspelt field fails), and the settings in them and in the container image
against the server they configure (its flags, ports, drain grace and metric names).

Offline: kubernetes-validate carries the schemas. KServe's kinds are custom resources it has no
schema for; their references to each other and their server arguments are checked here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from trtserve.engine.metric_families import FAMILIES
from trtserve.serving.supervisor import STOP_SLACK_S

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
GPU_CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile.gpu"
KUBERNETES_VERSION = "1.30"  # HPA autoscaling/v2 and gRPC probes are GA from 1.27
CUSTOM_GROUPS = ("serving.kserve.io/",)  # KServe: checked by test_kserve_runtime_serves_the_service


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def by_kind(kind: str) -> dict:
    matches = [doc for _, doc in documents() if doc["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind} in deploy/k8s, found {len(matches)}"
    return matches[0]


def instructions(containerfile: Path, keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", containerfile.read_text())
    return [line[len(keyword) + 1:] for line in text.splitlines() if line.startswith(keyword + " ")]


def image_env(containerfile: Path = CONTAINERFILE) -> dict[str, str]:
    """The ENV instructions of a Containerfile, as a dict."""
    return dict(pair.split("=", 1) for args in instructions(containerfile, "ENV") for pair in args.split())


def container_env(container: dict) -> dict[str, str]:
    """What the server sees: the image's ENV, then the manifest container's ``env``."""
    return {**image_env(), **{e["name"]: e["value"] for e in container.get("env", [])}}


def serve_args(environ: dict[str, str], args: list[str], monkeypatch) -> argparse.Namespace:
    """``trtserve serve`` as the server parses it with these TRTSERVE_ variables and arguments
    (argparse exits 2 on an unknown flag or a bad value); every variable must name a flag."""
    from trtserve.cli import build_parser, env_name

    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    parser = build_parser("serve")
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    known = {env_name(a) for p in (parser, serve) for a in p._actions if a.option_strings}
    unknown = sorted(n for n in environ if n.startswith("TRTSERVE_") and n not in known)
    assert not unknown, f"not a `trtserve serve` flag: {unknown}"
    return parser.parse_args(["serve", *args])


@pytest.mark.parametrize(
    "name,doc", [(n, d) for n, d in documents() if not d["apiVersion"].startswith(CUSTOM_GROUPS)],
    ids=lambda v: v if isinstance(v, str) else v["kind"],
)
def test_each_resource_matches_the_kubernetes_schema(name, doc):
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        raise AssertionError(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message} at {where}") from None


def test_the_image_and_the_deployment_configure_real_flags(monkeypatch):
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = serve_args(container_env(container), [], monkeypatch)
    assert str(args.model_repository) == "/models" and args.allow_http is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": args.port, "http": args.http_port, "metrics": args.metrics_port}


def test_the_gpu_image_runs_the_server_as_the_cpu_image_does():
    """Containerfile.gpu is not built here: it keeps the CPU image's settings, user, health check
    and entry point (the parts a deployment relies on), checked line for line."""
    assert image_env(GPU_CONTAINERFILE) == image_env()
    for keyword in ("USER", "EXPOSE", "ENTRYPOINT", "CMD"):
        assert instructions(GPU_CONTAINERFILE, keyword)[-1:] == instructions(CONTAINERFILE, keyword)[-1:], keyword
    check = [h.split(" CMD ", 1)[1] for h in instructions(CONTAINERFILE, "HEALTHCHECK")]
    assert [h.split(" CMD ", 1)[1] for h in instructions(GPU_CONTAINERFILE, "HEALTHCHECK")] == check


def test_termination_grace_outlasts_the_drain(monkeypatch):
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    grace = serve_args(container_env(container), [], monkeypatch).grace_period
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(pre_stop[1]) + grace + STOP_SLACK_S
    assert pod["terminationGracePeriodSeconds"] > drain, (
        f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} s does not outlast the drain "
        f"(preStop {pre_stop[1]} s + grace {grace} s + stop slack {STOP_SLACK_S} s): the kubelet would kill it"
    )


def test_probes_and_service_use_the_servers_health_routes_and_ports():
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["readinessProbe"]["grpc"] == {"port": ports["grpc"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"] is True
    service = by_kind("Service")["spec"]
    assert {p["targetPort"] for p in service["ports"]} == set(ports)
    assert service["selector"] == by_kind("Deployment")["spec"]["selector"]["matchLabels"]
    assert by_kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == service["selector"]


def test_the_autoscaler_metric_is_an_adapter_rule_over_a_server_series():
    hpa = by_kind("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == by_kind("Deployment")["metadata"]["name"]
    (metric,) = hpa["metrics"]
    rules = yaml.safe_load(by_kind("ConfigMap")["data"]["config.yaml"])["rules"]
    served = [rule["name"]["as"] for rule in rules]
    assert metric["pods"]["metric"]["name"] in served, f"the HPA's metric is none of the adapter's {served}"
    exported = {name + ("_total" if family.kind == "counter" else "") for name, family in FAMILIES.items()}
    for rule in rules:
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert series in exported, f"the adapter rule reads {series}, which the server does not export"
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_kserve_runtime_serves_the_service(monkeypatch):
    runtime = by_kind("ServingRuntime")
    service = by_kind("InferenceService")["spec"]["predictor"]["model"]
    assert service["runtime"] == runtime["metadata"]["name"]
    assert service["modelFormat"] in [
        {k: f[k] for k in ("name", "version")} for f in runtime["spec"]["supportedModelFormats"]
    ]
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = runtime["spec"]["containers"]
    assert container["args"][0] == "serve"
    args = serve_args(container_env(container), container["args"][1:], monkeypatch)
    # KServe's conventions: the storage initializer's /mnt/models, REST on 8080, gRPC on 9000.
    assert (str(args.model_repository), args.http_port, args.port, args.allow_http) == ("/mnt/models", 8080, 9000, True)
    assert [p["containerPort"] for p in container["ports"]] == [8080]
