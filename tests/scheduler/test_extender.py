"""The extender's verbs against an in-memory API: filter reserves, bind writes, nothing
is ever booked twice whatever kube-scheduler interleaves."""

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from gpupack import keys, seal
from gpupack.capacity import CREATED_FOR
from gpupack.packing import Allocation, plan
from gpupack.quantity import parse_compute
from gpupack.runtime.api import ApiError
from gpupack.shares import pool_of
from scheduler import waiting as waiting_module
from scheduler import wire
from scheduler.cache import Cache, Dirty
from scheduler.escapes import Escapes
from scheduler.exclusion import KARPENTER_API, SETTLING
from scheduler.extender import Extender
from scheduler.ledger import Ledger, Request
from scheduler.placement import place
from scheduler.score import PackingScorer
from scheduler.settings import Settings
from scheduler.waiting import REQUEUE_AGAIN, VERDICT_RENEWED, VERDICT_WRITTEN
from tests.scheduler.test_cache import UUIDS, Store, capacity, fractional, node

JSON = dict[str, Any]


class Api:
    """The verbs the extender writes with, over the same stores its informers read."""

    def __init__(self, pods: Store) -> None:
        self.pods = pods
        self.nodes = Store()  # `setup` shares its node store
        self.karpenter = False  # whether karpenter.sh/v1 is served
        self.node_patch_error: ApiError | None = None
        self.created: list[tuple[str, JSON]] = []
        self.patched: list[tuple[str, JSON]] = []
        self.calls: list[str] = []  # every write, in order
        self.lagging = False
        self.patch_seconds = 0.0
        self.conflict_once: set[str] = set()

    def _key(self, path: str) -> str:
        parts = path.split("/")
        return f"{parts[4]}/{parts[6]}"

    def get(self, path: str) -> JSON:
        if path == KARPENTER_API:
            if self.karpenter:
                return {"kind": "APIResourceList", "groupVersion": "karpenter.sh/v1"}
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if path.startswith("/api/v1/nodes/"):
            found = self.nodes.get(path.rsplit("/", 1)[1])
            if found is None:
                raise ApiError(404, "NotFound", "gone")
            return found
        pod = self.pods.get(self._key(path))
        if pod is None:
            raise ApiError(404, "NotFound", "gone")
        return pod

    def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        """A merge patch of labels and annotations (None removes), recorded; with
        `lagging`, recorded only (the informer has not brought it yet)."""
        time.sleep(self.patch_seconds)
        self.patched.append((path, body))
        self.calls.append(f"patch {path}")
        if path.startswith("/api/v1/nodes/"):
            if self.node_patch_error is not None:
                raise self.node_patch_error
            node_meta = self.get(path)["metadata"]
            if body["metadata"].get("resourceVersion") != node_meta.get("resourceVersion"):
                raise ApiError(409, "Conflict", "the object has been modified")
            node_meta.setdefault("labels", {}).update(body["metadata"]["labels"])
            node_meta["resourceVersion"] = str(int(node_meta.get("resourceVersion", "1")) + 1)
            return body
        if self.lagging or path.endswith("/status"):
            return body
        meta = self.get(path)["metadata"]
        for field in ("labels", "annotations"):
            values = meta.setdefault(field, {})
            for k, v in (body["metadata"].get(field) or {}).items():
                if v is None:
                    values.pop(k, None)
                else:
                    values[k] = v
        return body

    def create(self, path: str, body: JSON) -> JSON:
        """A Binding as the API server takes one: uid and resourceVersion preconditions,
        its annotations copied onto the pod with the node."""
        if path.endswith("/binding"):
            pod_path = path.removesuffix("/binding")
            key = self._key(pod_path)
            pod = self.get(pod_path)
            meta = pod["metadata"]
            if key in self.conflict_once:
                self.conflict_once.discard(key)
                meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            wanted = body["metadata"]
            if (wanted["uid"], wanted["resourceVersion"]) != (meta["uid"], meta["resourceVersion"]):
                raise ApiError(409, "Conflict", "the object has been modified")
            if pod["spec"].get("nodeName"):
                raise ApiError(409, "Conflict", "already assigned")
            meta["annotations"].update(wanted["annotations"])
            pod["spec"]["nodeName"] = body["target"]["name"]
        self.created.append((path, body))
        self.calls.append(f"create {path}")
        return body

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        raise NotImplementedError

    def watch(self, path: str, params: Mapping[str, str]) -> Any:
        raise NotImplementedError

    def update(self, path: str, body: JSON) -> JSON:
        raise NotImplementedError

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        raise NotImplementedError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


KEY = b"decision-key-of-this-test-0123456789"


_made: list[Extender] = []


@pytest.fixture(autouse=True)
def _finish_capacity_writes() -> Iterator[None]:
    """Let each test's extenders finish their background writes before the next test:
    a write still running after its test logs into a closed capture."""
    yield
    stop = threading.Event()
    stop.set()
    while _made:
        _made.pop().run(stop)


HOSTNAME = "kubernetes.io/hostname"


def extender_over(
    nodes: Store, pods: Store, api: Api, clock: Clock | None = None, **settings: Any
) -> Extender:
    """An extender over these informer stores, writing through `api` on one writer thread
    (its writes run in order: `flush` waits for them)."""
    made = Extender(
        api,
        Cache(nodes, pods, Dirty(), key=KEY),
        PackingScorer(),
        Settings(workers=1, **settings),
        clock=clock or Clock(),
    )
    _made.append(made)
    return made


def setup(
    *gpus: int,
    timeout: float = 60.0,
    nodes: Mapping[str, int] | None = None,
    labels: Mapping[str, dict[str, str]] | None = None,
    api: Callable[[Store], Api] = Api,
    **settings: Any,
) -> tuple[Extender, Store, Api, Clock]:
    """An extender with capacity pods `cap-<i>` for `gpus` on n1, over `nodes` (name ->
    allocatable nvidia.com/gpu; by default n1 and n2 with none, as kwok nodes without
    the device plugin's count), with `labels` added to nodes by name."""
    node_store, pods = Store(), Store()
    for name, count in (nodes or {"n1": 0, "n2": 0}).items():
        node_store.objects[name] = node(name)
        node_store.objects[name]["metadata"]["labels"].update((labels or {}).get(name, {}))
        if count:
            node_store.objects[name]["status"]["allocatable"][keys.NVIDIA_GPU] = str(count)
    for index in gpus:
        pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-{index}"] = capacity(index)
    writer, clock = api(pods), Clock()
    writer.nodes = node_store
    settings.setdefault("reservation_timeout", timeout)
    return extender_over(node_store, pods, writer, clock, **settings), pods, writer, clock


