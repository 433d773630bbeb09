"""/proc/<pid>/cgroup contents as Kubernetes nodes of each kind write them.

cgroup v1 files list one line per mounted hierarchy (``<id>:<controllers>:<path>``),
plus a ``0::`` line on hybrid hosts (systemd 233 and later), which may disagree with
the v1 lines when the runtime does not manage the unified hierarchy. cgroup v2 files
have the single ``0::<path>`` line. Paths are as the reader's cgroup namespace sees them.
"""

BURSTABLE_POD_UID = "6513270e-269e-4d37-b2a7-4de452e6b438"
BESTEFFORT_POD_UID = "d23f0824-128b-4f33-8c5c-7fd0a6a3a450"
GUARANTEED_POD_UID = "9531985d-5d9d-49f8-9818-e811892f902b"
STATIC_POD_UID = "c7a2ea20b2f14c942e05319acb5c7427"  # the kubelet's config hash, no dashes
CONTAINER_A = "90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f"
CONTAINER_B = "0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23"
CONTAINER_C = "8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf"

# --- cgroup v1 and hybrid --------------------------------------------------------------

# EKS on Amazon Linux 2: Docker (dockershim), cgroupfs driver; systemd 219, no "0::" line.
V1_CGROUPFS_DOCKER_BURSTABLE = """\
11:pids:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
10:hugetlb:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
9:memory:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
8:cpuset:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
7:devices:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
6:perf_event:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
5:freezer:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
4:blkio:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
3:net_cls,net_prio:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
2:cpu,cpuacct:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
1:name=systemd:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f
"""

# Ubuntu 20.04 (hybrid): containerd, cgroupfs driver; runc joins the unified hierarchy too.
V1_CGROUPFS_CONTAINERD_BESTEFFORT = """\
12:rdma:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
11:cpuset:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
10:hugetlb:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
9:blkio:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
8:net_cls,net_prio:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
7:pids:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
6:memory:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
5:devices:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
4:freezer:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
3:perf_event:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
2:cpu,cpuacct:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
1:name=systemd:/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
0::/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
"""

# The same node, a guaranteed pod: no QoS level in the path.
V1_CGROUPFS_CONTAINERD_GUARANTEED = """\
12:rdma:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
11:cpuset:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
10:hugetlb:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
9:blkio:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
8:net_cls,net_prio:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
7:pids:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
6:memory:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
5:devices:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
4:freezer:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
3:perf_event:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
2:cpu,cpuacct:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
1:name=systemd:/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
0::/kubepods/pod9531985d-5d9d-49f8-9818-e811892f902b/8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf
"""

# Ubuntu 20.04 (hybrid): containerd with SystemdCgroup, systemd driver.
V1_SYSTEMD_CONTAINERD_BURSTABLE = """\
12:rdma:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
11:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
10:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
9:blkio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
8:net_cls,net_prio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
7:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
6:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
5:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
4:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
3:perf_event:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
2:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope
"""

# OpenShift 4 on RHEL 8 (legacy v1, no "0::" line): CRI-O, systemd driver.
V1_SYSTEMD_CRIO_BURSTABLE = """\
12:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
10:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
9:perf_event:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
8:net_cls,net_prio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
7:rdma:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
6:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
5:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
4:blkio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
3:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
2:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
"""

# The same pod's conmon (conmon_cgroup = "pod"): in the pod, not the container.
V1_SYSTEMD_CRIO_CONMON = """\
12:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
10:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
9:perf_event:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
8:net_cls,net_prio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
7:rdma:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
6:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
5:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
4:blkio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
3:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
2:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope
"""

# Ubuntu 18.04 (hybrid, no rdma hierarchy): Docker (cri-dockerd), systemd driver.
V1_SYSTEMD_DOCKER_GUARANTEED = """\
11:cpuset:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
10:hugetlb:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
9:blkio:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
8:net_cls,net_prio:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
7:pids:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
6:memory:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
5:devices:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
4:freezer:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
3:perf_event:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
2:cpu,cpuacct:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
1:name=systemd:/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
0::/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/docker-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope
"""

# Inside a kind node on a v1 host (no cgroup namespace): kubelet --cgroup-root=/kubelet.
V1_KIND_CGROUPFS_BESTEFFORT = """\
12:rdma:/
11:cpuset:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
10:hugetlb:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
9:blkio:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
8:net_cls,net_prio:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
7:pids:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
6:memory:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
5:devices:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
4:freezer:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
3:perf_event:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
2:cpu,cpuacct:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
1:name=systemd:/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/kubelet/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23
0::/docker/c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4/system.slice/containerd.service
"""

# A process in the pod's own cgroup, in no container's.
V1_CGROUPFS_POD_LEVEL = """\
11:pids:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
10:hugetlb:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
9:memory:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
8:cpuset:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
7:devices:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
6:perf_event:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
5:freezer:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
4:blkio:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
3:net_cls,net_prio:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
2:cpu,cpuacct:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
1:name=systemd:/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438
"""

# A host service (Ubuntu 20.04, hybrid).
V1_HOST_SERVICE = """\
12:rdma:/
11:cpuset:/
10:hugetlb:/
9:blkio:/system.slice/nvidia-persistenced.service
8:net_cls,net_prio:/
7:pids:/system.slice/nvidia-persistenced.service
6:memory:/system.slice/nvidia-persistenced.service
5:devices:/system.slice/nvidia-persistenced.service
4:freezer:/
3:perf_event:/
2:cpu,cpuacct:/system.slice/nvidia-persistenced.service
1:name=systemd:/system.slice/nvidia-persistenced.service
0::/system.slice/nvidia-persistenced.service
"""

