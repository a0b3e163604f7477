"""functions_worker.yml as runtime/pulsar_standalone.functions_worker_config writes it: what Pulsar
4.0's function worker needs to start with the process runtime (a worker without the topic names
fails on `persistent://public/functions/null`, a process runtime without javaInstanceJarLocation
refuses to start even for Python functions)."""
from __future__ import annotations

import json
from pathlib import Path

from pulsar_lifecycle.runtime.pulsar_standalone import PROCESS_RUNTIME, functions_worker_config


def _config(**kwargs: object) -> dict:
    base = dict(worker_id="w1", host="127.0.0.1", web_port=8081, service_url="pulsar://127.0.0.1:6651",
                admin_url="http://127.0.0.1:8081", state_storage_url="bk://127.0.0.1:4181",
                download_dir=Path("/data/download"))
    base.update(kwargs)
    return json.loads(functions_worker_config(**base))  # type: ignore[arg-type]  # kwargs of mixed types


def test_the_worker_config_names_what_the_worker_needs_to_start() -> None:
    conf = _config(python_instance=Path("/i/python_instance_main.py"), java_instance_jar=Path("/j/instance.jar"),
                   log_dir=Path("/logs"), liveness_check_ms=5000)
    assert {conf[k] for k in ("functionMetadataTopicName", "functionAssignmentTopicName",
                              "clusterCoordinationTopicName")} == {"metadata", "assignments", "coordinate"}
    assert conf["functionRuntimeFactoryClassName"] == PROCESS_RUNTIME
    assert conf["functionRuntimeFactoryConfigs"] == {"pythonInstanceLocation": "/i/python_instance_main.py",
                                                     "javaInstanceJarLocation": "/j/instance.jar",
                                                     "logDirectory": "/logs"}
    assert conf["instanceLivenessCheckFreqMs"] == 5000
    assert conf["stateStorageServiceUrl"] == "bk://127.0.0.1:4181"
    assert (conf["workerId"], conf["workerPort"], conf["pulsarServiceUrl"]) == ("w1", 8081, "pulsar://127.0.0.1:6651")


def test_no_state_url_means_no_function_state_and_extra_keys_override() -> None:
    conf = _config(state_storage_url=None, extra={"workerPort": 9090, "failureCheckFreqMs": 1000})
    assert "stateStorageServiceUrl" not in conf
    assert (conf["workerPort"], conf["failureCheckFreqMs"]) == (9090, 1000)
