"""``--export kubeflow`` and ``--export mpijob`` checked against the Kubeflow API schemas.

Kubernetes cannot run here, so the documents are validated, not run. The schemas are the
OpenAPI models that ship in pip packages: ``kubeflow-training`` (TFJob ``kubeflow.org/v1``:
TFJobSpec, RunPolicy, ReplicaSpec) and ``kubernetes`` (PodTemplateSpec, Container, EnvVar...).
The MPI Operator's ``MPIJob`` ``kubeflow.org/v2beta1`` has no Python models: its top level
(`MPIJOB_V2BETA1_SPEC`, written here from the operator's API field list) is checked field by
field, and everything below it (RunPolicy, ReplicaSpec, the pod template) with the same models.

The check is strict: an unknown field, a wrong type, a missing required field (the models'
client-side validation) or a value outside an enum fails, naming the path.
"""

from __future__ import annotations

import functools
import re
from types import ModuleType
from typing import Any

import pytest
import yaml

from tfdist.launcher.export.documents import export_job
from tfdist.launcher.plan import JobOptions, plan_job

pytestmark = pytest.mark.unit



@functools.cache
def _schemas() -> tuple[ModuleType, ModuleType]:
    """The TFJob and pod models, imported by the first test that reads them: about 1 CPU-s that
    a pytest-xdist worker running none of these tests no longer pays while collecting."""
    training = pytest.importorskip("kubeflow.training.models",
                                   reason="kubeflow-training (pip) ships the TFJob models")
    kube = pytest.importorskip("kubernetes.client.models",
                               reason="kubernetes (pip) ships pod models")
    return training, kube


_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,),
}

# MPIJobSpec of kubeflow/mpi-operator's v2beta1 API: field -> model type (as the models name
# types), required fields, and enums.
MPIJOB_V2BETA1_SPEC = {
    "slotsPerWorker": "int", "runPolicy": "KubeflowOrgV1RunPolicy",
    "mpiReplicaSpecs": "dict(str, KubeflowOrgV1ReplicaSpec)", "sshAuthMountPath": "str",
    "launcherCreationPolicy": "str", "mpiImplementation": "str", "runLauncherAsWorker": "bool",
}
MPIJOB_REQUIRED = ("mpiReplicaSpecs",)
MPIJOB_ENUMS = {"mpiImplementation": {"OpenMPI", "Intel", "MPICH"},
                "launcherCreationPolicy": {"AtStartup", "WaitForWorkersReady"}}
MPIJOB_REPLICA_TYPES = {"Launcher", "Worker"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


def _model(name: str) -> type:
    for module in _schemas():
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"no model named {name}")


def check(value: Any, type_name: str, path: str = "$") -> None:
    """Raises AssertionError (naming ``path``) where ``value`` does not fit ``type_name``."""
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        assert isinstance(value, list), f"{path}: expected a list, got {value!r}"
        for i, item in enumerate(value):
            check(item, match.group(1), f"{path}[{i}]")
    elif match := re.fullmatch(r"dict\((\w+), (.+)\)", type_name):
        assert isinstance(value, dict), f"{path}: expected a mapping, got {value!r}"
        for key, item in value.items():
            assert isinstance(key, str), f"{path}: key {key!r} is not a string"
            check(item, match.group(2), f"{path}.{key}")
    elif type_name in _PRIMITIVES:
        wrong_bool = isinstance(value, bool) and type_name in ("int", "float")
        assert isinstance(value, _PRIMITIVES[type_name]) and not wrong_bool, (
            f"{path}: expected {type_name}, got {value!r}")
    else:
        _check_model(value, _model(type_name), path)


def _check_model(value: Any, cls: type, path: str) -> None:
    assert isinstance(value, dict), f"{path}: expected a {cls.__name__} mapping, got {value!r}"
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = set(value) - set(by_json)
    assert not unknown, f"{path}: {sorted(unknown)} are not fields of {cls.__name__}"
    for key, item in value.items():
        check(item, cls.openapi_types[by_json[key]], f"{path}.{key}")
    try:  # the models' own checks: required fields, enums
        cls(**{by_json[key]: item for key, item in value.items()})
    except ValueError as err:
        raise AssertionError(f"{path}: {cls.__name__}: {err}") from err


