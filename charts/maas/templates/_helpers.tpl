{{/* Names are "<release>-maas-<component>" unless the release is already called maas. */}}
{{- define "maas.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "maas.name" -}}
{{- printf "%s-%s" (include "maas.fullname" .root) .component -}}
{{- end -}}

{{- define "maas.selectorLabels" -}}
app.kubernetes.io/name: maas
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "maas.labels" -}}
{{ include "maas.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "maas.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Redis as services reach it: redis.external.url, else the chart's StatefulSet. */}}
{{- define "maas.redisUrl" -}}
{{- if .Values.redis.external.url -}}
{{- .Values.redis.external.url -}}
{{- else -}}
{{- printf "redis://%s:%d/0" (include "maas.name" (dict "root" . "component" "redis")) (int .Values.redis.port) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the chart runs Redis itself (no redis.external.url), else "". */}}
{{- define "maas.chartRedis" -}}
{{- if not .Values.redis.external.url }}true{{ end -}}
{{- end -}}

{{/* The Secret with the chart's PostgreSQL password (postgres.yaml). */}}
{{- define "maas.postgresSecret" -}}
{{- include "maas.name" (dict "root" . "component" "postgres") -}}
{{- end -}}

{{/* "true" when the chart runs PostgreSQL itself (no billing.database.external.url), else "". */}}
{{- define "maas.chartPostgres" -}}
{{- if not .Values.billing.database.external.url }}true{{ end -}}
{{- end -}}

{{/* The Secret with the service token and the Redis password (internal-auth.yaml). */}}
{{- define "maas.internalAuthSecret" -}}
{{- include "maas.name" (dict "root" . "component" "internal-auth") -}}
{{- end -}}

{{/*
A Redis ACL user's name and password (maas_services.common.redis_acl), for the one
service that logs in as it. Params: root, user. With redis.external every service
logs in as redis.external.username (if any) with the existingSecret's password
(if any): an external Redis has its own users, which the chart cannot create.
*/}}
{{- define "maas.redisCredentialsEnv" -}}
{{- $external := .root.Values.redis.external }}
{{- if not $external.url }}
- name: MAAS_REDIS_USERNAME
  value: {{ .user }}
- name: MAAS_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ include "maas.internalAuthSecret" .root }}, key: redis-password-{{ .user }}}
{{- else }}
{{- with $external.username }}
- name: MAAS_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- with $external.existingSecret }}
- name: MAAS_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: {{ $external.existingSecretPasswordKey }}}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every maas pod shares. */}}
{{- define "maas.podSpecCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Env every `maas serve` container shares: listen on the pod IP, log JSON, caches in /tmp. */}}
{{- define "maas.commonEnv" -}}
- name: MAAS_HOST
  value: "0.0.0.0"
- name: MAAS_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: HOME
  value: /tmp
# Internal gRPC servers demand it and internal clients send it (docs/security.md).
- name: MAAS_SERVICE_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "maas.internalAuthSecret" . }}, key: service-token}
{{- end -}}

{{/* A writable /tmp: the root filesystem is read-only. */}}
{{- define "maas.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "maas.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/*
gRPC health probes: readiness asks the server's overall health; startup and
liveness ask .liveness, a health name of its own, where a service's readiness
depends on something outside it (billing on Redis) and an outage of that must
not restart it. Takes (dict "port" P "liveness" NAME-or-empty).
*/}}
{{- define "maas.grpcProbes" -}}
{{- $live := dict "port" .port }}
{{- with .liveness }}{{ $_ := set $live "service" . }}{{ end }}
startupProbe:
  grpc: {{ toJson $live }}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: 5
livenessProbe:
  grpc: {{ toJson $live }}
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}
