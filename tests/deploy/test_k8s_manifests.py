"""The k8s/ deployment as rendered by kustomize: every object valid, every worker deployed the way
the fleet expects to be run, secrets never inline, NATS configured for the users the fleet uses."""

from __future__ import annotations

import re
from collections.abc import Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml

from contracts.jobs import JOBS_STREAM
from infra.nats_accounts import grants, password_variable
from services.settings import Settings
from workers.compactor import COMPACTOR_DURABLE

from .manifests import (
    CRDS,
    K8S,
    NoSchema,
    Obj,
    containers,
    crd_validator,
    env_of,
    kustomize_command,
    nats_values,
    pod_spec,
    render,
    validate,
)

pytestmark = pytest.mark.skipif(
    kustomize_command() is None,
    reason="needs `kubectl` (built-in kustomize) or `kustomize` on PATH to render k8s/",
)

TREES = {"base": K8S / "base", "example": K8S / "overlays" / "example"}
WORKERS = ("recorder", "assembler", "budgeter", "compactor", "indexer")
WORKLOAD_KIND = {"recorder": "StatefulSet"} | {w: "Deployment" for w in WORKERS if w != "recorder"}
NATS_USERS_SECRET = "ctxfleet-nats-users"
DB_SECRET = "ctxfleet-db-app"
# Values that must only ever come from a Secret (a `value:` would put them in git).
SECRET_ENV = re.compile(r"^CTX_\w*(PASSWORD|TOKEN|API_KEY|DATABASE_URL)$")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: render(path) for name, path in TREES.items()}


@pytest.fixture(params=list(TREES))
def objects(request: pytest.FixtureRequest, rendered: dict[str, list[Obj]]) -> list[Obj]:
    return rendered[request.param]


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def worker(objects: list[Obj], name: str) -> Obj:
    return one(objects, WORKLOAD_KIND[name], f"ctxfleet-{name}")


def worker_container(objects: list[Obj], name: str) -> Obj:
    spec = pod_spec(worker(objects, name))
    assert spec is not None
    (container,) = spec["containers"]
    return container


def workloads(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for obj in objects:
        if (spec := pod_spec(obj)) is not None:
            yield obj, spec


def settings_configmap(objects: list[Obj]) -> Obj:
    (cm,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("ctxfleet-settings")
    ]
    return cm


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- every object is valid -------------------------------------------------------------------------


def test_every_rendered_object_is_valid_against_its_kubernetes_or_crd_schema(objects: list[Obj]) -> None:
    problems = []
    for obj in objects:
        try:
            validate(obj)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError, NoSchema) as exc:
            problems.append(f"{obj['kind']} {obj['metadata'].get('name')}: {str(exc).splitlines()[0]}")
    assert problems == []


def test_every_custom_kind_used_has_a_vendored_schema_with_a_named_source(objects: list[Obj]) -> None:
    sources = (CRDS / "SOURCES.md").read_text()
    custom = {(o["apiVersion"], o["kind"]) for o in objects if "." in o["apiVersion"].split("/")[0]}
    custom -= {(api, kind) for api, kind in custom if api.split("/")[0].endswith(".k8s.io")}
    for api_version, kind in sorted(custom):
        assert crd_validator(api_version, kind) is not None, f"no schema for {api_version} {kind}"
        group, _, version = api_version.rpartition("/")
        assert f"{group}_{version}_{kind.lower()}.json" in sources


