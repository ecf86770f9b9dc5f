{{/*
Redis maxmemory in bytes: redis.maxmemory when set, else maxmemoryPercent of the
container's memory limit. The rest of the limit is headroom: an AOF rewrite
forks, and the child's copy-on-write pages count against the same cgroup.
*/}}
{{- define "maas.redisMaxmemory" -}}
{{- $v := .Values.redis -}}
{{- if $v.maxmemory -}}
{{- $v.maxmemory -}}
{{- else -}}
{{- $limit := toString (required "redis.resources.limits.memory (or redis.maxmemory) sizes Redis maxmemory" $v.resources.limits.memory) -}}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti)?$" $limit) -}}
{{- fail (printf "redis.resources.limits.memory %q: use a whole number of Ki, Mi, Gi or Ti, or set redis.maxmemory" $limit) -}}
{{- end -}}
{{- $unit := regexFind "(Ki|Mi|Gi|Ti)$" $limit -}}
{{- $scale := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $unit -}}
{{- div (mul (int64 (trimSuffix $unit $limit)) $scale $v.maxmemoryPercent) 100 -}}
{{- end -}}
{{- end -}}
