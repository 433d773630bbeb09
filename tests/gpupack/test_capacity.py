"""The pure capacity planner: how many GPUs a pool lacks, their names, their manifest."""

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack import keys
from gpupack.capacity import CREATED_FOR, capacity_index, capacity_names, placement_of
from gpupack.objects import JSON
from gpupack.packing import FULL_GPU, Allocation, Bin, PlanGpu, Shortfall, plan, shortfall
from scheduler.manifest import Where, affinity_to_others, capacity_pod, holding_nodes

GiB = 2**30
POOL = "0123456789abcdef"


def pods(
    count: int, compute: int, memory: int = GiB, owner: str = "ml/Deployment/llm"
) -> list[Allocation]:
    return [Allocation(f"{owner}-{compute}-{i}", compute, memory, owner) for i in range(count)]


def mps(count: int, compute: int, owner: str) -> list[Allocation]:
    return [Allocation(f"{owner}-{i}", compute, GiB, owner, exclusive=True) for i in range(count)]


@pytest.mark.parametrize(
    ("gpus", "unplaced", "new_gpu_memory", "missing"),
    [
        pytest.param([], pods(9, 300), None, 3, id="nine-pods-of-300m-need-three-gpus"),
        pytest.param([], pods(4, 600), None, 4, id="four-pods-of-600m-need-four-gpus"),
        pytest.param([], pods(1, 1000), None, 1, id="a-whole-gpu-pod-needs-one"),
        pytest.param([], [], None, 0, id="nothing-to-place"),
        pytest.param([], pods(4, 100, 8 * GiB), 16 * GiB, 2, id="memory-bound-two-per-16gi-gpu"),
        pytest.param([], pods(4, 100, 8 * GiB), None, 1, id="unknown-memory-checks-compute-only"),
        pytest.param(
            [PlanGpu("g0", memory=16 * GiB, allocations=tuple(pods(1, 100, 12 * GiB)))],
            pods(1, 100, 8 * GiB, owner="ml/Deployment/b"),
            None,
            1,
            id="known-memory-of-an-existing-gpu-is-respected",
        ),
        pytest.param(
            [PlanGpu("g0", allocations=tuple(pods(1, 100, 12 * GiB)))],
            pods(1, 100, 8 * GiB, owner="ml/Deployment/b"),
            None,
            0,
            id="unknown-memory-of-an-existing-gpu-is-not-checked",
        ),
        pytest.param(
            [PlanGpu("g0", running=True, allocations=tuple(pods(1, 700)))],
            pods(1, 300, owner="ml/Job/x"),
            None,
            0,
            id="partly-filled-gpu-absorbs-a-pod",
        ),
        pytest.param(
            [PlanGpu("g0", running=True, allocations=tuple(pods(1, 700)))],
            pods(2, 300, owner="ml/Job/x"),
            None,
            1,
            id="partly-filled-gpu-absorbs-what-fits",
        ),
        pytest.param(
            [PlanGpu("g0"), PlanGpu("g1")], pods(6, 300), None, 0, id="pending-capacity-pods-count"
        ),
        pytest.param(
            [], mps(2, 300, "ml/Deployment/a") + pods(1, 300), None, 2, id="mps-is-not-shared"
        ),
        pytest.param(
            [],
            mps(1, 100, "ml/Deployment/a") + mps(1, 100, "ml/Deployment/b"),
            None,
            2,
            id="mps-workloads-never-share-with-each-other",
        ),
        pytest.param(
            [],
            mps(3, 300, "ml/Deployment/a"),
            None,
            1,
            id="mps-pods-of-one-workload-share",
        ),
        pytest.param(
            [PlanGpu("g0", allocations=tuple(pods(1, 100)))],
            mps(1, 100, "ml/Deployment/a"),
            None,
            1,
            id="mps-pod-does-not-join-a-shared-gpu",
        ),
        pytest.param(
            [PlanGpu("g0", allocations=tuple(mps(1, 100, "ml/Deployment/a")))],
            pods(1, 100),
            None,
            1,
            id="shared-pod-does-not-join-an-mps-gpu",
        ),
        pytest.param(
            [PlanGpu("g0", allocations=tuple(mps(1, 100, "ml/Deployment/a")))],
            [Allocation("new", 100, GiB, "ml/Deployment/a", exclusive=True)],
            None,
            0,
            id="mps-pod-joins-its-own-workloads-gpu",
        ),
        pytest.param([], pods(1, 100, 24 * GiB), 16 * GiB, 1, id="oversized-pod-still-gets-a-gpu"),
    ],
)
def test_plan_counts_the_missing_gpus(
    gpus: list[PlanGpu], unplaced: list[Allocation], new_gpu_memory: int | None, missing: int
) -> None:
    assert plan(gpus, unplaced, new_gpu_memory=new_gpu_memory).missing == missing


