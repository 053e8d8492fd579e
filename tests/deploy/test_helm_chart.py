"""The Helm chart in deploy/helm/nereid: `helm lint` and `helm template` for every values file in its ci/ folder,
`kubernetes-validate --strict` on each rendered manifest, the settings a cluster relies on (probes, termination grace
against --exit-timeout-secs, GPU scheduling, S3), and the prometheus-adapter rule evaluated on real scrapes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.adapter_rule import CHART, adapter_rule, measure_under_load, write_slow_model
from tests.servers import RunningServer, start_nereid

VALUES_FILES = sorted((CHART / "ci").glob("*.yaml"))
BUILT_IN_KINDS = {
    "Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap",
    "PersistentVolumeClaim",
}  # fmt: skip


def _template(helm: str, values: Path | None, *sets: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [helm, "template", "demo", str(CHART), "--namespace", "serving"]
    if values is not None:
        command += ["-f", str(values)]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _render(helm: str, values: Path | None, *sets: str) -> dict[str, dict[str, Any]]:
    """The rendered objects by `Kind/name`."""
    docs = [d for d in yaml.safe_load_all(_template(helm, values, *sets).stdout) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def _of_kind(objects: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for key, o in objects.items() if key.startswith(kind + "/")]
    assert len(found) == 1, f"expected one {kind}, got {sorted(objects)}"
    return found[0]


def _container(objects: dict[str, dict[str, Any]], kind: str = "Deployment") -> dict[str, Any]:
    return _of_kind(objects, kind)["spec"]["template"]["spec"]["containers"][0]


def test_ci_values_files_exist_for_each_shape_of_deployment() -> None:
    names = {p.stem for p in VALUES_FILES}
    assert {"pvc-values", "gpu-values", "s3-autoscaling-values", "statefulset-values"} <= names


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_helm_lint_passes_strictly(helm: str, values: Path) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_every_rendered_manifest_passes_kubernetes_validate_strict(helm: str, values: Path, tmp_path: Path) -> None:
    rendered = _template(helm, values).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    validated = 0
    for index, doc in enumerate(docs):
        if doc["kind"] not in BUILT_IN_KINDS:
            continue  # custom resources (ServiceMonitor) have no bundled schema; checked on their own below
        path = tmp_path / f"{index}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        result = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", str(path)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{doc['kind']}/{doc['metadata']['name']}: {result.stdout}{result.stderr}"
        assert "passed" in result.stdout
        validated += 1
    assert validated >= 3  # at least the workload, its Service and the PDB


def test_validation_rejects_a_manifest_with_an_unknown_field(tmp_path: Path) -> None:
    """The strict check is not a rubber stamp: a misspelt field fails it."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                                    "spec": {"ports": [{"port": 80}], "selectr": {"a": "b"}}}))  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0


def test_probes_use_the_health_endpoints_with_strict_readiness(helm: str) -> None:
    container = _container(_render(helm, CHART / "ci" / "pvc-values.yaml"))
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "--strict-readiness=true" in container["args"]
    assert "--model-repository=/models/repository" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}


@pytest.mark.parametrize(("values", "kind", "exit_timeout", "grace"), [
    ("pvc-values", "Deployment", "30", 5 + 30 + 5),
    ("gpu-values", "Deployment", "120", 5 + 120 + 5),
    ("statefulset-values", "StatefulSet", "45.5", 0 + 46 + 5),
])  # fmt: skip
def test_termination_grace_covers_the_pre_stop_sleep_and_the_exit_timeout(
    helm: str, values: str, kind: str, exit_timeout: str, grace: int
) -> None:
    objects = _render(helm, CHART / "ci" / f"{values}.yaml")
    pod = _of_kind(objects, kind)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    assert f"--exit-timeout-secs={exit_timeout}" in pod["containers"][0]["args"]


