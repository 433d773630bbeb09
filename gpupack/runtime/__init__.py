"""gpupack's runtime: the one way every binary talks to Kubernetes and runs as a process.

- `config`: where the cluster is (--kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config);
- `transport`: every API verb over one urllib3 pool, plain dicts in and out;
- `api`: the one error type (`ApiError`), the one retry helper, the watch framing;
- `informer`: list-then-watch caches with a synced signal;
- `leader`: leader election through a coordination.k8s.io Lease;
- `shell`: the process shell (signals, wait for sync, lead or serve, exit codes);
- `logs`, `args`: JSON logs and the shared argument types;
- `events`: events.k8s.io Events on any object, best effort;
- `serverclock`: the API server's wall clock, from its answers' `Date`;
- `httpserver`, `endpoints`: the one bounded plain-HTTP server, and the `/metrics`,
  `/healthz`, `/readyz` every binary serves with it;
- `http`: plain GETs to in-cluster endpoints that are not the API server (scrapes);
- `protowire`: the protobuf wire format the node agent's gRPC peers speak.

It may import the contract (`gpupack.*`), `kubernetes` (configuration loading only) and
`urllib3`; it never imports a component (import-linter enforces both). Components import
it, and declare the verbs they use as small Protocols, so tests pass in-memory fakes.
"""