def test_largest_allocations_are_placed_first() -> None:
    unplaced = pods(3, 300, owner="a/Job/small") + pods(2, 700, owner="a/Job/big")

    result = plan([], unplaced, new_gpu_memory=None)

    assert [[a.compute for a in b.allocations] for b in result.bins] == [
        [700, 300],
        [700, 300],
        [300],
    ]


def test_an_allocation_larger_than_the_assumed_gpu_is_reported() -> None:
    big = Allocation("big", 100, 24 * GiB, "ml/Job/big")

    result = plan([], [big], new_gpu_memory=16 * GiB)

    assert result.oversized == ("big",)
    assert result.bins == (Bin(None, None, (big,)),)


@given(st.permutations(pods(5, 300) + pods(3, 450, 6 * GiB, "b/Job/x") + mps(2, 200, "c/D/y")))
def test_plan_does_not_depend_on_input_order(unplaced: list[Allocation]) -> None:
    reference = pods(5, 300) + pods(3, 450, 6 * GiB, "b/Job/x") + mps(2, 200, "c/D/y")
    gpus = [PlanGpu("g1", memory=16 * GiB), PlanGpu("g0", running=True)]

    assert plan(gpus, unplaced, new_gpu_memory=16 * GiB) == plan(
        list(reversed(gpus)), reference, new_gpu_memory=16 * GiB
    )


owners = st.sampled_from(["a/Deployment/x", "a/Deployment/y", "b/Job/z"])
allocations = st.builds(
    Allocation,
    key=st.uuids().map(str),
    compute=st.integers(1, FULL_GPU),
    memory=st.integers(1, 40 * GiB),
    owner=owners,
    exclusive=st.booleans(),
)
gpu_memories = st.one_of(st.none(), st.sampled_from([16 * GiB, 24 * GiB, 80 * GiB]))


@st.composite
def existing_gpus(draw: st.DrawFn) -> list[PlanGpu]:
    """GPUs whose current allocations respect their capacity (as the scheduler keeps them)."""
    gpus = []
    for index in range(draw(st.integers(0, 4))):
        memory = draw(gpu_memories)
        on_it = draw(allocations)
        fits = memory is None or on_it.memory <= memory
        gpus.append(
            PlanGpu(
                f"g{index}",
                memory=memory,
                running=draw(st.booleans()),
                allocations=(on_it,) if fits else (),
            )
        )
    return gpus


@given(existing_gpus(), st.lists(allocations, max_size=25), gpu_memories)
def test_planned_gpus_always_suffice(
    gpus: list[PlanGpu], unplaced: list[Allocation], new_gpu_memory: int | None
) -> None:
    result = plan(gpus, unplaced, new_gpu_memory=new_gpu_memory)

    placed = [a for b in result.bins for a in b.allocations]
    already = [a for g in gpus for a in g.allocations]
    assert sorted(placed, key=repr) == sorted(already + unplaced, key=repr)
    for b in result.bins:
        assert b.compute_used <= FULL_GPU
        assert b.memory is None or b.memory_used <= b.memory
        exclusive = {a.owner for a in b.allocations if a.exclusive}
        assert not exclusive or {a.owner for a in b.allocations} == exclusive
    assert result.missing <= len(unplaced)
    assert {b.name for b in result.bins if b.name is not None} == {g.name for g in gpus}


@pytest.mark.parametrize(
    ("used", "count", "names"),
    [
        pytest.param([], 3, (0, 1, 2), id="empty-pool-starts-at-zero"),
        pytest.param([0, 2], 3, (1, 3, 4), id="lowest-free-indices"),
        pytest.param([0, 1, 2], 1, (3,), id="after-the-last"),
        pytest.param([1], 0, (), id="none-wanted"),
    ],
)
def test_capacity_names_take_the_lowest_free_indices(
    used: list[int], count: int, names: tuple[int, ...]
) -> None:
    taken = [f"gpupack-capacity-{POOL}-{i}" for i in used]
    other = ["gpupack-capacity-ffffffffffffffff-0", f"gpupack-capacity-{POOL}-01", "coredns"]

    chosen = capacity_names(POOL, taken + other, count)

    assert chosen == tuple(f"gpupack-capacity-{POOL}-{i}" for i in names)
    assert [capacity_index(POOL, name) for name in chosen] == list(names)


