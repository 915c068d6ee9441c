{{/* Names, labels and the image, shared by every template. */}}

{{- define "headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "headroom.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "headroom.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "agent"). */}}
{{- define "headroom.selector" -}}
app.kubernetes.io/name: {{ include "headroom.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "headroom.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "headroom.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "headroom.fullname" .)) .Values.tokens.existingSecret -}}
{{- end -}}

{{/* The Secret holding the database URL, and its key. */}}
{{- define "headroom.databaseSecret" -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "%s-database" (include "headroom.fullname" .) -}}
{{- else -}}
{{- .Values.database.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "headroom.databaseSecretKey" -}}
{{- if .Values.postgresql.enabled -}}url{{- else -}}{{ .Values.database.existingSecretKey }}{{- end -}}
{{- end -}}

{{- define "headroom.coordinatorUrl" -}}
{{- printf "http://%s-coordinator:%d" (include "headroom.fullname" .) (int .Values.coordinator.port) -}}
{{- end -}}

{{/*
A generated secret value, kept across upgrades: the existing Secret's, else random.
(dict "root" $ "secret" NAME "key" KEY "length" N)
*/}}
{{- define "headroom.keptSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if and $existing (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum (int .length) -}}
{{- end -}}
{{- end -}}

{{/* Whether the agent requests its node's GPUs (real ones, a count given): "true" or "". */}}
{{- define "headroom.requestsGpus" -}}
{{- if and (ne .Values.agent.gpuBackend "fake") (gt (int .Values.agent.gpusPerNode) 0) -}}true{{- end -}}
{{- end -}}