def pending(
    pods: Store, name: str, compute: str = "300m", extra: dict[str, str] | None = None
) -> JSON:
    """A pod the webhook admitted (with `extra` annotations): sealed with the key."""
    pod = fractional(name, compute)
    annotations = pod["metadata"]["annotations"]
    annotations.update(extra or {})
    annotations[keys.SEAL] = seal.seal(KEY, "ml", annotations, 1_800_000_000)
    pod["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    pods.objects[f"ml/{name}"] = pod
    return pod


def filter_(extender: Extender, pod: JSON, nodes: tuple[str, ...] = ("n1", "n2")) -> JSON:
    return dict(extender.filter(wire.FilterArgs(pod, nodes)))


def bind(extender: Extender, pod: JSON, node_name: str) -> JSON:
    args = wire.BindArgs("ml", pod["metadata"]["name"], pod["metadata"]["uid"], node_name)
    return dict(extender.bind(args))


def test_filter_answers_the_node_of_the_gpu_it_reserves() -> None:
    extender, pods, _, _ = setup(0)
    pod = pending(pods, "a")

    result = filter_(extender, pod)

    assert result["NodeNames"] == ["n1"]
    assert extender.reservations["ml/a"].gpu == UUIDS[0]
    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 300


def test_pods_filtered_before_any_bind_never_share_a_full_gpu() -> None:
    extender, pods, _, _ = setup(0)
    answers = [filter_(extender, pending(pods, f"p{i}")) for i in range(4)]

    assert [a["NodeNames"] for a in answers[:3]] == [["n1"]] * 3
    refused = answers[3]
    assert refused["NodeNames"] == []
    assert set(refused["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    assert "insufficient GPU compute (asks 300m" in refused["FailedAndUnresolvableNodes"]["n1"]
    assert "no GPU of the pod's pool" in refused["FailedAndUnresolvableNodes"]["n2"]
    assert "ml/p3" in extender.waiting


def test_a_pod_filtered_again_gives_back_what_it_held() -> None:
    extender, pods, _, _ = setup(0)
    pod = pending(pods, "a", "600m")
    filter_(extender, pod)

    filter_(extender, pod)

    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 600


def test_a_reservation_never_bound_is_released_after_the_timeout() -> None:
    extender, pods, _, clock = setup(0, timeout=30)
    filter_(extender, pending(pods, "a", "600m"))
    clock.now += 31

    extender.tick()

    assert extender.reservations == {}
    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 0
    assert "ml/a" in extender.cache.pending


def test_bind_writes_the_assignment_with_the_binding() -> None:
    extender, pods, api, _ = setup(0)
    pod = pending(pods, "a")
    filter_(extender, pod)

    assert bind(extender, pod, "n1") == {"Error": ""}

    annotations = pods.objects["ml/a"]["metadata"]["annotations"]
    assert (annotations[keys.GPU_UUID], annotations[keys.CAPACITY_POD]) == (UUIDS[0], "cap-0")
    assert [path for path, _ in api.created] == ["/api/v1/namespaces/ml/pods/a/binding"]
    assert extender.reservations == {}
    assert "ml/a" in extender.cache.assumed  # booked until the informer shows it bound


def test_a_pod_touched_since_filter_is_bound_at_its_new_version_if_its_share_is_unchanged() -> None:
    extender, pods, api, _ = setup(0)
    pod = pending(pods, "a")
    filter_(extender, pod)
    api.conflict_once.add("ml/a")  # kube-scheduler wrote a condition in between

    assert bind(extender, pod, "n1") == {"Error": ""}
    assert pods.objects["ml/a"]["spec"]["nodeName"] == "n1"


def test_a_pod_whose_share_changed_since_filter_is_not_bound_and_its_gpu_is_released() -> None:
    extender, pods, api, _ = setup(0)
    pod = pending(pods, "a")
    filter_(extender, pod)
    api.conflict_once.add("ml/a")
    pods.objects["ml/a"] = {
        **pod,
        "metadata": {
            **pod["metadata"],
            "annotations": {**pod["metadata"]["annotations"], keys.GPU_COMPUTE: "900m"},
        },
    }

    result = bind(extender, pod, "n1")

    assert "share changed" in result["Error"]
    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 0
    assert not api.created


def test_a_bind_without_a_reservation_places_the_pod_again_on_that_node() -> None:
    extender, pods, _, clock = setup(0, timeout=5)
    pod = pending(pods, "a")
    filter_(extender, pod)
    clock.now += 10
    extender.tick()  # expired

    assert bind(extender, pod, "n1") == {"Error": ""}
    assert pods.objects["ml/a"]["metadata"]["annotations"][keys.GPU_UUID] == UUIDS[0]


def test_a_bind_without_a_reservation_fails_when_the_gpu_filled_up_meanwhile() -> None:
    extender, pods, _, clock = setup(0, timeout=5)
    late = pending(pods, "late", "600m")
    filter_(extender, late)
    clock.now += 10
    extender.tick()
    filter_(extender, pending(pods, "other", "600m"))

    result = bind(extender, late, "n1")

    assert "insufficient GPU compute" in result["Error"]
    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 600


def test_a_pod_not_admitted_by_the_webhook_fails_on_every_node_with_the_reason() -> None:
    extender, pods, _, _ = setup(0)
    pod = pending(pods, "forged")
    del pod["metadata"]["annotations"][keys.DECISION]

    result = filter_(extender, pod)

    assert result["NodeNames"] == []
    assert all(keys.DECISION in why for why in result["FailedAndUnresolvableNodes"].values())
    assert set(result["FailedAndUnresolvableNodes"]) == {"n1", "n2"}


def test_the_capacity_pod_is_marked_hosting_before_the_first_bind_only() -> None:
    extender, pods, api, _ = setup(0)
    for name in ("a", "b"):
        pod = pending(pods, name)
        filter_(extender, pod)
        bind(extender, pod, "n1")
        extender.tick()

    capacity = pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-0"]
    assert capacity["metadata"]["labels"][keys.HOSTING] == "true"
    assert [path for path, _ in api.patched] == [
        f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/pods/cap-0"
    ]
    assert api.calls[:2] == [
        f"patch /api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/pods/cap-0",
        "create /api/v1/namespaces/ml/pods/a/binding",
    ]


def test_a_pod_whose_gpu_is_starting_on_a_feasible_node_is_asked_to_retry() -> None:
    extender, pods, _, _ = setup()
    starting = capacity(0)
    del starting["metadata"]["annotations"][keys.GPU_UUID]  # bound, no device named yet
    pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-0"] = starting

    retried = filter_(extender, pending(pods, "a"), ("n1", "n2"))
    parked = filter_(extender, pending(pods, "b"), ("n2",))  # n1 is not for this pod

    assert retried["NodeNames"] == []
    assert "cap-0 on n1 is starting" in retried["Error"]
    assert parked["Error"] == ""
    assert set(parked["FailedAndUnresolvableNodes"]) == {"n2"}


def test_parallel_binds_onto_one_gpu_write_the_mark_once_and_all_after_it() -> None:
    extender, pods, api, _ = setup(0)
    api.lagging, api.patch_seconds = True, 0.05
    names = ("a", "b", "c")
    for name in names:
        filter_(extender, pending(pods, name, "100m"))
    binds = [
        threading.Thread(target=bind, args=(extender, pods.objects[f"ml/{n}"], "n1")) for n in names
    ]
    for thread in binds:
        thread.start()
    for thread in binds:
        thread.join()

    assert len(api.patched) == 1
    assert api.calls[0].startswith("patch ")  # every Binding came after the label
    assert sum(call.endswith("/binding") for call in api.calls) == 3


def test_the_mark_is_not_repeated_while_the_informer_lags_behind_it() -> None:
    extender, pods, api, _ = setup(0)
    api.lagging = True  # the informer's copy of the capacity pod stays unlabelled
    for name in ("a", "b", "c"):
        pod = pending(pods, name, "100m")
        filter_(extender, pod)
        assert bind(extender, pod, "n1")["Error"] == ""

    assert len(api.patched) == 1
    capacity = pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-0"]
    capacity["metadata"]["resourceVersion"] = "changed"  # e.g. housekeeping unlabelled it
    pod = pending(pods, "d", "100m")
    filter_(extender, pod)
    assert bind(extender, pod, "n1")["Error"] == ""
    assert len(api.patched) == 2


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda a: a.pop(keys.SEAL), id="no-seal"),
        pytest.param(lambda a: a.update({keys.GPU_COMPUTE: "1m"}), id="share-edited"),
        pytest.param(lambda a: a.update({keys.SEAL: "v1.1.AAAA"}), id="made-up-seal"),
    ],
)
def test_a_pod_whose_seal_does_not_verify_is_not_placed(forge: Any) -> None:
    extender, pods, _, _ = setup(0)
    pod = pending(pods, "forged")
    forge(pod["metadata"]["annotations"])

    result = filter_(extender, pod)

    assert result["NodeNames"] == []
    assert all(keys.SEAL in why for why in result["FailedAndUnresolvableNodes"].values())
    assert extender.cache.ledger.gpus[UUIDS[0]].used_compute == 0


def test_a_pod_sealed_for_another_namespace_is_not_placed() -> None:
    extender, pods, _, _ = setup(0)
    pod = pending(pods, "moved")
    pod["metadata"]["namespace"] = "other-team"
    pods.objects["other-team/moved"] = pods.objects.pop("ml/moved")

    assert filter_(extender, pod)["NodeNames"] == []


@pytest.mark.parametrize("seed", range(20))
def test_no_interleaving_of_filters_binds_timeouts_and_deletes_over_books_a_gpu(seed: int) -> None:
    rng = random.Random(seed)
    extender, pods, _, clock = setup(0, 1, timeout=5)
    names = [f"p{i}" for i in range(30)]
    for name in names:
        pending(pods, name, rng.choice(["100m", "200m", "300m", "500m"]))
    for _ in range(300):
        name = rng.choice(names)
        key = f"ml/{name}"
        pod = pods.objects.get(key)
        action = rng.random()
        if pod is None:
            continue
        if action < 0.5 and not pod["spec"].get("nodeName"):
            filter_(extender, pod)
        elif action < 0.8 and not pod["spec"].get("nodeName"):
            bind(extender, pod, rng.choice(["n1", "n2"]))
        elif action < 0.9:
            del pods.objects[key]
        else:
            clock.now += rng.choice([1, 6])
        extender.cache.dirty.pod(key)  # the informer saw whatever changed
        extender.tick()
        booked: dict[str, int] = {}
        for other in pods.objects.values():
            uuid = other["metadata"]["annotations"].get(keys.GPU_UUID)
            if other["spec"].get("nodeName") and uuid and other["metadata"]["namespace"] == "ml":
                compute = parse_compute(other["metadata"]["annotations"][keys.GPU_COMPUTE], "c")
                booked[uuid] = booked.get(uuid, 0) + compute
        for uuid, gpu in extender.cache.ledger.gpus.items():
            assert booked.get(uuid, 0) <= gpu.used_compute <= 1000, (seed, uuid)


def created_capacity(extender: Extender, api: Api) -> list[str]:
    stop = threading.Event()
    stop.set()
    extender.run(stop)  # returns at once, after the capacity writes finished
    return [body["metadata"]["name"] for path, body in api.created if path.endswith("/pods")]


def test_a_pod_that_fits_no_gpu_of_its_pool_gets_capacity() -> None:
    extender, pods, api, _ = setup(0)
    filter_(extender, pending(pods, "big", "900m"))
    filter_(extender, pending(pods, "more", "900m"))

    assert len(created_capacity(extender, api)) == 1


def test_capacity_for_a_pod_lands_only_where_that_pod_could_then_run() -> None:
    """kube-scheduler judged the pod: of the GPU nodes, only n1 is feasible (say its
    anti-affinity or a host port excludes n2 and n3). Its capacity pod may go to n1 or to a
    node an autoscaler adds, never to n2 or n3; and it carries the pod's affinity to
    other pods, so a node added for it is one the pod could use."""
    extender, pods, api, _ = setup(0, nodes={"n1": 8, "n2": 8, "n3": 8, "cpu-only": 0})
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))  # fills cap-0
    pod = pending(pods, "web", "900m")
    near_db = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME}
    pod["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [near_db]}
    }

    filter_(extender, pod, nodes=("n1", "cpu-only"))

    assert len(created_capacity(extender, api)) == 1
    [body] = [b for path, b in api.created if path.endswith("/pods")]
    affinity = body["spec"]["affinity"]
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": HOSTNAME, "operator": "NotIn", "values": ["n2", "n3"]} in (
        required["nodeSelectorTerms"][0]["matchExpressions"]
    )
    assert affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {**near_db, "namespaces": ["ml"]}
    ]