def test_gpu_values_request_a_gpu_and_tolerate_the_gpu_taint(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "gpu-values.yaml")
    pod = _of_kind(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    claim = _of_kind(objects, "PersistentVolumeClaim")
    assert pod["volumes"][1]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "--model-memory-budget=gpu0:70GB" in pod["containers"][0]["args"]


def test_s3_values_pass_the_url_the_cache_folder_and_the_credentials_secret(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "s3-autoscaling-values.yaml")
    container = _container(objects)
    assert "--model-repository=s3://minio.storage:9000/models/production" in container["args"]
    assert "--model-control-mode=poll" in container["args"] and "--repository-poll-secs=30" in container["args"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TRITON_AWS_MOUNT_DIRECTORY"] == "/var/cache/nereid/s3"
    assert container["envFrom"] == [{"secretRef": {"name": "nereid-s3"}}]
    assert not any("persistentVolumeClaim" in v for v in _of_kind(objects, "Deployment")["spec"]["template"]["spec"]["volumes"])


def test_hpa_targets_the_queue_time_metric_and_the_service_monitor_selects_the_service(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "s3-autoscaling-values.yaml")
    hpa = _of_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-nereid"}
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "avg_time_queue_us"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert "replicas" not in _of_kind(objects, "Deployment")["spec"]  # the HPA owns the count
    monitor = _of_kind(objects, "ServiceMonitor")
    service = objects["Service/demo-nereid"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert _of_kind(objects, "ConfigMap")["metadata"]["namespace"] == "monitoring"


def test_alert_rules_watch_drift_and_rollbacks_with_the_values_threshold(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "s3-autoscaling-values.yaml")
    rules = {rule["alert"]: rule for group in _of_kind(objects, "PrometheusRule")["spec"]["groups"] for rule in group["rules"]}
    assert set(rules) == {"NereidInputDrift", "NereidOutputDrift", "NereidRolloutRolledBack"}
    assert rules["NereidInputDrift"]["expr"] == "max by (model, version, input) (nereid_input_drift_psi) > 0.3"
    assert rules["NereidRolloutRolledBack"]["expr"] == "increase(nereid_rollout_rollbacks_total[15m]) > 0"
    assert "{{ $labels.model }}" in rules["NereidInputDrift"]["annotations"]["summary"]  # left for Prometheus
    off = _render(helm, CHART / "ci" / "gpu-values.yaml")
    assert not [key for key in off if key.startswith("PrometheusRule/")]  # off unless asked for


def test_statefulset_gets_a_headless_service_and_the_pdb_its_minimum(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "statefulset-values.yaml")
    assert objects["StatefulSet/demo-nereid"]["spec"]["serviceName"] == "demo-nereid-headless"
    assert objects["Service/demo-nereid-headless"]["spec"]["clusterIP"] == "None"
    assert objects["PodDisruptionBudget/demo-nereid"]["spec"]["minAvailable"] == 2
    assert "lifecycle" not in _container(objects, "StatefulSet")  # preStopSleepSeconds: 0
    # Each pod keeps its local copy of the S3 repository on its own claim, so a restart fetches only what changed.
    statefulset = objects["StatefulSet/demo-nereid"]["spec"]
    [claim] = statefulset["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "s3-cache" and claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert "s3-cache" not in {v["name"] for v in statefulset["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in _container(objects, "StatefulSet")["volumeMounts"]}
    assert mounts["s3-cache"] == "/var/cache/nereid/s3"
    assert statefulset["template"]["spec"]["securityContext"]["fsGroup"] == 1000


@pytest.mark.parametrize(("sets", "message"), [
    (("modelRepository.source=s3",), "modelRepository.s3.url is required"),
    (("modelRepository.source=nfs",), "modelRepository.source must be pvc or s3"),
    (("modelRepository.pvc.claimName=",), "modelRepository.pvc.claimName is required"),
    (("workload.kind=DaemonSet", "modelRepository.pvc.claimName=m"), "workload.kind must be Deployment or StatefulSet"),
    (("modelRepository.source=s3", "modelRepository.s3.url=s3://b/p", "modelRepository.s3.persistentCache.enabled=true"),
     "modelRepository.s3.persistentCache needs workload.kind StatefulSet"),
])  # fmt: skip
def test_bad_values_fail_rendering_with_a_clear_message(helm: str, sets: tuple[str, ...], message: str) -> None:
    result = _template(helm, None, *sets, check=False)
    assert result.returncode != 0
    assert message in result.stderr


# -- the prometheus-adapter rule against Nereid's own metrics ------------------------------------------------------


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("repo")
    write_slow_model(repository)
    running = start_nereid(repository, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop()


def test_adapter_rule_on_two_scrapes_under_load_is_the_queue_time_per_request(helm: str, slow_server: RunningServer) -> None:
    rule, query = adapter_rule(helm)
    assert rule["name"]["as"] == "avg_time_queue_us"
    assert rule["seriesQuery"].startswith("nv_inference_queue_duration_us{")
    assert (query["queue"], query["success"]) == ("nv_inference_queue_duration_us", "nv_inference_request_success")
    measured = measure_under_load(slow_server, query)
    assert measured.idle_value == 0.0  # no traffic: nothing to scale on
    assert measured.served >= 4 * 20, measured
    # The rule's value (undoing its +1) is the statistics endpoint's queue time per request over the same window.
    assert measured.value * (1 + measured.served) / measured.served == pytest.approx(measured.stats_queue_us_per_request, rel=0.15)
    # Four clients on one 20 ms instance: each request waits behind the others, tens of milliseconds, in microseconds.
    assert 10_000 < measured.value < 2_000_000, measured
