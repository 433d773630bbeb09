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
