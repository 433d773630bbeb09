"""The memory shim's CSI driver on the node: what it gives a pod, and whom it refuses.

The published directory is then used by the real shim (built from cuda-shim/) under the
fake driver, as a container would: the limit it reads is the one the driver wrote from
the pod's sealed annotation."""

import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from doubles.shim_build import Build
from gpupack import budget, cuda, keys
from node import cuda_csi
from node.csi import PublishRequest, Refused, UnpublishRequest
from node.cuda_volumes import CudaVolumes

NODE = "gpu-1"
UID = "5b1c0d3e-0000-4000-8000-000000000001"


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "infer-0",
            "namespace": "ml",
            "uid": UID,
            "annotations": {keys.ENFORCEMENT: "memory", keys.GPU_MEMORY: "1Gi", **annotations},
        },
        "spec": {"nodeName": NODE},
    }


def publish_request(target: Path, uid: str = UID, volume_id: str = "csi-abc") -> PublishRequest:
    return PublishRequest(
        volume_id,
        str(target),
        volume_context={
            "csi.storage.k8s.io/pod.namespace": "ml",
            "csi.storage.k8s.io/pod.name": "infer-0",
            "csi.storage.k8s.io/pod.uid": uid,
        },
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("shim")).make()


def volumes(built: Build, the_pod: dict[str, Any] | None) -> CudaVolumes:
    return CudaVolumes(built.shim, node=NODE, get_pod=lambda namespace, name: the_pod)


