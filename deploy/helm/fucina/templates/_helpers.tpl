{{/* Names: <release>-fucina unless the release name already holds the chart's name. */}}
{{- define "fucina.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fucina.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fucina.coordinator" -}}{{ include "fucina.fullname" . }}-coordinator{{- end }}
{{- define "fucina.workers" -}}{{ include "fucina.fullname" . }}-workers{{- end }}

{{- define "fucina.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fucina.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: coordinator | worker. */}}
{{- define "fucina.selector" -}}
app.kubernetes.io/name: {{ include "fucina.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fucina.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Secrets: the join token, the API key, the cluster TLS material. */}}
{{- define "fucina.tokenSecret" -}}
{{ .Values.cluster.token.existingSecret | default (printf "%s-cluster-token" (include "fucina.fullname" .)) }}
{{- end }}
{{- define "fucina.tokenKey" -}}
{{ ternary .Values.cluster.token.existingSecretKey "token" (ne .Values.cluster.token.existingSecret "") }}
{{- end }}
{{- define "fucina.apiKeySecret" -}}
{{ .Values.apiKey.existingSecret | default (printf "%s-api-key" (include "fucina.fullname" .)) }}
{{- end }}
{{- define "fucina.apiKeyKey" -}}
{{ ternary .Values.apiKey.existingSecretKey "api-key" (ne .Values.apiKey.existingSecret "") }}
{{- end }}
{{- define "fucina.apiKeyEnabled" -}}
{{- if or .Values.apiKey.value .Values.apiKey.existingSecret }}true{{ end }}
{{- end }}
{{- define "fucina.tlsSecret" -}}
{{ .Values.cluster.tls.existingSecret | default (printf "%s-cluster-tls" (include "fucina.fullname" .)) }}
{{- end }}
{{/* TLS unless the user asked for a plaintext plane and brought no certificate. */}}
{{- define "fucina.tls" -}}
{{- if or .Values.cluster.tls.existingSecret (not .Values.cluster.insecure) }}true{{ end }}
{{- end }}

{{/* The cluster flags and environment every process shares. */}}
{{- define "fucina.clusterArgs" -}}
{{- if include "fucina.tls" . }}
- --tls-cert=/etc/fucina/tls/tls.crt
- --tls-key=/etc/fucina/tls/tls.key
- --tls-ca=/etc/fucina/tls/ca.crt
{{- else }}
- --insecure-cluster
{{- end }}
{{- end }}

{{- define "fucina.clusterEnv" -}}
- name: FUCINA_CLUSTER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "fucina.tokenSecret" . }}
      key: {{ include "fucina.tokenKey" . }}
{{- end }}

{{- define "fucina.tlsVolume" -}}
{{- if include "fucina.tls" . }}
- name: tls
  secret:
    secretName: {{ include "fucina.tlsSecret" . }}
    # Root owns the files and the pod's fsGroup reads them. Never open to other users (the
    # Kubernetes default, 0644): fucina refuses a --tls-key that other users may read.
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "fucina.tlsMount" -}}
{{- if include "fucina.tls" . }}
- name: tls
  mountPath: /etc/fucina/tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The model: at most one source ("url" also when none is set: model.default is pulled);
where the coordinator reads it. */}}
{{- define "fucina.modelSource" -}}
{{- $m := .Values.model }}
{{- $n := 0 }}
{{- if $m.url }}{{ $n = add1 $n }}{{ end }}
{{- if $m.existingClaim }}{{ $n = add1 $n }}{{ end }}
{{- if $m.hostPath }}{{ $n = add1 $n }}{{ end }}
{{- if gt $n 1 }}
{{- fail "model: set at most one of model.url, model.existingClaim, model.hostPath" }}
{{- end }}
{{- if and (eq $n 0) (not $m.default.url) }}
{{- fail "model: set one of model.url, model.existingClaim, model.hostPath (model.default.url is empty)" }}
{{- end }}
{{- if $m.existingClaim }}claim{{ else if $m.hostPath }}hostPath{{ else }}url{{ end }}
{{- end }}

{{/* What the pull-model init container fetches and checks: model.url, else model.default. */}}
{{- define "fucina.modelUrl" -}}
{{- if .Values.model.url }}{{ .Values.model.url }}{{ else }}{{ .Values.model.default.url }}{{ end }}
{{- end }}

{{- define "fucina.modelSha256" -}}
{{- if .Values.model.url }}{{ .Values.model.sha256 }}{{ else }}{{ .Values.model.default.sha256 }}{{ end }}
{{- end }}

{{- define "fucina.modelPath" -}}
/models/{{ .Values.model.file }}
{{- end }}