def _capacity_requirements(api: Api) -> list[JSON]:
    [body] = [b for path, b in api.created if path.endswith("/pods")]
    required = body["spec"]["affinity"]["nodeAffinity"]
    terms: list[JSON] = required["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return [e for term in terms for e in term["matchExpressions"]]


def test_where_karpenter_runs_capacity_names_the_nodes_it_avoids_by_gpupacks_node_label() -> None:
    """Karpenter ignores a pod whose required node affinity names the hostname; the
    nodes the capacity pod must avoid get gpupack's own label first, and it names them
    by that. n2 already carries one (Karpenter's random value, say): it is kept."""
    extender, pods, api, _ = setup(0, nodes={"n1": 8, "n2": 8, "n3": 8})
    api.karpenter = True
    api.nodes.objects["n2"]["metadata"]["labels"][keys.NODE] = "4821"
    extender.cache.dirty.node("n2")
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))  # fills cap-0

    filter_(extender, pending(pods, "web", "900m"), nodes=("n1",))

    assert len(created_capacity(extender, api)) == 1
    assert _capacity_requirements(api) == [
        {"key": keys.NODE, "operator": "NotIn", "values": ["4821", "n3"]}
    ]
    assert api.nodes.objects["n3"]["metadata"]["labels"][keys.NODE] == "n3"
    assert api.nodes.objects["n2"]["metadata"]["labels"][keys.NODE] == "4821"


