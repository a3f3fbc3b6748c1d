{{/* Names and labels. */}}
{{- define "neardup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "neardup.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "neardup.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "neardup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neardup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "neardup.labels" -}}
helm.sh/chart: {{ include "neardup.chart" . }}
{{ include "neardup.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: worker
{{- end }}

{{/*
A setting's value as an environment string. Helm reads every number in a values file as
a float64, which would print 5242880 as 5.24288e+06; whole numbers print as integers.
*/}}
{{- define "neardup.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end }}

{{/* Whether a setting is set: null and "" leave the worker's default. */}}
{{- define "neardup.isSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") }}true{{ end -}}
{{- end }}

{{/* The Secret and key holding NEARDUP_SASL_PASSWORD, if any. */}}
{{- define "neardup.saslSecretName" -}}
{{- if .Values.existingSecret.name }}{{ .Values.existingSecret.name }}{{ else if .Values.settings.sasl_password }}{{ include "neardup.fullname" . }}{{ end -}}
{{- end }}

{{- define "neardup.saslSecretKey" -}}
{{- if .Values.existingSecret.name }}{{ .Values.existingSecret.key }}{{ else }}sasl-password{{ end -}}
{{- end }}

{{/* Refuse values that would deploy a broken worker. */}}
{{- define "neardup.validate" -}}
{{- $s := .Values.settings -}}
{{- if gt (int .Values.replicaCount) (int $s.partitions) }}
{{- fail (printf "replicaCount (%d) is more than settings.partitions (%d): a worker beyond the partition count would run no part task. Lower replicaCount or raise settings.partitions (NEARDUP_PARTITIONS)." (int .Values.replicaCount) (int $s.partitions)) }}
{{- end }}
{{- if and .Values.existingSecret.name $s.sasl_password }}
{{- fail "set either settings.sasl_password or existingSecret.name, not both" }}
{{- end }}
{{- if hasPrefix "SASL_" (toString $s.security_protocol) }}
{{- if not $s.sasl_username }}
{{- fail (printf "settings.security_protocol is %s: set settings.sasl_username (NEARDUP_SASL_USERNAME)" $s.security_protocol) }}
{{- end }}
{{- if not (include "neardup.saslSecretName" .) }}
{{- fail (printf "settings.security_protocol is %s: set settings.sasl_password or existingSecret.name (NEARDUP_SASL_PASSWORD)" $s.security_protocol) }}
{{- end }}
{{- else if include "neardup.saslSecretName" . }}
{{- /* The password would go unread, yet every pod would wait for its Secret; and a
       SASL source with a protocol that has none is more often a forgotten protocol
       than a spare credential. */}}
{{- $source := "settings.sasl_password" }}
{{- $value := $source }}
{{- if .Values.existingSecret.name }}
{{- $source = "existingSecret.name" }}
{{- $value = printf "existingSecret.name (%s)" .Values.existingSecret.name }}
{{- end }}
{{- fail (printf "%s is set, but settings.security_protocol (NEARDUP_SECURITY_PROTOCOL) is %s, which uses no SASL: the pods would need a Secret the worker never reads. Set settings.security_protocol to SASL_PLAINTEXT or SASL_SSL, or unset %s" $value (toString (default "PLAINTEXT" $s.security_protocol)) $source) }}
{{- end }}
{{- if lt (int $s.http_port) 1 }}
{{- fail "settings.http_port (NEARDUP_HTTP_PORT) is 0: the worker would listen on a port of the kernel's choosing, which the container port, the probes and Prometheus cannot name. Set a port from 1 to 65535" }}
{{- end }}
{{- if and (include "neardup.isSet" $s.stop_grace_s) (ge (float64 $s.stop_grace_s) (float64 .Values.terminationGracePeriodSeconds)) }}
{{- fail (printf "settings.stop_grace_s (NEARDUP_STOP_GRACE_S, %v) must be under terminationGracePeriodSeconds (%v): the worker's own deadline has to come before Kubernetes' SIGKILL, so that it says why it stops" $s.stop_grace_s .Values.terminationGracePeriodSeconds) }}
{{- end }}
{{- if include "neardup.isSet" $s.group_instance_id }}
{{- fail "settings.group_instance_id (NEARDUP_GROUP_INSTANCE_ID) is set: it would be every pod's, and pods sharing one take it from each other until all but one stop. Leave it null: with staticMembership each pod's is its own name" }}
{{- end }}
{{- if not (hasPrefix "/" (toString $s.state_dir)) }}
{{- fail "settings.state_dir (NEARDUP_STATE_DIR) must be an absolute path: the state volume is mounted there" }}
{{- end }}
{{- end }}
