{{- /* The chart's name (nameOverride) and the prefix of every object it names
(fullnameOverride, else the release name, suffixed with the chart's name unless it
already contains it: `helm install gpupack` names objects gpupack-*). */ -}}
{{- define "gpupack.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpupack.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpupack.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpupack.labels" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gpupack
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpupack.webhook.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "gpupack.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpupack.webhook.name" -}}{{ include "gpupack.fullname" . }}-webhook{{- end -}}

{{/* The gpupack-certs arguments, shared by the hook Job and the renewal CronJob. */}}
{{- define "gpupack.certs.args" -}}
- --namespace={{ .Release.Namespace }}
- --secret-name={{ .Values.certificates.secretName }}
- --service-name={{ .Values.webhook.serviceName }}
- --webhook-config={{ include "gpupack.webhook.name" . }}
- --ca-validity-days={{ .Values.certificates.caValidityDays }}
- --cert-validity-days={{ .Values.certificates.certValidityDays }}
- --renew-before-days={{ .Values.certificates.renewBeforeDays }}
- --key-algorithm={{ .Values.certificates.keyAlgorithm }}
- --owner-deployment={{ include "gpupack.webhook.name" . }}
{{- range .Values.certificates.extraDnsNames }}
- --dns-name={{ . }}
{{- end }}
{{- end -}}