def test_nodes_the_capacity_pods_own_node_selector_excludes_are_not_named() -> None:
    """Pinned to L4 GPUs, the pod finds the A100 node infeasible; so does its capacity
    pod, by the node selector it inherits: nothing needs naming, and the pod is one every
    autoscaler reads without gpupack's label."""
    l4 = {keys.GFD_PRODUCT: "NVIDIA-L4"}
    a100 = {keys.GFD_PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    extender, pods, api, _ = setup(0, nodes={"n1": 8, "a100": 8}, labels={"n1": l4, "a100": a100})
    api.karpenter = True
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))
    pod = pending(pods, "web", "900m")
    pod["spec"]["nodeSelector"] = dict(l4)

    filter_(extender, pod, nodes=("n1",))

    assert len(created_capacity(extender, api)) == 1
    [body] = [b for path, b in api.created if path.endswith("/pods")]
    assert body["spec"]["nodeSelector"] == l4
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in (body["spec"]["affinity"]["nodeAffinity"])
    )
    assert not [path for path, _ in api.patched if path.startswith("/api/v1/nodes/")]


def test_a_node_whose_labels_change_is_judged_again_for_the_pool() -> None:
    """The verdict that a pool's node selector keeps capacity off a node is kept per
    node object: relabelled to the pool's GPU model, the node must be named."""
    l4 = {keys.GFD_PRODUCT: "NVIDIA-L4"}
    extender, pods, api, _ = setup(
        0, nodes={"n1": 8, "other": 8}, labels={"n1": l4, "other": {keys.GFD_PRODUCT: "A100"}}
    )

    def pinned(name: str) -> JSON:
        pod = pending(pods, name, "900m")
        pod["spec"]["nodeSelector"] = dict(l4)
        extender.cache.dirty.pod(f"ml/{name}")
        return pod

    # One at a time, each filtered as it comes.
    filter_(extender, pinned("web"), nodes=("n1",))  # "other" is excluded by the selector
    relabelled = dict(api.nodes.objects["other"])
    relabelled["metadata"] = {**relabelled["metadata"], "labels": {**l4}}
    api.nodes.objects["other"] = relabelled  # a new object, as the informer stores one
    extender.cache.dirty.node("other")
    filter_(extender, pinned("more"), nodes=("n1",))  # now infeasible for other reasons

    assert len(created_capacity(extender, api)) == 2
    first, second = [b for p, b in api.created if p.endswith("/pods")]
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in (first["spec"]["affinity"]["nodeAffinity"])
    )
    assert _avoided(second) == ["other"]


def test_a_node_that_cannot_be_labelled_gets_no_capacity_pod_that_could_land_on_it() -> None:
    extender, pods, api, _ = setup(0, nodes={"n1": 8, "n2": 8})
    api.karpenter = True
    api.node_patch_error = ApiError(403, "Forbidden", "denied by the admission policy")
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))

    filter_(extender, pending(pods, "web", "900m"), nodes=("n1",))
    extender.flush()

    assert not [path for path, _ in api.created if path.endswith("/pods")]
    api.node_patch_error = None
    filter_(extender, pods.objects["ml/web"], nodes=("n1",))  # claimed names were released
    assert len(created_capacity(extender, api)) == 1
    assert _capacity_requirements(api) == [
        {"key": keys.NODE, "operator": "NotIn", "values": ["n2"]}
    ]


@pytest.mark.parametrize(
    ("autoscaler", "karpenter", "labelled"),
    [
        pytest.param("auto", True, ["n1", "n2"], id="auto-with-karpenter"),
        pytest.param("auto", False, [], id="auto-without-karpenter"),
        pytest.param("karpenter", False, ["n1", "n2"], id="karpenter"),
        pytest.param("cluster-autoscaler", True, [], id="cluster-autoscaler"),
        pytest.param("none", True, [], id="none"),
    ],
)
def test_housekeeping_labels_every_gpu_node_only_where_karpenter_runs(
    autoscaler: str, karpenter: bool, labelled: list[str]
) -> None:
    extender, _, api, _ = setup(0, nodes={"n1": 8, "n2": 4, "cpu": 0}, autoscaler=autoscaler)
    api.karpenter = karpenter
    extender.leading = True

    extender.tick()
    extender.flush()

    found = sorted(
        n for n, obj in api.nodes.objects.items() if keys.NODE in obj["metadata"]["labels"]
    )
    assert found == labelled


def test_a_pod_larger_than_every_gpu_of_its_pool_gets_no_capacity() -> None:
    extender, pods, api, _ = setup(0)  # the pool's GPU has 80Gi (the node's GFD label)
    pod = pending(pods, "huge", extra={keys.GPU_MEMORY: "100Gi"})

    result = filter_(extender, pod)

    assert "insufficient GPU memory" in result["FailedAndUnresolvableNodes"]["n1"]
    assert created_capacity(extender, api) == []


def test_only_the_leader_writes_the_event_of_an_escaped_pod_and_every_replica_counts_it() -> None:
    nodes, pods, namespaces = Store(), Store(), Store()
    nodes.objects["n1"] = node("n1")
    namespaces.objects["ml"] = {"metadata": {"name": "ml", "labels": {keys.OPTIMIZE: "enabled"}}}
    whole = {"name": "c", "resources": {"limits": {keys.NVIDIA_GPU: "1"}}}
    pods.objects["ml/escaped"] = {
        "metadata": {"name": "escaped", "namespace": "ml", "uid": "u1"},
        "spec": {"containers": [whole], "schedulerName": "default-scheduler"},
    }
    api = Api(pods)
    escapes = Escapes(pods, namespaces, {"kube-system"})
    extender = Extender(
        api,
        Cache(nodes, pods, Dirty(), key=KEY),
        PackingScorer(),
        Settings(workers=1),
        escapes=escapes,
    )

    extender.tick()
    assert extender.usage.escaped == 1
    assert api.created == []  # a standby counts, but writes nothing

    extender.leading = True
    extender.tick()
    extender.tick()
    extender._pool.shutdown(wait=True)
    events = [body for path, body in api.created if path.endswith("/events")]
    assert len(events) == 1
    assert events[0]["reason"] == "NotRewrittenByGPUPack"
    assert events[0]["type"] == "Warning"
    assert events[0]["regarding"]["name"] == "escaped"