# A plain `docker run` container on the same host, outside Kubernetes.
V1_DOCKER_OUTSIDE_KUBERNETES = """\
12:rdma:/
11:cpuset:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
10:hugetlb:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
9:blkio:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
8:net_cls,net_prio:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
7:pids:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
6:memory:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
5:devices:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
4:freezer:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
3:perf_event:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
2:cpu,cpuacct:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
1:name=systemd:/docker/907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547
0::/system.slice/containerd.service
"""

# --- cgroup v2 ---------------------------------------------------------------------------

V2_SYSTEMD_CONTAINERD_BURSTABLE = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope\n"
V2_SYSTEMD_CONTAINERD_GUARANTEED = "0::/kubepods.slice/kubepods-pod9531985d_5d9d_49f8_9818_e811892f902b.slice/cri-containerd-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope\n"
V2_SYSTEMD_CRIO_BESTEFFORT = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podd23f0824_128b_4f33_8c5c_7fd0a6a3a450.slice/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope\n"
V2_SYSTEMD_CRIO_CONMON = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podd23f0824_128b_4f33_8c5c_7fd0a6a3a450.slice/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope\n"
V2_SYSTEMD_DOCKER_BURSTABLE = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/docker-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope\n"
# k3s and other cgroupfs-driver nodes.
V2_CGROUPFS_CONTAINERD_BURSTABLE = "0::/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f\n"
V2_CGROUPFS_CRIO_BESTEFFORT = "0::/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/crio-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23\n"
V2_CGROUPFS_CRIO_CONMON = "0::/kubepods/besteffort/podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/crio-conmon-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23\n"
# A static pod (kube-apiserver and friends): its UID is the manifest's hash.
V2_SYSTEMD_STATIC_POD = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podc7a2ea20b2f14c942e05319acb5c7427.slice/cri-containerd-8e81973e0becd7b03898d190f9ebdacc0cb1e29c658cda1495e60af593bd04cf.scope\n"
# runc in cgroupfs mode under a systemd-driver kubelet: the "slice:prefix:name"
# cgroupsPath taken as a relative path, under containerd's own cgroup.
V2_LITERAL_SYSTEMD_PATH = "0::/system.slice/containerd.service/kubepods-besteffort-podd23f0824_128b_4f33_8c5c_7fd0a6a3a450.slice:cri-containerd:0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23\n"
# Sub-cgroups below the container's: a container running systemd, or a workload that
# delegates (the "init" leaf, then its own tree).
V2_SYSTEMD_CONTAINER_INIT = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope/init\n"
V2_SYSTEMD_WORKLOAD_SUBTREE = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope/system.slice/trainer.service/\n"
V2_CGROUPFS_WORKLOAD_SUBTREE = "0::/kubepods/burstable/pod6513270e-269e-4d37-b2a7-4de452e6b438/90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f/jobs/worker-3\n"
# kind on a v2 host: inside the node (private cgroup namespace), and from the host.
V2_KIND_SYSTEMD_BESTEFFORT = "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-podd23f0824_128b_4f33_8c5c_7fd0a6a3a450.slice/cri-containerd-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope\n"
V2_KIND_FROM_HOST = "0::/system.slice/docker-c6f877186d76b07e881ed162ae2eb1547f15052434b9b5df9e7769b10f4205b4.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-podd23f0824_128b_4f33_8c5c_7fd0a6a3a450.slice/cri-containerd-0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23.scope\n"
# Read from inside a container with a private cgroup namespace (the v2 default): paths
# are relative to the reader's cgroup, here a besteffort pod's container.
V2_NAMESPACED_SYSTEMD_BURSTABLE = "0::/../../../kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice/cri-containerd-90c192cfd3ac94af0f21ddb66cad4a268d116ece1738f7d93d9c172411e20b8f.scope\n"
V2_NAMESPACED_CGROUPFS_BESTEFFORT = "0::/../../podd23f0824-128b-4f33-8c5c-7fd0a6a3a450/0fd630f1f29d0da9953f48f1a09f76b5a170b33839263059f28c105d1fb17c23\n"
V2_NAMESPACED_HOST_SERVICE = "0::/../../../../system.slice/nvidia-persistenced.service\n"
V2_NAMESPACED_OWN_CGROUP = "0::/\n"
V2_SYSTEMD_POD_LEVEL = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6513270e_269e_4d37_b2a7_4de452e6b438.slice\n"

# Not in a pod.
V2_HOST_SERVICE = "0::/system.slice/nvidia-persistenced.service\n"
V2_HOST_SESSION = "0::/user.slice/user-1000.slice/session-4.scope\n"
V2_HOST_INIT = "0::/init.scope\n"
V2_KERNEL_THREAD = "0::/\n"
V2_DOCKER_OUTSIDE_KUBERNETES = "0::/system.slice/docker-907a70c31012f037b64ce4228c38fb2918f135d25f557203301850c5a38fd547.scope\n"
V2_PODMAN = "0::/machine.slice/libpod-3f98e2774cbd87ad5c90a9587403e430ec66a78795e761d17731af10506bf2ef.scope/container\n"
V2_KUBEPODS_QOS_LEVEL = "0::/kubepods.slice/kubepods-besteffort.slice\n"