def test_capacity_index_ignores_other_pools_and_names() -> None:
    assert capacity_index(POOL, f"gpupack-capacity-{POOL}-7") == 7
    assert capacity_index(POOL, "gpupack-capacity-ffffffffffffffff-7") is None
    assert capacity_index(POOL, f"gpupack-capacity-{POOL}-x") is None


SCHEDULING: JSON = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "inference",
    "runtimeClassName": "nvidia",
}


def test_capacity_pod_holds_one_gpu_and_inherits_the_scheduling_metadata() -> None:
    pod = capacity_pod(POOL, SCHEDULING, index=2, created_for="ml/Deployment/llm")

    kubernetes_validate.validate(pod, "1.34", strict=True)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == f"gpupack-capacity-{POOL}-2"
    assert meta["namespace"] == keys.SYSTEM_NAMESPACE
    assert meta["labels"][keys.ROLE] == keys.ROLE_CAPACITY
    assert meta["labels"][keys.POOL] == POOL
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "gpupack"
    assert meta["annotations"] == {CREATED_FOR: "ml/Deployment/llm"}
    assert "ownerReferences" not in meta
    for field, value in SCHEDULING.items():
        if field != "affinity":
            assert spec[field] == value
    assert spec["affinity"]["nodeAffinity"] == SCHEDULING["affinity"]["nodeAffinity"]
    (container,) = spec["containers"]
    assert container["image"] == "registry.k8s.io/pause:3.10"
    assert container["resources"]["limits"] == {keys.NVIDIA_GPU: "1"}
    assert container["resources"]["requests"][keys.NVIDIA_GPU] == "1"
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False


def test_an_mps_pools_capacity_pod_runs_the_daemon_on_the_shared_mps_volume() -> None:
    scheduling = {**SCHEDULING, "sharing": "mps"}
    pod = capacity_pod(POOL, scheduling, index=0, created_for="ml/Deployment/llm", mps_image="g:1")

    kubernetes_validate.validate(pod, "1.34", strict=True)
    assert pod["metadata"]["labels"]["gpupack.io/sharing"] == "mps"
    assert "sharing" not in pod["spec"]  # a mark of the pool, not a pod field
    assert pod["spec"]["volumes"] == [{"name": "gpupack-mps", "csi": {"driver": "mps.gpupack.io"}}]
    (container,) = pod["spec"]["containers"]
    assert (container["image"], container["command"]) == ("g:1", ["gpupack-mps-daemon"])
    assert container["resources"]["limits"] == {keys.NVIDIA_GPU: "1"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpupack/mps/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/gpupack/mps/log",
    }
    mounts = {m["mountPath"]: m.get("subPath") for m in container["volumeMounts"]}
    assert mounts == {"/run/gpupack/mps": None, "/dev/shm": "shm"}
    assert container["readinessProbe"]["exec"]["command"] == ["gpupack-mps-daemon", "--check"]
    security = container["securityContext"]
    assert security.get("privileged") is not True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "SYS_ADMIN" not in security["capabilities"]["add"]


def test_an_mps_pool_without_a_daemon_image_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="MPS pool"):
        capacity_pod(POOL, {"sharing": "mps"}, index=0, created_for="ml/Deployment/llm")