def test_an_mps_daemon_that_restarts_is_reported_on_its_gpu_and_its_pods_and_takes_no_pods() -> (
    None
):
    nodes, pods = Store(), Store()
    nodes.objects["n1"] = node("n1")
    holder = capacity(0)
    holder["metadata"]["labels"]["gpupack.io/sharing"] = "mps"
    holder["metadata"]["uid"] = "cap-uid"
    status = {"name": "capacity", "ready": True, "restartCount": 0}
    holder["status"]["containerStatuses"] = [status]
    pods.objects["gpupack-system/cap-0"] = holder
    pods.objects["ml/on-it"] = fractional("on-it", "300m", gpu=0)
    api = Api(pods)
    extender = Extender(
        api, Cache(nodes, pods, Dirty(), key=KEY), PackingScorer(), Settings(workers=1)
    )
    extender.leading = True

    extender.tick()
    assert (extender.usage.mps_daemons, extender.usage.mps_daemons_ready) == (1, 1)
    assert extender.usage.unhealthy == 0

    status.update(
        ready=False,
        restartCount=1,
        lastState={"terminated": {"reason": "Error", "exitCode": 1}},
    )
    extender.cache.dirty.pod("gpupack-system/cap-0")
    extender.tick()
    extender.tick()  # reported once
    extender._pool.shutdown(wait=True)

    events = [body for path, body in api.created if path.endswith("/events")]
    assert sorted(e["regarding"]["name"] for e in events) == ["cap-0", "on-it"]
    assert {e["reason"] for e in events} == {"MPSDaemonRestarted"}
    assert "Error with status 1" in events[0]["note"]
    assert "ml/on-it" in events[0]["note"]
    assert (extender.usage.mps_daemons, extender.usage.mps_daemons_ready) == (1, 0)
    assert extender.usage.unhealthy == 1  # no new pods while its daemon does not answer


def requeued(extender: Extender, api: Api) -> list[str]:
    """The pods the extender asked kube-scheduler to try again, once its writes finished."""
    created_capacity(extender, api)
    return requests_to_requeue(api)


def requeued_so_far(extender: Extender, api: Api) -> list[str]:
    """`requeued`, for an extender that goes on: the writes submitted so far are done."""
    extender.flush()
    return requests_to_requeue(api)


def requests_to_requeue(api: Api) -> list[str]:
    return [
        path.split("/")[-2]
        for path, body in api.patched
        if path.endswith("/status")
        and [c["type"] for c in body["status"]["conditions"]] == [keys.REQUEUE_CONDITION]
    ]


def refused_behind(nodes: tuple[str, ...]) -> tuple[Extender, Store, Api, Clock]:
    """`first` holds the one GPU (cap-0 on n1); `web` was refused, feasible on `nodes`."""
    extender, pods, api, clock = setup(0)
    extender.leading = True
    assert filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))["NodeNames"]
    assert not filter_(extender, pending(pods, "web", "900m"), nodes=nodes).get("NodeNames")
    extender.tick()
    return extender, pods, api, clock


def test_a_refused_pod_is_requeued_as_soon_as_a_gpu_it_may_use_has_room() -> None:
    """kube-scheduler parks a pod its extender refused until an event its own plugins care
    about; a share freeing on a GPU is none. An update of the pod itself is."""
    extender, pods, api, clock = refused_behind(("n1", "n2"))
    extender.tick()
    assert not any(path.endswith("/status") for path, _ in api.patched)  # still no room

    del pods.objects["ml/first"]  # its share frees
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()
    extender.tick()  # nothing changed since: no second request

    assert requeued(extender, api) == ["web"]


def test_a_gpu_freed_for_one_pod_requeues_one_waiting_pod_not_all_of_them() -> None:
    """Four pods of 900m wait behind `first`; when its share frees, the GPU has room for
    one of them: one is asked to try again (the one waiting longest), not four, and not
    the others at the next rounds while its filter is coming. Each request is a write
    on the API server; at 2,000 pods, the requests for room that one pod takes were
    most of the burst's writes."""
    extender, pods, api, clock = setup(0)
    extender.leading = True
    assert filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))["NodeNames"]
    for name in ("w1", "w2", "w3", "w4"):
        assert not filter_(extender, pending(pods, name, "900m"), nodes=("n1",)).get("NodeNames")
        clock.now += 0.1
    extender.tick()

    del pods.objects["ml/first"]
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()
    clock.now += 1
    extender.tick()

    assert requeued(extender, api) == ["w1"]


def test_a_refused_pod_is_not_requeued_for_room_on_a_node_it_may_not_use() -> None:
    extender, pods, api, clock = refused_behind(("n2",))  # kube-scheduler excluded n1

    del pods.objects["ml/first"]
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()

    assert requeued(extender, api) == []


def test_only_the_leader_requeues() -> None:
    extender, pods, api, clock = refused_behind(("n1", "n2"))
    extender.leading = False

    del pods.objects["ml/first"]
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()

    assert requeued(extender, api) == []


def _live_capacity(api: Api, pods: Store) -> set[str]:
    """Capacity pods the API server has: created (whether the informer shows them yet or
    not), not deleted."""
    created = {
        body["metadata"]["name"]
        for path, body in api.created
        if path == f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/pods"
    }
    return created | {k.split("/")[1] for k in pods.objects if k.startswith(keys.SYSTEM_NAMESPACE)}


class CreatingApi(Api):
    """The API server refuses a second pod of one name, as the real one does, and serves
    the pod of that name on a GET."""

    def get(self, path: str) -> JSON:
        collection, _, name = path.rpartition("/")
        if collection == f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/pods":
            made = [b for p, b in self.created if p == collection and b["metadata"]["name"] == name]
            if made:
                return made[-1]
        return super().get(path)

    def create(self, path: str, body: JSON) -> JSON:
        if path.endswith(f"{keys.SYSTEM_NAMESPACE}/pods"):
            name = body["metadata"]["name"]
            if any(b["metadata"]["name"] == name for p, b in self.created if p == path):
                raise ApiError(409, "AlreadyExists", f"pods {name!r} already exists")
        return super().create(path, body)