def test_a_memory_enforced_pod_gets_the_shim_its_limit_and_a_budget(
    built: Build, tmp_path: Path
) -> None:
    target = tmp_path / "mount"
    volumes(built, pod()).publish(publish_request(target))
    files = {p.name: p for p in target.iterdir()}
    assert sorted(files) == ["budget", "ld.so.preload", "libgpupack-cuda.so", "limit"]
    assert files["limit"].read_text() == f"{1 << 30}\n"
    assert files["ld.so.preload"].read_text() == "/run/gpupack/cuda/libgpupack-cuda.so\n"
    assert files["libgpupack-cuda.so"].read_bytes() == built.shim.read_bytes()
    for name in ("limit", "ld.so.preload", "libgpupack-cuda.so"):
        assert stat.S_IMODE(files[name].stat().st_mode) == 0o644, name  # the pod cannot edit
    assert stat.S_IMODE(files["budget"].stat().st_mode) == 0o666  # every container writes
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert len(files["budget"].read_bytes()) == budget.BYTES

    # The shim reads what the driver wrote: a container's processes are held to 1 GiB.
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": str(built.root),
        "LD_PRELOAD": str(files["libgpupack-cuda.so"]),
        "GPUPACK_CUDA_DIR": str(target),
        "FAKE_CUDA_STATE": str(tmp_path / "device"),
        "FAKE_CUDA_CONTEXT": "0",
    }
    done = subprocess.run(
        [str(built.probe), "linked", "ctx", "info", f"alloc:{2 << 30}"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert f"info rc=0 free={1 << 30} total={1 << 30}" in done.stdout
    assert f"alloc:{2 << 30} rc=2" in done.stdout


def test_a_second_publish_keeps_what_the_pods_processes_hold(built: Build, tmp_path: Path) -> None:
    target = tmp_path / "mount"
    driver = volumes(built, pod())
    driver.publish(publish_request(target))
    held = b"GPUPACK2" + bytes(range(256)) * 40
    (target / "budget").write_bytes(held + bytes(budget.BYTES - len(held)))
    driver.publish(publish_request(target))
    assert (target / "budget").read_bytes().startswith(held)


def test_a_pod_whose_budget_an_older_shim_uses_keeps_that_shim(
    built: Build, tmp_path: Path
) -> None:
    target = tmp_path / "mount"
    driver = volumes(built, pod())
    driver.publish(publish_request(target))
    (target / "libgpupack-cuda.so").write_bytes(b"the shim the pod started with")
    (target / "budget").write_bytes(b"GPUPACK1" + bytes(65592))
    driver.publish(publish_request(target))  # the kubelet again, after a node agent upgrade
    assert (target / "libgpupack-cuda.so").read_bytes() == b"the shim the pod started with"
    assert (target / "budget").read_bytes().startswith(b"GPUPACK1")
    assert (target / "limit").read_text() == f"{1 << 30}\n"


def test_a_republish_never_follows_a_symlink_the_pods_side_put_there(
    built: Build, tmp_path: Path
) -> None:
    """Names swapped for symlinks to another pod's files between publishes: the driver
    replaces the links and leaves the files they point at (their content and mode) as
    they were."""
    target = tmp_path / "mount"
    driver = volumes(built, pod())
    driver.publish(publish_request(target))
    other = tmp_path / "other-pod"
    other.mkdir()
    victims = {}
    for name in ("budget", "limit", "libgpupack-cuda.so"):
        victim = other / name
        victim.write_bytes(b"GPUPACK2 another pod's " + name.encode())
        victim.chmod(0o600)
        victims[name] = victim
        (target / name).unlink()
        (target / name).symlink_to(victim)
    driver.publish(publish_request(target))
    for name, victim in victims.items():
        assert not (target / name).is_symlink(), name
        assert victim.read_bytes() == b"GPUPACK2 another pod's " + name.encode()
        assert victim.stat().st_mode & 0o777 == 0o600, name
    assert (target / "limit").read_text() == f"{1 << 30}\n"
    assert (target / "budget").stat().st_size == budget.BYTES


def test_unpublish_removes_the_directory(built: Build, tmp_path: Path) -> None:
    target = tmp_path / "mount"
    driver = volumes(built, pod())
    driver.publish(publish_request(target))
    driver.unpublish(UnpublishRequest("csi-abc", str(target)))
    assert not target.exists()
    driver.unpublish(UnpublishRequest("csi-abc", str(target)))  # idempotent


@pytest.mark.parametrize(
    ("the_pod", "uid", "said"),
    [
        (pod(), "another-uid", "is not the one the kubelet mounts for"),
        ({**pod(), "spec": {"nodeName": "elsewhere"}}, UID, "is not bound to node gpu-1"),
        (pod(**{keys.ENFORCEMENT: "accounting"}), UID, "does not name memory"),
        (pod(**{keys.ENFORCEMENT: "mps"}), UID, "does not name memory"),
        (pod(**{keys.GPU_MEMORY: "lots"}), UID, "gpupack.io/gpu-memory"),
    ],
)
def test_any_other_pod_is_refused_with_a_reason_for_its_event(
    built: Build, tmp_path: Path, the_pod: dict[str, Any], uid: str, said: str
) -> None:
    target = tmp_path / "mount"
    with pytest.raises(Refused) as refused:
        volumes(built, the_pod).publish(publish_request(target, uid))
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert said in str(refused.value)
    assert not target.exists()


def test_a_pod_without_a_share_is_refused(built: Build, tmp_path: Path) -> None:
    the_pod = pod()
    del the_pod["metadata"]["annotations"][keys.GPU_MEMORY]
    with pytest.raises(Refused, match="has no gpupack.io/gpu-memory"):
        volumes(built, the_pod).publish(publish_request(tmp_path / "mount"))


def test_a_pod_that_is_gone_and_a_bad_volume_id_are_refused(built: Build, tmp_path: Path) -> None:
    with pytest.raises(Refused) as gone:
        volumes(built, None).publish(publish_request(tmp_path / "mount"))
    assert gone.value.code is grpc.StatusCode.NOT_FOUND
    with pytest.raises(Refused) as bad:
        volumes(built, pod()).publish(publish_request(tmp_path / "mount", volume_id="../x"))
    assert bad.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_the_driver_without_a_library_to_hand_out_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cuda_csi.main(["--node-name=n", f"--library={tmp_path / 'none.so'}"])
    assert code == 2
    assert "the memory shim to hand out" in capsys.readouterr().err


def test_help_names_the_driver(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cuda_csi.main(["--help"])
    assert done.value.code == 0
    assert "cuda.gpupack.io" in capsys.readouterr().out


GPU_A = "GPU-0a0b0c0d-0000-4000-8000-00000000000a"
GPU_B = "GPU-0a0b0c0d-0000-4000-8000-00000000000b"


def paced(
    uid: str, gpu: str | None, enforcement: str = "memory,compute", compute: str = "300m"
) -> dict[str, Any]:
    the_pod = pod(**{keys.ENFORCEMENT: enforcement, keys.GPU_COMPUTE: compute})
    the_pod["metadata"]["uid"] = uid
    if gpu is not None:
        the_pod["metadata"]["annotations"][keys.GPU_UUID] = gpu
    return the_pod


def published(tmp_path: Path, driver: CudaVolumes, index: int) -> Path:
    target = tmp_path / "pods" / f"uid-{index}" / "volumes" / "kubernetes.io~csi" / "c" / "mount"
    driver.publish(publish_request(target, uid=f"uid-{index}"))
    return target


class Pods:
    """Pods of this node the driver is asked about, by UID."""

    def __init__(self) -> None:
        self.by_uid: dict[str, dict[str, Any]] = {}
        self.asking = ""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.by_uid.get(self.asking)


def paced_driver(built: Build, tmp_path: Path, pods: Pods) -> CudaVolumes:
    return CudaVolumes(built.shim, node=NODE, get_pod=pods.get, pods_dir=tmp_path / "pods")


def publish_paced(tmp_path: Path, driver: CudaVolumes, pods: Pods, index: int, **kw: Any) -> Path:
    pods.asking = f"uid-{index}"
    pods.by_uid[pods.asking] = paced(pods.asking, **kw)
    return published(tmp_path, driver, index)


def test_pods_of_one_gpu_pace_by_one_file_and_another_gpus_by_another(
    built: Build, tmp_path: Path
) -> None:
    pods = Pods()
    driver = paced_driver(built, tmp_path, pods)
    first = publish_paced(tmp_path, driver, pods, 1, gpu=GPU_A)
    second = publish_paced(tmp_path, driver, pods, 2, gpu=GPU_A, enforcement="memory,compute-cap")
    other = publish_paced(tmp_path, driver, pods, 3, gpu=GPU_B)
    assert (first / "compute").read_text() == "300 share\n"
    assert (second / "compute").read_text() == "300 cap\n"
    assert stat.S_IMODE((first / "compute").stat().st_mode) == 0o644
    shared = (first / "gpu-time").stat()
    assert shared.st_size == cuda.GPU_TIME_BYTES
    assert stat.S_IMODE(shared.st_mode) == 0o666  # every pod of the GPU writes its slot
    assert (second / "gpu-time").stat().st_ino == shared.st_ino
    assert (other / "gpu-time").stat().st_ino != shared.st_ino
    # The GPU's first pod goes: the next pod still joins the file the second one has.
    driver.unpublish(UnpublishRequest("csi-abc", str(first)))
    fourth = publish_paced(tmp_path, driver, pods, 4, gpu=GPU_A)
    assert (fourth / "gpu-time").stat().st_ino == (second / "gpu-time").stat().st_ino


def test_a_restarted_driver_finds_the_gpus_file_again(built: Build, tmp_path: Path) -> None:
    pods = Pods()
    first = publish_paced(tmp_path, paced_driver(built, tmp_path, pods), pods, 1, gpu=GPU_A)
    again = publish_paced(tmp_path, paced_driver(built, tmp_path, pods), pods, 2, gpu=GPU_A)
    assert (again / "gpu-time").stat().st_ino == (first / "gpu-time").stat().st_ino


def test_a_paced_pod_without_a_gpu_uuid_gets_a_file_of_its_own(
    built: Build, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pods = Pods()
    driver = paced_driver(built, tmp_path, pods)
    first = publish_paced(tmp_path, driver, pods, 1, gpu=None)
    second = publish_paced(tmp_path, driver, pods, 2, gpu="../../etc")  # not a UUID either
    assert (first / "gpu-time").stat().st_ino != (second / "gpu-time").stat().st_ino
    assert "paced by a file of its own" in caplog.text


def test_a_pod_not_paced_gets_no_compute_files(built: Build, tmp_path: Path) -> None:
    target = tmp_path / "mount"
    volumes(built, pod(**{keys.GPU_COMPUTE: "300m", keys.GPU_UUID: GPU_A})).publish(
        publish_request(target)
    )
    assert not (target / "compute").exists()
    assert not (target / "gpu-time").exists()


def test_a_paced_pod_without_a_compute_share_is_refused(built: Build, tmp_path: Path) -> None:
    the_pod = pod(**{keys.ENFORCEMENT: "memory,compute"})
    with pytest.raises(Refused, match="no gpupack.io/gpu-compute"):
        volumes(built, the_pod).publish(publish_request(tmp_path / "mount"))


def test_two_published_pods_of_one_gpu_get_gpu_time_by_their_shares(
    built: Build, tmp_path: Path
) -> None:
    """The directories the driver wrote, used by the real shim as containers would."""
    pods = Pods()
    driver = paced_driver(built, tmp_path, pods)
    targets = [
        publish_paced(tmp_path, driver, pods, i, gpu=GPU_A, compute=compute)
        for i, compute in ((1, "300m"), (2, "700m"))
    ]
    start = time.monotonic() * 1000 + 1500
    end = start + 2000
    procs = [
        subprocess.Popen(
            [str(built.probe), "gpa", "ctx", f"work:{start}:{end}:4"],
            env={
                "PATH": os.environ["PATH"],
                "LD_LIBRARY_PATH": str(built.root),
                "LD_PRELOAD": str(target / "libgpupack-cuda.so"),
                "GPUPACK_CUDA_DIR": str(target),
                "GPUPACK_CUDA_QUIET": "1",
                "FAKE_CUDA_STATE": str(tmp_path / "device"),
                "FAKE_CUDA_CLOCK": str(tmp_path / "clock"),
                "FAKE_CUDA_KERNEL_US": "1000",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target in targets
    ]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        got.append(int(out.split("gpu_ns=")[1].split()[0]) / 2e9)
    assert abs(got[0] - 0.3) <= 0.05, got
    assert abs(got[1] - 0.7) <= 0.05, got