def test_capacity_pod_prefers_where_the_pod_may_go_then_nodes_already_holding_gpus() -> None:
    """Both preferences are node affinity, so their weights add in one plugin: a node of
    `steer` (100) beats one merely holding capacity pods (50); one in both wins (150).
    No pod affinity: an existing capacity pod's would pull every new one to its node."""
    where = Where(steer=("n2", "n1"), packed=("n3", "n1"))
    pod = capacity_pod(POOL, SCHEDULING, index=0, created_for="ml/Pod/p", where=where)
    assert placement_of(pod) == ""  # preferences are no requirement

    kubernetes_validate.validate(pod, "1.34", strict=True)
    affinity = pod["spec"]["affinity"]
    preferred = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(p["weight"], p["preference"]["matchExpressions"]) for p in preferred] == [
        (100, [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]}]),
        (50, [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n3"]}]),
    ]
    assert "podAffinity" not in affinity
    inherited = SCHEDULING["affinity"]["nodeAffinity"]
    assert (
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        == (inherited["requiredDuringSchedulingIgnoredDuringExecution"])
    )
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in inherited  # not aliased


def test_holding_nodes_are_the_nodes_of_placed_capacity_pods() -> None:
    pods: list[JSON] = [
        {"spec": {"nodeName": "b"}},
        {"spec": {}},
        {"spec": {"nodeName": "a"}},
        {"spec": {"nodeName": "b"}},
    ]
    assert holding_nodes(pods) == ["a", "b"]


def test_capacity_pod_takes_only_scheduling_fields_and_does_not_alias_them() -> None:
    scheduling = {**SCHEDULING, "containers": [{"name": "evil"}]}

    pod = capacity_pod(POOL, scheduling, index=0, created_for="ml/Pod/x", image="pause:x")

    assert [c["name"] for c in pod["spec"]["containers"]] == ["capacity"]
    assert pod["spec"]["containers"][0]["image"] == "pause:x"
    pod["spec"]["tolerations"].append({"key": "other"})
    assert len(SCHEDULING["tolerations"]) == 1


def one_at_a_time(
    gpus: list[PlanGpu], unplaced: list[Allocation], new_gpu_memory: int | None
) -> list[list[str]]:
    """Plain first-fit decreasing, one allocation at a time: the specification that the
    planner's run-at-a-time packing must reproduce exactly."""
    bins: list[tuple[int | None, list[Allocation]]] = [
        (g.memory, list(g.allocations)) for g in sorted(gpus, key=lambda g: (not g.running, g.name))
    ]

    def fits(memory: int | None, on: list[Allocation], a: Allocation) -> bool:
        if sum(x.compute for x in on) + a.compute > FULL_GPU:
            return False
        if memory is not None and sum(x.memory for x in on) + a.memory > memory:
            return False
        exclusive = {x.owner for x in on if x.exclusive}
        if exclusive and exclusive != {a.owner}:
            return False
        return not (a.exclusive and {x.owner for x in on} - {a.owner})

    for a in sorted(unplaced, key=lambda a: (-a.compute, -a.memory, a.owner, a.key)):
        target = next((b for b in bins if fits(b[0], b[1], a)), None)
        if target is None:
            memory = new_gpu_memory if fits(new_gpu_memory, [], a) else None
            target = (memory, [])
            bins.append(target)
        target[1].append(a)
    return [[a.key for a in on] for _, on in bins]


same_shapes = st.builds(
    lambda n, compute, memory, owner: [
        Allocation(f"k{i:03}", compute, memory, owner) for i in range(n)
    ],
    st.integers(0, 40),
    st.sampled_from([100, 250, 300, 400, 1000]),
    st.sampled_from([4 * GiB, 8 * GiB, 12 * GiB]),
    owners,
)


mixed_runs = st.lists(
    st.builds(
        Allocation,
        key=st.uuids().map(str),
        compute=st.sampled_from([100, 250, 500]),
        memory=st.sampled_from([4 * GiB, 8 * GiB]),
        owner=owners,
        exclusive=st.booleans(),
    ),
    max_size=40,
)


@given(existing_gpus(), st.lists(allocations, max_size=25) | same_shapes | mixed_runs, gpu_memories)
def test_packing_runs_of_equal_shapes_equals_first_fit_one_at_a_time(
    gpus: list[PlanGpu], unplaced: list[Allocation], new_gpu_memory: int | None
) -> None:
    result = plan(gpus, unplaced, new_gpu_memory=new_gpu_memory)
    assert [[a.key for a in b.allocations] for b in result.bins] == one_at_a_time(
        gpus, unplaced, new_gpu_memory
    )


def test_capacity_pod_never_goes_where_the_pods_it_is_for_may_not_run() -> None:
    """`avoid` joins every required node-selector term (they are ORed), so no term lets
    the capacity pod onto a node the waiting pod may not use; a new node is still fine."""
    scheduling = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["x"]}
                            ]
                        },
                    ]
                }
            }
        }
    }
    pod = capacity_pod(
        POOL, scheduling, index=0, created_for="ml/Pod/p", where=Where(avoid=("n2", "n1"))
    )

    kubernetes_validate.validate(pod, "1.34", strict=True)
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    not_in = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}
    assert [t["matchExpressions"][-1] for t in terms["nodeSelectorTerms"]] == [not_in, not_in]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "zone"
    assert (
        "matchExpressions"
        not in scheduling["affinity"]["nodeAffinity"][  # not aliased
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][1]
    )

    alone = capacity_pod(POOL, {}, index=0, created_for="ml/Pod/p", where=Where(avoid=("n1",)))
    required = alone["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required == {"nodeSelectorTerms": [{"matchExpressions": [{**not_in, "values": ["n1"]}]}]}


def test_capacity_pod_leaves_a_huge_avoid_list_to_the_preferences() -> None:
    avoid = tuple(f"n{i}" for i in range(1001))
    pod = capacity_pod(POOL, {}, index=0, created_for="ml/Pod/p", where=Where(avoid=avoid))
    assert "affinity" not in pod["spec"]


def _waiting(labels: dict[str, str], *terms: JSON) -> JSON:
    return {
        "metadata": {"name": "p", "namespace": "ml", "labels": labels},
        "spec": {
            "affinity": {
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}
            }
        },
    }