@pytest.mark.parametrize("seed", range(20))
def test_no_interleaving_of_filters_restarts_and_slow_capacity_pods_over_provisions(
    seed: int,
) -> None:
    """Bounded capacity: every capacity pod that holds no share is one the pods still
    waiting need under gpupack's packing. Random interleavings of filters, binds, the
    extender restarting (its in-flight names lost) and capacity pods that the informer
    shows late, or that start late, never break it."""
    rng = random.Random(seed)
    nodes, pods = Store(), Store()
    nodes.objects["n1"], nodes.objects["n2"] = node("n1"), node("n2")
    api, clock = CreatingApi(pods), Clock()

    def start() -> Extender:
        return extender_over(nodes, pods, api, clock)

    extender = start()
    names = [f"p{i}" for i in range(24)]
    for name in names:
        pending(pods, name, rng.choice(["200m", "300m", "500m", "700m"]))
    shown: set[str] = set()
    for _ in range(250):
        action = rng.random()
        name = rng.choice(names)
        pod = pods.objects[f"ml/{name}"]
        if action < 0.45 and not pod["spec"].get("nodeName"):
            result = filter_(extender, pod)
            if result.get("NodeNames"):
                bind(extender, pod, result["NodeNames"][0])
        elif action < 0.75:  # a capacity pod created earlier reaches the informer, or starts
            waiting = sorted(_live_capacity(api, pods) - shown)
            if waiting:
                made = waiting[0]
                index = int(made.rsplit("-", 1)[1])
                holder = capacity(index % len(UUIDS), rng.choice(["n1", "n2"]))
                holder["metadata"]["name"] = made
                holder["metadata"]["labels"][keys.POOL] = pool_of(pod)
                if index >= len(UUIDS) or rng.random() < 0.3:  # still starting: no GPU named
                    holder["metadata"]["annotations"].pop(keys.GPU_UUID)
                    holder["spec"].pop("nodeName")
                    holder["status"]["phase"] = "Pending"
                else:
                    shown.add(made)
                pods.objects[f"{keys.SYSTEM_NAMESPACE}/{made}"] = holder
                extender.cache.dirty.pod(f"{keys.SYSTEM_NAMESPACE}/{made}")
        elif action < 0.85:
            extender.flush()
            extender = start()  # a restart: the in-flight names are gone
        else:
            clock.now += rng.choice([1, 10])
        extender.cache.dirty.pod(f"ml/{name}")
        extender.tick()
        extender.flush()

        hosting = {
            p["metadata"]["annotations"][keys.CAPACITY_POD]
            for p in pods.objects.values()
            if p["metadata"]["namespace"] == "ml" and p["spec"].get("nodeName")
        }
        hosting |= {r.holder for r in extender.reservations.values()}
        unplaced = [
            Allocation(
                f"ml/{p['metadata']['name']}",
                parse_compute(p["metadata"]["annotations"][keys.GPU_COMPUTE], "c"),
                0,
                "ml/Pod/x",
            )
            for p in pods.objects.values()
            if p["metadata"]["namespace"] == "ml" and not p["spec"].get("nodeName")
        ]
        idle = _live_capacity(api, pods) - hosting
        assert len(idle) <= plan((), unplaced, new_gpu_memory=None).missing, (seed, sorted(idle))


class DeletingApi(Api):
    def __init__(self, pods: Store) -> None:
        super().__init__(pods)
        self.deleted: list[str] = []

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        self.deleted.append(path.rsplit("/", 1)[1])
        return {}


