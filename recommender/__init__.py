"""gpupack-recommender: per-workload usage history into GPU allocation recommendations.

It ships in the scheduler's package (it shares the scheduler's API transport and leader
election) but runs as its own binary, Deployment, Lease and ServiceAccount: scraping every
node's exporter must never delay a binding, and rollouts need permissions (patching
Deployments and StatefulSets) the scheduler should not hold.

Pure modules: `histogram` (decaying histograms), `recommend` (history + policy ->
target). Adapters: `usage` (exporters or Prometheus), `controller` (informers, the loop,
checkpoints, rollouts), `cli`.
"""
