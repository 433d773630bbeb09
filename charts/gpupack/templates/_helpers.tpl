{{- define "gpupack.labels" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpupack.webhook.selector" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "gpupack.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpupack.webhook.name" -}}gpupack-webhook{{- end -}}

{{/* The gpupack-certs arguments, shared by both hook Jobs. */}}
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

{{- define "gpupack.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gpupack.scheduler.name" -}}gpupack-scheduler{{- end -}}

{{- define "gpupack.scheduler.selector" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "gpupack.exporter.name" -}}gpupack-exporter{{- end -}}

{{- define "gpupack.exporter.selector" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end -}}

{{- define "gpupack.recommender.name" -}}gpupack-recommender{{- end -}}

{{- define "gpupack.recommender.selector" -}}
app.kubernetes.io/name: gpupack
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

{{/* The KubeSchedulerConfiguration of the gpupack kube-scheduler (templates/scheduler.yaml). */}}
{{- define "gpupack.scheduler.config" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  qps: {{ .Values.scheduler.kubeScheduler.qps }}
  burst: {{ .Values.scheduler.kubeScheduler.burst }}
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElection.enabled }}
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ include "gpupack.scheduler.name" . }}
  leaseDuration: {{ .Values.scheduler.leaderElection.leaseDurationSeconds }}s
  renewDeadline: {{ .Values.scheduler.leaderElection.renewDeadlineSeconds }}s
  retryPeriod: {{ .Values.scheduler.leaderElection.retryPeriodSeconds }}s
percentageOfNodesToScore: 100
profiles:
  - schedulerName: gpupack-scheduler
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.scheduler.extenderPort }}
    filterVerb: filter
    bindVerb: bind
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: 30s
{{- end -}}