def test_an_empty_gpu_another_pools_waiting_pod_needs_is_released_at_once() -> None:
    """cap-0 (pool A) sits empty on n1. A pod of pool B may only go to n1, and B's capacity
    pod fits nowhere (n1's GPUs are all held). The grace period would keep cap-0 for five
    minutes; B's pod needs that GPU now."""
    extender, pods, api, _ = setup(0, nodes={"n1": 0}, api=DeletingApi)
    assert isinstance(api, DeletingApi)
    extender.leading = True
    other = pending(pods, "other", "300m")
    other["spec"]["tolerations"] = [{"key": "team-b", "operator": "Exists"}]  # pool B
    assert not filter_(extender, other, nodes=("n1",)).get("NodeNames")
    extender.flush()
    [body] = [b for p, b in api.created if p.endswith("/pods")]
    assert body["metadata"]["labels"][keys.POOL] == pool_of(other)
    extender.tick()
    extender.flush()
    assert api.deleted == []  # B's capacity pod may still find a GPU

    body["status"] = unschedulable("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    key = f"{keys.SYSTEM_NAMESPACE}/{body['metadata']['name']}"
    pods.objects[key] = body
    extender.cache.dirty.pod(key)
    extender.tick()
    extender.flush()

    assert api.deleted == ["cap-0"]


def test_pods_that_may_go_to_different_nodes_do_not_count_on_each_others_gpus() -> None:
    """Two 300m pods of one pool would share one GPU, but kube-scheduler lets `a` only onto
    n1 and `b` only onto n2 (anti-affinity, say): a GPU coming for one is no GPU for the
    other, so each gets its own, required where it may run. Pods with equal requirements
    still share one."""
    extender, pods, api, _ = setup(nodes={"n1": 8, "n2": 8})

    filter_(extender, pending(pods, "a", "300m"), nodes=("n1",))
    filter_(extender, pending(pods, "b", "300m"), nodes=("n2",))
    filter_(extender, pending(pods, "c", "300m"), nodes=("n2",))  # joins b's GPU

    assert len(created_capacity(extender, api)) == 2
    avoided = sorted(
        b["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][-1]["values"][0]
        for p, b in api.created
        if p.endswith("/pods")
    )
    assert avoided == ["n1", "n2"]


def unschedulable(message: str) -> JSON:
    """A pending pod's status after kube-scheduler found no node for it."""
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    return {"phase": "Pending", "conditions": [{**condition, "message": message}]}


def test_a_pod_no_node_can_take_gets_a_gpu_only_on_a_node_not_there_yet() -> None:
    """kube-scheduler finds no node for `far` (say its node selector names a GPU model no
    node has yet) and never asks the extender; the leader asks capacity for it anyway,
    required off every existing GPU node, so only an autoscaler's new node can take it.
    A pod gpupack refused was seen by the extender: it waits for its next filter."""
    extender, pods, api, _ = setup(nodes={"n1": 8, "n2": 0})
    extender.leading = True
    for name, message in (
        ("far", "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."),
        ("seen", "0/2 nodes are available: 2 gpupack: no GPU of this pod's pool."),
    ):
        pending(pods, name, "300m")["status"] = unschedulable(message)
    for name in ("far", "seen"):
        extender.cache.dirty.pod(f"ml/{name}")

    extender.tick()

    assert len(created_capacity(extender, api)) == 1
    [body] = [b for p, b in api.created if p.endswith("/pods")]
    assert body["metadata"]["annotations"][CREATED_FOR] == "ml/Pod/far"
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][-1] == {
        "key": HOSTNAME,
        "operator": "NotIn",
        "values": ["n1"],
    }


def test_a_pod_no_node_can_take_is_judged_again_when_a_gpu_node_arrives() -> None:
    """Two replicas that each need a node of their own wait at once, off n1: one capacity
    pod is planned for both, and an autoscaler's node n2 comes for it. One replica runs
    there; the other is still refused by kube-scheduler (its anti-affinity), which never
    asks the extender. When the GPU nodes change and kube-scheduler has said so of the
    new ones, the leader judges it again: its GPU must now stay off n2 too, a requirement
    no coming GPU meets, so it asks for one."""
    message = "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    extender, pods, api, _ = setup(nodes={"n1": 8})
    extender.leading = True
    replicas = {}
    for name in ("r1", "r2"):
        replicas[name] = pending(pods, name, "500m")
        replicas[name]["status"] = unschedulable(message)
        extender.cache.dirty.pod(f"ml/{name}")
    extender.tick()
    extender.flush()
    [first] = [b for p, b in api.created if p.endswith("/pods")]
    assert _avoided(first) == ["n1"]

    extender.tick()  # nothing changed: asked for already
    extender.flush()
    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 1

    add_gpu_node(extender, api, "n2")
    extender.tick()  # kube-scheduler's verdict is still about n1 alone
    extender.flush()
    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 1

    replicas["r2"]["status"] = unschedulable(message.replace("1", "2"))
    extender.cache.dirty.pod("ml/r2")
    extender.tick()

    assert len(created_capacity(extender, api)) == 2
    second = [b for p, b in api.created if p.endswith("/pods")][1]
    assert _avoided(second) == ["n1", "n2"]


def add_gpu_node(extender: Extender, api: Api, name: str, gpus: int = 2) -> None:
    api.nodes.objects[name] = node(name)
    api.nodes.objects[name]["status"]["allocatable"][keys.NVIDIA_GPU] = str(gpus)
    extender.cache.dirty.node(name)


def test_a_node_added_for_pods_no_node_could_take_is_not_counted_against_them() -> None:
    """Three pods of a pool scaled to zero wait; their three capacity pods are asked for,
    and an autoscaler's node comes for them. Until kube-scheduler judges the pods against
    it (it lets them go there, and asks the extender), their verdict is about the nodes
    before: the new node is not one they cannot use, and no GPU is asked for again."""
    message = "0/1 nodes are available: 1 node(s) had untolerated taint {cpu-only: }."
    extender, pods, api, clock = setup(nodes={"cpu": 0})
    extender.leading = True
    for name in ("a", "b", "c"):
        pending(pods, name, "900m")["status"] = unschedulable(message)
        extender.cache.dirty.pod(f"ml/{name}")
    extender.tick()
    extender.flush()
    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 3

    add_gpu_node(extender, api, "gpu-1", gpus=8)
    for _ in range(5):
        clock.now += 2
        extender.tick()
        extender.flush()

    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 3


def test_a_verdict_kube_scheduler_never_renews_is_judged_again_in_the_end() -> None:
    """kube-scheduler may not write a new verdict on a pod after the GPU nodes change (one
    node went as another came: the same words). After `VERDICT_RENEWED` its verdict
    counts as judged against the nodes there are."""
    message = "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    extender, pods, api, clock = setup(nodes={"n1": 8})
    extender.leading = True
    pending(pods, "r", "500m")["status"] = unschedulable(message)
    extender.cache.dirty.pod("ml/r")
    extender.tick()
    extender.flush()
    add_gpu_node(extender, api, "n2")
    extender.tick()
    extender.flush()
    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 1

    clock.now += VERDICT_RENEWED
    extender.tick()

    assert len(created_capacity(extender, api)) == 2
    second = [b for p, b in api.created if p.endswith("/pods")][1]
    assert _avoided(second) == ["n1", "n2"]


def test_a_pod_whose_feasible_nodes_all_went_since_its_filter_is_judged_again() -> None:
    """`web` was filtered with n1 feasible and full: its capacity pod may go to n1 or a
    new node. Then a replica of its own lands on n1 (say), and kube-scheduler finds no
    node for it without asking the extender. Once kube-scheduler has had time to write
    that verdict, the leader judges it as a pod no node can take: its GPU must stay off
    n1 and n2, and the GPU asked for it before, which may land on n1, no longer counts."""
    extender, pods, api, clock = setup(0, nodes={"n1": 8, "n2": 8})
    extender.leading = True
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))  # fills cap-0
    web = pending(pods, "web", "900m")
    filter_(extender, web, nodes=("n1",))
    extender.flush()
    [first] = [b for p, b in api.created if p.endswith("/pods")]
    assert _avoided(first) == ["n2"]

    web["status"] = unschedulable(
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    )
    extender.cache.dirty.pod("ml/web")
    extender.tick()  # within VERDICT_WRITTEN of the filter: not judged yet
    extender.flush()
    assert len([p for p, _ in api.created if p.endswith("/pods")]) == 1

    clock.now += VERDICT_WRITTEN
    extender.tick()

    assert len(created_capacity(extender, api)) == 2
    second = [b for p, b in api.created if p.endswith("/pods")][1]
    assert _avoided(second) == ["n1", "n2"]


def _avoided(body: JSON) -> list[str]:
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    values: list[str] = required["nodeSelectorTerms"][0]["matchExpressions"][-1]["values"]
    return values


def test_capacity_no_pod_ever_used_is_released_after_the_short_grace_period() -> None:
    """A burst's capacity its pods did not need holds a GPU for `unused_grace`, not the
    grace period kept for GPUs that hosted shares (a pod that restarts finds one warm).
    Capacity pods there when the extender started may have hosted before: the long one."""
    extender, pods, api, clock = setup(  # cap-0: there at start
        0, nodes={"n1": 0}, api=DeletingApi, grace_period=300, unused_grace=30
    )
    assert isinstance(api, DeletingApi)
    extender.leading = True
    extender.tick()
    pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-1"] = capacity(1)  # a burst's, unused
    extender.cache.dirty.pod(f"{keys.SYSTEM_NAMESPACE}/cap-1")

    for _ in range(4):
        extender.tick()
        clock.now += 10
    extender.tick()
    extender.flush()
    assert api.deleted == ["cap-1"]
    del pods.objects[f"{keys.SYSTEM_NAMESPACE}/cap-1"]  # the informer sees it go
    extender.cache.dirty.pod(f"{keys.SYSTEM_NAMESPACE}/cap-1")

    clock.now += 300
    extender.tick()
    extender.flush()
    assert api.deleted == ["cap-1", "cap-0"]


def test_a_capacity_pod_seen_and_then_gone_no_longer_counts_as_coming() -> None:
    """The informer shows the capacity pod made for `a`, then it is deleted (say with its
    node). Its name was in flight when created; seen once, it is no GPU coming any more,
    so the next pod that fits nowhere gets a new one at once, not after the name's TTL."""
    extender, pods, api, _ = setup(nodes={"n1": 8})
    extender.leading = True
    filter_(extender, pending(pods, "a", "900m"), nodes=("n1",))
    extender.flush()
    [made] = [b for p, b in api.created if p.endswith("/pods")]
    key = f"{keys.SYSTEM_NAMESPACE}/{made['metadata']['name']}"
    shown = capacity(0)
    shown["metadata"] |= {"name": made["metadata"]["name"], "labels": made["metadata"]["labels"]}
    pods.objects[key] = shown
    extender.cache.dirty.pod(key)
    extender.tick()  # the leader's round sees it

    del pods.objects[key]
    extender.cache.dirty.pod(key)
    filter_(extender, pending(pods, "b", "900m"), nodes=("n1",))

    # `a` (still waiting) and `b` need a GPU each, and nothing is coming: two more.
    assert len(created_capacity(extender, api)) == 1 + 2