def test_the_crd_schemas_reject_wrong_types_and_unknown_fields(rendered: dict[str, list[Obj]]) -> None:
    # Proves the vendored-schema validation is real: each custom object, broken, fails.
    scaled = one(rendered["base"], "ScaledObject", "ctxfleet-compactor")
    wrong_type = {**scaled, "spec": {**scaled["spec"], "maxReplicaCount": "eight"}}
    unknown_field = {**scaled, "spec": {**scaled["spec"], "maxReplicas": 8}}
    bad_metadata = {**scaled, "metadata": {**scaled["metadata"], "nmae": "x"}}
    monitor = one(rendered["base"], "ServiceMonitor", "ctxfleet-workers")
    no_endpoints = {**monitor, "spec": {k: v for k, v in monitor["spec"].items() if k != "endpoints"}}
    cluster = one(rendered["base"], "Cluster", "ctxfleet-db")
    instances_as_text = {**cluster, "spec": {**cluster["spec"], "instances": "three"}}
    for broken in (wrong_type, unknown_field, bad_metadata, no_endpoints, instances_as_text):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    with pytest.raises(NoSchema):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


# --- the workers -----------------------------------------------------------------------------------


def test_every_worker_kind_is_deployed_as_the_right_workload(objects: list[Obj]) -> None:
    for name in WORKERS:
        assert worker(objects, name)["kind"] == WORKLOAD_KIND[name]


def test_each_worker_container_runs_ctxfleet_worker_with_its_own_name(objects: list[Obj]) -> None:
    for name in WORKERS:
        container = worker_container(objects, name)
        # The image's ENTRYPOINT is `ctxfleet`, so args are the subcommand.
        assert container["args"] == ["worker", name]
        assert "command" not in container
        assert container["image"].split("/")[-1].startswith("ctxfleet:")


