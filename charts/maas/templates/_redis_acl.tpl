{{/*
Redis ACL users (docs/security.md). The rules are files/redis-users.acl, which
tests hold equal to maas_services.common.redis_acl.chart_rules(): one table for the
chart and local mode. Each user's password is internalAuth.redisPasswords.<user>,
else what the release's Secret already holds (lookup: upgrades keep it), else
generated once.
*/}}

{{/* The users of the rules file, as a JSON list (default, which is off, excluded). */}}
{{- define "maas.redisAclUsers" -}}
{{- $users := list }}
{{- range $line := .Files.Get "files/redis-users.acl" | splitList "\n" }}
{{- $name := index (splitList " " (printf "%s " $line)) 1 }}
{{- if and $name (ne $name "default") }}
{{- $users = append $users $name }}
{{- end }}
{{- end }}
{{- toJson $users -}}
{{- end -}}

{{/*
Every user's password, as a JSON object. Made once per render and kept in
.Values, so the Secret and the checksum that rolls Redis see the same ones.
*/}}
{{- define "maas.redisPasswords" -}}
{{- $auth := .Values.internalAuth }}
{{- if not (hasKey $auth "generatedRedisPasswords") }}
{{- $name := include "maas.internalAuthSecret" . }}
{{- $held := (lookup "v1" "Secret" .Release.Namespace $name).data | default dict }}
{{- $given := $auth.redisPasswords | default dict }}
{{- $passwords := dict }}
{{- range $user := include "maas.redisAclUsers" . | fromJsonArray }}
{{- $key := printf "redis-password-%s" $user }}
{{- $_ := set $passwords $user (get $given $user | default (get $held $key | b64dec) | default (randAlphaNum 48)) }}
{{- end }}
{{- $_ := set $auth "generatedRedisPasswords" $passwords }}
{{- end }}
{{- toJson $auth.generatedRedisPasswords -}}
{{- end -}}

{{/* The ACL file Redis loads: the rules, each user with its password's SHA-256 (never the password). */}}
{{- define "maas.redisAclFile" -}}
{{- $passwords := include "maas.redisPasswords" . | fromJson }}
{{- range $line := .Files.Get "files/redis-users.acl" | trim | splitList "\n" }}
{{- $name := index (splitList " " $line) 1 }}
{{- if eq $name "default" }}
{{ $line }}
{{- else }}
{{ $line }} #{{ get $passwords $name | sha256sum }}
{{- end }}
{{- end }}
{{- end -}}