{{- /* What gpupack-certs may do, for the hook Job and the renewal CronJob alike: create
Secrets in the release namespace and rewrite only its two; read the webhook Deployment
(to own the Secrets); read and patch only the webhook's configuration (caBundle). */ -}}
{{- define "gpupack.certs.rules" -}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [{{ .Values.certificates.secretName }}, {{ printf "%s-ca" .Values.certificates.secretName }}]
  verbs: [get, update, patch]
- apiGroups: [apps]
  resources: [deployments]
  resourceNames: [{{ include "gpupack.webhook.name" . }}]
  verbs: [get]
{{- end -}}

{{- define "gpupack.certs.clusterRules" -}}
- apiGroups: [admissionregistration.k8s.io]
  resources: [mutatingwebhookconfigurations]
  resourceNames: [{{ include "gpupack.webhook.name" . }}]
  verbs: [get, patch]
{{- end -}}

{{- /* Where hook Jobs and the renewal CronJob run (values `hooks`), as pod spec keys. */ -}}
{{- define "gpupack.hooks.scheduling" -}}
{{- with .Values.hooks.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.hooks.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.hooks.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.hooks.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* The pod that runs gpupack-certs, given the ServiceAccount (dict "root" $ "sa" name). */ -}}
{{- define "gpupack.certs.pod" -}}
{{- $ := .root -}}
metadata:
  labels: {{- include "gpupack.labels" $ | nindent 4 }}
    app.kubernetes.io/component: certificates
spec:
  serviceAccountName: {{ .sa }}
  restartPolicy: Never
  {{- include "gpupack.hooks.scheduling" $ | nindent 2 }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets: {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: gpupack-certs
      image: {{ include "gpupack.image" $ }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      command: [gpupack-certs]
      args: {{- include "gpupack.certs.args" $ | nindent 8 }}
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {memory: 128Mi}
      securityContext: {{- include "gpupack.securityContext" $ | nindent 8 }}
{{- end -}}

{{- define "gpupack.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gpupack.scheduler.name" -}}{{ include "gpupack.fullname" . }}-scheduler{{- end -}}

{{- define "gpupack.scheduler.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "gpupack.exporter.name" -}}{{ include "gpupack.fullname" . }}-exporter{{- end -}}

{{- define "gpupack.csi.name" -}}{{ include "gpupack.fullname" . }}-csi{{- end -}}

{{- define "gpupack.csi.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: csi
{{- end -}}

{{- define "gpupack.exporter.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end -}}

{{- define "gpupack.recommender.name" -}}{{ include "gpupack.fullname" . }}-recommender{{- end -}}

{{- define "gpupack.recommender.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: recommender
{{- end -}}

{{/*
The kube-scheduler image: the cluster's own version unless a tag is set. Managed
clusters report versions such as v1.31.2+k3s1 or v1.30.4-eks-a737599; the upstream
release is the part before the suffix. The same version as the API server is always
within kube-scheduler's skew policy (never newer than kube-apiserver, at most one minor
older).
*/}}
{{- define "gpupack.kubeScheduler.version" -}}
{{- $image := .Values.scheduler.kubeScheduler.image -}}
{{- if $image.tag -}}
{{- $image.tag -}}
{{- else -}}
{{- $found := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if not $found -}}
{{- fail (printf "cannot read a Kubernetes version from %q; set scheduler.kubeScheduler.image.tag" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- printf "v%s" (trimPrefix "v" $found) -}}
{{- end -}}
{{- end -}}

{{- define "gpupack.kubeScheduler.image" -}}
{{ .Values.scheduler.kubeScheduler.image.repository }}:{{ include "gpupack.kubeScheduler.version" . }}
{{- end -}}

{{/* What both of gpupack's kube-schedulers share: the client's rate limit, leader
election (the Lease named in `lease`), every node scored. Called with (dict "root" $
"lease" name). */}}
{{- define "gpupack.scheduler.common" -}}
{{- $values := .root.Values -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  qps: {{ $values.scheduler.kubeScheduler.qps }}
  burst: {{ $values.scheduler.kubeScheduler.burst }}
leaderElection:
  leaderElect: {{ $values.scheduler.leaderElection.enabled }}
  resourceNamespace: {{ .root.Release.Namespace }}
  resourceName: {{ .lease }}
  leaseDuration: {{ $values.scheduler.leaderElection.leaseDurationSeconds }}s
  renewDeadline: {{ $values.scheduler.leaderElection.renewDeadlineSeconds }}s
  retryPeriod: {{ $values.scheduler.leaderElection.retryPeriodSeconds }}s
percentageOfNodesToScore: 100
{{- end -}}

{{/* The KubeSchedulerConfiguration of the kube-scheduler that places fractional pods,
with the extender (templates/scheduler.yaml, config.yaml). */}}
{{- define "gpupack.scheduler.config" -}}
{{ include "gpupack.scheduler.common" (dict "root" . "lease" (include "gpupack.scheduler.name" .)) }}
profiles:
  - schedulerName: gpupack-scheduler
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.scheduler.extenderPort }}
    filterVerb: filter
    bindVerb: bind
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: 30s
    # The share as the webhook charges it for ResourceQuotas: no node advertises these,
    # so kube-scheduler must not fit them (the kubelet drops them the same way).
    managedResources:
      - {name: gpupack.io/gpu-compute-milli, ignoredByScheduler: true}
      - {name: gpupack.io/gpu-memory, ignoredByScheduler: true}
{{- end -}}

{{/* The KubeSchedulerConfiguration of the kube-scheduler that places capacity pods
(templates/scheduler.yaml, capacity.yaml): kube-scheduler's own rules (capacity pods
carry the waiting pods' node constraints), scored to fill the GPU nodes already in use
before touching others, so an autoscaler can remove the idle ones. A process of its own,
not a second profile beside gpupack-scheduler: one kube-scheduler has one queue, ordered
by priority and then by age, and a capacity pod created for a burst of shares would wait
behind every share queued before it (docs/scheduler.md, "Scale"). No extender. */}}
{{- define "gpupack.scheduler.capacityConfig" -}}
{{ include "gpupack.scheduler.common" (dict "root" . "lease" (printf "%s-capacity" (include "gpupack.scheduler.name" .))) }}
profiles:
  - schedulerName: gpupack-capacity
    plugins:
      score:
        enabled:
          - {name: NodeResourcesFit, weight: {{ .Values.scheduler.capacityPacking.weight }}}
    pluginConfig:
      - name: NodeResourcesFit
        args:
          apiVersion: kubescheduler.config.k8s.io/v1
          kind: NodeResourcesFitArgs
          scoringStrategy:
            type: MostAllocated
            resources:
              - {name: nvidia.com/gpu, weight: 1}
{{- end -}}

{{- /* The namespaces the webhook never rewrites: kube-system, the release's, and the
operator's list. */ -}}
{{- define "gpupack.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.excludedNamespaces | uniq | toJson -}}
{{- end -}}

{{- /* gpupack's control-plane identities as a CEL list: the webhook and the scheduler,
who may write gpupack's annotations and labels, create pods for gpupack-capacity, or
delete a capacity pod that hosts pods. The node agent (exporter) is not one: its token is
on every GPU node, so it is fenced on its own (gpupack-exporter-writes). */ -}}
{{- define "gpupack.identities" -}}
{{- $ns := .Release.Namespace -}}
[{{- range $i, $n := list (include "gpupack.webhook.name" .) (include "gpupack.scheduler.name" .) -}}
{{- if $i }}, {{ end }}'system:serviceaccount:{{ $ns }}:{{ $n }}'
{{- end -}}]
{{- end -}}

{{- /* The node agent's identity, as the API server names its ServiceAccount. */ -}}
{{- define "gpupack.exporter.identity" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpupack.exporter.name" . }}
{{- end -}}

{{- /* The annotations the node agent owns on a capacity pod of its node. */ -}}
{{- define "gpupack.exporter.annotations" -}}
['gpupack.io/gpu-uuid', 'gpupack.io/gpu-memory', 'gpupack.io/gpu-unhealthy']
{{- end -}}

{{- /* CEL: `object` and `oldObject` have the same owner references and finalizers: what
a fence that allows a narrow change must also hold still (a dangling owner makes the
garbage collector delete the object; a finalizer removed lets it go early). `who` names
the writer in the messages; `unless`, a CEL condition under which the checks pass (the
writes they do not apply to), or none. */ -}}
{{- define "gpupack.cel.sameOwnership" -}}
{{- $unless := ternary (printf "%s || " .unless) "" (hasKey . "unless") -}}
- expression: "{{ $unless }}object == null || oldObject == null || (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) == (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])"
  message: "gpupack: {{ .who }} may not change owner references"
  reason: Forbidden
- expression: "{{ $unless }}object == null || oldObject == null || (has(object.metadata.finalizers) ? object.metadata.finalizers : []) == (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : [])"
  message: "gpupack: {{ .who }} may not add or remove finalizers"
  reason: Forbidden
{{- end -}}

{{- /* CEL: whether a pod write is exempt from gpupack-immutable-allocations' checks of
gpupack's own metadata: gpupack's identities, and the node agent (fenced by
gpupack-exporter-writes). */ -}}
{{- define "gpupack.cel.writesGpupackMetadata" -}}
request.userInfo.username in {{ include "gpupack.identities" . }} || request.userInfo.username == '{{ include "gpupack.exporter.identity" . }}'
{{- end -}}

{{- /* CEL: gpupack-scheduler updating a pod outside the release namespace, where it may
change only the pod-deletion-cost (scheduler.deletionCost.enabled). */ -}}
{{- define "gpupack.cel.schedulerOutside" -}}
request.operation == 'UPDATE' && request.userInfo.username == 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpupack.scheduler.name" . }}' && request.namespace != '{{ .Release.Namespace }}'
{{- end -}}

{{- /* CEL: whether the pod (`object`) is in an opted-in scope, as the webhook's two
selectors and its decision say: the pod labelled enabled, or its namespace labelled
enabled and the pod not disabled; never in an excluded namespace. */ -}}
{{- define "gpupack.cel.optedIn" -}}
!(namespaceObject.metadata.name in {{ include "gpupack.excludedNamespaces" . }}) && (variables.podOptimize == 'enabled' || (variables.namespaceOptimize == 'enabled' && variables.podOptimize != 'disabled'))
{{- end -}}

{{- define "gpupack.cel.optimizeVariables" -}}
- name: podOptimize
  expression: "has(object.metadata.labels) && 'gpupack.io/optimize' in object.metadata.labels ? object.metadata.labels['gpupack.io/optimize'] : ''"
- name: namespaceOptimize
  expression: "has(namespaceObject.metadata.labels) && 'gpupack.io/optimize' in namespaceObject.metadata.labels ? namespaceObject.metadata.labels['gpupack.io/optimize'] : ''"
{{- end -}}

{{- /* CEL over one container list `$` (an expression): no container selects GPU devices
through the NVIDIA container toolkit's variables, except gpupack's own
NVIDIA_VISIBLE_DEVICES (the assigned GPU, from the downward API) on a pod it rewrote,
and the values that select none. */ -}}
{{- define "gpupack.cel.noDeviceEnv" -}}
{{ . }}.all(c, !has(c.env) || c.env.all(e, !(e.name in ['NVIDIA_VISIBLE_DEVICES', 'NVIDIA_MIG_CONFIG_DEVICES', 'NVIDIA_MIG_MONITOR_DEVICES', 'NVIDIA_IMEX_CHANNELS']) || (has(e.value) && e.value in ['void', 'none']) || (!has(e.value) && !has(e.valueFrom)) || (e.name == 'NVIDIA_VISIBLE_DEVICES' && object.spec.schedulerName == 'gpupack-scheduler' && has(e.valueFrom) && has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath == "metadata.annotations['gpupack.io/gpu-uuid']")))
{{- end -}}

{{- /* CEL: containers `.` set no memory-share variable but as gpupack writes it: the
     driver's own limit equal to the pod's gpupack.io/gpu-memory in MiB, and the shim's
     directory only as gpupack's own path. */ -}}
{{- define "gpupack.cel.noMemoryEnv" -}}
{{ . }}.all(c, !has(c.env) || c.env.all(e, !(e.name in ['NVIDIA_GPU_MEMORY_LIMIT', 'NVIDIA_GPU_MEMORY_REQUEST', 'GPUPACK_CUDA_DIR']) || (e.name == 'GPUPACK_CUDA_DIR' && object.spec.schedulerName == 'gpupack-scheduler' && has(e.value) && e.value == '/run/gpupack/cuda') || (e.name != 'GPUPACK_CUDA_DIR' && object.spec.schedulerName == 'gpupack-scheduler' && has(e.value) && has(object.metadata.annotations) && 'gpupack.io/gpu-memory' in object.metadata.annotations && isQuantity(object.metadata.annotations['gpupack.io/gpu-memory']) && e.value == string(quantity(object.metadata.annotations['gpupack.io/gpu-memory']).asInteger() / 1048576))))
{{- end -}}

{{- /* CEL: whether container `.` asks for nvidia.com/gpu in its limits or requests. */ -}}
{{- define "gpupack.cel.asksGpu" -}}
has({{ . }}.resources) && ((has({{ . }}.resources.limits) && 'nvidia.com/gpu' in {{ . }}.resources.limits) || (has({{ . }}.resources.requests) && 'nvidia.com/gpu' in {{ . }}.resources.requests))
{{- end -}}

{{- /* CEL: whether container `.` reaches GPUs through its image's environment: the
kubelet gives it none (no nvidia.com/* resource, no DRA claim) and its env does not set
NVIDIA_VISIBLE_DEVICES. Such a container gets NVIDIA_VISIBLE_DEVICES=void. */ -}}
{{- define "gpupack.cel.unguarded" -}}
!(has({{ . }}.resources) && ((has({{ . }}.resources.limits) && {{ . }}.resources.limits.exists(k, k.startsWith('nvidia.com/'))) || (has({{ . }}.resources.requests) && {{ . }}.resources.requests.exists(k, k.startsWith('nvidia.com/'))) || (has({{ . }}.resources.claims) && {{ . }}.resources.claims.size() > 0))) && !(has({{ . }}.env) && {{ . }}.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES'))
{{- end -}}

{{- /* CEL: whether ephemeral container `.` was on the pod before this update (immutable:
neither guarded nor judged again). */ -}}
{{- define "gpupack.cel.ephemeralExisting" -}}
oldObject != null && has(oldObject.spec.ephemeralContainers) && oldObject.spec.ephemeralContainers.exists(o, o.name == {{ . }}.name)
{{- end -}}

{{- /* CEL: whether the pod (`object`) has a container that reaches GPUs through its
image's environment (ephemeral containers: only those this update adds). */ -}}
{{- define "gpupack.cel.anyUnguarded" -}}
object.spec.containers.exists(c, {{ include "gpupack.cel.unguarded" "c" }})
|| (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ include "gpupack.cel.unguarded" "c" }}))
|| (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, !({{ include "gpupack.cel.ephemeralExisting" "c" }}) && {{ include "gpupack.cel.unguarded" "c" }}))
{{- end -}}

{{- /* CEL: a kubelet's mirror of a static pod (written by the node, not a user). */ -}}
{{- define "gpupack.cel.notMirror" -}}
!(has(object.metadata.annotations) && 'kubernetes.io/config.mirror' in object.metadata.annotations)
{{- end -}}

{{- /* The namespaces the device-env boundary leaves alone: the release namespace and
security.deviceEnv.exemptNamespaces, as a JSON list. */ -}}
{{- define "gpupack.deviceEnv.exempt" -}}
{{- concat (list .Release.Namespace) .Values.security.deviceEnv.exemptNamespaces | uniq | toJson -}}
{{- end -}}

{{- /* Which API version of MutatingAdmissionPolicy sets NVIDIA_VISIBLE_DEVICES=void, or
"" where the webhook does (security.deviceEnv: scope cluster only). */ -}}
{{- define "gpupack.deviceEnv.policyVersion" -}}
{{- $d := .Values.security.deviceEnv -}}
{{- if and (eq $d.scope "cluster") (ne $d.mutation "webhook") -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1beta1
{{- else if eq $d.mutation "policy" -}}
{{- fail "security.deviceEnv.mutation=policy: this API server serves no MutatingAdmissionPolicy (admissionregistration.k8s.io/v1 from Kubernetes 1.36, v1beta1 when enabled); use auto or webhook" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpupack.decisionKey.secret" -}}
{{- .Values.security.decisionKey.existingSecret | default (printf "%s-decision-key" .Release.Name) -}}
{{- end -}}