def test_recorder_partition_spec_names_the_statefulset_replica_count(objects: list[Obj]) -> None:
    recorder = worker(objects, "recorder")
    env = env_of(worker_container(objects, "recorder"))
    assert env["CTX_RECORDER_PARTITIONS"]["value"] == f"pod/{recorder['spec']['replicas']}"
    # The ordinal comes from the pod's own name.
    assert env["CTX_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_recorder_pods_together_own_every_partition_exactly_once(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs the fleet's own parsing of the rendered settings for each pod name the StatefulSet makes.
    recorder = worker(objects, "recorder")
    env = {
        **settings_configmap(objects)["data"],
        "CTX_RECORDER_PARTITIONS": env_of(worker_container(objects, "recorder"))["CTX_RECORDER_PARTITIONS"][
            "value"
        ],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    owned: list[int] = []
    for ordinal in range(recorder["spec"]["replicas"]):
        monkeypatch.setenv("CTX_POD_NAME", f"{recorder['metadata']['name']}-{ordinal}")
        owned.extend(Settings().owned_partitions())
    assert sorted(owned) == list(range(int(env["CTX_PARTITIONS"])))


def test_example_overlay_runs_more_recorders_than_the_base(rendered: dict[str, list[Obj]]) -> None:
    assert worker(rendered["example"], "recorder")["spec"]["replicas"] == 4
    assert worker(rendered["base"], "recorder")["spec"]["replicas"] == 2


def test_compactors_are_scaled_by_keda_on_the_compaction_consumer_lag(objects: list[Obj]) -> None:
    scaled = one(objects, "ScaledObject", "ctxfleet-compactor")
    compactor = worker(objects, "compactor")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target.get("apiVersion"), target.get("kind"), target["name"]) == (
        "apps/v1",
        "Deployment",
        compactor["metadata"]["name"],
    )
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "nats-jetstream"
    meta = trigger["metadata"]
    # The names the fleet's code uses for the work queue and its durable consumer.
    assert (meta["stream"], meta["consumer"], meta["account"]) == (JOBS_STREAM, COMPACTOR_DURABLE, "$G")
    assert int(meta["lagThreshold"]) > 0
    assert scaled["spec"]["minReplicaCount"] == 1
    assert scaled["spec"]["maxReplicaCount"] > 1
    # KEDA owns the replica count; a fixed one would be reset by every apply.
    assert "replicas" not in compactor["spec"]


def test_keda_reads_the_nats_monitoring_port_of_the_release_in_the_same_namespace(objects: list[Obj]) -> None:
    scaled = one(objects, "ScaledObject", "ctxfleet-compactor")
    endpoint = scaled["spec"]["triggers"][0]["metadata"]["natsServerMonitoringEndpoint"]
    host, _, port = endpoint.partition(":")
    assert int(port) == nats_values()["config"]["monitor"]["port"]
    service, namespace, *rest = host.split(".")
    # The headless Service of the Helm release "nats": KEDA asks the stream leader as <pod>.<endpoint>.
    assert service == "nats-headless" and rest == ["svc", "cluster", "local"]
    assert namespace == scaled["metadata"].get("namespace", "ctxfleet")


def test_example_overlay_lets_more_compactors_run_than_the_base(rendered: dict[str, list[Obj]]) -> None:
    def most(objects: list[Obj]) -> int:
        return int(one(objects, "ScaledObject", "ctxfleet-compactor")["spec"]["maxReplicaCount"])

    assert most(rendered["example"]) > most(rendered["base"])


def test_migration_job_migrates_the_database_then_provisions_the_streams(objects: list[Obj]) -> None:
    job = one(objects, "Job", "ctxfleet-migrate")
    spec = pod_spec(job)
    assert spec is not None
    assert [c["args"] for c in spec["initContainers"]] == [["migrate"]]
    # No --force: a partition-count change must stay a deliberate, manual step.
    assert [c["args"] for c in spec["containers"]] == [["provision"]]
    assert env_of(spec["initContainers"][0])["CTX_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": DB_SECRET,
        "key": "uri",
    }
    assert env_of(spec["containers"][0])["CTX_NATS_USER"]["value"] == "provisioner"
    # Deleted once finished, so the next apply (an upgrade) runs it again.
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert spec["restartPolicy"] in {"OnFailure", "Never"}


def test_every_worker_serves_probes_and_metrics_on_its_http_port(objects: list[Obj]) -> None:
    settings = settings_configmap(objects)["data"]
    assert settings["CTX_HTTP_HOST"] == "0.0.0.0"
    for name in WORKERS:
        container = worker_container(objects, name)
        (port,) = [p for p in container["ports"] if p["name"] == "http"]
        assert port["containerPort"] == int(settings["CTX_HTTP_PORT"])
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container.get("envFrom") == [
            {"configMapRef": {"name": settings_configmap(objects)["metadata"]["name"]}}
        ]


def test_every_container_runs_as_non_root_with_a_read_only_root_filesystem(objects: list[Obj]) -> None:
    for obj, spec in workloads(objects):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001, obj["metadata"]["name"]
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        tmp_volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in containers(spec):
            sc = container["securityContext"]
            where = f"{obj['metadata']['name']}/{container['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc.get("runAsNonRoot", True) is True, where
            # Python, tiktoken and the fleet write scratch files: /tmp is an emptyDir.
            assert any(
                m["mountPath"] == "/tmp" and m["name"] in tmp_volumes for m in container["volumeMounts"]
            ), where


def test_every_container_has_cpu_and_memory_requests_and_limits(objects: list[Obj]) -> None:
    for obj, spec in workloads(objects):
        for container in containers(spec):
            resources = container["resources"]
            for bound in ("requests", "limits"):
                assert set(resources[bound]) >= {"cpu", "memory"}, (
                    f"{obj['metadata']['name']}/{container['name']} {bound}"
                )


def test_graceful_shutdown_finishes_inside_the_termination_grace_period(objects: list[Obj]) -> None:
    shutdown = float(settings_configmap(objects)["data"]["CTX_SHUTDOWN_TIMEOUT_S"])
    for name in WORKERS:
        spec = pod_spec(worker(objects, name))
        assert spec is not None
        assert spec["terminationGracePeriodSeconds"] == 30
        assert shutdown == 25 < spec["terminationGracePeriodSeconds"]


def test_every_worker_kind_has_its_own_pod_disruption_budget(objects: list[Obj]) -> None:
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    for name in WORKERS:
        labels = worker(objects, name)["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if labels_match(b["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, f"{name}: {len(covering)} PodDisruptionBudgets"
        others = [w for w in WORKERS if w != name]
        for other in others:
            other_labels = worker(objects, other)["spec"]["template"]["metadata"]["labels"]
            assert not labels_match(covering[0]["spec"]["selector"]["matchLabels"], other_labels)


def test_service_monitor_scrapes_metrics_on_every_worker_pods_http_port(objects: list[Obj]) -> None:
    monitor = one(objects, "ServiceMonitor", "ctxfleet-workers")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    services = [
        s
        for s in objects
        if s["kind"] == "Service"
        and labels_match(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))
    ]
    assert services, "the ServiceMonitor selects no Service"
    scraped = set()
    for service in services:
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert port["targetPort"] == "http"
        for name in WORKERS:
            if labels_match(
                service["spec"]["selector"], worker(objects, name)["spec"]["template"]["metadata"]["labels"]
            ):
                scraped.add(name)
    assert scraped == set(WORKERS)


# --- settings and secrets --------------------------------------------------------------------------


def ctx_env_names(objects: list[Obj]) -> set[str]:
    """Every CTX_* name a container gets: its env, and the keys of ConfigMaps it reads with envFrom."""
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    names: set[str] = set()
    for _, spec in workloads(objects):
        for container in containers(spec):
            names |= set(env_of(container))
            for source in container.get("envFrom", []):
                names |= set(configmaps[source["configMapRef"]["name"]])
    return {n for n in names if n.startswith("CTX_")}


def test_every_ctx_variable_in_the_manifests_is_a_setting_the_fleet_reads(objects: list[Obj]) -> None:
    used = ctx_env_names(objects)
    assert {"CTX_NATS_URL", "CTX_DATABASE_URL", "CTX_RECORDER_PARTITIONS"} <= used
    assert sorted(used - Settings.env_names()) == []


def test_the_shared_settings_are_accepted_by_the_settings_object(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in settings_configmap(objects)["data"].items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.bus.nats_url == ("nats://nats:4222",)
    assert settings.bus.partitions == 16


def test_no_secret_value_is_written_inline(objects: list[Obj]) -> None:
    for obj, spec in workloads(objects):
        for container in containers(spec):
            for name, entry in env_of(container).items():
                if SECRET_ENV.match(name):
                    assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], (
                        f"{obj['metadata']['name']}: {name}"
                    )
    for cm in (o for o in objects if o["kind"] == "ConfigMap"):
        assert not [k for k in cm.get("data", {}) if SECRET_ENV.match(k)]


def test_base_holds_no_secret_objects(rendered: dict[str, list[Obj]]) -> None:
    assert [o["metadata"]["name"] for o in rendered["base"] if o["kind"] == "Secret"] == []


def test_workers_read_the_database_url_from_the_cloudnativepg_app_secret(objects: list[Obj]) -> None:
    cluster = one(objects, "Cluster", "ctxfleet-db")
    # CloudNativePG names the owner's Secret <cluster>-app.
    assert DB_SECRET == f"{cluster['metadata']['name']}-app"
    for name in WORKERS:
        ref = env_of(worker_container(objects, name))["CTX_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": DB_SECRET, "key": "uri"}


def nats_password_key(spec: Obj, container: Obj) -> str:
    """The key of ctxfleet-nats-users mounted where CTX_NATS_PASSWORD_FILE points."""
    path = env_of(container)["CTX_NATS_PASSWORD_FILE"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == NATS_USERS_SECRET
    relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == relative]
    key: str = item["key"]
    return key


def test_each_worker_connects_to_nats_as_its_own_user_with_only_its_own_password(objects: list[Obj]) -> None:
    for name in WORKERS:
        spec = pod_spec(worker(objects, name))
        assert spec is not None
        container = worker_container(objects, name)
        assert env_of(container)["CTX_NATS_USER"]["value"] == name
        assert nats_password_key(spec, container) == name
    job_spec = pod_spec(one(objects, "Job", "ctxfleet-migrate"))
    assert job_spec is not None
    assert nats_password_key(job_spec, job_spec["containers"][0]) == "provisioner"


def test_every_nats_user_the_manifests_use_is_configured_in_nats(objects: list[Obj]) -> None:
    configured = {u["user"] for u in nats_values()["config"]["merge"]["authorization"]["users"]}
    used = {
        env_of(c)["CTX_NATS_USER"]["value"]
        for _, spec in workloads(objects)
        for c in containers(spec)
        if "CTX_NATS_USER" in env_of(c)
    }
    assert used == {*WORKERS, "provisioner"} and used <= configured


def test_example_overlay_generates_a_password_for_every_nats_user(rendered: dict[str, list[Obj]]) -> None:
    secret = one(rendered["example"], "Secret", NATS_USERS_SECRET)  # unsuffixed: the Helm release names it
    configured = {u["user"] for u in nats_values()["config"]["merge"]["authorization"]["users"]}
    assert set(secret["data"]) == configured


def test_example_overlay_puts_everything_in_its_namespace_with_the_pinned_image(
    rendered: dict[str, list[Obj]],
) -> None:
    kustomization = yaml.safe_load((TREES["example"] / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    pinned = f"{image['newName']}:{image['newTag']}"
    for obj in rendered["example"]:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == kustomization["namespace"], obj["metadata"]["name"]
    for _, spec in workloads(rendered["example"]):
        assert {c["image"] for c in containers(spec)} == {pinned}


def test_database_is_a_three_instance_cloudnativepg_cluster_owned_by_ctxfleet(objects: list[Obj]) -> None:
    spec = one(objects, "Cluster", "ctxfleet-db")["spec"]
    assert spec["instances"] == 3
    assert spec["bootstrap"]["initdb"] == {"database": "ctxfleet", "owner": "ctxfleet"}
    assert spec["storage"]["size"]
    assert spec["monitoring"]["enablePodMonitor"] is True


# --- the NATS Helm values --------------------------------------------------------------------------


def test_nats_runs_a_three_node_jetstream_cluster_on_file_storage() -> None:
    config = nats_values()["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    jetstream = config["jetstream"]
    assert jetstream["enabled"] is True
    assert jetstream["fileStore"]["enabled"] is True and jetstream["fileStore"]["pvc"]["enabled"] is True
    assert config["monitor"]["enabled"] is True


def test_nats_passwords_come_from_the_users_secret_through_the_environment() -> None:
    values = nats_values()
    env = values["container"]["env"]
    for user in values["config"]["merge"]["authorization"]["users"]:
        # `<< $VAR >>` is emitted unquoted, so nats-server reads $VAR from its environment.
        variable = password_variable(user["user"])
        assert user["password"] == f"<< ${variable} >>", (
            f"{user['user']}: the password must be a reference, not a value"
        )
        assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": NATS_USERS_SECRET, "key": user["user"]}


def _rule(subjects: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    # As infra.nats_accounts renders it: no subjects is an explicit deny-all, not an empty allow list.
    return {"allow": sorted(subjects)} if subjects else {"deny": [">"]}


def test_nats_users_and_permissions_match_infra_nats_accounts() -> None:
    expected = {
        name: {
            "publish": _rule(g.publish),
            "subscribe": _rule(g.subscribe),
            "allow_responses": g.allow_responses,
        }
        for name, g in grants().items()
    }
    configured = {}
    for user in nats_values()["config"]["merge"]["authorization"]["users"]:
        permissions = user["permissions"]
        configured[user["user"]] = {
            verb: {kind: sorted(subjects) for kind, subjects in permissions[verb].items()}
            for verb in ("publish", "subscribe")
        } | {"allow_responses": permissions.get("allow_responses", False)}
    assert configured == expected