def test_capacity_never_lands_on_a_node_whose_gpus_are_too_small_for_the_pod() -> None:
    """kube-scheduler knows nothing of GPU memory: both nodes are feasible for a pod asking
    30Gi, but the L4 node's GPUs have 22.5Gi (GPU Feature Discovery's label). A capacity
    pod there would be a GPU the pod cannot use (and kube-scheduler's packing score
    prefers the fuller, smaller node)."""
    l4 = {keys.GFD_MEMORY_MIB: "23034"}
    extender, pods, api, _ = setup(nodes={"a100": 8, "l4": 2}, labels={"l4": l4})

    filter_(extender, pending(pods, "big", "300m", {keys.GPU_MEMORY: "30Gi"}), ("a100", "l4"))

    assert len(created_capacity(extender, api)) == 1
    [body] = [b for p, b in api.created if p.endswith("/pods")]
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][-1] == {
        "key": HOSTNAME,
        "operator": "NotIn",
        "values": ["l4"],
    }


def test_a_requeued_pod_is_not_asked_again_before_its_filter_comes() -> None:
    """In a burst a requeued pod may wait many seconds behind the pods queued before it:
    asked again every 2 s meanwhile, each request another write. It is asked again once
    filtered (and refused) again, or after `REQUEUE_AGAIN` (an update kube-scheduler
    missed)."""
    extender, pods, api, clock = refused_behind(("n1", "n2"))
    del pods.objects["ml/first"]
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()

    def asked() -> list[str]:
        return requeued_so_far(extender, api)

    assert asked() == ["web"]

    for _ in range(5):  # ten seconds of a busy cluster, no filter of web
        clock.now += 2
        extender.cache.dirty.pod("ml/web")  # its own update (the request), others'
        extender.tick()
    assert asked() == ["web"]

    clock.now += REQUEUE_AGAIN
    extender.cache.dirty.pod("ml/web")
    extender.tick()
    assert asked() == ["web", "web"]


def test_a_pod_waiting_for_its_filter_costs_no_placement_until_it_may_be_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each requeue round places every waiting pod under the lock kube-scheduler's filters
    wait on. While a requeued pod's filter is coming and nothing changes, no round runs;
    the next comes when it may be asked again (`REQUEUE_AGAIN`), with no change needed."""
    extender, pods, api, clock = refused_behind(("n1", "n2"))
    del pods.objects["ml/first"]
    extender.cache.dirty.pod("ml/first")
    clock.now += 1
    extender.tick()
    assert requeued_so_far(extender, api) == ["web"]

    placed: list[str] = []
    real = place

    def counted(snapshot: Ledger, request: Request, *args: object) -> object:
        placed.append(request.key)
        return real(snapshot, request, *args)  # type: ignore[arg-type]

    clock.now += 2
    extender.cache.dirty.pod("ml/web")  # the update the request made
    extender.tick()
    monkeypatch.setattr(waiting_module, "place", counted)  # the requeue round's
    for _ in range(5):  # ten quiet seconds: web's filter has not come
        clock.now += 2
        extender.tick()
    assert placed == []

    clock.now += REQUEUE_AGAIN
    extender.tick()
    assert placed
    assert requeued_so_far(extender, api) == ["web", "web"]


def test_a_node_that_just_began_taking_pods_is_not_held_against_a_pod_filtered_then() -> None:
    """On a busy machine kube-scheduler may judge a pod against its view from before a new
    node took pods, while the extender already sees the node ready. Named as avoided, it
    made a requirement the GPU coming for the pods does not meet, and a capacity pod more
    (in CI, a third Karpenter node for two nodes' worth of shares). Once `SETTLING` has
    passed, kube-scheduler's verdict on the node counts."""
    extender, pods, api, clock = setup(0, nodes={"n1": 8})
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))  # fills cap-0
    filter_(extender, pending(pods, "web", "500m"), nodes=("n1",))
    extender.flush()
    [asked] = [b for path, b in api.created if path.endswith("/pods")]  # room for 500m more
    add_gpu_node(extender, api, "bought")  # the node an autoscaler bought for it
    clock.now += 1

    filter_(extender, pending(pods, "more", "500m"), nodes=("n1",))  # judged without it
    extender.flush()

    assert [b for path, b in api.created if path.endswith("/pods")] == [asked]
    clock.now += SETTLING
    filter_(extender, pending(pods, "late", "500m"), nodes=("n1",))
    extender.flush()
    [_, late] = [b for path, b in api.created if path.endswith("/pods")]
    assert _avoided(late) == ["bought"]


def test_room_on_a_node_that_just_began_requeues_a_pod_filtered_without_it() -> None:
    """A filter that left out a node which had just begun taking pods may not have judged
    the pod against it: room on its GPUs is room the pod may use, as on a node not there
    at all, and the pod is asked to try again."""
    extender, pods, api, clock = setup(0, nodes={"n1": 8})
    extender.leading = True
    assert filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))["NodeNames"]
    add_gpu_node(extender, api, "bought")
    occupant = fractional("occupant", "900m", gpu=1)
    occupant["spec"]["nodeName"] = "bought"
    for key, pod in (
        (f"{keys.SYSTEM_NAMESPACE}/cap-1", capacity(1, "bought")),
        ("ml/occupant", occupant),
    ):
        pods.objects[key] = pod
        extender.cache.dirty.pod(key)
    assert not filter_(extender, pending(pods, "web", "900m"), nodes=("n1",)).get("NodeNames")
    extender.tick()

    del pods.objects["ml/occupant"]  # room on bought's GPU
    extender.cache.dirty.pod("ml/occupant")
    clock.now += 1
    extender.tick()

    assert requeued(extender, api) == ["web"]


def test_a_node_still_starting_is_not_a_node_the_capacity_must_avoid() -> None:
    """A node an autoscaler just added is tainted `node.kubernetes.io/not-ready` until its
    kubelet is ready, and kube-scheduler refuses every pod there meanwhile: no verdict on
    the pod. Named among the nodes to avoid, it would change where the waiting pods' GPUs
    may land, and ask theirs again elsewhere while they are coming there."""
    extender, pods, api, _ = setup(0, nodes={"n1": 8, "new": 8, "other": 8})
    api.nodes.objects["new"]["spec"]["taints"] = [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ]
    extender.cache.dirty.node("new")
    filter_(extender, pending(pods, "first", "900m"), nodes=("n1",))  # fills cap-0

    filter_(extender, pending(pods, "web", "900m"), nodes=("n1",))

    assert len(created_capacity(extender, api)) == 1
    [body] = [b for path, b in api.created if path.endswith("/pods")]
    assert _avoided(body) == ["other"]
