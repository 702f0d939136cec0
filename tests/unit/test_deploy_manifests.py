"""The deployment files, checked offline: every YAML file lints, every Kubernetes manifest
validates against the bundled schemas (strict), each ScaledObject against KEDA's own CRD
(``tests/unit/data/keda``, from kedacore/keda 8b4f083) and each Kafka trigger's metadata
against the scaler's parameter list (``infra/keda_kafka.py``), and the files agree with the
code: setting names, consumer groups, the partition cap, the worker id, the grace period,
the runtime user and its data dir, readiness, the sizes of ``crawlfleet plan``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from yamllint import config as yl_config
from yamllint import linter

from consumers.parse import ParseStage
from core.config import SECRET_FIELDS, SETTING_DEFAULTS, Settings
from crawlfleet.plan import Costs, plan
from infra.deploy_files import DEPLOY as WRITTEN_TO
from infra.deploy_files import compose_workers, sizes_table, stage_size, stale
from infra.keda_kafka import kafka_trigger_problems
from schemas.stages import StageSpec, every_stage, register_stage, unregister_stage
from schemas.topics import Topology
from streams.batch_stage import BatchStage
from streams.io import transaction_timeout_ms

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
KEDA_CRD = Path(__file__).with_name("data") / "keda" / "keda.sh_scaledobjects.yaml"
LINT = yl_config.YamlLintConfig("extends: default\nrules:\n  line-length: {max: 100}\n"
                                "  document-start: disable\n  truthy: {check-keys: false}\n"
                                "  comments: {min-spaces-from-content: 1}\n")


def _docs() -> list[dict[str, Any]]:
    return [d for p in K8S for d in yaml.safe_load_all(p.read_text()) if d]


def _kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in _docs() if d["kind"] == kind]


@pytest.mark.parametrize("path", [*K8S, DEPLOY / "compose.yaml"], ids=lambda p: p.name)
def test_every_file_lints(path: Path) -> None:
    problems = list(linter.run(path.read_text(), LINT))
    assert not problems, "\n".join(f"{path.name}:{p.line}: {p.message}" for p in problems)


def test_core_kinds_validate_against_the_kubernetes_schemas() -> None:
    core = [d for d in _docs() if not d["apiVersion"].startswith("keda.sh/")]
    assert {d["kind"] for d in core} >= {"StatefulSet", "Service", "PodDisruptionBudget",
                                          "ConfigMap", "Secret", "Job"}
    for doc in core:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_scaled_objects_validate_against_kedas_crd() -> None:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    scaled = _kind("ScaledObject")
    assert len(scaled) == len(every_stage())
    for doc in scaled:
        jsonschema.validate(doc, schema)


def test_bad_manifests_are_caught() -> None:
    """The checks can fail: a misspelt field and a ScaledObject without a target."""
    (sts, *_) = _kind("StatefulSet")
    bad = {**sts, "spec": {**sts["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)
    crd = yaml.safe_load(KEDA_CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (so, *_) = _kind("ScaledObject")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**so, "spec": {"triggers": so["spec"]["triggers"]}}, schema)


def _config() -> dict[str, str]:
    (cm,) = _kind("ConfigMap")
    return dict(cm["data"])


def _valid_setting(var: str) -> bool:
    name = var.removeprefix("CRAWLFLEET_").lower()
    return name in SETTING_DEFAULTS or (name.endswith("_file") and name[:-5] in SECRET_FIELDS)


def test_every_variable_is_a_setting_and_secrets_stay_in_the_secret() -> None:
    (secret,) = _kind("Secret")
    assert set(secret["stringData"]) == {"CRAWLFLEET_CLICKHOUSE_DSN"}
    for var in [*_config(), *secret["stringData"]]:
        assert _valid_setting(var), var
    assert not any("DSN" in k or "PASSWORD" in k for k in _config())
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, _ in compose_workers():
        env = compose["services"][name]["environment"]
        assert all(_valid_setting(k) for k in env if k.startswith("CRAWLFLEET_")), env
        assert "CRAWLFLEET_CLICKHOUSE_DSN" not in env  # from the secret file only
    assert sorted(n for n in compose["services"] if n.startswith("kafka")) == \
        ["kafka-1", "kafka-2", "kafka-3"]


def test_each_stage_is_a_statefulset_scaled_on_its_own_group_within_the_partitions() -> None:
    config = _config()
    topo = Topology(config["CRAWLFLEET_TOPIC_PREFIX"], int(config["CRAWLFLEET_PARTITIONS"]))
    grace = transaction_timeout_ms(Settings()) / 1000
    by_stage = {d["metadata"]["name"].removeprefix("crawlfleet-"): d
                for d in _kind("StatefulSet")}
    assert set(by_stage) == set(every_stage())
    for stage, sts in by_stage.items():
        pod = sts["spec"]["template"]["spec"]
        (box,) = pod["containers"]
        assert box["args"][:2] == ["worker", stage]
        assert box["args"][2:] == ["--worker-id", "$(POD_NAME)"]  # stable id = pod name
        assert pod["terminationGracePeriodSeconds"] >= 2 * grace
        assert box["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
        assert box["livenessProbe"]["httpGet"]["port"] == "metrics"
    for so in _kind("ScaledObject"):
        stage = so["spec"]["scaleTargetRef"]["name"].removeprefix("crawlfleet-")
        (trigger,) = so["spec"]["triggers"]
        assert trigger["metadata"]["consumerGroup"] == topo.group(stage)
        assert so["spec"]["maxReplicaCount"] == topo.partitions
    pdbs = {d["metadata"]["name"] for d in _kind("PodDisruptionBudget")}
    assert pdbs == {f"crawlfleet-{s}" for s in every_stage()}


def test_the_image_copies_every_package_it_installs() -> None:
    """A package missing from the image installs nothing and fails at the first import."""
    import tomllib
    root = Path(__file__).resolve().parents[2]
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    packages = set(conf["tool"]["importlinter"]["root_packages"])
    copied = {line.split()[1] for line in
              (root / "infra" / "deploy" / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and len(line.split()) == 3}
    assert packages <= copied, packages - copied
    # and the build backend the tree names (buildsupport: it writes the code revision)
    assert conf["build-system"]["build-backend"].split(".")[0] in copied


def test_the_stage_files_are_the_ones_the_registry_writes() -> None:
    """Every stage of the registry, the quarantine app included, is deployed from one
    template; a stage added without `python -m infra.deploy_files` fails here."""
    assert WRITTEN_TO == DEPLOY
    assert stale() == []
    assert {p.stem for p in K8S} == {*every_stage(), "config", "topics", "schema"}


def test_a_stage_added_to_the_registry_makes_the_files_stale() -> None:
    register_stage(StageSpec("tally", ("crawl.parsed",), "tally:Tally"))
    try:
        assert DEPLOY / "k8s" / "tally.yaml" in stale()
        assert DEPLOY / "compose.yaml" in stale()
    finally:
        unregister_stage("tally")
    assert stale() == []


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / "compose.yaml").read_text()))


def _image_user_and_data_dir() -> tuple[str, str, list[str]]:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    (user,) = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    (env,) = [ln.split()[1] for ln in lines if ln.startswith("ENV CRAWLFLEET_DATA_DIR=")]
    return user, env.split("=", 1)[1], lines


def test_the_image_makes_its_data_dir_owned_by_its_user() -> None:
    """Every stage makes its status dir under the data dir at start: a dir the runtime user
    cannot write is a crash loop (issue 42)."""
    user, data_dir, lines = _image_user_and_data_dir()
    text = "\n".join(lines)
    assert f"mkdir -p {data_dir}" in text and f"chown {user} {data_dir}" in text
    assert data_dir == _config()["CRAWLFLEET_DATA_DIR"]
    uid, gid = (int(x) for x in user.split(":"))
    for sts in _kind("StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (uid, gid, gid)
        (box,) = pod["containers"]
        (mount,) = box["volumeMounts"]
        assert mount == {"name": "state", "mountPath": data_dir}


def test_compose_keeps_every_stateful_part_on_a_named_volume() -> None:
    compose = _compose()
    services, declared = compose["services"], set(compose["volumes"])

    def named(service: str) -> dict[str, str]:
        mounts = dict(v.split(":", 1)[::-1] for v in services[service].get("volumes", []))
        assert set(mounts.values()) <= declared, service  # named volumes, not bind mounts
        return mounts

    for broker in ("kafka-1", "kafka-2", "kafka-3"):
        assert services[broker]["environment"]["KAFKA_LOG_DIRS"] in named(broker)
    assert "/var/lib/clickhouse" in named("clickhouse")
    _, data_dir, _ = _image_user_and_data_dir()
    ids = []
    for wid, stage in compose_workers():
        svc = services[wid]
        assert svc["environment"]["CRAWLFLEET_DATA_DIR"] == data_dir
        assert named(wid) == {data_dir: f"{wid}-state"}  # its own, never shared
        assert svc["command"] == ["worker", stage, "--worker-id", wid]  # stable on recreate
        assert svc["hostname"] == wid
        assert svc["depends_on"]["topics"] == {"condition": "service_completed_successfully"}
        assert "/ready" in " ".join(svc["healthcheck"]["test"])
        ids.append(wid)
    assert len(set(ids)) == len(ids)
    assert services["topics"]["command"] == ["topics", "create"]


def test_the_quarantine_app_is_deployed_in_both() -> None:
    """Without it a deployed fleet issues no quarantine at all (issue 42)."""
    assert "quarantine" in every_stage()
    assert any(st == "quarantine" for _, st in compose_workers())
    (sts,) = [d for d in _kind("StatefulSet") if d["metadata"]["name"] == "crawlfleet-quarantine"]
    (box,) = sts["spec"]["template"]["spec"]["containers"]
    assert box["args"][:2] == ["worker", "quarantine"]


def test_the_kafka_cluster_id_is_one_kraft_accepts() -> None:
    import base64
    cid = _compose()["services"]["kafka-1"]["environment"]["CLUSTER_ID"]
    assert len(cid) == 22 and len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_every_kafka_trigger_uses_only_the_scalers_parameters() -> None:
    for so in _kind("ScaledObject"):
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        assert kafka_trigger_problems(trigger["metadata"]) == [], so["metadata"]["name"]
        # the consumers read from the earliest offset: a group with none lags it all
        assert trigger["metadata"]["offsetResetPolicy"] == "earliest"


@pytest.mark.parametrize(("change", "problem"), [
    ({"lagTreshold": "100"}, "lagTreshold: not a parameter"),
    ({"lagThreshold": "1e4"}, "lagThreshold: '1e4' is not a valid int"),
    ({"offsetResetPolicy": "oldest"}, "not one of earliest, latest"),
    ({"allowIdleConsumers": "nope"}, "not a valid bool"),
    ({"lagThreshold": 100}, "not a string"),
    ({"bootstrapServers": "kafka-0"}, "not a valid servers"),
])
def test_a_misspelt_or_mistyped_trigger_key_fails(change: dict[str, Any], problem: str) -> None:
    (so, *_) = _kind("ScaledObject")
    (trigger,) = so["spec"]["triggers"]
    problems = kafka_trigger_problems({**trigger["metadata"], **change})
    assert any(problem in p for p in problems), problems


def _held_uncommitted(stage: str) -> int:
    """What one busy worker of ``stage`` holds read but not committed: its lag at pace."""
    s = Settings()
    return {"fetch": s.max_buffered, "parse": ParseStage.batch_size,
            "store": s.store_batch_rows}.get(stage, BatchStage.batch_size)


def test_lag_thresholds_sit_above_what_a_busy_worker_holds() -> None:
    """A threshold under one worker's own buffer (200 against fetch's 5,000) reads every
    busy worker as behind and pins the stage at its maximum."""
    for so in _kind("ScaledObject"):
        stage = so["spec"]["scaleTargetRef"]["name"].removeprefix("crawlfleet-")
        (trigger,) = so["spec"]["triggers"]
        assert int(trigger["metadata"]["lagThreshold"]) >= 2 * _held_uncommitted(stage), stage


def test_sizes_are_the_plans_at_the_stated_scale() -> None:
    """replicas = the plan's workers, CPU = its worker_cpu, fetch's disk >= its share of the
    dedupe and parked state (issue 42: 10Gi against ~38 GB)."""
    table = sizes_table()
    assert "--pages-per-day 1e9 --targets 10000000" in table["scale"]
    p = plan(1e9, 10_000_000, 2.0, Costs.load())
    assert table["partitions"] == p.partitions
    by_stage = {d["metadata"]["name"].removeprefix("crawlfleet-"): d
                for d in _kind("StatefulSet")}

    def gib(q: str) -> float:
        return float(q.removesuffix("Gi"))

    for stage, n in p.workers.items():
        size = stage_size(stage)
        assert size.replicas == n, stage
        sts = by_stage[stage]
        assert sts["spec"]["replicas"] == n
        (box,) = sts["spec"]["template"]["spec"]["containers"]
        if p.loads.get(f"{stage} workers' CPU"):
            assert box["resources"]["requests"]["cpu"] == "800m", stage  # worker_cpu 0.8
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["spec"]["resources"]["requests"]["storage"] == size.disk
    fetch_gb = (p.seen_gb + p.parked_gb) / p.workers["fetch"]
    assert gib(stage_size("fetch").disk) * 2**30 / 1e9 >= fetch_gb
    assert gib(stage_size("retry").disk) * 2**30 / 1e9 >= p.timers_gb / p.workers["retry"]


def test_the_schema_job_applies_the_cluster_schema_for_the_store_replicas() -> None:
    """The ConfigMap names a ClickHouse cluster, whose store workers never run DDL: the
    schema Job applies it, its deduplication window sized for the store's replicas."""
    (job,) = yaml.safe_load_all((DEPLOY / "k8s" / "schema.yaml").read_text())
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["schema", "--apply"]
    store = next(d for d in yaml.safe_load_all((DEPLOY / "k8s" / "store.yaml").read_text())
                 if d and d["kind"] == "StatefulSet")
    assert int(args[args.index("--store-workers") + 1]) == store["spec"]["replicas"]
    config = next(yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text()))
    assert config["data"]["CRAWLFLEET_CLICKHOUSE_CLUSTER"]