def check_tfjob(document: dict[str, Any]) -> None:
    assert (document["apiVersion"], document["kind"]) == ("kubeflow.org/v1", "TFJob")
    check(document, "KubeflowOrgV1TFJob")
    assert document["spec"]["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
    assert set(document["spec"]["tfReplicaSpecs"]) <= {"Chief", "Master", "Worker", "PS",
                                                       "Evaluator"}


def check_mpijob(document: dict[str, Any]) -> None:
    assert (document["apiVersion"], document["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
    check(document["metadata"], "V1ObjectMeta", "$.metadata")
    spec = document["spec"]
    unknown = set(spec) - set(MPIJOB_V2BETA1_SPEC)
    assert not unknown, f"$.spec: {sorted(unknown)} are not MPIJob v2beta1 fields"
    for field in MPIJOB_REQUIRED:
        assert field in spec, f"$.spec.{field} is required"
    for field, item in spec.items():
        check(item, MPIJOB_V2BETA1_SPEC[field], f"$.spec.{field}")
        if field in MPIJOB_ENUMS:
            assert item in MPIJOB_ENUMS[field], f"$.spec.{field}: {item!r} not in the enum"
    assert set(spec["mpiReplicaSpecs"]) == MPIJOB_REPLICA_TYPES
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert spec["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES


def _export(fmt: str, options: JobOptions, **extra: Any) -> dict[str, Any]:
    return yaml.safe_load(export_job(plan_job(options), fmt, image="me/train:1", **extra))


@pytest.mark.parametrize("options", [
    JobOptions("train.py", ("--epochs", "2"), workers=2),                     # multi_worker
    JobOptions("train.py", workers=3, chief=True),                            # with a chief
    JobOptions("train.py", workers=2, ps=2),                                  # parameter server
    JobOptions("train.py", workers=2, evaluator=True),                        # with an evaluator
    JobOptions("train.py", strategy="mirrored", workers=1),                   # one process
], ids=["multi_worker", "chief", "parameter_server", "evaluator", "mirrored"])
def test_every_kubeflow_export_is_a_valid_tfjob(options: JobOptions) -> None:
    check_tfjob(_export("kubeflow", options))


@pytest.mark.parametrize(("workers", "slots", "mpi"), [(2, 1, False), (4, 2, False), (1, 1, False),
                                                      (2, 1, True)])
def test_every_mpijob_export_is_a_valid_v2beta1_mpijob(workers: int, slots: int, mpi: bool) -> None:
    options = JobOptions("train.py", ("--lr", "0.1"), strategy="horovod", workers=workers, mpi=mpi)
    document = _export("mpijob", options, slots_per_worker=slots)
    check_mpijob(document)
    assert document["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == workers // slots


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["spec"].update(tfReplicaSpec={}), r"\['tfReplicaSpec'\] are not fields"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2"),
     r"Worker.replicas: expected int"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .pop("name"), r"V1Container: Invalid value for `name`, must not be `None`"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     ["env"].append({"value": "1"}), r"V1EnvVar: Invalid value for `name`"),
])
def test_the_tfjob_check_catches_a_broken_document(edit: Any, message: str) -> None:
    """The validator is not a rubber stamp: each sabotage of a good export is caught."""
    document = _export("kubeflow", JobOptions("train.py", workers=2))
    edit(document)
    with pytest.raises(AssertionError, match=message):
        check_tfjob(document)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["spec"].update(mpiImplementation="MVAPICH"), r"'MVAPICH' not in the enum"),
    (lambda d: d["spec"].update(slotsPerWorkers=1), r"\['slotsPerWorkers'\] are not MPIJob"),
    (lambda d: d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"].update(spec={}),
     r"V1PodSpec: Invalid value for `containers`"),
])
def test_the_mpijob_check_catches_a_broken_document(edit: Any, message: str) -> None:
    document = _export("mpijob", JobOptions("train.py", strategy="horovod", workers=2))
    edit(document)
    with pytest.raises(AssertionError, match=message):
        check_mpijob(document)
