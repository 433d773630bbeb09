"""Operator tooling: the kubectl plugin (`kubectl gpupack`), its status and why-pending
reports, the offline explain, the audit-log reader and the CRD upgrade hook
(`gpupack-crds`). It reads the components' pure decisions, never their servers."""