def test_a_pod_that_must_sit_next_to_another_gives_its_capacity_pod_that_affinity() -> None:
    """Carried with its namespace pinned: the capacity pod lives in gpupack's namespace,
    where the term would otherwise look. matchLabelKeys is already merged by then."""
    next_to_db = {
        "labelSelector": {"matchLabels": {"app": "db"}},
        "topologyKey": "kubernetes.io/hostname",
        "matchLabelKeys": ["pod-template-hash"],
    }
    pod = _waiting({"app": "web"}, next_to_db)

    near = affinity_to_others(pod)

    assert near == (
        {
            "labelSelector": {"matchLabels": {"app": "db"}},
            "topologyKey": "kubernetes.io/hostname",
            "namespaces": ["ml"],
        },
    )
    capacity = capacity_pod(POOL, {}, index=0, created_for="ml/Pod/p", where=Where(near=near))
    kubernetes_validate.validate(capacity, "1.34", strict=True)
    assert capacity["spec"]["affinity"]["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": list(near)
    }
    assert "namespaces" not in next_to_db  # not aliased


@pytest.mark.parametrize(
    "term",
    [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"},
        {
            "labelSelector": {
                "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]
            },
            "topologyKey": "zone",
            "namespaces": ["ml", "other"],
        },
        {
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
            "topologyKey": "zone",
            "namespaceSelector": {},
        },
        {"labelSelector": {}, "topologyKey": "zone"},
    ],
)
def test_a_pods_affinity_to_its_own_replicas_is_not_carried(term: JSON) -> None:
    """The first replica may start anywhere (kube-scheduler lets a pod that matches its
    own term go where none runs yet); its capacity pod, carrying the term, could not."""
    assert affinity_to_others(_waiting({"app": "web"}, term)) == ()


@pytest.mark.parametrize(
    "term",
    [
        {
            "labelSelector": {"matchLabels": {"app": "web"}},
            "topologyKey": "zone",
            "namespaces": ["other"],
        },
        {
            "labelSelector": {
                "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]
            },
            "topologyKey": "zone",
        },
        {
            "labelSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            "topologyKey": "zone",
        },
        {"topologyKey": "zone"},  # a null selector selects nothing
    ],
)
def test_affinity_to_other_pods_is_carried(term: JSON) -> None:
    pod = _waiting({"app": "web", "tier": "front"}, term)
    assert len(affinity_to_others(pod)) == 1


def test_capacity_pods_made_with_equal_requirements_share_a_placement_key() -> None:
    near = ({"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"},)
    one = Where(steer=("n1",), avoid=("n2", "n3"), near=near)
    same = Where(packed=("n4",), avoid=("n3", "n2"), near=near)

    assert one.key == same.key != ""
    assert one.key != Where(avoid=("n2", "n3")).key
    assert Where(avoid=("n2",)).key != Where(avoid=("n3",)).key
    assert Where(steer=("n1",)).key == ""
    pod = capacity_pod(POOL, {}, index=0, created_for="ml/Pod/p", where=one)
    assert placement_of(pod) == one.key


shared = st.builds(  # no real-time-mps: the shortfall's own path; 30Gi > some GPUs
    Allocation,
    key=st.uuids().map(str),
    compute=st.sampled_from([50, 100, 230, 300, 470, 810, 1000]),
    memory=st.sampled_from([GiB, 4 * GiB, 20 * GiB, 30 * GiB]),
    owner=owners,
)


@settings(max_examples=300)
@given(
    existing_gpus(),
    st.lists(allocations, max_size=25) | same_shapes | mixed_runs | st.lists(shared, max_size=60),
    gpu_memories,
)
def test_the_shortfall_is_what_the_plan_lacks(
    gpus: list[PlanGpu], unplaced: list[Allocation], new_gpu_memory: int | None
) -> None:
    result = plan(gpus, unplaced, new_gpu_memory=new_gpu_memory)

    assert shortfall(gpus, unplaced, new_gpu_memory=new_gpu_memory) == Shortfall(
        result.missing, result.oversized
    )
