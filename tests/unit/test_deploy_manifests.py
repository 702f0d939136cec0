"""The deployment files, checked offline: every YAML file lints, every Kubernetes manifest
validates against the bundled schemas (strict), each ScaledObject against KEDA's own CRD
(``tests/unit/data/keda``, from kedacore/keda 8b4f083), and the files agree with the code:
setting names, consumer groups, the partition cap, the worker id, the grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from yamllint import config as yl_config
from yamllint import linter

from core.config import SECRET_FIELDS, SETTING_DEFAULTS, Settings
from infra.deploy_files import DEPLOY as WRITTEN_TO
from infra.deploy_files import stale
from schemas.stages import StageSpec, every_stage, register_stage, unregister_stage
from schemas.topics import Topology
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
                                          "ConfigMap", "Secret"}
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
    for name in every_stage():
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
        assert box["readinessProbe"]["httpGet"]["port"] == "metrics"
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
    assert {p.stem for p in K8S} == {*every_stage(), "config"}


def test_a_stage_added_to_the_registry_makes_the_files_stale() -> None:
    register_stage(StageSpec("tally", ("crawl.parsed",), "tally:Tally"))
    try:
        assert DEPLOY / "k8s" / "tally.yaml" in stale()
        assert DEPLOY / "compose.yaml" in stale()
    finally:
        unregister_stage("tally")
    assert stale() == []
